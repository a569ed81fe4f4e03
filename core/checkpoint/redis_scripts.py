"""The Lua scripts of the Redis store: each write that must be atomic is one script.

A script runs alone on the server (nothing interleaves), so each one checks and writes
in one step: the write id, the owner, the lease fence, the run checks, the write itself,
the thread index and the change feed.

Rules every script keeps:

* Every check comes before the first write. Redis has no rollback: a script that stopped
  half way (an error after a write) would keep what it wrote, so a script that refuses
  returns before it has written anything, and one that gets past its checks cannot fail.
* The owner (:mod:`core.owners`). A script about one thread has ``KEYS[1..11]`` = the
  keys that can hold anything of the thread (:meth:`~core.checkpoint.redis_keys.Keys.scope`:
  its record, message list, extra, runs, the pending-request hash, its journal, jobs,
  steps, live events and command index, and the unowned scope's lease hash) and
  ``ARGV[1..2]`` = the thread id and the store's owner (``''`` for the unowned scope).
  ``scope()`` reads them: ``ok`` (the owner's thread, or for the unowned scope a thread that
  records no owner), ``new`` (nothing is stored for it) or ``unavailable`` (another
  owner's; for a named owner also a thread without owner, one of before v3 too, even when
  all it left is a key of ours such as a finished job). A write returns ``{'unavailable'}``
  for the last, and for ``new`` creates the thread's record (``adopt``) after its checks; a
  read of another owner's thread returns what a missing thread gives. Threads of CubePi's
  example layout and of ours before v3 have no record: they are the unowned scope's.
* Message, extra, journal, job, lease, command and pending-request JSON is built in
  Python and stored as the exact text given; Lua never re-encodes it. Redis's ``cjson``
  turns ``[]`` into ``{}`` and rounds numbers to 14 digits, so it only *reads* leases
  (``holder_id``, ``expires_at``) and run records, whose values Lua writes itself as strings.
* The write id: a ``KEYS`` entry names ``tui:w:{write_id}``; a script that finds it returns
  ``{'dup', stored}`` and writes nothing, so a call retried after its reply was lost
  (:func:`core.checkpoint.reconnect.with_reconnect`) is not made twice. A write stores
  its reply there for ``WRITE_MEMORY`` seconds.
* The fence (:func:`core.checkpoint.base.check_lease_holder`, decided inside the script):
  with a holder id given, the thread's lease must name that holder and not have expired
  at ``now`` (the caller's unix seconds), else the script returns ``{'lease', raw}`` and
  writes nothing; Python then raises the contract's sentence from that same record. The
  owner is checked before the fence, as the memory store does.
* Every write adds an entry to the change feed (``XADD tui:changes MAXLEN ~ 1000``).

Replies are arrays whose first element says what happened (``ok``, ``dup``, ``lease``,
``unavailable``, ``conflict``, ...). Read-only scripts carry ``flags=no-writes``, so they
also run on a replica and on a browse-only store.
"""

from __future__ import annotations

from core.checkpoint.redis_keys import CHANGES_KEEP

_SCOPE = """
local function scope()
  local o = redis.call('HGET', KEYS[1], 'owner')
  if o then
    if o == ARGV[2] then return 'ok' end
    return 'unavailable'
  end
  if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]) == 0
      and redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 and redis.call('HEXISTS', KEYS[11], ARGV[1]) == 0 then
    return 'new'
  end
  if ARGV[2] == '' then return 'ok' end
  return 'unavailable'
end
"""

