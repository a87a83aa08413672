"""The Lua scripts that move a campaign's rows atomically (`voice.campaigns.store` says the key
layout). Every key a script touches is in its KEYS, and all of them are one campaign's, in its
Redis Cluster slot `{<campaign id>}`.

The meta hash counts rows by status (`n:<status>`), so each move between statuses goes through
`move`. A row held by a worker carries that hold's `token`: only its holder (or the status
callback of the call it placed, which names the token) may move it on, so a late or repeated
report never settles a row twice. A campaign ends, once, in the script that leaves it with
nothing due and nothing in flight: that script returns 2, sets `notify` pending, and the
`campaign.ended` webhook is then sent by whichever worker claims it."""

from __future__ import annotations

_PRELUDE = """
local function move(meta, row, new)
  local old = redis.call('HGET', row, 'status')
  if old then redis.call('HINCRBY', meta, 'n:' .. old, -1) end
  redis.call('HINCRBY', meta, 'n:' .. new, 1)
  redis.call('HSET', row, 'status', new)
end
local function finish_if_done(meta, due, inflight, now)
  if redis.call('ZCARD', due) > 0 or redis.call('ZCARD', inflight) > 0 then return 1 end
  local state = redis.call('HGET', meta, 'state')
  if state == 'ended' or state == 'creating' then return 1 end
  local as = 'completed'
  if state == 'stopped' then as = 'stopped' end
  redis.call('HSET', meta, 'state', 'ended', 'ended_as', as, 'ended_at', now, 'notify', 'pending')
  return 2
end
local function finish_row(meta, due, inflight, row, status, now)
  move(meta, row, status)
  redis.call('HSET', row, 'finished_at', now)
  redis.call('HDEL', row, 'next_at', 'waiting')
  return finish_if_done(meta, due, inflight, now)
end
local function requeue(meta, due, inflight, row, id, due_at, waiting, now)
  redis.call('ZREM', inflight, id)
  redis.call('HDEL', row, 'token', 'worker', 'provider_status')
  if redis.call('HGET', meta, 'state') == 'stopped' then
    return finish_row(meta, due, inflight, row, 'stopped', now)
  end
  move(meta, row, 'queued')
  redis.call('HSET', row, 'next_at', due_at, 'waiting', waiting)
  redis.call('ZADD', due, due_at, id)
  return 1
end
"""

# KEYS: meta, due, inflight, row. ARGV: now, lease until, token, worker, row id.
# Returns {attempts, to, timezone, variables}; or -2 (not running), -1 (concurrency reached),
# 0 (not due: taken meanwhile).
CLAIM = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return -2 end
local limit = tonumber(redis.call('HGET', KEYS[1], 'concurrency'))
if redis.call('ZCARD', KEYS[3]) >= limit then return -1 end
local score = redis.call('ZSCORE', KEYS[2], ARGV[5])
if not score or tonumber(score) > tonumber(ARGV[1]) then return 0 end
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[5])
move(KEYS[1], KEYS[4], 'dialling')
redis.call('HSET', KEYS[4], 'token', ARGV[3], 'worker', ARGV[4], 'claimed_at', ARGV[1])
redis.call('HDEL', KEYS[4], 'next_at', 'waiting')
redis.call('HINCRBY', KEYS[1], 'dials', 1)
local attempts = redis.call('HINCRBY', KEYS[4], 'attempts', 1)
local row = redis.call('HMGET', KEYS[4], 'to', 'timezone', 'variables')
return {attempts, row[1] or '', row[2] or '', row[3] or '{}'}
"""
)

# Give back a held row that was not dialled (calling hours, the call rate, a full cluster):
# its attempt is not counted. KEYS: meta, due, inflight, row. ARGV: token, due at, row id,
# why it waits, now. 0: not held with this token.
RELEASE = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[4], 'token') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', KEYS[4], 'attempts', -1)
redis.call('HINCRBY', KEYS[1], 'dials', -1)
return requeue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[2], ARGV[4], ARGV[5])
"""
)

