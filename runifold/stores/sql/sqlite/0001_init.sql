-- runifold SQLite schema, version 1.
-- Times are seconds since the epoch (REAL). Event bodies and payloads are JSON text.

CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    checkpoint_id TEXT UNIQUE,
    name          TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    input_json    TEXT    NOT NULL,
    status        TEXT    NOT NULL,
    revision      INTEGER NOT NULL,
    -- invariant: due_at is NULL exactly when the run can never be claimed by time alone
    due_at        REAL,
    lease_owner   TEXT,
    lease_token   INTEGER NOT NULL DEFAULT 0,
    lease_until   REAL,
    wait_signals  TEXT    NOT NULL DEFAULT '[]',
    reason        TEXT    NOT NULL DEFAULT '',
    created_at    REAL    NOT NULL,
    updated_at    REAL    NOT NULL
);

-- Claims only ever look at runs with a due time, so the index stays small as
-- finished runs accumulate.
CREATE INDEX runs_due ON runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX runs_listing ON runs (name, version, status);

CREATE TABLE events (
    run_id TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    type   TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    at     REAL    NOT NULL,
    body   TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE signals (
    run_id      TEXT    NOT NULL,
    signal_id   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    sender      TEXT    NOT NULL,
    key_id      TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    received_at REAL    NOT NULL,
    arrival     INTEGER NOT NULL,
    consumed    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, signal_id)
);

CREATE TABLE signal_audit (
    id           INTEGER PRIMARY KEY,
    run_id       TEXT,
    run_ref      TEXT NOT NULL,
    signal_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    sender       TEXT NOT NULL,
    key_id       TEXT NOT NULL,
    verdict      TEXT NOT NULL,
    payload_hash TEXT NOT NULL,
    reason       TEXT NOT NULL,
    detail       TEXT NOT NULL,
    at           REAL NOT NULL
);
CREATE INDEX signal_audit_run ON signal_audit (run_id);
CREATE INDEX signal_audit_ref ON signal_audit (run_ref);
