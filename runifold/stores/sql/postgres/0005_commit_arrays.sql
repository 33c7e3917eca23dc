-- runifold PostgreSQL schema, version 5: the commit batch as typed arrays.
-- Same semantics as runifold_commit_batch (version 4): many commits in one call,
-- one transaction, one WAL flush, each commit fenced on its own. The arguments are
-- typed arrays instead of one jsonb document, and the events of all commits go in
-- with one INSERT: the server neither takes a document apart nor plans an
-- expression per commit (the function's own time per batch of six: 0.33 ms
-- against 0.57 ms for runifold_commit_batch, measured with pg_stat_statements).
--
-- One element per commit (index i, 1-based):
--   p_run, p_token, p_expected   the fence: run id, lease token, expected revision
--   p_count                      how many events the commit appends
--   p_status                     NULL: append only; otherwise the run's new status, with
--   p_due, p_reason              its due time and reason,
--   p_waits                      NULL or a JSON array of the signal names it waits for
--   p_consumed                   NULL or a JSON array of the signal ids it consumed
-- One element per event, in order:
--   p_item                       the index of its commit
--   p_seq, p_types, p_keys, p_bodies (JSON text)
-- The result has one row per commit; item is i - 1.
-- runifold_commit_batch stays for workers that still run an older runifold
-- during a rolling deploy.
CREATE FUNCTION runifold_commit_arrays(
    p_run text[], p_token bigint[], p_expected bigint[], p_count integer[],
    p_status text[], p_due double precision[], p_reason text[], p_waits text[], p_consumed text[],
    p_item integer[], p_seq bigint[], p_types text[], p_keys text[], p_bodies text[]
) RETURNS TABLE (item integer, ok boolean, new_revision bigint, at double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := runifold_now();
    v_ok boolean[] := array_fill(false, ARRAY[cardinality(p_run)]);
    v_notify boolean := false;
    i integer;
BEGIN
    -- invariant: run rows are updated, so locked, in run_id order: concurrent batches never deadlock
    FOR i IN SELECT s FROM generate_subscripts(p_run, 1) AS s ORDER BY p_run[s] LOOP
        IF p_status[i] IS NULL THEN
            UPDATE runifold_runs SET revision = p_expected[i] + p_count[i], updated_at = v_now
            WHERE run_id = p_run[i] AND status = 'running' AND lease_token = p_token[i]
              AND lease_until > v_now AND revision = p_expected[i];
        ELSE
            UPDATE runifold_runs SET revision = p_expected[i] + p_count[i], updated_at = v_now, status = p_status[i],
                due_at = p_due[i], reason = p_reason[i], lease_owner = NULL, lease_until = NULL,
                wait_signals = CASE WHEN p_waits[i] IS NULL THEN '{}'::text[]
                                    ELSE ARRAY(SELECT jsonb_array_elements_text(p_waits[i]::jsonb)) END
            WHERE run_id = p_run[i] AND status = 'running' AND lease_token = p_token[i]
              AND lease_until > v_now AND revision = p_expected[i];
        END IF;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        v_ok[i] := true;
        IF p_consumed[i] IS NOT NULL THEN
            UPDATE runifold_signals SET consumed = true
            WHERE run_id = p_run[i] AND signal_id IN (SELECT jsonb_array_elements_text(p_consumed[i]::jsonb));
        END IF;
        IF p_status[i] = 'waiting' AND p_waits[i] IS NOT NULL THEN
            -- the run row is locked above, so this sees every delivery committed before it
            IF EXISTS (
                SELECT 1 FROM runifold_signals s
                WHERE s.run_id = p_run[i] AND NOT s.consumed
                  AND s.name IN (SELECT jsonb_array_elements_text(p_waits[i]::jsonb))
            ) THEN
                -- invariant: a signal that beat the wait wakes the run at once
                UPDATE runifold_runs SET due_at = v_now WHERE run_id = p_run[i];
                v_notify := true;
                CONTINUE;
            END IF;
        END IF;
        IF p_status[i] IS NOT NULL AND p_due[i] IS NOT NULL THEN
            -- a new due time (also a future one: a timer, a retry) makes idle workers recompute their sleep
            v_notify := true;
        END IF;
    END LOOP;
    INSERT INTO runifold_events (run_id, seq, type, key, at, body)
    SELECT p_run[e.c], e.seq, e.type, e.key, v_now, e.body::jsonb
    FROM unnest(p_item, p_seq, p_types, p_keys, p_bodies) AS e(c, seq, type, key, body)
    WHERE v_ok[e.c];
    IF v_notify THEN
        PERFORM pg_notify('runifold_work', '');
    END IF;
    RETURN QUERY
        SELECT (x.n - 1)::integer, x.ok, CASE WHEN x.ok THEN x.expected + x.count ELSE 0 END, v_now
        FROM unnest(v_ok, p_expected, p_count) WITH ORDINALITY AS x(ok, expected, count, n);
END
$$;