_PROLOGUE = (
    _SCOPE
    + f"""
local function adopt(state, now)
  if state ~= 'new' then return end
  if ARGV[2] == '' then
    redis.call('HSET', KEYS[1], 'created_at', now)
  else
    redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'created_at', now)
  end
end
local function fence(leases, thread_id, holder, now)
  if holder == '' then return nil end
  local raw = redis.call('HGET', leases, thread_id)
  if not raw then return {{'lease', false}} end
  local lease = cjson.decode(raw)
  if lease['holder_id'] ~= holder or tonumber(lease['expires_at']) <= tonumber(now) then
    return {{'lease', raw}}
  end
  return nil
end
-- The first checks of a write of one thread, in this order: its write id (a write already
-- made answers 'dup' and the reply it stored) and the owner ('unavailable'). Returns the
-- scope() state, or nil and the reply to return.
local function begin(write)
  local done = redis.call('GET', write)
  if done then return nil, {{'dup', done}} end
  local state = scope()
  if state == 'unavailable' then return nil, {{'unavailable'}} end
  return state
end
local function changed(changes, thread_id)
  redis.call('XADD', changes, 'MAXLEN', '~', '{CHANGES_KEEP}', '*', 't', thread_id)
end
"""
)

_READ = "#!lua flags=no-writes\n"

_STEP_FIELDS = """
local function step_fields(steps, key)
  return redis.call('HMGET', steps, 'i:' .. key, 'w:' .. key, 'n:' .. key, 't:' .. key,
    'r:' .. key, 'd:' .. key, 'c:' .. key, 'u:' .. key)
end
"""

APPEND = (
    _PROLOGUE
    + """
-- KEYS: scope (11), leases, index, changes, write, first
-- ARGV: thread_id, owner, holder, now, ttl, has_prompt, prompt, n_runs, run ids..., messages...
local tid, holder, now, ttl = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local state, refused = begin(KEYS[15])
if refused then return refused end
local lost = fence(KEYS[12], tid, holder, now)
if lost then return lost end
local nruns = tonumber(ARGV[8])
for i = 9, 8 + nruns do
  local raw = redis.call('HGET', KEYS[4], ARGV[i])
  if raw and cjson.decode(raw)['completed_at'] then return {'completed', ARGV[i]} end
end
adopt(state, now)
local first = 9 + nruns
local size = 0
while first <= #ARGV do
  local last = math.min(first + 999, #ARGV)
  size = redis.call('RPUSH', KEYS[2], unpack(ARGV, first, last))
  first = last + 1
end
if ARGV[6] == '1' then redis.call('HSETNX', KEYS[16], tid, ARGV[7]) end
redis.call('ZADD', KEYS[13], now, tid)
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], tostring(size), 'EX', ttl)
return {'ok', tostring(size)}
"""
)

CLAIM = (
    _PROLOGUE
    + """
-- KEYS: scope (11), leases, index, changes, write
-- ARGV: thread_id, owner, holder, now, ttl, run_id
local tid, holder, now, ttl, run = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local state, refused = begin(KEYS[15])
if refused then return refused end
local lost = fence(KEYS[12], tid, holder, now)
if lost then return lost end
local raw = redis.call('HGET', KEYS[4], run)
if raw then
  if cjson.decode(raw)['completed_at'] then return {'completed'} end
  return {'claimed'}
end
adopt(state, now)
-- Runs are never deleted (but with their thread), so the count orders claims.
local n = redis.call('HLEN', KEYS[4]) + 1
redis.call('HSET', KEYS[4], run, cjson.encode({claimed_at = now, n = tostring(n)}))
redis.call('ZADD', KEYS[13], now, tid)
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], 'ok', 'EX', ttl)
return {'ok'}
"""
)

COMPLETE = (
    _PROLOGUE
    + """
-- KEYS: scope (11), leases, changes, write
-- ARGV: thread_id, owner, holder, now, ttl, run_id
local tid, holder, now, ttl, run = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local _, refused = begin(KEYS[14])
if refused then return refused end
local lost = fence(KEYS[12], tid, holder, now)
if lost then return lost end
local raw = redis.call('HGET', KEYS[4], run)
if not raw then return {'unclaimed'} end
local record = cjson.decode(raw)
if record['completed_at'] then return {'ok'} end
local top = 0
for _, other in ipairs(redis.call('HVALS', KEYS[4])) do
  local seq = tonumber(cjson.decode(other)['completion_seq'] or '0')
  if seq > top then top = seq end
end
record['completed_at'] = now
record['completion_seq'] = tostring(top + 1)
redis.call('HSET', KEYS[4], run, cjson.encode(record))
changed(KEYS[13], tid)
redis.call('SET', KEYS[14], 'ok', 'EX', ttl)
return {'ok'}
"""
)

