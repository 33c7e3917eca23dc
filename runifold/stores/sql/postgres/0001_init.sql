-- runifold PostgreSQL schema, version 1.
-- Times are seconds since the epoch on the database clock (clock_timestamp()).

CREATE TABLE runifold_runs (
    run_id        text PRIMARY KEY,
    checkpoint_id text UNIQUE,
    name          text    NOT NULL,
    version       integer NOT NULL,
    input_json    text    NOT NULL,
    status        text    NOT NULL,
    revision      bigint  NOT NULL,
    -- invariant: due_at is NULL exactly when the run can never be claimed by time alone
    due_at        double precision,
    lease_owner   text,
    lease_token   bigint  NOT NULL DEFAULT 0,
    lease_until   double precision,
    wait_signals  text[]  NOT NULL DEFAULT '{}',
    reason        text    NOT NULL DEFAULT '',
    created_at    double precision NOT NULL,
    updated_at    double precision NOT NULL
);
CREATE INDEX runifold_runs_due ON runifold_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX runifold_runs_listing ON runifold_runs (name, version, status);

CREATE TABLE runifold_events (
    run_id text   NOT NULL,
    seq    bigint NOT NULL,
    type   text   NOT NULL,
    key    text   NOT NULL,
    at     double precision NOT NULL,
    body   jsonb  NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE runifold_signals (
    run_id      text    NOT NULL,
    signal_id   text    NOT NULL,
    name        text    NOT NULL,
    payload     jsonb   NOT NULL,
    sender      text    NOT NULL,
    key_id      text    NOT NULL,
    reason      text    NOT NULL,
    received_at double precision NOT NULL,
    arrival     bigserial,
    consumed    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, signal_id)
);

CREATE TABLE runifold_signal_audit (
    id           bigserial PRIMARY KEY,
    run_id       text,
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
CREATE INDEX runifold_signal_audit_run ON runifold_signal_audit (run_id);
CREATE INDEX runifold_signal_audit_ref ON runifold_signal_audit (run_ref);

CREATE FUNCTION runifold_now() RETURNS double precision
LANGUAGE sql VOLATILE AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

-- One round trip per durable step: fence, append, consume signals, transition.
-- The run row is locked first, so the signal check below sees every delivery
-- committed before it (each statement of a VOLATILE function takes a new snapshot).
CREATE FUNCTION runifold_commit(
    p_run_id text, p_token bigint, p_expected bigint,
    p_types text[], p_keys text[], p_bodies text[],
    p_transition boolean, p_status text, p_due double precision, p_signals text[], p_reason text,
    p_consumed text[]
) RETURNS TABLE (ok boolean, new_revision bigint, at double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := runifold_now();
    v_run runifold_runs%ROWTYPE;
    v_n bigint := coalesce(array_length(p_types, 1), 0);
    v_due double precision := p_due;
BEGIN
    SELECT * INTO v_run FROM runifold_runs WHERE run_id = p_run_id FOR UPDATE;
    IF NOT FOUND OR v_run.status <> 'running' OR v_run.lease_token <> p_token
       OR v_run.lease_until <= v_now OR v_run.revision <> p_expected THEN
        RETURN QUERY SELECT false, coalesce(v_run.revision, 0::bigint), v_now;
        RETURN;
    END IF;
    INSERT INTO runifold_events (run_id, seq, type, key, at, body)
    SELECT p_run_id, p_expected + e.ord, e.type, e.key, v_now, e.body::jsonb
    FROM unnest(p_types, p_keys, p_bodies) WITH ORDINALITY AS e(type, key, body, ord);
    IF coalesce(array_length(p_consumed, 1), 0) > 0 THEN
        UPDATE runifold_signals SET consumed = true WHERE run_id = p_run_id AND signal_id = ANY (p_consumed);
    END IF;
    IF NOT p_transition THEN
        UPDATE runifold_runs SET revision = p_expected + v_n, updated_at = v_now WHERE run_id = p_run_id;
    ELSE
        IF p_status = 'waiting' AND EXISTS (
            SELECT 1 FROM runifold_signals s
            WHERE s.run_id = p_run_id AND NOT s.consumed AND s.name = ANY (p_signals)
        ) THEN
            v_due := v_now;  -- invariant: a signal that beat the wait wakes the run at once
        END IF;
        UPDATE runifold_runs SET revision = p_expected + v_n, updated_at = v_now, status = p_status,
            due_at = v_due, wait_signals = p_signals, reason = p_reason, lease_owner = NULL, lease_until = NULL
        WHERE run_id = p_run_id;
        IF v_due IS NOT NULL AND v_due <= v_now THEN
            PERFORM pg_notify('runifold_work', '');
        END IF;
    END IF;
    RETURN QUERY SELECT true, p_expected + v_n, v_now;
END
$$;
