-- runifold PostgreSQL schema, version 3: a child that finishes after its parent was purged posts nothing (its
-- last event went into a signal row addressed to no run, which no purge ever deleted); such rows are deleted.
-- And a child's end always wakes its waiting parent: the parent's row is locked as a signal delivery locks a run
-- (the baseline took no lock, so a child finishing while its parent's suspending commit was in flight found the
-- parent still running and posted its end unseen: the parent waited for ever).

CREATE OR REPLACE FUNCTION runifold_notify_parent(p_run text, p_body text, p_now double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_parent text;
    v_name text := 'child:' || p_run;
BEGIN
    -- invariant: the parent's row is locked before its inbox is written, as runifold_deliver locks a run's: a
    -- commit of the parent in flight is waited for (and its wait is then seen), and a later one waits for this
    -- transaction (and then sees the end in its inbox); a purge of the parent in flight is waited for, and then
    -- finds no parent
    SELECT p.run_id INTO v_parent
    FROM runifold_runs r JOIN runifold_runs p ON p.run_id = r.parent_run_id WHERE r.run_id = p_run
    FOR NO KEY UPDATE OF p;
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

DELETE FROM runifold_signals s WHERE s.signal_id LIKE 'child:%'
    AND NOT EXISTS (SELECT 1 FROM runifold_runs r WHERE r.run_id = s.run_id);
