"""Agents: who answers a call (agent files), the tools it may use (built-in and HTTP), and how a
call is put through to a person on each provider."""
