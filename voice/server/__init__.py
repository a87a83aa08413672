"""The HTTP server: the app and its lifespan, the call switchboard, metrics, settings, and the
APIs (routes/, one module per API area)."""
