"""The tier simulator: an OpenAI-compatible HTTP server with fast and standard tiers (the
embedded default LLM, and the fake provider of the tests and experiments)."""
