-- runifold PostgreSQL schema, version 4: many commits in one round trip.
-- A worker process groups the commits of its concurrent runs into one call:
-- one statement, one transaction, one WAL flush. Each commit is fenced on its
-- own: a refused commit changes nothing and does not stop the others.
-- p_batch is a JSON array of commits:
--   {"i": 1, "run_id": "...", "token": 3, "expected": 7,
--    "events": [["step_completed", "a#1", {...body...}], ...],
--    "transition": true, "status": "waiting", "due": null, "signals": ["go"],
--    "reason": "...", "consumed": ["signal-id", ...]}
-- and the result has one row per commit, matched by "i".
-- runifold_commit (versions 1-3) stays for workers that still run an older
-- runifold during a rolling deploy.
CREATE FUNCTION runifold_commit_batch(p_batch jsonb)
RETURNS TABLE (item integer, ok boolean, new_revision bigint, at double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := runifold_now();
    v_notify boolean := false;
    c record;
BEGIN
    -- invariant: run rows are updated, so locked, in run_id order: concurrent batches never deadlock
    FOR c IN SELECT * FROM jsonb_to_recordset(p_batch) AS x(
        i integer, run_id text, token bigint, expected bigint, events jsonb,
        transition boolean, status text, due double precision, signals text[], reason text, consumed text[]
    ) ORDER BY x.run_id LOOP
        item := c.i;
        at := v_now;
        new_revision := c.expected + jsonb_array_length(c.events);
        IF c.transition THEN
            UPDATE runifold_runs SET revision = new_revision, updated_at = v_now, status = c.status,
                due_at = c.due, wait_signals = c.signals, reason = c.reason, lease_owner = NULL, lease_until = NULL
            WHERE run_id = c.run_id AND status = 'running' AND lease_token = c.token
              AND lease_until > v_now AND revision = c.expected;
        ELSE
            UPDATE runifold_runs SET revision = new_revision, updated_at = v_now
            WHERE run_id = c.run_id AND status = 'running' AND lease_token = c.token
              AND lease_until > v_now AND revision = c.expected;
        END IF;
        ok := FOUND;
        IF NOT ok THEN
            new_revision := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO runifold_events (run_id, seq, type, key, at, body)
        SELECT c.run_id, c.expected + e.ord, e.ev->>0, e.ev->>1, v_now, e.ev->2
        FROM jsonb_array_elements(c.events) WITH ORDINALITY AS e(ev, ord);
        IF cardinality(c.consumed) > 0 THEN
            UPDATE runifold_signals SET consumed = true WHERE run_id = c.run_id AND signal_id = ANY (c.consumed);
        END IF;
        IF c.transition AND c.status = 'waiting' AND EXISTS (
            SELECT 1 FROM runifold_signals s
            WHERE s.run_id = c.run_id AND NOT s.consumed AND s.name = ANY (c.signals)
        ) THEN
            -- invariant: a signal that beat the wait wakes the run at once
            UPDATE runifold_runs SET due_at = v_now WHERE run_id = c.run_id;
            v_notify := true;
        ELSIF c.transition AND c.due IS NOT NULL THEN
            -- a new due time (also a future one: a timer, a retry) makes idle workers recompute their sleep
            v_notify := true;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_notify THEN
        PERFORM pg_notify('runifold_work', '');
    END IF;
END
$$;