SAVE_EXTRA = (
    _PROLOGUE
    + """
-- The merge was made in Python on the extra as read: written only if the extra is still
-- that text ('retry' otherwise: Python reads and merges again) and, with an expected
-- revision, if the extra's revision is still that ('conflict', the revision, otherwise).
-- KEYS: scope (11), index, changes, write
-- ARGV: thread_id, owner, now, ttl, had ('0' no extra, '1' the text in ARGV[6]), old text,
--       new text, expected revision ('' for none)
local tid, now, ttl = ARGV[1], ARGV[3], ARGV[4]
local state, refused = begin(KEYS[14])
if refused then return refused end
local revision = tonumber(redis.call('HGET', KEYS[1], 'xrev') or '0')
if ARGV[8] ~= '' and revision ~= tonumber(ARGV[8]) then return {'conflict', tostring(revision)} end
local current = redis.call('GET', KEYS[3])
if (ARGV[5] == '0' and current) or (ARGV[5] == '1' and current ~= ARGV[6]) then return {'retry'} end
adopt(state, now)
redis.call('SET', KEYS[3], ARGV[7])
revision = redis.call('HINCRBY', KEYS[1], 'xrev', 1)
redis.call('ZADD', KEYS[12], now, tid)
changed(KEYS[13], tid)
redis.call('SET', KEYS[14], tostring(revision), 'EX', ttl)
return {'ok', tostring(revision)}
"""
)

FINGERPRINTS = (
    _PROLOGUE
    + """
-- Compare-and-set of the fingerprints on the record's revision; the override (JSON text)
-- is appended to the overrides array as text, so Lua re-encodes nothing.
-- KEYS: scope (11), changes, write
-- ARGV: thread_id, owner, now, ttl, expected revision, fingerprints JSON, override JSON ('' none)
local tid, now, ttl = ARGV[1], ARGV[3], ARGV[4]
local done = redis.call('GET', KEYS[13])
if done then return {'dup', redis.call('HGETALL', KEYS[1])} end
local state = scope()
if state == 'unavailable' then return {'unavailable'} end
local revision = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if revision ~= tonumber(ARGV[5]) then return {'conflict', tostring(revision)} end
adopt(state, now)
redis.call('HSET', KEYS[1], 'fp', ARGV[6], 'rev', tostring(revision + 1))
if ARGV[7] ~= '' then
  local old = redis.call('HGET', KEYS[1], 'ovr')
  if old and old ~= '[]' then
    redis.call('HSET', KEYS[1], 'ovr', string.sub(old, 1, -2) .. ',' .. ARGV[7] .. ']')
  else
    redis.call('HSET', KEYS[1], 'ovr', '[' .. ARGV[7] .. ']')
  end
end
changed(KEYS[12], tid)
redis.call('SET', KEYS[13], 'ok', 'EX', ttl)
return {'ok', redis.call('HGETALL', KEYS[1])}
"""
)

