-- runifold PostgreSQL schema, version 1 (the baseline).
-- Times are seconds since the epoch on the database clock (clock_timestamp()).
-- Event bodies, inputs and payloads are JSON kept as text: any valid Unicode,
-- NUL included (JSON escapes it as \u0000, which jsonb would refuse), is kept
-- exactly as the client encoded it.
--
-- What each function does to a run is the rule of runifold/stores/_rule.py,
-- stated in SQL; the differential test holds the two to each other.

-- One row per run: its identity, scheduling state and lease.
CREATE TABLE runifold_runs (
    run_id        text PRIMARY KEY,          -- 'run_' + 24 hex digits; sorts by creation time
    checkpoint_id text UNIQUE,               -- the caller's identity of the run; never starts with 'run_'
    name          text    NOT NULL,
    version       integer NOT NULL,
    input_json    text    NOT NULL,          -- canonical JSON (sorted keys): compares re-enqueued tasks
    status        text    NOT NULL,          -- ready, running, waiting, parked, diverged, completed, failed, cancelled
    revision      bigint  NOT NULL,          -- invariant: the seq of the run's last event
    -- invariant: due_at is NULL exactly when the run can never be claimed by time alone
    due_at        double precision,
    lease_owner   text,
    lease_token   bigint  NOT NULL DEFAULT 0, -- the fencing token: only ever grows
    lease_until   double precision,
    claim_nonce   text,                      -- the claim call that took the lease: a retried claim finds it
    recoveries    integer NOT NULL DEFAULT 0, -- claims that took the run over from an expired lease
    wait_signals  text[]  NOT NULL DEFAULT '{}',
    reason        text    NOT NULL DEFAULT '',
    created_at    double precision NOT NULL,
    updated_at    double precision NOT NULL,
    parent_run_id text,                      -- a child workflow's parent: gets its last event when it finishes
    -- a claim passes over a due run while concurrency_limit runs of its concurrency_key are
    -- running under an unexpired lease (both NULL: no limit)
    concurrency_key   text,
    concurrency_limit integer
);
CREATE INDEX runifold_runs_due ON runifold_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX runifold_runs_listing ON runifold_runs (name, version, status);
CREATE INDEX runifold_runs_claims ON runifold_runs (claim_nonce) WHERE status = 'running';
-- finished runs, oldest first, for purge_finished. invariant: no index of this table covers
-- revision or updated_at, which every step commit changes, so a step updates its run's row
-- in place (a HOT update) without touching an index
CREATE INDEX runifold_runs_finished ON runifold_runs (run_id) WHERE status IN ('completed', 'failed', 'cancelled');
-- the runs of a key that may hold its slots, counted by the claim (status is no column a step
-- commit changes, so steps stay HOT updates)
CREATE INDEX runifold_runs_running_key ON runifold_runs (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- A claim walks the due_at index from its oldest entry, and every claim, lease
-- renewal and final commit leaves a dead entry in it until VACUUM removes it.
-- With the defaults, autovacuum waits for dead rows worth 20 % of the table
-- (mostly finished runs) and then skips the indexes, so dead entries pile up in
-- proportion to the finished runs kept. Vacuum it, indexes included, once its
-- dead rows reach 1,000 plus 1 % of it.
ALTER TABLE runifold_runs SET (
    vacuum_index_cleanup = on,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000
);

-- The append-only log: seq 1, 2, 3, ... per run.
CREATE TABLE runifold_events (
    run_id text   NOT NULL,
    seq    bigint NOT NULL,
    type   text   NOT NULL,
    key    text   NOT NULL,
    at     double precision NOT NULL,
    body   text   NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Accepted signals, once per (run, signal id).
CREATE TABLE runifold_signals (
    run_id       text    NOT NULL,
    signal_id    text    NOT NULL,
    name         text    NOT NULL,
    payload      text    NOT NULL,
    payload_hash text    NOT NULL,
    sender       text    NOT NULL,
    key_id       text    NOT NULL,
    reason       text    NOT NULL,
    received_at  double precision NOT NULL,
    arrival      bigserial,                  -- orders signals received at the same time
    consumed     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, signal_id)
);

-- Every signal attempt: accepted, duplicate, rejected (and why). Never a secret.
CREATE TABLE runifold_signal_audit (
    id           bigserial PRIMARY KEY,
    run_id       text,                       -- NULL: the attempt named no known run
    run_ref      text NOT NULL,
    signal_id    text NOT NULL,
    name         text NOT NULL,
    sender       text NOT NULL,
    key_id       text NOT NULL,
    verdict      text NOT NULL,
    payload_hash text NOT NULL,
    reason       text NOT NULL,
    detail       text NOT NULL,
    at           double precision NOT NULL
);
CREATE INDEX runifold_signal_audit_run ON runifold_signal_audit (run_id, id);
CREATE INDEX runifold_signal_audit_ref ON runifold_signal_audit (run_ref);

-- Schedules (runifold/stores/_schedule.py): a workflow started at every tick of a cron
-- expression or an interval, by whichever worker checks first (the tick is in the run's
-- checkpoint id, so each tick starts one run).
CREATE TABLE runifold_schedules (
    name            text PRIMARY KEY,
    workflow        text    NOT NULL,
    version         integer NOT NULL,
    input_json      text    NOT NULL,          -- canonical JSON (sorted keys)
    cron            text,                      -- five or six cron fields; NULL: every_seconds
    every_seconds   integer,                   -- ticks at its multiples since the epoch; NULL: cron
    timezone        text    NOT NULL,          -- the IANA zone cron's fields are read in
    catchup_seconds double precision NOT NULL, -- earlier due ticks at most this old start too
    paused          boolean NOT NULL DEFAULT false,
    last_tick       double precision NOT NULL, -- invariant: only grows, except when replaced; ticks at or before it never start
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL
);

CREATE OR REPLACE FUNCTION runifold_now() RETURNS double precision
LANGUAGE sql VOLATILE AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

-- A run looked up by reference (p_column: 'run_id' or 'checkpoint_id') and locked.
CREATE OR REPLACE FUNCTION runifold_lock_run(p_column text, p_ref text) RETURNS runifold_runs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run runifold_runs%ROWTYPE;
BEGIN
    IF p_column = 'checkpoint_id' THEN
        SELECT * INTO v_run FROM runifold_runs WHERE checkpoint_id = p_ref FOR UPDATE;
    ELSE
        SELECT * INTO v_run FROM runifold_runs WHERE run_id = p_ref FOR UPDATE;
    END IF;
    RETURN v_run;
END
$$;

-- Enqueue any number of tasks in one transaction. The caller chooses the run
-- ids, so a retried call finds the runs its first attempt created (created =
-- true) instead of creating them twice. A checkpoint id that names another task
-- (another name, version, input or parent) raises SQLSTATE RF001 (DETAIL: the existing run id, HINT: the checkpoint id)
-- and nothing is enqueued.
CREATE OR REPLACE FUNCTION runifold_enqueue(
    p_run_ids text[], p_checkpoint_ids text[], p_names text[], p_versions integer[], p_inputs text[],
    p_types text[], p_keys text[], p_bodies text[], p_parents text[], p_concurrency_keys text[],
    p_concurrency_limits integer[]
) RETURNS TABLE (run_id text, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now double precision := runifold_now();
    v_existing runifold_runs%ROWTYPE;
    i integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_run_ids), 0) LOOP
        INSERT INTO runifold_runs (run_id, checkpoint_id, name, version, input_json, status, revision, due_at,
                                   created_at, updated_at, parent_run_id, concurrency_key, concurrency_limit)
        VALUES (p_run_ids[i], p_checkpoint_ids[i], p_names[i], p_versions[i], p_inputs[i], 'ready', 1, v_now,
                v_now, v_now, p_parents[i], p_concurrency_keys[i], p_concurrency_limits[i])
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            INSERT INTO runifold_events (run_id, seq, type, key, at, body)
            VALUES (p_run_ids[i], 1, p_types[i], p_keys[i], v_now, p_bodies[i]);
            run_id := p_run_ids[i];
            created := true;
        ELSE
            IF p_checkpoint_ids[i] IS NOT NULL THEN
                SELECT * INTO v_existing FROM runifold_runs WHERE checkpoint_id = p_checkpoint_ids[i];
            ELSE
                SELECT * INTO v_existing FROM runifold_runs WHERE run_id = p_run_ids[i];
            END IF;
            IF v_existing.name <> p_names[i] OR v_existing.version <> p_versions[i]
               OR v_existing.input_json <> p_inputs[i] OR v_existing.parent_run_id IS DISTINCT FROM p_parents[i] THEN
                RAISE EXCEPTION 'checkpoint id names another task' USING ERRCODE = 'RF001',
                    DETAIL = v_existing.run_id, HINT = coalesce(p_checkpoint_ids[i], '');
            END IF;
            run_id := v_existing.run_id;
            created := v_existing.run_id = p_run_ids[i];  -- our own first attempt
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM pg_notify('runifold_work', '');
END
$$;

