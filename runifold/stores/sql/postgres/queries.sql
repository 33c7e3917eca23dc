-- Every statement the PostgreSQL store sends. Operations that change a run
-- call the functions of schema.sql, one call each; the rest are below.

-- name: migration_lock
SELECT pg_advisory_xact_lock(1920298601)

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS runifold_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())

-- name: has_schema_table
SELECT to_regclass('runifold_schema')

-- name: schema_version
SELECT coalesce(max(version), 0) FROM runifold_schema

-- name: record_version
INSERT INTO runifold_schema (version) VALUES ($1)

-- name: now
SELECT runifold_now()

-- name: enqueue
SELECT run_id, created FROM runifold_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)

-- name: claim
-- leases up to $6 runs (the claims of one process that met in flight) and returns each one's
-- history and inbox (read as they were: the UPDATE touches neither)
-- invariant: "now" is computed once, so it bounds the due_at index scan (runifold_now() is
-- volatile: as a plain filter the scan would walk every future timer)
WITH n AS (
    SELECT runifold_now() AS now
), again AS (
    -- a retry of this claim call (its answer lost) gets the run its first attempt leased
    SELECT run_id FROM runifold_runs WHERE claim_nonce = $5 AND status = 'running'
), pick AS (
    -- a run with a concurrency key whose key looks full (in this statement's snapshot) is passed
    -- over here already; runifold_admit decides the keyed ones that remain, under their key's lock
    SELECT run_id, concurrency_key FROM runifold_runs r
    WHERE NOT EXISTS (SELECT 1 FROM again)
      AND due_at IS NOT NULL AND due_at <= (SELECT now FROM n)
      AND name = ANY ($2::text[]) AND NOT (run_id = ANY ($3::text[]))
      AND (concurrency_key IS NULL OR (
          SELECT count(*) FROM runifold_runs o WHERE o.concurrency_key = r.concurrency_key AND o.status = 'running'
            AND o.lease_until > (SELECT now FROM n)) < concurrency_limit)
    ORDER BY due_at LIMIT $6 FOR UPDATE SKIP LOCKED
), admitted AS (
    -- only called when a candidate has a key: runs without one never wait for a key's lock
    SELECT a.run_id FROM runifold_admit(ARRAY(SELECT run_id FROM pick WHERE concurrency_key IS NOT NULL),
                                        (SELECT now FROM n), $2::text[], $3::text[], 16) AS a(run_id)
    WHERE EXISTS (SELECT 1 FROM pick WHERE concurrency_key IS NOT NULL)
), claimed AS (
    UPDATE runifold_runs r SET status = 'running', lease_token = r.lease_token + 1, lease_owner = $1,
        lease_until = n.now + $4, due_at = n.now + $4, updated_at = n.now, claim_nonce = $5,
        recoveries = r.recoveries + (r.status = 'running')::integer
    FROM pick, n WHERE r.run_id = pick.run_id AND pick.concurrency_key IS NULL
    RETURNING r.run_id, r.checkpoint_id, r.name, r.version, r.lease_token, r.lease_until, r.recoveries, n.now
), claimed_keyed AS (
    UPDATE runifold_runs r SET status = 'running', lease_token = r.lease_token + 1, lease_owner = $1,
        lease_until = n.now + $4, due_at = n.now + $4, updated_at = n.now, claim_nonce = $5,
        recoveries = r.recoveries + (r.status = 'running')::integer
    FROM admitted, n WHERE r.run_id = admitted.run_id
    RETURNING r.run_id, r.checkpoint_id, r.name, r.version, r.lease_token, r.lease_until, r.recoveries, n.now
), got AS (
    SELECT * FROM claimed
    UNION ALL
    SELECT * FROM claimed_keyed
    UNION ALL
    SELECT r.run_id, r.checkpoint_id, r.name, r.version, r.lease_token, r.lease_until, r.recoveries,
           r.lease_until - $4
    FROM runifold_runs r JOIN again USING (run_id)
)
SELECT got.*, h.seqs, h.ats, h.types, h.keys, h.bodies,
       i.ids, i.names, i.payloads, i.senders, i.reasons, i.received
FROM got
CROSS JOIN LATERAL (
    SELECT array_agg(e.seq ORDER BY e.seq) AS seqs, array_agg(e.at ORDER BY e.seq) AS ats,
           array_agg(e.type ORDER BY e.seq) AS types, array_agg(e.key ORDER BY e.seq) AS keys,
           array_agg(e.body ORDER BY e.seq) AS bodies
    FROM runifold_events e WHERE e.run_id = got.run_id
) h
CROSS JOIN LATERAL (
    SELECT array_agg(s.signal_id ORDER BY s.received_at, s.arrival) AS ids,
           array_agg(s.name ORDER BY s.received_at, s.arrival) AS names,
           array_agg(s.payload ORDER BY s.received_at, s.arrival) AS payloads,
           array_agg(s.sender ORDER BY s.received_at, s.arrival) AS senders,
           array_agg(s.reason ORDER BY s.received_at, s.arrival) AS reasons,
           array_agg(s.received_at ORDER BY s.received_at, s.arrival) AS received
    FROM runifold_signals s WHERE s.run_id = got.run_id AND NOT s.consumed
) i

-- name: renew
-- the new lease end, or NULL with the run's status (NULL too: the run is gone) to say why not
WITH n AS (SELECT runifold_now() AS now), u AS (
    UPDATE runifold_runs SET lease_until = n.now + $3, due_at = n.now + $3 FROM n
    WHERE run_id = $1 AND status = 'running' AND lease_token = $2 AND lease_until > n.now
    RETURNING lease_until)
SELECT (SELECT lease_until FROM u), (SELECT status FROM runifold_runs WHERE run_id = $1)

-- name: commit
SELECT item, ok, new_revision, at, detail FROM runifold_commit($1, $2, $3, $4, $5, $6, $7, $8)

-- name: release
WITH r AS (
    UPDATE runifold_runs SET status = 'ready', due_at = runifold_now(), lease_owner = NULL, lease_until = NULL
    WHERE run_id = $1 AND status = 'running' AND lease_token = $2 RETURNING 1
) SELECT pg_notify('runifold_work', '') FROM r

-- name: intervene
SELECT run_id, status, revision, new_revision, at FROM runifold_intervene($1, $2, $3, $4, $5, $6, $7, $8, $9)

-- name: wake
SELECT run_id, status, woken FROM runifold_wake($1, $2)

-- name: purge
SELECT run_id, status FROM runifold_purge($1, $2)

-- name: purge_finished
SELECT runifold_purge_finished($1, $2)

-- name: deliver
SELECT verdict, received_at, run_status FROM runifold_deliver($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)

-- name: record_rejected
SELECT runifold_record_rejected($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)

-- name: run
SELECT run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, lease_until,
       created_at, updated_at, reason, recoveries, concurrency_key, concurrency_limit
FROM runifold_runs WHERE {ref} = $1

-- name: inbox
SELECT signal_id, name, payload, sender, reason, received_at FROM runifold_signals
WHERE run_id = $1 AND NOT consumed ORDER BY received_at, arrival

-- name: history
SELECT e.seq, e.at, e.type, e.key, e.body
FROM runifold_runs r JOIN runifold_events e ON e.run_id = r.run_id
WHERE r.{ref} = $1 ORDER BY e.seq

-- name: list_runs
SELECT run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, lease_until,
       created_at, updated_at, reason, recoveries, concurrency_key, concurrency_limit
FROM runifold_runs
WHERE ($1::text[] IS NULL OR status = ANY ($1)) AND ($2::text IS NULL OR name = $2) AND ($3::integer IS NULL OR version = $3)
  AND ($4::text IS NULL OR run_id < $4)
ORDER BY run_id DESC LIMIT $5

-- name: count_runs
SELECT count(*) FROM runifold_runs
WHERE ($1::text[] IS NULL OR status = ANY ($1)) AND ($2::text IS NULL OR name = $2) AND ($3::integer IS NULL OR version = $3)
  AND ($4::text IS NULL OR concurrency_key = $4)
  AND (NOT $5::boolean OR (status = 'running' AND lease_until > runifold_now()))

-- name: audit
SELECT run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at
FROM runifold_signal_audit
WHERE run_id = (SELECT run_id FROM runifold_runs WHERE {ref} = $1) OR run_ref = $1
ORDER BY id

-- name: next_due
SELECT min(due_at) - runifold_now() FROM runifold_runs WHERE due_at > (SELECT runifold_now())

-- name: schedules
SELECT name, workflow, version, input_json, cron, every_seconds, timezone, catchup_seconds, paused, last_tick,
       created_at, updated_at
FROM runifold_schedules ORDER BY name

-- name: add_schedule
-- the rule of _rule.schedule_added: a new or changed schedule's ticks start after now and a
-- replaced one keeps its paused state; an identical one is not written (the old row is returned)
WITH n AS (
    SELECT runifold_now() AS now
), put AS (
    INSERT INTO runifold_schedules AS s (name, workflow, version, input_json, cron, every_seconds, timezone,
                                         catchup_seconds, paused, last_tick, created_at, updated_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, false, n.now, n.now, n.now FROM n
    ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, version = excluded.version,
        input_json = excluded.input_json, cron = excluded.cron, every_seconds = excluded.every_seconds,
        timezone = excluded.timezone, catchup_seconds = excluded.catchup_seconds, last_tick = excluded.last_tick,
        updated_at = excluded.updated_at
    WHERE (s.workflow, s.version, s.input_json, s.cron, s.every_seconds, s.timezone, s.catchup_seconds)
        IS DISTINCT FROM (excluded.workflow, excluded.version, excluded.input_json, excluded.cron,
                          excluded.every_seconds, excluded.timezone, excluded.catchup_seconds)
    RETURNING s.name, s.workflow, s.version, s.input_json, s.cron, s.every_seconds, s.timezone, s.catchup_seconds,
              s.paused, s.last_tick, s.created_at, s.updated_at
)
SELECT * FROM put
UNION ALL
SELECT name, workflow, version, input_json, cron, every_seconds, timezone, catchup_seconds, paused, last_tick,
       created_at, updated_at
FROM runifold_schedules WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM put)

-- name: delete_schedule
DELETE FROM runifold_schedules WHERE name = $1 RETURNING name

-- name: pause_schedule
-- resuming (the rule of _rule.resumed_last_tick): the ticks due while it was paused never start
WITH n AS (SELECT runifold_now() AS now)
UPDATE runifold_schedules s SET paused = $2, updated_at = n.now,
    last_tick = CASE WHEN s.paused AND NOT $2 THEN greatest(s.last_tick, n.now) ELSE s.last_tick END
FROM n WHERE s.name = $1
RETURNING s.name, s.workflow, s.version, s.input_json, s.cron, s.every_seconds, s.timezone, s.catchup_seconds,
          s.paused, s.last_tick, s.created_at, s.updated_at

-- name: advance_schedules
UPDATE runifold_schedules s SET last_tick = t.tick
FROM unnest($1::text[], $2::double precision[]) AS t(name, tick)
WHERE s.name = t.name AND s.last_tick < t.tick
