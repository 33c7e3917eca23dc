-- runifold PostgreSQL schema, version 4: an operator's append may name the revision it was decided on
-- (p_decided_at), and is refused when the run has moved on since: two operators resolving one effect at once
-- were both accepted, and the run went on with the second's resolution while the first was told it was done.
-- The run's revision comes back beside its status, so a refusal can say which rule refused it
-- (runifold/stores/_rule.py, intervene_refusal).

DROP FUNCTION IF EXISTS runifold_intervene(text, text, text[], text[], text[], text[], text, text);

-- An operator's append: fences off any lease holder. Returns the run's status and revision before (new_revision
-- NULL: its status is not in p_allowed, or p_decided_at is given and is not its revision; nothing written); no
-- row: no such run.
CREATE OR REPLACE FUNCTION runifold_intervene(
    p_column text, p_ref text, p_allowed text[], p_types text[], p_keys text[], p_bodies text[], p_status text,
    p_reason text, p_decided_at bigint
) RETURNS TABLE (run_id text, status text, revision bigint, new_revision bigint, at double precision)
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
    IF NOT v_run.status = ANY (p_allowed) OR v_run.revision IS DISTINCT FROM coalesce(p_decided_at, v_run.revision)
    THEN
        RETURN QUERY SELECT v_run.run_id, v_run.status, v_run.revision, NULL::bigint, v_now;
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
    RETURN QUERY SELECT v_run.run_id, v_run.status, v_run.revision, v_run.revision + v_n, v_now;
END
$$;
