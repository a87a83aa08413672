"""The HTTP server: the app and its lifespan, the call switchboard, metrics, settings, the APIs."""