# A row whose holder's lease ran out while dialling (the worker died): due again at once, its
# attempt not counted. KEYS: meta, due, inflight, row. ARGV: the lease's token, now, row id.
RETAKE = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[4], 'status') ~= 'dialling' then return 0 end
if redis.call('HGET', KEYS[4], 'token') ~= ARGV[1] then return 0 end
local score = redis.call('ZSCORE', KEYS[3], ARGV[3])
if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[4], 'attempts', -1)
redis.call('HINCRBY', KEYS[4], 'retaken', 1)
redis.call('HINCRBY', KEYS[1], 'dials', -1)
return requeue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[2], 'retaken', ARGV[2])
"""
)

# The provider took the call. KEYS: meta, inflight, row. ARGV: token, row id, call id, next
# look at, now.
PLACED = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[3], 'token') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[3], 'status') ~= 'dialling' then return 0 end
move(KEYS[1], KEYS[3], 'ringing')
redis.call('HSET', KEYS[3], 'call_id', ARGV[3], 'placed_at', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'dialled', 1)
return 1
"""
)

# What a dial came to. KEYS: meta, due, inflight, row. ARGV: token, row id, outcome, final
# ('1': the row ends with it; '0': due again at ARGV[5]), due at, now, '1' if the attempt is
# not counted (never dialled: the do-not-call list), '1' if the provider took the call (its
# status callback: counted as dialled if it came before the call was noted), then field/value
# pairs for the row.
# 0: stale (not held with this token); 1: done; 2: done, and the campaign has ended.
SETTLE = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[4], 'token') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[4], 'status')
if status ~= 'dialling' and status ~= 'ringing' then return 0 end
if ARGV[7] == '1' then
  redis.call('HINCRBY', KEYS[4], 'attempts', -1)
  redis.call('HINCRBY', KEYS[1], 'dials', -1)
else
  local outcomes = redis.call('HGET', KEYS[4], 'outcomes')
  if outcomes and outcomes ~= '' then outcomes = outcomes .. ',' .. ARGV[3]
  else outcomes = ARGV[3] end
  redis.call('HSET', KEYS[4], 'outcomes', outcomes)
end
if ARGV[8] == '1' and status == 'dialling' then redis.call('HINCRBY', KEYS[1], 'dialled', 1) end
if #ARGV > 8 then redis.call('HSET', KEYS[4], unpack(ARGV, 9)) end
redis.call('HSET', KEYS[4], 'last_outcome', ARGV[3])
if ARGV[4] == '1' or redis.call('HGET', KEYS[1], 'state') == 'stopped' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('HDEL', KEYS[4], 'token', 'worker', 'provider_status')
  return finish_row(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[6])
end
return requeue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[5], 'retry', ARGV[6])
"""
)

# The provider says the call was answered and has ended (Twilio `completed`): note it and look
# at the call's record at once (a row still dialling: once the call is noted). KEYS: inflight,
# row. ARGV: token, row id, status, look at.
PROVIDER_STATUS = """
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'provider_status', ARGV[3])
if redis.call('HGET', KEYS[2], 'status') == 'ringing' then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ARGV[2])
end
return 1
"""

# One worker's turn to look at a ringing row (others skip it until ARGV[3]). KEYS: inflight.
# ARGV: row id, now, next look at.
LOOK = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

# A stopped campaign's queued rows become `stopped`. KEYS: meta, due, inflight, then rows.
# ARGV: now, then the rows' ids. Returns 2 when the campaign has ended.
SWEEP = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'stopped' then return 0 end
for i = 4, #KEYS do
  local id = ARGV[i - 2]
  if redis.call('ZREM', KEYS[2], id) == 1 then
    move(KEYS[1], KEYS[i], 'stopped')
    redis.call('HSET', KEYS[i], 'finished_at', ARGV[1])
    redis.call('HDEL', KEYS[i], 'next_at', 'waiting')
  end
end
return finish_if_done(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
"""
)

# pause | resume | stop. KEYS: meta. ARGV: what, now. Returns the state after it ('' if there
# is no such campaign).
CHANGE_STATE = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return '' end
if state == 'ended' or state == 'stopped' or state == 'creating' then return state end
local what = ARGV[1]
if what == 'pause' and state == 'running' then state = 'paused'
elseif what == 'resume' and state == 'paused' then state = 'running'
elseif what == 'stop' then state = 'stopped'
  redis.call('HSET', KEYS[1], 'stopped_at', ARGV[2])
end
redis.call('HSET', KEYS[1], 'state', state)
return state
"""

# Claim sending the campaign.ended webhook for a while. KEYS: meta. ARGV: now, until.
NOTIFY = """
if redis.call('HGET', KEYS[1], 'notify') ~= 'pending' then return 0 end
local lease = tonumber(redis.call('HGET', KEYS[1], 'notify_until') or '0')
if lease > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'notify_until', ARGV[2])
return 1
"""