STEP_BEGIN = (
    _PROLOGUE
    + _STEP_FIELDS
    + """
-- KEYS: scope (11), steps, leases, changes, write
-- ARGV: thread_id, owner, holder, now, ttl, key, input fingerprint, workflow,
--       has_total, total, has_call, tool_call_id
local tid, holder, now, ttl, key = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local done = redis.call('GET', KEYS[15])
if done then return {'ok', step_fields(KEYS[12], key)} end
local state = scope()
if state == 'unavailable' then return {'unavailable'} end
local lost = fence(KEYS[13], tid, holder, now)
if lost then return lost end
local workflow = redis.call('HGET', KEYS[12], 'w:' .. key)
if workflow then
  if workflow ~= ARGV[8] or redis.call('HGET', KEYS[12], 'i:' .. key) ~= ARGV[7] then return {'input'} end
  return {'ok', step_fields(KEYS[12], key)}
end
adopt(state, now)
redis.call('HSET', KEYS[12], 'i:' .. key, ARGV[7], 'w:' .. key, ARGV[8], 'n:' .. key, '0', 'r:' .. key, '0',
  'u:' .. key, now)
if ARGV[9] == '1' then redis.call('HSET', KEYS[12], 't:' .. key, ARGV[10]) end
if ARGV[11] == '1' then redis.call('HSET', KEYS[12], 'c:' .. key, ARGV[12]) end
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], 'ok', 'EX', ttl)
return {'ok', step_fields(KEYS[12], key)}
"""
)

STEP_COMMIT = (
    _PROLOGUE
    + _STEP_FIELDS
    + """
-- The lesson's one UPDATE ... SET next_step, data, revision = revision + 1
-- WHERE key = ? AND revision = ? AND workflow = ?, whose row count must be 1: each
-- condition is checked first, and only then are the three columns written.
-- KEYS: scope (11), steps, leases, changes, write
-- ARGV: thread_id, owner, holder, now, ttl, key, expected revision, workflow, next_step, data
local tid, holder, now, ttl, key = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local done = redis.call('GET', KEYS[15])
if done then return {'ok', step_fields(KEYS[12], key)} end
if scope() == 'unavailable' then return {'unavailable'} end
local lost = fence(KEYS[13], tid, holder, now)
if lost then return lost end
local workflow = redis.call('HGET', KEYS[12], 'w:' .. key)
if not workflow then return {'missing'} end
if workflow ~= ARGV[8] then return {'input'} end
local revision = tonumber(redis.call('HGET', KEYS[12], 'r:' .. key))
if revision ~= tonumber(ARGV[7]) then return {'conflict', tostring(revision)} end
redis.call('HSET', KEYS[12], 'n:' .. key, ARGV[9], 'd:' .. key, ARGV[10], 'u:' .. key, now,
  'r:' .. key, tostring(revision + 1))
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], 'ok', 'EX', ttl)
return {'ok', step_fields(KEYS[12], key)}
"""
)

DELETE = (
    _PROLOGUE
    + """
-- Everything stored for one thread, unless a live lease holds it.
-- KEYS: scope (11), commands, leases, index, first, changes, write, answers
-- ARGV: thread_id, owner, now, ttl
local tid, now = ARGV[1], ARGV[3]
if redis.call('GET', KEYS[17]) then return {'ok'} end
if scope() ~= 'ok' then return {'unavailable'} end
local lease = redis.call('HGET', KEYS[13], tid)
if lease and tonumber(cjson.decode(lease)['expires_at']) > tonumber(now) then return {'leased', lease} end
local seqs = redis.call('ZRANGE', KEYS[10], 0, -1)
for first = 1, #seqs, 1000 do
  redis.call('HDEL', KEYS[12], unpack(seqs, first, math.min(first + 999, #seqs)))
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[18])
redis.call('HDEL', KEYS[5], tid)
redis.call('HDEL', KEYS[13], tid)
redis.call('HDEL', KEYS[15], tid)
redis.call('ZREM', KEYS[14], tid)
changed(KEYS[16], tid)
redis.call('SET', KEYS[17], 'ok', 'EX', ARGV[4])
return {'ok'}
"""
)