-- Rule 6: a run that finished posts its last event (p_body) to its parent's
-- inbox, once, as signal 'child:<run id>', and wakes the parent if it waits for
-- it. Returns whether it woke the parent. No parent (or no body): nothing.
CREATE OR REPLACE FUNCTION runifold_notify_parent(p_run text, p_body text, p_now double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_parent text;
    v_name text := 'child:' || p_run;
BEGIN
    SELECT parent_run_id INTO v_parent FROM runifold_runs WHERE run_id = p_run;
    IF v_parent IS NULL OR p_body IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO runifold_signals (run_id, signal_id, name, payload, payload_hash, sender, key_id, reason, received_at)
    VALUES (v_parent, v_name, v_name, p_body, 'child', 'runifold', '', 'child run finished', p_now)
    ON CONFLICT (run_id, signal_id) DO NOTHING;
    UPDATE runifold_runs SET due_at = p_now WHERE run_id = v_parent AND status = 'waiting' AND v_name = ANY (wait_signals);
    RETURN FOUND;
END
$$;

-- The commit rule (runifold/stores/_rule.py), for any number of commits in one
-- transaction (a process sends the commits of its runs that meet in flight
-- together: one round trip, one WAL flush). Each is judged on its own: fenced,
-- or recognised as a retry of itself; then it appends, consumes, transitions;
-- a signal that beat the wait makes the run due now; idle workers are woken
-- when a due time was set.
--
-- One element per commit i:
--   p_run, p_token, p_expected   the fence: run id, lease token, expected revision
--   p_count                      how many events it appends (they follow those of commit i - 1)
--   p_change                     NULL (it only appends), or a JSON object: "status" (absent: no
--                                transition), "due", "reason", "waits" (signal names), "consumed"
--                                (signal ids)
-- One element per event, in order: p_types, p_keys, p_bodies.
-- One row per commit, item = i - 1; detail says why a refused one was refused.
-- invariant: the client sends a batch in run_id order, so the run rows are locked in that
-- order and concurrent batches never deadlock.
CREATE OR REPLACE FUNCTION runifold_commit(
    p_run text[], p_token bigint[], p_expected bigint[], p_count integer[], p_change text[],
    p_types text[], p_keys text[], p_bodies text[]
) RETURNS TABLE (item integer, ok boolean, new_revision bigint, at double precision, detail text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now double precision := runifold_now();
    v_first integer := 1;  -- commit i's events are p_types[v_first:v_last] (and keys, bodies)
    v_last integer;
    v_run runifold_runs%ROWTYPE;
    v_change jsonb;
    v_status text;
    v_due double precision;
    v_reason text;
    v_waits text[];
    v_notify boolean := false;
    v_key text;
    i integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_run), 0) LOOP
        IF i > 1 THEN
            v_first := v_first + p_count[i - 1];
        END IF;
        v_last := v_first + p_count[i] - 1;
        item := i - 1;
        at := v_now;
        detail := '';
        v_change := p_change[i]::jsonb;
        v_status := NULL;
        IF v_change IS NOT NULL THEN
            v_status := v_change->>'status';
            v_due := (v_change->>'due')::double precision;
            v_reason := v_change->>'reason';
            v_waits := ARRAY(SELECT jsonb_array_elements_text(coalesce(v_change->'waits', '[]')));
        END IF;
        -- the fence: the UPDATE takes the run's row lock, so the checks below see every
        -- delivery committed before it, and later deliveries wait for this transaction
        IF v_status IS NULL THEN
            UPDATE runifold_runs SET revision = p_expected[i] + p_count[i], updated_at = v_now
            WHERE run_id = p_run[i] AND status = 'running' AND lease_token = p_token[i] AND lease_until > v_now
              AND revision = p_expected[i];
        ELSE
            UPDATE runifold_runs SET revision = p_expected[i] + p_count[i], updated_at = v_now, status = v_status,
                due_at = v_due, wait_signals = v_waits, reason = v_reason, lease_owner = NULL, lease_until = NULL
            WHERE run_id = p_run[i] AND status = 'running' AND lease_token = p_token[i] AND lease_until > v_now
              AND revision = p_expected[i]
            RETURNING concurrency_key INTO v_key;
            -- a run with a concurrency key leaves running: a slot of its key is free
            v_notify := v_notify OR v_key IS NOT NULL;
        END IF;
        IF NOT FOUND THEN
            SELECT * INTO v_run FROM runifold_runs WHERE run_id = p_run[i];
            new_revision := coalesce(v_run.revision, 0);
            ok := FOUND AND v_run.lease_token = p_token[i] AND v_run.revision = p_expected[i] + p_count[i] AND (
                (p_count[i] > 0 AND NOT EXISTS (
                    SELECT 1 FROM unnest(p_types[v_first:v_last], p_keys[v_first:v_last], p_bodies[v_first:v_last])
                        WITH ORDINALITY AS x(type, key, body, ord)
                    LEFT JOIN runifold_events e ON e.run_id = p_run[i] AND e.seq = p_expected[i] + x.ord
                    WHERE e.body IS DISTINCT FROM x.body OR e.type IS DISTINCT FROM x.type
                       OR e.key IS DISTINCT FROM x.key))
                OR (p_count[i] = 0 AND v_status IS NOT NULL AND v_run.status = v_status
                    AND v_run.lease_until IS NULL AND v_run.wait_signals = v_waits AND v_run.reason = v_reason));
            IF ok THEN
                -- a retry of this very commit, whose first attempt was written and its answer lost
                at := v_run.updated_at;
            ELSE
                ok := false;
                detail := CASE
                    WHEN v_run.run_id IS NULL THEN 'the run no longer exists'
                    WHEN v_run.status = 'cancelled' THEN 'the run was cancelled'
                    WHEN v_run.status <> 'running' OR v_run.lease_token <> p_token[i] THEN 'fenced off by a newer lease'
                    WHEN v_run.lease_until <= v_now THEN 'the lease expired'
                    ELSE format('revision %s is not the expected %s', v_run.revision, p_expected[i]) END;
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF p_count[i] > 0 THEN
            INSERT INTO runifold_events (run_id, seq, type, key, at, body)
            SELECT p_run[i], p_expected[i] + x.ord, x.type, x.key, v_now, x.body
            FROM unnest(p_types[v_first:v_last], p_keys[v_first:v_last], p_bodies[v_first:v_last])
                WITH ORDINALITY AS x(type, key, body, ord);
        END IF;
        IF v_change IS NOT NULL AND v_change ? 'consumed' THEN
            UPDATE runifold_signals SET consumed = true
            WHERE run_id = p_run[i] AND signal_id IN (SELECT jsonb_array_elements_text(v_change->'consumed'));
        END IF;
        IF v_status IS NOT NULL THEN  -- the rest only for a transition (a plain append skips it)
            IF v_status = 'waiting' AND EXISTS (
                SELECT 1 FROM runifold_signals s WHERE s.run_id = p_run[i] AND NOT s.consumed AND s.name = ANY (v_waits)
            ) THEN
                -- invariant: a signal that beat the wait wakes the run at once
                UPDATE runifold_runs SET due_at = v_now WHERE run_id = p_run[i];
                v_notify := true;
            ELSIF v_due IS NOT NULL THEN
                -- a new due time (also a future one: a timer, a retry) makes idle workers recompute their sleep
                v_notify := true;
            END IF;
            -- (nested: SQL does not promise to skip the call when the first condition is false)
            IF v_status IN ('completed', 'failed', 'cancelled') THEN
                PERFORM pg_notify('runifold_finished', p_run[i]);  -- a client awaiting its result wakes
                IF p_count[i] > 0 AND runifold_notify_parent(p_run[i], p_bodies[v_last], v_now) THEN
                    v_notify := true;
                END IF;
            END IF;
        END IF;
        ok := true;
        new_revision := p_expected[i] + p_count[i];
        RETURN NEXT;
    END LOOP;
    IF v_notify THEN
        PERFORM pg_notify('runifold_work', '');
    END IF;
