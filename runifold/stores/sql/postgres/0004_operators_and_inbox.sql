-- runifold PostgreSQL schema, version 4: an operator's append may name the revision it was decided on
-- (p_decided_at), and is refused when the run has moved on since: two operators resolving one effect at once
-- were both accepted, and the run went on with the second's resolution while the first was told it was done.
-- The run's revision comes back beside its status, so a refusal can say which rule refused it
-- (runifold/stores/_rule.py, intervene_refusal).
-- And a run's inbox limit counts the unconsumed signals of the delivered signal's name: the senders of one signal
-- filled it against another's (a thousand early finance approvals refused the manager's approval the run waited
-- for), runifold/stores/_rule.py, signal_verdict.


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

-- The previous form, kept for processes of the previous runifold still running while this one migrated the
-- database (a rolling upgrade): it decides on no revision.
CREATE OR REPLACE FUNCTION runifold_intervene(
    p_column text, p_ref text, p_allowed text[], p_types text[], p_keys text[], p_bodies text[], p_status text,
    p_reason text
) RETURNS TABLE (run_id text, status text, new_revision bigint, at double precision)
LANGUAGE sql VOLATILE AS $$
    SELECT i.run_id, i.status, i.new_revision, i.at
    FROM runifold_intervene(p_column, p_ref, p_allowed, p_types, p_keys, p_bodies, p_status, p_reason, NULL::bigint) i
$$;

-- A delivery, as version 2 made it, with the inbox limit counted per signal name.
CREATE OR REPLACE FUNCTION runifold_deliver(
    p_run text, p_ref text, p_signal text, p_name text, p_payload text, p_hash text, p_sender text, p_key text,
    p_reason text, p_max integer, p_cap integer
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
        IF v_verdict = 'rejected:conflict' THEN
            v_detail := 'the signal id names another signal (it differs in: ' || concat_ws(', ',
                CASE WHEN v_sig.name <> p_name THEN 'name' END, CASE WHEN v_sig.payload_hash <> p_hash THEN 'payload' END,
                CASE WHEN v_sig.sender <> p_sender THEN 'sender' END, CASE WHEN v_sig.reason <> p_reason THEN 'reason' END
            ) || ')';
        END IF;
    ELSIF (SELECT count(*) FROM runifold_signals WHERE run_id = p_run AND name = p_name AND NOT consumed) >= p_max THEN
        v_verdict := 'rejected:inbox_full';
        v_detail := 'the run''s inbox is full (at most ' || p_max || ' unconsumed signals named ''' || p_name || ''')';
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
    IF v_verdict <> 'accepted' THEN
        PERFORM runifold_trim_refused(p_run, p_cap);
    END IF;
    RETURN QUERY SELECT v_verdict, coalesce(v_sig.received_at, v_now), v_run.status;
END
$$;