CAS = (
    _PROLOGUE
    + """
-- One hash field, compare-and-set: the caller read the field, decided in Python, and
-- writes only if nobody changed it meanwhile (else 'conflict': it reads and decides again).
-- KEYS: scope (11), hash, leases, changes, write, index
-- ARGV: thread_id, owner, field, expect ('0' absent, '1' equal to ARGV[5]), expected,
--       op ('set' / 'del' / 'keep': only the checks, nothing written), new, holder, now,
--       ttl, touch ('1' bumps the index)
local tid, field, expect, expected, op, new = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local holder, now, ttl, touch = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local state, refused = begin(KEYS[15])
if refused then return refused end
local lost = fence(KEYS[13], tid, holder, now)
if lost then return lost end
local current = redis.call('HGET', KEYS[12], field)
if expect == '0' and current then return {'conflict'} end
if expect == '1' and current ~= expected then return {'conflict'} end
if op == 'keep' then return {'ok'} end
if op == 'set' then
  adopt(state, now)
  redis.call('HSET', KEYS[12], field, new)
else
  redis.call('HDEL', KEYS[12], field)
end
if touch == '1' then redis.call('ZADD', KEYS[16], now, tid) end
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], op == 'set' and new or '', 'EX', ttl)
return {'ok'}
"""
)

PENDING_OF = """
-- The run key ('' for none) and question id of a tui:pending field (JSON built in Python
-- whose request_json is cubeloop's text), or nil for no field or one that is no question;
-- only reads.
local function pending_of(raw)
  if not raw then return nil end
  local ok, record = pcall(cjson.decode, raw)
  if not ok or type(record) ~= 'table' or type(record['request_json']) ~= 'string' then return nil end
  local run = record['run_id']
  if type(run) ~= 'string' then run = '' end
  local ok2, request = pcall(cjson.decode, record['request_json'])
  if not ok2 or type(request) ~= 'table' or type(request['question_id']) ~= 'string' then return nil end
  return run, request['question_id']
end
-- 1 when the pending request in the tui:pending field `raw` has its answer in the thread's
-- tui:answers hash `answers`, else 0. The field is redis_keys.answer_field's: the run key's
-- length as Python counts it (characters: UTF-8 continuation bytes left out), ':', the run
-- key, the question id.
local function answer_stored(raw, answers)
  local run, qid = pending_of(raw)
  if not run then return 0 end
  local _, chars = string.gsub(run, '[^\\128-\\191]', '')
  return redis.call('HEXISTS', answers, chars .. ':' .. run .. qid)
end
"""
"""Lua helpers of every script that reads a pending request: its run and question, and
whether its answer is stored (the listing, the versions, the loads, answering, settling)."""

_PENDING_IS = (
    PENDING_OF
    + """
-- Whether the thread's pending request is question `qid` of run `run` ('' for none).
local function pending_is(pending, thread_id, run, qid)
  local asked, question = pending_of(redis.call('HGET', pending, thread_id))
  return asked == run and question == qid
end
"""
)

ANSWER = (
    _PROLOGUE
    + _PENDING_IS
    + """
-- Record one human answer: never replaced (HSETNX), only while the request is pending.
-- KEYS: scope (11), answers, changes, write
-- ARGV: thread_id, owner, run key, question id, field, answer JSON, ttl
local tid, run, qid, field = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local state, refused = begin(KEYS[14])
if refused then return refused end
if state ~= 'ok' then return {'unavailable'} end
if not pending_is(KEYS[5], tid, run, qid) then return {'stale'} end
if redis.call('HSETNX', KEYS[12], field, ARGV[6]) == 0 then return {'answered', redis.call('HGET', KEYS[12], field)} end
changed(KEYS[13], tid)
redis.call('SET', KEYS[14], 'ok', 'EX', ARGV[7])
return {'ok'}
"""
)

