"""The Lua scripts of the Redis gate and of the fenced Redis result backend, with one fence check.

Every script that checks a token runs the same Lua function, ``fence``, and
refuses in one convention: an error reply ``FENCED <kind> <detail>``, which
:func:`parse_refusal` splits. No redis-py import here, so the Celery layer
can use the scripts without importing a gate.

The refusal kinds:

===============  ===========================================================
``stale``        the token is below the mark (detail: the mark)
``grantor``      the mark belongs to another grantor (detail: its grantor id)
``corrupt``      the mark key does not hold a 20-digit mark (detail: the key), or
                 the floor key no floor (detail: ``floor``)
``owner``        the data belongs to another resource (detail: that resource)
``applied``      another, older execution of this task id applied here (detail:
                 its token, or ``-`` when the record names no token)
``superseded``   a newer execution of this task id applied here (detail: its token)
``tokenless``    a write without a token over a result that one wrote (backend)
``changed``      an operator's reset found the mark moved (detail: the mark, or ``-``)
``unarmed``      the store holds no floor: it is new, or it lost its data (a restart
                 without persistence, a flush); every token is refused until a floor
                 is set (detail: ``-``)
``floor``        the token is below the store's floor (detail: the floor)
===============  ===========================================================

The floor: a store that forgot its marks would take any stale token, so each
store (each hash tag in a Redis Cluster) keeps one key, the floor, that its
marks depend on. It is set from a token minted after the store was found
without it, so every token minted before the loss is below it. A store without
the key is unarmed and refuses everything: a restart without persistence wipes
the floor with the marks, and fails closed.

Marks are compared as equal-width digit strings, never as Lua numbers: Lua
numbers are doubles, exact only below 2**53. Lua's string comparison uses
strcoll(), and every locale orders the digits 0-9 numerically at the first
level, so equal-width digit strings compare as their numbers do.
"""

from __future__ import annotations

__all__ = [
    "ARM_SCRIPT",
    "CLAIM_RESULT_SCRIPT",
    "CLAIM_SCRIPT",
    "DELETE_SCRIPT",
    "EVAL_SCRIPT_TEMPLATE",
    "FENCE_FUNCTION",
    "HSET_SCRIPT",
    "RESET_SCRIPT",
    "RESULT_FLOOR_KEY",
    "SEAL_RESULT_SCRIPT",
    "SET_SCRIPT",
    "STORE_FUNCTION",
    "WRITE_RESULT_SCRIPT",
    "parse_refusal",
]

# floor_value(floor): the 20 digits of a stored floor ("<20 digits>" or "<20 digits>:<grantor
# id>"), or nil when the key holds something else. The one check of a floor's shape, for the
# fence's floored() and for the arm script.
FLOOR_VALUE_FUNCTION = """\
local function floor_value(floor)
  local value = string.sub(floor, 1, 20)
  if #value < 20 or not string.find(value, '^[0-9]+$') then return nil end
  if #floor > 20 and string.sub(floor, 21, 21) ~= ':' then return nil end
  return value
end
"""

FENCE_FUNCTION = (
    FLOOR_VALUE_FUNCTION
    + """\
-- fence(mark, grantor, applied, token, token_grantor, execution, where): nil when the
-- token may write, else the refusal "FENCED <kind> <detail>".
--   mark       the stored mark (20 digits) or false
--   grantor    the grantor id of the mark or false
--   applied    the record of this task id here, "<token>:<execution id>" (the token
--              of the execution that applied, 20 digits), or an execution id alone
--              (the result backend's seal), or false
--   execution  this execution's id; '' records and checks nothing
--   where      the mark's key, named in a corrupt-mark refusal
-- floored(floor, token) is checked first, by every script that checks a token:
-- a store without its floor knows nothing, whatever its other keys say.
-- Grantor first: a wiped grantor's tokens are low too, and the mismatch is the news.
-- "Applied" before "stale": a refused copy of a task that another execution
-- applied must end as done, not retry and apply again. Whether it was applied by
-- a newer execution of the task (superseded: that one finishes the task) or an
-- older one is told by the recorded token: the resource's mark may belong to
-- another task.
local function fence(mark, grantor, applied, token, token_grantor, execution, where)
  if grantor and token_grantor ~= '' and grantor ~= token_grantor then return 'FENCED grantor ' .. grantor end
  if mark and #mark ~= 20 then return 'FENCED corrupt ' .. where end
  if applied and execution ~= '' then
    local by, at = applied, nil
    if string.sub(applied, 21, 21) == ':' then at, by = string.sub(applied, 1, 20), string.sub(applied, 22) end
    if by ~= execution then
      if at and at > token then return 'FENCED superseded ' .. at end
      return 'FENCED applied ' .. (at or '-')
    end
  end
  if mark and mark > token then return 'FENCED stale ' .. mark end
  return nil
end
-- floored(floor, token, token_grantor): the floor is "<20 digits>" or "<20 digits>:<grantor id>"
-- (the grantor of the token it was minted as). A token of another grantor is not on
-- its scale: it passes here, and the marks' grantor check judges it. A floor key that
-- holds anything else refuses every token (corrupt), never lets one through.
local function floored(floor, token, token_grantor)
  if not floor or #floor < 20 then return 'FENCED unarmed -' end
  local value, floor_grantor = floor_value(floor), string.sub(floor, 22)
  if not value then return 'FENCED corrupt floor' end
  if floor_grantor ~= '' and token_grantor ~= '' and floor_grantor ~= token_grantor then return nil end
  if value > token then return 'FENCED floor ' .. value end
  return nil
end
"""
)