END
$$;

-- The claim's concurrency rule (runifold/stores/_rule.py: holds_slot, passed_over) for the
-- candidates with a key that the claim statement locked (p_ids), in due order; returns the
-- ones it may claim. Per key, under a transaction-level advisory lock taken in key order (so
-- claims never deadlock on each other), it counts the key's runs running under an unexpired
-- lease. Each statement of this VOLATILE function reads a fresh snapshot, so the count sees
-- every claim committed before the lock was granted: two claims can never both take a key's
-- last slot. A candidate passed over is replaced by the next due run (of any kind), up to
-- p_spare times, so the claim takes the next one as the rule says. Replacements only try
-- their keys' locks (a key another claim is deciding is passed over): a claim waits for a
-- lock only while it holds none of a later key, so claims never wait for each other in a cycle.
-- (ROWS 1: the planner would otherwise expect ten rows, and so price the claim statement too high
-- to ever reuse its generic plan, planning it again at every claim.)
CREATE OR REPLACE FUNCTION runifold_admit(
    p_ids text[], p_now double precision, p_names text[], p_exclude text[], p_spare integer
) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    v_admitted text[] := '{}';
    v_seen text[] := p_ids;
    v_todo text[] := p_ids;
    v_key text;
    v_running integer;
    v_row record;
    v_wanted integer;
    v_first boolean := true;
