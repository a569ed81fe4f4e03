"""The Lua scripts of the Redis store: each write that must be atomic is one script.

A script runs alone on the server (nothing interleaves), so each one checks and writes
in one step: the write id, the lease fence, the run checks, the write itself, the thread
index and the change feed.

Rules every script keeps:

* Message, extra, journal, job, lease, command and pending-request JSON is built in
  Python and stored as the exact text given; Lua never re-encodes it. Redis's ``cjson``
  turns ``[]`` into ``{}`` and rounds numbers to 14 digits, so it only *reads* leases
  (``holder_id``, ``expires_at``) and run records, whose values Lua writes itself as strings.
* The write id: ``KEYS`` name ``tui:w:{write_id}``; a script that finds it returns
  ``{'dup', stored}`` and writes nothing, so a call retried after its reply was lost
  (:func:`core.checkpoint.reconnect.with_reconnect`) is not made twice. A write stores
  its reply there for ``WRITE_MEMORY`` seconds.
* The fence (:func:`core.checkpoint.base.check_lease_holder`, decided inside the script):
  with a holder id given, the thread's lease must name that holder and not have expired
  at ``now`` (the caller's unix seconds), else the script returns ``{'lease', raw}`` and
  writes nothing; Python then raises the contract's sentence from that same record.
* Every write adds an entry to the change feed (``XADD tui:changes MAXLEN ~ 1000``).

Replies are arrays whose first element says what happened (``ok``, ``dup``, ``lease``,
``conflict``, ...).
"""

from __future__ import annotations

from core.checkpoint.redis_keys import CHANGES_KEEP

_PROLOGUE = f"""
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
local function changed(changes, thread_id)
  redis.call('XADD', changes, 'MAXLEN', '~', '{CHANGES_KEEP}', '*', 't', thread_id)
end
"""

APPEND = (
    _PROLOGUE
    + """
-- KEYS: msgs, runs, leases, threads, changes, write, first
-- ARGV: thread_id, holder, now, ttl, has_prompt, prompt, n_runs, run ids..., messages...
local tid, holder, now, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local done = redis.call('GET', KEYS[6])
if done then return {'dup', done} end
local lost = fence(KEYS[3], tid, holder, now)
if lost then return lost end
local nruns = tonumber(ARGV[7])
for i = 8, 7 + nruns do
  local raw = redis.call('HGET', KEYS[2], ARGV[i])
  if raw and cjson.decode(raw)['completed_at'] then return {'completed', ARGV[i]} end
end
local first = 8 + nruns
local size = 0
while first <= #ARGV do
  local last = math.min(first + 999, #ARGV)
  size = redis.call('RPUSH', KEYS[1], unpack(ARGV, first, last))
  first = last + 1
end
if ARGV[5] == '1' then redis.call('HSETNX', KEYS[7], tid, ARGV[6]) end
redis.call('ZADD', KEYS[4], now, tid)
changed(KEYS[5], tid)
redis.call('SET', KEYS[6], tostring(size), 'EX', ttl)
return {'ok', tostring(size)}
"""
)

CLAIM = (
    _PROLOGUE
    + """
-- KEYS: runs, leases, threads, changes, write    ARGV: thread_id, holder, now, ttl, run_id
local tid, holder, now, ttl, run = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local done = redis.call('GET', KEYS[5])
if done then return {'dup', done} end
local lost = fence(KEYS[2], tid, holder, now)
if lost then return lost end
local raw = redis.call('HGET', KEYS[1], run)
if raw then
  if cjson.decode(raw)['completed_at'] then return {'completed'} end
  return {'claimed'}
end
-- Runs are never deleted, so the count orders claims.
local n = redis.call('HLEN', KEYS[1]) + 1
redis.call('HSET', KEYS[1], run, cjson.encode({claimed_at = now, n = tostring(n)}))
redis.call('ZADD', KEYS[3], now, tid)
changed(KEYS[4], tid)
redis.call('SET', KEYS[5], 'ok', 'EX', ttl)
return {'ok'}
"""
)

COMPLETE = (
    _PROLOGUE
    + """
-- KEYS: runs, leases, changes, write    ARGV: thread_id, holder, now, ttl, run_id
local tid, holder, now, ttl, run = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local done = redis.call('GET', KEYS[4])
if done then return {'dup', done} end
local lost = fence(KEYS[2], tid, holder, now)
if lost then return lost end
local raw = redis.call('HGET', KEYS[1], run)
if not raw then return {'unclaimed'} end
local record = cjson.decode(raw)
if record['completed_at'] then return {'ok'} end
local top = 0
for _, other in ipairs(redis.call('HVALS', KEYS[1])) do
  local seq = tonumber(cjson.decode(other)['completion_seq'] or '0')
  if seq > top then top = seq end
end
record['completed_at'] = now
record['completion_seq'] = tostring(top + 1)
redis.call('HSET', KEYS[1], run, cjson.encode(record))
changed(KEYS[3], tid)
redis.call('SET', KEYS[4], 'ok', 'EX', ttl)
return {'ok'}
"""
)