# keep(key, value, ttl): SET, with PX when ttl is not '0'. The fence state of a
# transient resource (a task id, which is never fenced again once its task is
# done) expires; a domain resource's is kept for good.
STORE_FUNCTION = """\
local function keep(key, value, ttl)
  if ttl ~= '0' then redis.call('SET', key, value, 'PX', ttl) else redis.call('SET', key, value) end
end
"""

CLAIM_SCRIPT = (
    """\
-- Claim: raise the resource's mark to the token unless the mark is above it.
-- KEYS[1] mark key of the token's resource
-- KEYS[2] grantor key of the token's resource
-- KEYS[3] floor key of the store (of the resource's hash tag in a cluster)
-- ARGV[1] token, a 20-digit zero-padded decimal string
-- ARGV[2] grantor id of the token, or '' for none
-- ARGV[3] milliseconds the mark and grantor keys live ('0': for good)
-- returns 1 when the mark now equals the token; refusals unarmed, floor, stale, grantor, corrupt
"""
    + FENCE_FUNCTION
    + STORE_FUNCTION
    + """\
local state = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
local mark, grantor = state[1], state[2]
local refused = floored(state[3], ARGV[1], ARGV[2]) or fence(mark, grantor, false, ARGV[1], ARGV[2], '', KEYS[1])
if refused then return redis.error_reply(refused) end
if mark ~= ARGV[1] then keep(KEYS[1], ARGV[1], ARGV[3]) end
if ARGV[2] ~= '' and not grantor then keep(KEYS[2], ARGV[2], ARGV[3]) end
return 1
"""
)

RESET_SCRIPT = """\
-- Operator reset (celery-fencing rebase / repair): set the mark and its
-- grantor, lower or not, if they are still what the operator read.
-- KEYS[1] mark key, KEYS[2] grantor key
-- ARGV[1] expected mark ('' for none), ARGV[2] expected grantor ('' for none)
-- ARGV[3] new mark (20 digits), ARGV[4] new grantor ('' for none)
-- returns 1 when reset; refusal "FENCED changed <mark>" when the mark moved
local state = redis.call('MGET', KEYS[1], KEYS[2])
if (state[1] or '') ~= ARGV[1] or (state[2] or '') ~= ARGV[2] then
  return redis.error_reply('FENCED changed ' .. (state[1] or '-'))
end
redis.call('SET', KEYS[1], ARGV[3])
if ARGV[4] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[4]) end
return 1
"""