BEGIN
    LOOP
        v_wanted := 0;
        FOR v_key IN SELECT DISTINCT concurrency_key FROM runifold_runs
                     WHERE run_id = ANY (v_todo) AND concurrency_key IS NOT NULL ORDER BY 1 LOOP
            IF v_first THEN
                PERFORM pg_advisory_xact_lock(1920298602, hashtext(v_key));
            ELSIF NOT pg_try_advisory_xact_lock(1920298602, hashtext(v_key)) THEN
                v_wanted := v_wanted + (SELECT count(*) FROM runifold_runs
                                        WHERE run_id = ANY (v_todo) AND concurrency_key = v_key);
                CONTINUE;
            END IF;
            -- the key's runs holding a slot, and those this claim admitted already (not yet running)
            SELECT count(*) INTO v_running FROM runifold_runs
            WHERE concurrency_key = v_key AND (status = 'running' AND lease_until > p_now OR run_id = ANY (v_admitted));
            FOR v_row IN SELECT run_id, concurrency_limit FROM runifold_runs
                         WHERE run_id = ANY (v_todo) AND concurrency_key = v_key ORDER BY due_at, run_id LOOP
                IF v_running < v_row.concurrency_limit THEN
                    v_admitted := v_admitted || v_row.run_id;
                    v_running := v_running + 1;
                ELSE
                    v_wanted := v_wanted + 1;
                END IF;
            END LOOP;
        END LOOP;
        v_admitted := v_admitted || ARRAY(SELECT run_id FROM runifold_runs
                                          WHERE run_id = ANY (v_todo) AND concurrency_key IS NULL);
        v_first := false;
        v_wanted := least(v_wanted, p_spare);
        EXIT WHEN v_wanted = 0;
        p_spare := p_spare - v_wanted;
        -- the next due runs, as the claim statement picks them
        v_todo := ARRAY(
            SELECT r.run_id FROM runifold_runs r
            WHERE r.due_at IS NOT NULL AND r.due_at <= p_now AND r.name = ANY (p_names)
              AND NOT (r.run_id = ANY (p_exclude)) AND NOT (r.run_id = ANY (v_seen))
              AND (r.concurrency_key IS NULL OR (
                  SELECT count(*) FROM runifold_runs o WHERE o.concurrency_key = r.concurrency_key
                    AND o.status = 'running' AND o.lease_until > p_now) < r.concurrency_limit)
            ORDER BY r.due_at LIMIT v_wanted FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(v_todo) = 0;
        v_seen := v_seen || v_todo;
    END LOOP;
    RETURN QUERY SELECT unnest(v_admitted);
END
$$;

-- Deliver a signal to exactly one run id: accepted, duplicate (same name,
-- payload hash, sender and reason), rejected:conflict (the id names another signal) or
-- rejected:inbox_full; every attempt is audited. No row: the run does not exist.
CREATE OR REPLACE FUNCTION runifold_deliver(
    p_run text, p_ref text, p_signal text, p_name text, p_payload text, p_hash text, p_sender text, p_key text,
    p_reason text, p_max integer
) RETURNS TABLE (verdict text, received_at double precision, run_status text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now double precision := runifold_now();
    v_run runifold_runs%ROWTYPE;
    v_sig runifold_signals%ROWTYPE;
    v_verdict text;
    v_detail text := '';
BEGIN
    -- invariant: the run row is locked, so a concurrent commit sees this signal or we see its wait
    SELECT * INTO v_run FROM runifold_runs WHERE run_id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_sig FROM runifold_signals WHERE run_id = p_run AND signal_id = p_signal;
    IF FOUND THEN
        v_verdict := CASE WHEN v_sig.name = p_name AND v_sig.payload_hash = p_hash AND v_sig.sender = p_sender
                               AND v_sig.reason = p_reason THEN 'duplicate'
                          ELSE 'rejected:conflict' END;
    ELSIF (SELECT count(*) FROM runifold_signals WHERE run_id = p_run AND NOT consumed) >= p_max THEN
        v_verdict := 'rejected:inbox_full';
    ELSE
        v_verdict := 'accepted';
        IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
            v_detail := 'run finished; kept unconsumed';
        END IF;
        INSERT INTO runifold_signals (run_id, signal_id, name, payload, payload_hash, sender, key_id, reason, received_at)
        VALUES (p_run, p_signal, p_name, p_payload, p_hash, p_sender, p_key, p_reason, v_now);
        IF v_run.status = 'waiting' AND p_name = ANY (v_run.wait_signals) THEN
            UPDATE runifold_runs SET due_at = v_now WHERE run_id = p_run;
            PERFORM pg_notify('runifold_work', '');
        END IF;
    END IF;
    INSERT INTO runifold_signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason,
                                       detail, at)
    VALUES (p_run, p_ref, p_signal, p_name, p_sender, p_key, v_verdict, p_hash, p_reason, v_detail, v_now);
    RETURN QUERY SELECT v_verdict, coalesce(v_sig.received_at, v_now), v_run.status;
END
$$;

-- Keep a rejected attempt, and only the newest p_cap rejected attempts of its run
-- (of attempts against no known run, when p_run is NULL).
CREATE OR REPLACE FUNCTION runifold_record_rejected(
    p_run text, p_ref text, p_signal text, p_name text, p_sender text, p_key text, p_verdict text, p_hash text,
    p_reason text, p_detail text, p_at double precision, p_cap integer
) RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO runifold_signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash,
                                       reason, detail, at)
    VALUES (p_run, p_ref, p_signal, p_name, p_sender, p_key, p_verdict, p_hash, p_reason, p_detail, p_at);
    DELETE FROM runifold_signal_audit WHERE run_id IS NOT DISTINCT FROM p_run AND verdict LIKE 'rejected%' AND id <= (
        SELECT id FROM runifold_signal_audit WHERE run_id IS NOT DISTINCT FROM p_run AND verdict LIKE 'rejected%'
        ORDER BY id DESC OFFSET p_cap LIMIT 1);
