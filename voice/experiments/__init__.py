"""Latency-budget experiments: arms and assignment, the report, the offline simulation."""