CAS = (
    _PROLOGUE
    + """
-- One hash field, compare-and-set: the caller read the field, decided in Python, and
-- writes only if nobody changed it meanwhile (else 'conflict': it reads and decides again).
-- KEYS: hash, leases, changes, write, threads
-- ARGV: field, expect ('0' absent, '1' equal to ARGV[3]), expected, op ('set' / 'del' /
--       'keep': only the fence, nothing written), new, thread_id, holder, now, ttl,
--       touch ('1' bumps the index)
local field, expect, expected, op, new = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tid, holder, now, ttl, touch = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local done = redis.call('GET', KEYS[4])
if done then return {'dup', done} end
local lost = fence(KEYS[2], tid, holder, now)
if lost then return lost end
local current = redis.call('HGET', KEYS[1], field)
if expect == '0' and current then return {'conflict'} end
if expect == '1' and current ~= expected then return {'conflict'} end
if op == 'keep' then return {'ok'} end
if op == 'set' then
  redis.call('HSET', KEYS[1], field, new)
else
  redis.call('HDEL', KEYS[1], field)
end
if touch == '1' then redis.call('ZADD', KEYS[5], now, tid) end
changed(KEYS[3], tid)
redis.call('SET', KEYS[4], op == 'set' and new or '', 'EX', ttl)
return {'ok'}
"""
)

SEND_COMMAND = (
    _PROLOGUE
    + """
-- KEYS: commands, command_seq, thread_commands, changes, write    ARGV: thread_id, record, ttl
local done = redis.call('GET', KEYS[5])
if done then return {'dup', done} end
local seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], seq, ARGV[2])
redis.call('ZADD', KEYS[3], seq, seq)
changed(KEYS[4], ARGV[1])
redis.call('SET', KEYS[5], tostring(seq), 'EX', ARGV[3])
return {'ok', tostring(seq)}
"""
)

LIVE_APPEND = (
    _PROLOGUE
    + """
-- Each event's stream id is 0-{seq}, seq from the store's counter: integer, increasing,
-- never reused after a prune. KEYS: live, live_seq, changes, write
-- ARGV: thread_id, has_run, run_id, at, keep, ttl, events...
local done = redis.call('GET', KEYS[4])
if done then return {'dup', done} end
for i = 7, #ARGV do
  local seq = redis.call('INCR', KEYS[2])
  if ARGV[2] == '1' then
    redis.call('XADD', KEYS[1], '0-' .. seq, 'd', ARGV[i], 'at', ARGV[4], 'r', ARGV[3])
  else
    redis.call('XADD', KEYS[1], '0-' .. seq, 'd', ARGV[i], 'at', ARGV[4])
  end
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[5])
changed(KEYS[3], ARGV[1])
redis.call('SET', KEYS[4], 'ok', 'EX', ARGV[6])
return {'ok'}
"""
)

PRUNE_LIVE = (
    _PROLOGUE
    + """
-- KEYS: live, changes    ARGV: thread_id (deleting twice deletes nothing: no write id needed)
if redis.call('DEL', KEYS[1]) == 1 then changed(KEYS[2], ARGV[1]) end
return {'ok'}
"""
)

LIST_CHUNK = (
    "#!lua flags=no-writes\n"
    + """
-- What a listing needs of each of n threads, in one round trip and one consistent view.
-- KEYS: msgs and runs of each thread (2n), then leases, pending, first
-- ARGV: window, with_head ('1': also the first window entries), thread ids...
-- Reply per thread: {count, last window entries, runs (flat HGETALL), first prompt,
--                    lease, pending request, first window entries or {}}
local window, with_head = tonumber(ARGV[1]), ARGV[2] == '1'
local n = #ARGV - 2
local leases, pending, first = KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3]
local out = {}
for i = 1, n do
  local tid, msgs = ARGV[i + 2], KEYS[2 * i - 1]
  local head = {}
  if with_head then head = redis.call('LRANGE', msgs, 0, window - 1) end
  out[i] = {
    redis.call('LLEN', msgs), redis.call('LRANGE', msgs, -window, -1), redis.call('HGETALL', KEYS[2 * i]),
    redis.call('HGET', first, tid), redis.call('HGET', leases, tid), redis.call('HGET', pending, tid), head,
  }
end
return out
"""
)