$$;

-- An operator's append: fences off any lease holder. Returns the run's status
-- before (new_revision NULL: its status is not in p_allowed, nothing written);
-- no row: no such run.
CREATE OR REPLACE FUNCTION runifold_intervene(
    p_column text, p_ref text, p_allowed text[], p_types text[], p_keys text[], p_bodies text[], p_status text,
    p_reason text
) RETURNS TABLE (run_id text, status text, new_revision bigint, at double precision)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now double precision := runifold_now();
    v_run runifold_runs%ROWTYPE := runifold_lock_run(p_column, p_ref);
    v_n bigint := coalesce(cardinality(p_types), 0);
BEGIN
    IF v_run.run_id IS NULL THEN
        RETURN;
    END IF;
    IF NOT v_run.status = ANY (p_allowed) THEN
        RETURN QUERY SELECT v_run.run_id, v_run.status, NULL::bigint, v_now;
        RETURN;
    END IF;
    INSERT INTO runifold_events (run_id, seq, type, key, at, body)
    SELECT v_run.run_id, v_run.revision + x.ord, x.type, x.key, v_now, x.body
    FROM unnest(p_types, p_keys, p_bodies) WITH ORDINALITY AS x(type, key, body, ord);
    UPDATE runifold_runs SET revision = v_run.revision + v_n, updated_at = v_now, status = p_status, reason = p_reason,
        due_at = CASE WHEN p_status IN ('completed', 'failed', 'cancelled') THEN NULL ELSE v_now END,
        lease_token = lease_token + 1, lease_owner = NULL, lease_until = NULL
    WHERE run_id = v_run.run_id;
    IF p_status IN ('completed', 'failed', 'cancelled') THEN
        PERFORM pg_notify('runifold_finished', v_run.run_id);
        IF v_n > 0 THEN
            PERFORM runifold_notify_parent(v_run.run_id, p_bodies[v_n], v_now);
        END IF;
    END IF;
    PERFORM pg_notify('runifold_work', '');
    RETURN QUERY SELECT v_run.run_id, v_run.status, v_run.revision + v_n, v_now;