SETTLE = (
    _PROLOGUE
    + _PENDING_IS
    + """
-- Compare-and-clear the pending request, then delete the run's answers (their fields
-- start with the run's prefix). Replies {'ok', '1'} when cleared, {'ok', '0'} when the
-- request was another one (nothing written).
-- KEYS: scope (11), answers, leases, changes, write
-- ARGV: thread_id, owner, run key, question id, field prefix, holder, now, ttl
local tid, run, qid, prefix, holder, now = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local state, refused = begin(KEYS[15])
if refused then return refused end
if state ~= 'ok' then return {'unavailable'} end
local lost = fence(KEYS[13], tid, holder, now)
if lost then return lost end
if not pending_is(KEYS[5], tid, run, qid) then return {'ok', '0'} end
redis.call('HDEL', KEYS[5], tid)
for _, field in ipairs(redis.call('HKEYS', KEYS[12])) do
  if string.sub(field, 1, #prefix) == prefix then redis.call('HDEL', KEYS[12], field) end
end
changed(KEYS[14], tid)
redis.call('SET', KEYS[15], '1', 'EX', ARGV[8])
return {'ok', '1'}
"""
)

SEND_COMMAND = (
    _PROLOGUE
    + """
-- KEYS: scope (11), commands, command_seq, thread_commands, changes, write
-- ARGV: thread_id, owner, now, record, ttl
local state, refused = begin(KEYS[16])
if refused then return refused end
adopt(state, ARGV[3])
local seq = redis.call('INCR', KEYS[13])
redis.call('HSET', KEYS[12], seq, ARGV[4])
redis.call('ZADD', KEYS[14], seq, seq)
changed(KEYS[15], ARGV[1])
redis.call('SET', KEYS[16], tostring(seq), 'EX', ARGV[5])
return {'ok', tostring(seq)}
"""
)

LIVE_APPEND = (
    _PROLOGUE
    + """
-- Each event's stream id is 0-{seq}, seq from the store's counter: integer, increasing,
-- never reused after a prune. KEYS: scope (11), live, live_seq, changes, write
-- ARGV: thread_id, owner, has_run, run_id, at, keep, ttl, events...
local state, refused = begin(KEYS[15])
if refused then return refused end
adopt(state, ARGV[5])
for i = 8, #ARGV do
  local seq = redis.call('INCR', KEYS[13])
  if ARGV[3] == '1' then
    redis.call('XADD', KEYS[12], '0-' .. seq, 'd', ARGV[i], 'at', ARGV[5], 'r', ARGV[4])
  else
    redis.call('XADD', KEYS[12], '0-' .. seq, 'd', ARGV[i], 'at', ARGV[5])
  end
end
redis.call('XTRIM', KEYS[12], 'MAXLEN', ARGV[6])
changed(KEYS[14], ARGV[1])
redis.call('SET', KEYS[15], 'ok', 'EX', ARGV[7])
return {'ok'}
"""
)

PRUNE_LIVE = (
    _PROLOGUE
    + """
-- KEYS: scope (11), live, changes    ARGV: thread_id, owner
-- (deleting twice deletes nothing: no write id needed)
if scope() == 'unavailable' then return {'unavailable'} end
if redis.call('DEL', KEYS[12]) == 1 then changed(KEYS[13], ARGV[1]) end
return {'ok'}
"""
)

FIELD = (
    _READ
    + _SCOPE
    + """
-- What a compare-and-set decides on: the thread's scope and one hash field.
-- KEYS: scope (11), hash    ARGV: thread_id, owner, field
local state = scope()
if state == 'unavailable' then return {'unavailable'} end
return {state, redis.call('HGET', KEYS[12], ARGV[3])}
"""
)

EXTRA_READ = (
    _READ
    + _SCOPE
    + """
-- What save_extra merges into: the scope, the extra's revision and its text.
-- KEYS: scope (11)    ARGV: thread_id, owner
local state = scope()
if state == 'unavailable' then return {'unavailable'} end
return {state, redis.call('HGET', KEYS[1], 'xrev') or '0', redis.call('GET', KEYS[3])}
"""
)

