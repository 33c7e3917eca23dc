-- runifold PostgreSQL schema, version 3: every commit that sets a due time notifies.
-- Idle workers sleep until the next due time they know of; a timer or retry
-- committed after they computed it must wake them to recompute, or they would
-- oversleep until the fallback poll. (Version 2 notified only for runs due now.)
CREATE OR REPLACE FUNCTION runifold_commit(
    p_run_id text, p_token bigint, p_expected bigint,
    p_types text[], p_keys text[], p_bodies text[],
    p_transition boolean, p_status text, p_due double precision, p_signals text[], p_reason text,
    p_consumed text[]
) RETURNS TABLE (ok boolean, new_revision bigint, at double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := runifold_now();
    v_n bigint := coalesce(array_length(p_types, 1), 0);
BEGIN
    IF p_transition THEN
        UPDATE runifold_runs SET revision = p_expected + v_n, updated_at = v_now, status = p_status,
            due_at = p_due, wait_signals = p_signals, reason = p_reason, lease_owner = NULL, lease_until = NULL
        WHERE run_id = p_run_id AND status = 'running' AND lease_token = p_token
          AND lease_until > v_now AND revision = p_expected;
    ELSE
        UPDATE runifold_runs SET revision = p_expected + v_n, updated_at = v_now
        WHERE run_id = p_run_id AND status = 'running' AND lease_token = p_token
          AND lease_until > v_now AND revision = p_expected;
    END IF;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, 0::bigint, v_now;
        RETURN;
    END IF;
    INSERT INTO runifold_events (run_id, seq, type, key, at, body)
    SELECT p_run_id, p_expected + e.ord, e.type, e.key, v_now, e.body::jsonb
    FROM unnest(p_types, p_keys, p_bodies) WITH ORDINALITY AS e(type, key, body, ord);
    IF coalesce(array_length(p_consumed, 1), 0) > 0 THEN
        UPDATE runifold_signals SET consumed = true WHERE run_id = p_run_id AND signal_id = ANY (p_consumed);
    END IF;
    IF p_transition AND p_status = 'waiting' AND EXISTS (
        SELECT 1 FROM runifold_signals s
        WHERE s.run_id = p_run_id AND NOT s.consumed AND s.name = ANY (p_signals)
    ) THEN
        -- invariant: a signal that beat the wait wakes the run at once
        UPDATE runifold_runs SET due_at = v_now WHERE run_id = p_run_id;
        PERFORM pg_notify('runifold_work', '');
    ELSIF p_transition AND p_due IS NOT NULL THEN
        -- a new due time (also a future one: a timer, a retry) makes idle workers recompute their sleep
        PERFORM pg_notify('runifold_work', '');
    END IF;
    RETURN QUERY SELECT true, p_expected + v_n, v_now;
END
$$;
