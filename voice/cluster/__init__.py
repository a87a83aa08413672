"""Calls across processes and machines: the Redis call registry, its records and its store."""