LOAD = (
    _READ
    + _SCOPE
    + PENDING_OF
    + """
-- One thread in one consistent view, 0 when it is not this owner's (as for a missing one).
-- KEYS: scope (11; the journal is KEYS[6]), answers   ARGV: thread_id, owner, first list index
if scope() ~= 'ok' then return 0 end
local pending = redis.call('HGET', KEYS[5], ARGV[1])
return {
  redis.call('LRANGE', KEYS[2], tonumber(ARGV[3]), -1), redis.call('GET', KEYS[3]), redis.call('HGETALL', KEYS[4]),
  pending, redis.call('HGETALL', KEYS[6]), redis.call('HGETALL', KEYS[1]), answer_stored(pending, KEYS[12]),
}
"""
)

META = (
    _READ
    + _SCOPE
    + """
-- The thread's record (flat HGETALL, maybe empty for a thread that keeps none), 0 when
-- the thread is missing or not this owner's.   KEYS: scope (11)
-- ARGV: thread_id, owner
if scope() ~= 'ok' then return 0 end
return redis.call('HGETALL', KEYS[1])
"""
)

READ = (
    _READ
    + """
-- One read of a key about a thread, made only when the thread's record names this owner
-- (no owner recorded: the unowned scope); otherwise what a missing key gives (nil).
-- KEYS: rec, key    ARGV: owner, command (HGET, HMGET, HGETALL or XRANGE), its arguments...
local allowed = {HGET = true, HMGET = true, HGETALL = true, XRANGE = true}
if not allowed[ARGV[2]] then return redis.error_reply('not a read this script makes: ' .. ARGV[2]) end
if (redis.call('HGET', KEYS[1], 'owner') or '') ~= ARGV[1] then return false end
return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
"""
)

COMMANDS_READ = (
    _READ
    + """
-- A thread's commands after a seq: {seqs, records}, or {} when not this owner's thread.
-- KEYS: rec, thread_commands, commands    ARGV: owner, after
if (redis.call('HGET', KEYS[1], 'owner') or '') ~= ARGV[1] then return {} end
local seqs = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf')
if #seqs == 0 then return {} end
local raws = {}
for first = 1, #seqs, 1000 do
  local got = redis.call('HMGET', KEYS[3], unpack(seqs, first, math.min(first + 999, #seqs)))
  for _, raw in ipairs(got) do raws[#raws + 1] = raw end
end
return {seqs, raws}
"""
)

_ROLE = """
-- Whether a stored entry's role is the given one: only an entry naming it somewhere can
-- be, and cjson confirms it is the role (an entry that is not JSON has none).
local function has_role(raw, role)
  if not string.find(raw, role, 1, true) then return false end
  local ok, value = pcall(cjson.decode, raw)
  return ok and type(value) == 'table' and value['role'] == role
end
"""

LIST_CHUNK = (
    _READ
    + _ROLE
    + PENDING_OF
    + """
-- What a listing needs of each of n threads, in one round trip and one consistent view.
-- KEYS: msgs, runs, record and answers of each thread (4n), then leases, pending, first
-- ARGV: window, with_head ('1': also the first user entry), owner, thread ids...
-- Reply per thread: {count, tail start (list index from 0), the entries from there on,
--                    runs (flat HGETALL), first prompt, lease, pending request,
--                    {index, entry} of the first user entry or {}, whether the pending
--                    request's answer is stored (1/0)}, or 0 when the thread's record
--                    does not name this owner (it is left out).
-- The tail starts at the last assistant entry, found walking back window entries at a
-- time (only those rows are read); with none it is every entry.
local window, with_head, owner = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3]
local n = #ARGV - 3
local leases, pending, first = KEYS[4 * n + 1], KEYS[4 * n + 2], KEYS[4 * n + 3]
local out = {}
for i = 1, n do
  local tid, msgs = ARGV[i + 3], KEYS[4 * i - 3]
  if (redis.call('HGET', KEYS[4 * i - 1], 'owner') or '') ~= owner then
    out[i] = 0
  else
    local count = redis.call('LLEN', msgs)
    local start, hi, tail = 0, count - 1, nil
    while hi >= 0 do
      local lo = math.max(0, hi - window + 1)
      local rows = redis.call('LRANGE', msgs, lo, hi)
      for j = #rows, 1, -1 do
        if has_role(rows[j], 'assistant') then
          start = lo + j - 1
          if hi == count - 1 then tail = {unpack(rows, j)} end  -- found in the last window: no second read
          hi = -1
          break
        end
      end
      hi = math.min(hi, lo - 1)
    end
    local head = {}
    if with_head then
      local lo = 0
      while lo < count and #head == 0 do
        local rows = redis.call('LRANGE', msgs, lo, lo + window - 1)
        for j = 1, #rows do
          if has_role(rows[j], 'user') then head = {lo + j - 1, rows[j]}; break end
        end
        lo = lo + window
      end
    end
    local asked = redis.call('HGET', pending, tid)
    out[i] = {
      count, start, tail or redis.call('LRANGE', msgs, start, -1), redis.call('HGETALL', KEYS[4 * i - 2]),
      redis.call('HGET', first, tid), redis.call('HGET', leases, tid), asked, head, answer_stored(asked, KEYS[4 * i]),
    }
  end
end
return out
"""
)

