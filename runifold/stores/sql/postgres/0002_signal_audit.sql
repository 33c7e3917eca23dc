-- runifold PostgreSQL schema, version 2: the signal audit keeps a run's newest attempts that were not accepted
-- (duplicates as well as rejections: replaying one captured envelope added a row each time, without bound), and
-- says why a conflicting or refused delivery was refused.

-- Keep only the newest p_cap attempts against p_run that were not accepted (duplicates and rejections; p_run
-- NULL: attempts against no known run).
CREATE OR REPLACE FUNCTION runifold_trim_refused(p_run text, p_cap integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- (two statements, so that a run's uses the (run_id, id) index: IS NOT DISTINCT FROM cannot)
    IF p_run IS NULL THEN
        DELETE FROM runifold_signal_audit WHERE run_id IS NULL AND verdict <> 'accepted' AND id <= (
            SELECT id FROM runifold_signal_audit WHERE run_id IS NULL AND verdict <> 'accepted'
            ORDER BY id DESC OFFSET p_cap LIMIT 1);
    ELSE
        DELETE FROM runifold_signal_audit WHERE run_id = p_run AND verdict <> 'accepted' AND id <= (
            SELECT id FROM runifold_signal_audit WHERE run_id = p_run AND verdict <> 'accepted'
            ORDER BY id DESC OFFSET p_cap LIMIT 1);
    END IF;
END
$$;

-- Deliver a signal to exactly one run id: accepted, duplicate (same name, payload hash, sender and reason),
-- rejected:conflict (the id names another signal) or rejected:inbox_full; every attempt is audited, with why
-- for a refusal, and of those not accepted the newest p_cap are kept. No row: the run does not exist.
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
    ELSIF (SELECT count(*) FROM runifold_signals WHERE run_id = p_run AND NOT consumed) >= p_max THEN
        v_verdict := 'rejected:inbox_full';
        v_detail := 'the run''s inbox is full (at most ' || p_max || ' unconsumed signals)';
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

-- The baseline's form, kept for processes of the previous runifold still running while this one migrated the
-- database (a rolling upgrade): their deliveries keep the default 1,000 attempts not accepted.
CREATE OR REPLACE FUNCTION runifold_deliver(
    p_run text, p_ref text, p_signal text, p_name text, p_payload text, p_hash text, p_sender text, p_key text,
    p_reason text, p_max integer
) RETURNS TABLE (verdict text, received_at double precision, run_status text)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM runifold_deliver(p_run, p_ref, p_signal, p_name, p_payload, p_hash, p_sender, p_key, p_reason,
                                   p_max, 1000);
$$;

-- Keep a rejected attempt, and only the newest p_cap attempts of its run that were not accepted
-- (of attempts against no known run, when p_run is NULL).
CREATE OR REPLACE FUNCTION runifold_record_rejected(
    p_run text, p_ref text, p_signal text, p_name text, p_sender text, p_key text, p_verdict text, p_hash text,
    p_reason text, p_detail text, p_at double precision, p_cap integer
) RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO runifold_signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash,
                                       reason, detail, at)
    VALUES (p_run, p_ref, p_signal, p_name, p_sender, p_key, p_verdict, p_hash, p_reason, p_detail, p_at);
    SELECT runifold_trim_refused(p_run, p_cap);
$$;
