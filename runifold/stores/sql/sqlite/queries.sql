-- Every statement the SQLite store sends. What each operation does to a run
-- is decided in Python by runifold/stores/_rule.py; these read and write it (a commit's fence is also
-- stated in its UPDATE: see append).

-- name: has_schema_table
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runifold_schema'

-- name: schema_version
SELECT max(version) FROM runifold_schema

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS runifold_schema (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)

-- name: probe_write
-- writes nothing, yet fails (SQLITE_READONLY) where the file cannot be written: SQLite opens such a file
-- read-only without a word, and an empty transaction or a CREATE TABLE IF NOT EXISTS succeeds on it
DELETE FROM runifold_schema WHERE 0

-- name: record_version
INSERT INTO runifold_schema (version, applied_at) VALUES (?, ?)

-- name: run
SELECT run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, lease_until,
       created_at, updated_at, reason, recoveries, wait_signals, concurrency_key, concurrency_limit
FROM runs WHERE {ref} = ?

-- name: task_of
SELECT run_id, name, version, input_json, parent_run_id FROM runs WHERE {ref} = ?

-- name: insert_run
INSERT INTO runs (run_id, checkpoint_id, name, version, input_json, status, revision, due_at, created_at, updated_at,
                  parent_run_id, concurrency_key, concurrency_limit)
VALUES (?, ?, ?, ?, ?, 'ready', 1, ?, ?, ?, ?, ?, ?)

-- name: insert_event
INSERT INTO events (run_id, seq, type, key, at, body) VALUES (?, ?, ?, ?, ?, ?)

-- name: claim
-- '+name': never let the planner trade the small due-time index for the name index.
-- A run with a concurrency key is passed over while its key's running runs (under an
-- unexpired lease) reach its limit (_rule.holds_slot, _rule.passed_over); the write lock
-- makes the count exact across processes.
UPDATE runs SET status = 'running', lease_token = lease_token + 1, lease_owner = ?1, lease_until = ?2, due_at = ?2,
    updated_at = ?3, recoveries = recoveries + (status = 'running')
WHERE run_id = (
    SELECT run_id FROM runs r WHERE due_at IS NOT NULL AND due_at <= ?3
    AND +name IN (SELECT value FROM json_each(?4))
    AND run_id NOT IN (SELECT value FROM json_each(?5))
    AND (concurrency_key IS NULL OR (
        SELECT count(*) FROM runs o WHERE o.concurrency_key = r.concurrency_key AND o.status = 'running'
        AND o.lease_until > ?3) < concurrency_limit)
    ORDER BY due_at LIMIT 1
)
RETURNING run_id, checkpoint_id, name, version, lease_token, recoveries

-- name: history
SELECT seq, at, type, key, body FROM events WHERE run_id = ? ORDER BY seq

-- name: events_after
SELECT type, key, body FROM events WHERE run_id = ? AND seq > ? ORDER BY seq

-- name: inbox
SELECT signal_id, name, payload, sender, reason, received_at FROM signals
WHERE run_id = ? AND consumed = 0 ORDER BY received_at, arrival

-- name: unconsumed_names
SELECT DISTINCT name FROM signals WHERE run_id = ? AND consumed = 0

-- name: renew
UPDATE runs SET lease_until = ?, due_at = ? WHERE run_id = ?

-- A commit's run update carries its fence (_rule.fence, stated in the WHERE clause as PostgreSQL's
-- runifold_commit states it): it changes no row unless the lease still holds the run at the expected
-- revision; the store then reads the row to say why (or to recognise a retry of the same commit).

-- name: append
UPDATE runs SET revision = ?, updated_at = ?
WHERE run_id = ? AND status = 'running' AND lease_token = ? AND lease_until > ? AND revision = ?

-- name: transition
UPDATE runs SET revision = ?, updated_at = ?, status = ?, due_at = ?, wait_signals = ?, reason = ?,
    lease_owner = NULL, lease_until = NULL
WHERE run_id = ? AND status = 'running' AND lease_token = ? AND lease_until > ? AND revision = ?

-- name: consume
UPDATE signals SET consumed = 1 WHERE run_id = ? AND signal_id = ?

-- name: release
UPDATE runs SET status = 'ready', due_at = ?, lease_owner = NULL, lease_until = NULL
WHERE run_id = ? AND status = 'running' AND lease_token = ?

-- name: intervene
UPDATE runs SET revision = ?, updated_at = ?, status = ?, due_at = ?, reason = ?, lease_token = lease_token + 1,
    lease_owner = NULL, lease_until = NULL
WHERE run_id = ?

