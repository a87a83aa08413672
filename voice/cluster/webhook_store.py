"""The Redis side of `voice.cluster.webhooks`: key layout, the three Lua scripts that enqueue,
claim (under a lease) and finish a delivery atomically, and the exact body bytes that are
signed. Every key shares the `{prefix}` slot, so one script touches a delivery and the due set
together (the layout is described in `voice.cluster.webhooks`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_BODY_BYTES = 1_000_000  # a bigger document is refused by `enqueue`


def due_key(prefix: str) -> str:
    return f"{{{prefix}}}:webhooks:due"


def delivery_key(prefix: str, delivery_id: str) -> str:
    return f"{{{prefix}}}:webhook:{delivery_id}"


# KEYS: due, delivery. ARGV: id, due at, expire s, field/value pairs. Idempotent: a retry after
# a lost reply finds the delivery there and leaves it.
ENQUEUE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""
# KEYS: due, then each candidate's delivery. ARGV: now, lease until, claim token, worker, then
# each candidate's id. Returns {id, call_id, event, body, enqueued_at, attempts} per claim.
CLAIM = """
local claimed = {}
for i = 2, #KEYS do
  local id = ARGV[i + 3]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    if redis.call('HGET', KEYS[i], 'state') == 'pending' then
      redis.call('ZADD', KEYS[1], ARGV[2], id)
      redis.call('HINCRBY', KEYS[i], 'attempts', 1)
      redis.call('HSET', KEYS[i], 'claim', ARGV[3], 'worker', ARGV[4], 'last_attempt_at', ARGV[1])
      local d = redis.call('HMGET', KEYS[i], 'call_id', 'event', 'body', 'enqueued_at', 'attempts')
      table.insert(claimed, {id, d[1], d[2], d[3], d[4], d[5]})
    else
      redis.call('ZREM', KEYS[1], id)
    end
  end
end
return claimed
"""
# KEYS: due, delivery. ARGV: id, claim token, next attempt at ('' when final), retention s,
# field/value pairs. Only the holder of the latest claim records; 0 for anyone else.
FINISH = """
if redis.call('HGET', KEYS[2], 'claim') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 5))
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], 'body')
  redis.call('EXPIRE', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""


def json_body(document: Mapping[str, Any]) -> bytes:
    """`document` as compact UTF-8 JSON (\\u escapes only for a lone surrogate); ValueError if
    it is not JSON (NaN and infinities are not)."""
    try:
        body = json.dumps(
            dict(document), separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a webhook document must be JSON: {exc}") from exc
    try:
        return body.encode()
    except UnicodeEncodeError:
        return json.dumps(dict(document), separators=(",", ":"), allow_nan=False).encode()
