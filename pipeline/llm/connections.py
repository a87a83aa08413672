"""The connections to the LLM provider: kept open between a call's turns, and opened before the
first caller needs one.

The openai SDK's HTTP client (HTTPX2) closes a connection that has been idle for 5 s, and so
did the embedded simulator's uvicorn. A phone call's turns come further apart than that (the
caller speaks, then the reply plays), so every turn's request opened a new connection (4 of 4
in a one-call bench), and on a real provider that is a TCP and a TLS handshake, one to two more
round trips, before the request leaves. The clients keep idle connections `keepalive_s`
(`HOTLINE_LLM__KEEPALIVE_S`, 120 s), and `open_connection` opens one per tier at startup with
`GET /models` (nothing is generated or billed), which also takes the SDK's first use off the
first caller's turn: a one-call bench then made 5 requests on 2 connections, one per tier, and
the first turn waited 283-334 ms from its transcript to its first token against 319-357 before
(three alternated pairs; later turns 288-346 against 291-364).
"""

from __future__ import annotations

import asyncio
import logging

import httpx2
import openai

from pipeline.llm.settings import LLMSettings

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1000  # the SDK's own limits, but for how long an idle connection is kept
MAX_IDLE_CONNECTIONS = 100


def provider_client(settings: LLMSettings, base_url: str) -> openai.AsyncOpenAI:
    """The SDK's client for the provider at `base_url`, on the SDK's default HTTP client but
    keeping idle connections `settings.keepalive_s`."""
    limits = httpx2.Limits(
        max_connections=MAX_CONNECTIONS,
        max_keepalive_connections=MAX_IDLE_CONNECTIONS,
        keepalive_expiry=settings.keepalive_s,
    )
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=settings.api_key.get_secret_value(),
        timeout=openai.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
        max_retries=settings.max_retries,
        http_client=openai.DefaultAsyncHttpx2Client(limits=limits),
    )


async def open_connection(client: openai.AsyncOpenAI, within_s: float) -> bool:
    """Connect to the provider now (`GET /models`); False (logged) if it did not answer
    `within_s`. Any answer counts: a provider without `/models` answers 404 on a connection
    that is then kept all the same."""
    try:
        async with asyncio.timeout(within_s):
            await client.models.list()
    except openai.APIStatusError:
        return True
    except (openai.OpenAIError, TimeoutError) as exc:
        log.warning(
            "LLM at %s: no connection opened ahead of the first call (%s)",
            client.base_url,
            type(exc).__name__,
        )
        return False
    return True