ARM_SCRIPT = (
    FLOOR_VALUE_FUNCTION
    + """\
-- Arm a store: give it a floor (see the module's docstring).
-- KEYS[1] floor key
-- ARGV[1] the floor: 20 digits, then ':<grantor id>' when it was minted with one
-- ARGV[2] '1': only an unarmed store (a gate arming itself: whoever armed first wins);
--         '0': also raise a lower floor, or replace a key that holds no floor (an operator)
-- returns the floor in force afterwards
local floor = redis.call('GET', KEYS[1])
if floor and #floor >= 20 then
  -- A gate never replaces what it cannot read: the scripts refuse every token against it.
  if ARGV[2] == '1' then return floor end
  local value = floor_value(floor)
  if value and value >= string.sub(ARGV[1], 1, 20) then return floor end
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""
)

_ONE_KEY_HEADER = """\
-- KEYS[1] mark key of the token's resource
-- KEYS[2] grantor key of the token's resource
-- KEYS[3] applied-record key of the token's resource and the execution's task id
-- KEYS[4] floor key of the store (of the resource's hash tag in a cluster)
-- KEYS[5] owner key of the data key
-- KEYS[6] data key
-- ARGV[1] token, a 20-digit zero-padded decimal string
-- ARGV[2] resource of the token
-- ARGV[3] grantor id of the token, or '' for none
-- ARGV[4] execution id to record with the effect, or '' to record nothing
-- ARGV[5] how long the record is kept, in milliseconds (with an execution id)
-- ARGV[6] milliseconds the mark, grantor and owner keys live ('0': for good)
-- returns 1 when written; refusals unarmed, floor, stale, grantor, corrupt, owner, applied, superseded
"""

# The check of the single-key write scripts. It reads every piece of fence
# state with one MGET (this runs on every write) and writes nothing, so a
# refused write changes nothing.
_CHECK_ONE_KEY = """\
local state = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local mark, grantor, applied, owner = state[1], state[2], state[3], state[5]
local refused = floored(state[4], ARGV[1], ARGV[3])
if refused then return redis.error_reply(refused) end
if owner and owner ~= ARGV[2] then return redis.error_reply('FENCED owner ' .. owner) end
refused = fence(mark, grantor, applied, ARGV[1], ARGV[3], ARGV[4], KEYS[1])
if refused then return redis.error_reply(refused) end
"""

# Runs after the data command succeeded: a data command that fails (WRONGTYPE)
# aborts the script before this, leaving the fence state as it was. Unchanged
# values are not rewritten, which keeps the steady state of one execution's
# repeated writes to one MGET and one data write.
_ADVANCE_ONE_KEY = """\
if mark ~= ARGV[1] then keep(KEYS[1], ARGV[1], ARGV[6]) end
if ARGV[3] ~= '' and not grantor then keep(KEYS[2], ARGV[3], ARGV[6]) end
if not owner then keep(KEYS[5], ARGV[2], ARGV[6]) end
if ARGV[4] ~= '' and applied ~= ARGV[1] .. ':' .. ARGV[4] then
  redis.call('SET', KEYS[3], ARGV[1] .. ':' .. ARGV[4], 'PX', ARGV[5])
end
return 1
"""

SET_SCRIPT = (
    "-- Gated SET.\n"
    + _ONE_KEY_HEADER
    + "-- ARGV[7] value\n-- ARGV[8] optional: expiry in milliseconds\n"
    + FENCE_FUNCTION
    + STORE_FUNCTION
    + _CHECK_ONE_KEY
    + """\
if ARGV[8] then
  redis.call('SET', KEYS[6], ARGV[7], 'PX', ARGV[8])
else
  redis.call('SET', KEYS[6], ARGV[7])
end
"""
    + _ADVANCE_ONE_KEY
)

HSET_SCRIPT = (
    "-- Gated HSET.\n"
    + _ONE_KEY_HEADER
    + "-- ARGV[7 ..] field, value, field, value, ...\n"
    + FENCE_FUNCTION
    + STORE_FUNCTION
    + _CHECK_ONE_KEY
    # unpack() is bounded by Lua's C stack: large mappings go in chunks of 500
    # pairs. Only the first chunk can fail (WRONGTYPE), before anything is written.
    + """\
for i = 7, #ARGV, 1000 do
  redis.call('HSET', KEYS[6], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
"""
    + _ADVANCE_ONE_KEY
)

DELETE_SCRIPT = (
    "-- Gated DEL. The key stays bound to its resource.\n"
    + _ONE_KEY_HEADER
    + FENCE_FUNCTION
    + STORE_FUNCTION
    + _CHECK_ONE_KEY
    + "redis.call('DEL', KEYS[6])\n"
    + _ADVANCE_ONE_KEY
)

# The caller's body is spliced in with %: the template holds no other % sign.
EVAL_SCRIPT_TEMPLATE = (
    """\
-- Gated EVAL: the caller's Lua body runs only after the fence check passed.
-- KEYS[1] mark key of the token's resource
-- KEYS[2] grantor key of the token's resource
-- KEYS[3] applied-record key of the token's resource and the execution's task id
-- KEYS[4] floor key of the store (of the resource's hash tag in a cluster)
-- KEYS[5 .. n+4] owner keys of the caller's n data keys
-- KEYS[n+5 .. 2n+4] the caller's data keys (the body sees them as KEYS[1 .. n])
-- ARGV[1 .. 6] as for the single-key scripts: token, resource, grantor id,
--   execution id ('' records nothing), record retention in milliseconds,
--   milliseconds the mark, grantor and owner keys live ('0': for good)
-- ARGV[7 ..] the caller's arguments (the body sees them as ARGV[1 ..])
-- returns what the body returns; refusals unarmed, floor, stale, grantor,
--   corrupt, owner, applied, superseded (the body has not run)
"""
    + FENCE_FUNCTION
    + STORE_FUNCTION
    + """\
local n = (#KEYS - 4) / 2
local state = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local mark, grantor, applied = state[1], state[2], state[3]
local refused = floored(state[4], ARGV[1], ARGV[3])
if refused then return redis.error_reply(refused) end
local owners = {}
if n > 0 then owners = redis.call('MGET', unpack(KEYS, 5, n + 4)) end
for i = 1, n do
  if owners[i] and owners[i] ~= ARGV[2] then return redis.error_reply('FENCED owner ' .. owners[i]) end
end
refused = fence(mark, grantor, applied, ARGV[1], ARGV[3], ARGV[4], KEYS[1])
if refused then return redis.error_reply(refused) end
-- Advance before the body: Redis does not undo the writes of a script that
-- fails half-way, so the mark and the record must already cover whatever the body writes.
if mark ~= ARGV[1] then keep(KEYS[1], ARGV[1], ARGV[6]) end
if ARGV[3] ~= '' and not grantor then keep(KEYS[2], ARGV[3], ARGV[6]) end
if ARGV[4] ~= '' and applied ~= ARGV[1] .. ':' .. ARGV[4] then
  redis.call('SET', KEYS[3], ARGV[1] .. ':' .. ARGV[4], 'PX', ARGV[5])
end
for i = 1, n do
  if not owners[i] then keep(KEYS[4 + i], ARGV[2], ARGV[6]) end
end
local data_keys, data_args = {}, {}
for i = 1, n do data_keys[i] = KEYS[n + 4 + i] end
for i = 7, #ARGV do data_args[i - 6] = ARGV[i] end
local function body(KEYS, ARGV)
%s
end
return body(data_keys, data_args)
"""
)

#: The fenced result backend's floor key (before Celery's global key prefix):
#: never a fence hash's key, ``celery-task-fence-<task id>``, whose name goes on with '-'.
RESULT_FLOOR_KEY = "celery-task-fence:floor"

# The result backend keeps one hash per task beside its result key, with the
# fields mark, resource, grantor, state, final and done (the id of the
# execution that sealed the task: the one whose result stands).

WRITE_RESULT_SCRIPT = (
    """\
-- Write a task result under the fence.
-- KEYS[1] result key, KEYS[2] fence hash, KEYS[3] the backend's floor key
-- ARGV[1] encoded meta, ARGV[2] token as 20 digits or '' for none, ARGV[3] resource or '',
-- ARGV[4] state, ARGV[5] '1' when the state is final, ARGV[6] expiry in seconds ('0': none),
-- ARGV[7] grantor id of the token or '', ARGV[8] execution id of the writer ('-' for none),
-- ARGV[9] '1' when this write also seals the task (as SEAL_RESULT_SCRIPT: the first seal wins),
-- ARGV[10] seconds the fence hash lives when the result expires (never less than the exactly-once
--   retention: a copy the broker may still deliver must find the fence)
-- returns 1 written; refusals tokenless, unarmed, floor (a write with a token only),
--   owner, grantor, corrupt, applied, superseded (another execution sealed the task), stale
"""
    + FENCE_FUNCTION
    + """\
local f = redis.call('HMGET', KEYS[2], 'mark', 'resource', 'final', 'state', 'grantor', 'done')
local mark, owner, final, state, grantor, done = f[1], f[2], f[3], f[4], f[5], f[6]
if ARGV[2] == '' then
  if mark and final == '1' then
    return redis.error_reply('FENCED tokenless over a final result written with a token')
  end
  if state == 'SUCCESS' then return redis.error_reply('FENCED tokenless over SUCCESS') end
else
  -- The execution that sealed the task writes its result whatever the mark and the
  -- floor: it finished first, and every other execution defers to it. Its id in
  -- 'done' proves the hash outlived its seal, which passed the floor (perhaps with a
  -- fresh token its later writes do not carry).
  if done ~= ARGV[8] then
    local below = floored(redis.call('GET', KEYS[3]), ARGV[2], ARGV[7])
    if below then return redis.error_reply(below) end
  end
  if owner and owner ~= ARGV[3] then return redis.error_reply('FENCED owner ' .. owner) end
  if done ~= ARGV[8] then
    -- A sealing write is not ordered by tokens: the first execution to finish its body wins.
    local ordered = mark
    if ARGV[9] == '1' then ordered = false end
    local refused = fence(ordered, grantor, done, ARGV[2], ARGV[7], ARGV[8], KEYS[2])
    if refused then return redis.error_reply(refused) end
    if ARGV[9] == '1' then redis.call('HSET', KEYS[2], 'done', ARGV[8]) end
  end
  if not mark or ARGV[2] > mark then redis.call('HSET', KEYS[2], 'mark', ARGV[2]) end
  redis.call('HSET', KEYS[2], 'resource', ARGV[3])
  if ARGV[7] ~= '' and not grantor then redis.call('HSET', KEYS[2], 'grantor', ARGV[7]) end
end
redis.call('HSET', KEYS[2], 'state', ARGV[4], 'final', ARGV[5])
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[10]))
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""
)

# The start of the claim and seal scripts (KEYS[1] fence hash, KEYS[2] floor key; ARGV[1] token,
# ARGV[2] resource, ARGV[4] grantor id, ARGV[5] the sealing execution's id, nil for a claim): the
# floor first, then the fence hash's state, owned by the token's resource or by none. A token
# below the floor on a task another execution sealed is told the task is done ("applied"): the
# seal outlived the floor it passed, and whoever seals first wins whatever the tokens. A copy
# that polls for that seal with its old token sees it at once, instead of never.
_RESULT_STATE = """\
local below = floored(redis.call('GET', KEYS[2]), ARGV[1], ARGV[4])
if below then
  if string.sub(below, 1, 13) == 'FENCED floor ' then
    local sealer = redis.call('HGET', KEYS[1], 'done')
    if sealer and sealer ~= ARGV[5] then return redis.error_reply('FENCED applied -') end
  end
  return redis.error_reply(below)
end
local f = redis.call('HMGET', KEYS[1], 'mark', 'resource', 'grantor', 'done')
local mark, owner, grantor, done = f[1], f[2], f[3], f[4]
if owner and owner ~= ARGV[2] then return redis.error_reply('FENCED owner ' .. owner) end
"""

CLAIM_RESULT_SCRIPT = (
    """\
-- Raise a result's mark when a fenced execution starts.
-- KEYS[1] fence hash, KEYS[2] the backend's floor key
-- ARGV[1] token as 20 digits, ARGV[2] resource, ARGV[3] expiry seconds ('0': none),
-- ARGV[4] grantor id of the token or ''
-- returns 1 claimed; refusals unarmed, floor, owner, grantor, corrupt, applied or
--   superseded (the task was sealed: it is done), stale
"""
    + FENCE_FUNCTION
    + _RESULT_STATE
    + """\
local refused = fence(mark, grantor, done, ARGV[1], ARGV[4], '-', KEYS[1])
if refused then return redis.error_reply(refused) end
redis.call('HSET', KEYS[1], 'mark', ARGV[1], 'resource', ARGV[2])
if ARGV[4] ~= '' and not grantor then redis.call('HSET', KEYS[1], 'grantor', ARGV[4]) end
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return 1
"""
)

SEAL_RESULT_SCRIPT = (
    """\
-- Seal a task when its body has returned, before Celery sends its callbacks:
-- the first execution of a task id to seal is the one whose result stands.
-- Token order does not decide here: an older execution that finished its body
-- has applied its effects (a newer one meets them at its first gated write).
-- KEYS[1] fence hash, KEYS[2] the backend's floor key
-- ARGV[1] token as 20 digits, ARGV[2] resource, ARGV[3] expiry seconds ('0': none),
-- ARGV[4] grantor id of the token or '', ARGV[5] execution id
-- returns 1 sealed (or already sealed by this execution); refusals unarmed, floor,
--   owner, grantor, applied (another execution sealed first)
"""
    + FENCE_FUNCTION
    + _RESULT_STATE
    + """\
local refused = fence(false, grantor, done, ARGV[1], ARGV[4], ARGV[5], KEYS[1])
if refused then return redis.error_reply(refused) end
if done == ARGV[5] then return 1 end
redis.call('HSET', KEYS[1], 'done', ARGV[5], 'resource', ARGV[2])
if not mark or ARGV[1] > mark then redis.call('HSET', KEYS[1], 'mark', ARGV[1]) end
if ARGV[4] ~= '' and not grantor then redis.call('HSET', KEYS[1], 'grantor', ARGV[4]) end
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return 1
"""
)


def parse_refusal(message: str) -> tuple[str, str] | None:
    """Split a script's refusal ``"FENCED <kind> <detail>"`` into (kind, detail); ``None`` for any other error."""
    if not message.startswith("FENCED "):
        return None
    _, kind, detail = (message + " ").split(" ", 2)
    return kind, detail.strip()