END
$$;

-- Make a ready, waiting or diverged run due now; returns its status before
-- (woken false: not one of those, nothing written); no row: no such run.
CREATE OR REPLACE FUNCTION runifold_wake(p_column text, p_ref text) RETURNS TABLE (run_id text, status text, woken boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_run runifold_runs%ROWTYPE := runifold_lock_run(p_column, p_ref);
BEGIN
    IF v_run.run_id IS NULL THEN
        RETURN;
    END IF;
    IF v_run.status IN ('ready', 'waiting', 'diverged') THEN
        UPDATE runifold_runs SET due_at = runifold_now() WHERE run_id = v_run.run_id;
        PERFORM pg_notify('runifold_work', '');
        RETURN QUERY SELECT v_run.run_id, v_run.status, true;
    ELSE
        RETURN QUERY SELECT v_run.run_id, v_run.status, false;
    END IF;
END
$$;

-- Delete a finished run with its events, signals and audit; returns its status
-- (nothing deleted unless finished); no row: no such run.
CREATE OR REPLACE FUNCTION runifold_purge(p_column text, p_ref text) RETURNS TABLE (run_id text, status text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_run runifold_runs%ROWTYPE := runifold_lock_run(p_column, p_ref);
BEGIN
    IF v_run.run_id IS NULL THEN
        RETURN;
    END IF;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        PERFORM runifold_delete_runs(ARRAY[v_run.run_id]);
    END IF;
    RETURN QUERY SELECT v_run.run_id, v_run.status;
END
$$;

CREATE OR REPLACE FUNCTION runifold_delete_runs(p_runs text[]) RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM runifold_events WHERE run_id = ANY (p_runs);
    DELETE FROM runifold_signals WHERE run_id = ANY (p_runs);
    DELETE FROM runifold_signal_audit WHERE run_id = ANY (p_runs);
    DELETE FROM runifold_runs WHERE run_id = ANY (p_runs);
$$;

-- Delete up to p_limit finished runs last updated before p_before; returns how many.
CREATE OR REPLACE FUNCTION runifold_purge_finished(p_before double precision, p_limit integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_runs text[];
BEGIN
    SELECT array_agg(run_id) INTO v_runs FROM (
        SELECT run_id FROM runifold_runs WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < p_before
        ORDER BY run_id LIMIT p_limit FOR UPDATE SKIP LOCKED) doomed;
    IF v_runs IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM runifold_delete_runs(v_runs);
    RETURN cardinality(v_runs);
END
$$;