-- name: wake
UPDATE runs SET due_at = ? WHERE run_id = ?

-- name: finished_before
SELECT run_id FROM runs WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ? ORDER BY run_id LIMIT ?

-- name: delete_events
DELETE FROM events WHERE run_id = ?

-- name: delete_signals
DELETE FROM signals WHERE run_id = ?

-- name: delete_audit
DELETE FROM signal_audit WHERE run_id = ?

-- name: delete_run
DELETE FROM runs WHERE run_id = ?

-- name: signal_of
SELECT name, payload_hash, received_at, sender, reason FROM signals WHERE run_id = ? AND signal_id = ?

-- name: unconsumed_count
SELECT count(*) FROM signals WHERE run_id = ? AND name = ? AND consumed = 0

-- name: insert_signal
INSERT INTO signals (run_id, signal_id, name, payload, payload_hash, sender, key_id, reason, received_at, arrival)
SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(MAX(arrival), 0) + 1 FROM signals WHERE run_id = ?

-- name: insert_audit
INSERT INTO signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: trim_refused
-- keeps the newest ? attempts against one run that were not accepted (duplicates and rejections; run_id IS NULL:
-- attempts against no known run)
DELETE FROM signal_audit WHERE run_id IS ? AND verdict <> 'accepted' AND id <= (
    SELECT id FROM signal_audit WHERE run_id IS ? AND verdict <> 'accepted' ORDER BY id DESC LIMIT 1 OFFSET ?
)

-- name: audit
SELECT run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at
FROM signal_audit WHERE run_id = ? OR run_ref = ? ORDER BY id

-- name: next_due
SELECT min(due_at) FROM runs WHERE due_at > ?

-- name: list_runs
SELECT run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, lease_until,
       created_at, updated_at, reason, recoveries, wait_signals, concurrency_key, concurrency_limit
FROM runs
WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1))) AND (?2 IS NULL OR name = ?2)
  AND (?3 IS NULL OR version = ?3) AND (?4 IS NULL OR run_id < ?4)
ORDER BY run_id DESC LIMIT ?5

-- name: count_runs
SELECT count(*) FROM runs WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1))) AND (?2 IS NULL OR name = ?2) AND (?3 IS NULL OR version = ?3)
  AND (?4 IS NULL OR concurrency_key = ?4) AND (?5 IS NULL OR (status = 'running' AND lease_until > ?5))

-- name: parent_of
-- the run's parent, if it still exists (a parent purged before its child finished gets nothing)
SELECT p.run_id FROM runs r JOIN runs p ON p.run_id = r.parent_run_id WHERE r.run_id = ?

-- name: insert_child_signal
-- a finished child's last event, in its parent's inbox (once: the signal id is the child's)
INSERT OR IGNORE INTO signals (run_id, signal_id, name, payload, payload_hash, sender, key_id, reason, received_at,
                               arrival)
SELECT ?1, ?2, ?2, ?3, 'child', ?4, '', 'child run finished', ?5, COALESCE(MAX(arrival), 0) + 1
FROM signals WHERE run_id = ?1

-- name: wake_waiter
UPDATE runs SET due_at = ? WHERE run_id = ? AND status = 'waiting'
  AND EXISTS (SELECT 1 FROM json_each(wait_signals) WHERE value = ?)

-- name: schedule
SELECT name, workflow, version, input_json, cron, every_seconds, timezone, catchup_seconds, paused, last_tick,
       created_at, updated_at
FROM schedules WHERE name = ?

-- name: schedules
SELECT name, workflow, version, input_json, cron, every_seconds, timezone, catchup_seconds, paused, last_tick,
       created_at, updated_at
FROM schedules ORDER BY name

-- name: put_schedule
-- a new or changed schedule: its ticks start after now; a replaced one keeps its paused state
INSERT INTO schedules (name, workflow, version, input_json, cron, every_seconds, timezone, catchup_seconds, paused,
                       last_tick, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9, ?9, ?9)
ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, version = excluded.version,
    input_json = excluded.input_json, cron = excluded.cron, every_seconds = excluded.every_seconds,
    timezone = excluded.timezone, catchup_seconds = excluded.catchup_seconds, last_tick = excluded.last_tick,
    updated_at = excluded.updated_at

-- name: delete_schedule
DELETE FROM schedules WHERE name = ?

-- name: pause_schedule
UPDATE schedules SET paused = ?, last_tick = ?, updated_at = ? WHERE name = ?

-- name: advance_schedule
UPDATE schedules SET last_tick = ?1 WHERE name = ?2 AND last_tick < ?1