VERSIONS_CHUNK = (
    _READ
    + PENDING_OF
    + """
-- What each of n threads' writes leave behind, for its version: no entry is read.
-- KEYS: msgs, runs, record, extra and answers of each thread (5n), then leases, pending, index
-- ARGV: owner, thread ids...
-- Reply: one string, the threads' versions in order, separated by spaces: each the SHA-1
-- of its index score (last activity), list length, runs, the total length of the run
-- records (a completion lengthens its record), lease, pending request, record revisions,
-- whether it has an extra and whether the pending request's answer is stored, each
-- length-prefixed; '-' when the thread's record does not name this owner. One string: a
-- reply of many small values costs the client more to read than the script costs the server.
local owner = ARGV[1]
local n = #ARGV - 1
local leases, pending, index = KEYS[5 * n + 1], KEYS[5 * n + 2], KEYS[5 * n + 3]
local out = {}
for i = 1, n do
  local tid, record = ARGV[i + 1], KEYS[5 * i - 2]
  if (redis.call('HGET', record, 'owner') or '') ~= owner then
    out[i] = '-'
  else
    local size = 0
    for _, run in ipairs(redis.call('HVALS', KEYS[5 * i - 3])) do size = size + #run end
    local revisions = redis.call('HMGET', record, 'xrev', 'rev')
    local asked = redis.call('HGET', pending, tid)
    local parts = {
      redis.call('ZSCORE', index, tid) or '', redis.call('LLEN', KEYS[5 * i - 4]), redis.call('HLEN', KEYS[5 * i - 3]),
      size, redis.call('HGET', leases, tid) or '', asked or '', revisions[1] or '',
      revisions[2] or '', redis.call('EXISTS', KEYS[5 * i - 1]), answer_stored(asked, KEYS[5 * i]),
    }
    for j = 1, #parts do
      local text = tostring(parts[j])
      parts[j] = #text .. ':' .. text
    end
    out[i] = redis.sha1hex(table.concat(parts))
  end
end
return table.concat(out, ' ')
"""
)

NAMES = (
    "APPEND",
    "CLAIM",
    "COMPLETE",
    "SAVE_EXTRA",
    "FINGERPRINTS",
    "STEP_BEGIN",
    "STEP_COMMIT",
    "DELETE",
    "CAS",
    "ANSWER",
    "SETTLE",
    "SEND_COMMAND",
    "LIVE_APPEND",
    "PRUNE_LIVE",
    "FIELD",
    "EXTRA_READ",
    "LOAD",
    "META",
    "READ",
    "COMMANDS_READ",
    "LIST_CHUNK",
    "VERSIONS_CHUNK",
)
"""Every script above, by name (:class:`~core.checkpoint.redis_store.RedisStore` registers them)."""
