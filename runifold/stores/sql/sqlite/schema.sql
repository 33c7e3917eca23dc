-- runifold SQLite schema, version 1 (the baseline).
-- Times are seconds since the epoch (REAL) on the store's clock.
-- Event bodies, inputs and payloads are JSON text; any valid Unicode, NUL
-- included, is kept (JSON escapes it).

-- One row per run: its identity, scheduling state and lease.
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,         -- 'run_' + 24 hex digits; sorts by creation time
    checkpoint_id TEXT UNIQUE,              -- the caller's identity of the run; never starts with 'run_'
    name          TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    input_json    TEXT    NOT NULL,         -- canonical JSON (sorted keys): compares re-enqueued tasks
    status        TEXT    NOT NULL,         -- ready, running, waiting, parked, diverged, completed, failed, cancelled
    revision      INTEGER NOT NULL,         -- invariant: the seq of the run's last event
    -- invariant: due_at is NULL exactly when the run can never be claimed by time alone
    due_at        REAL,
    lease_owner   TEXT,
    lease_token   INTEGER NOT NULL DEFAULT 0, -- the fencing token: only ever grows
    lease_until   REAL,
    recoveries    INTEGER NOT NULL DEFAULT 0, -- claims that took the run over from an expired lease
    wait_signals  TEXT    NOT NULL DEFAULT '[]', -- JSON array of the signal names a waiting run waits for
    reason        TEXT    NOT NULL DEFAULT '',
    created_at    REAL    NOT NULL,
    updated_at    REAL    NOT NULL,
    parent_run_id TEXT,                     -- a child workflow's parent: gets its last event when it finishes
    -- a claim passes over a due run while concurrency_limit runs of its concurrency_key are
    -- running under an unexpired lease (both NULL: no limit)
    concurrency_key   TEXT,
    concurrency_limit INTEGER
);
-- Claims only ever look at runs with a due time, so the index stays small as
-- finished runs accumulate.
CREATE INDEX runs_due ON runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX runs_listing ON runs (name, version, status);
-- finished runs, oldest first, for purge_finished (no index covers revision or updated_at,
-- which every step commit changes)
CREATE INDEX runs_finished ON runs (run_id) WHERE status IN ('completed', 'failed', 'cancelled');
-- the runs of a key that may hold its slots, counted by the claim
CREATE INDEX runs_running_key ON runs (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- The append-only log: seq 1, 2, 3, ... per run.
CREATE TABLE events (
    run_id TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    type   TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    at     REAL    NOT NULL,
    body   TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- Accepted signals, once per (run, signal id).
CREATE TABLE signals (
    run_id       TEXT    NOT NULL,
    signal_id    TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    payload_hash TEXT    NOT NULL,
    sender       TEXT    NOT NULL,
    key_id       TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    received_at  REAL    NOT NULL,
    arrival      INTEGER NOT NULL,          -- orders signals received at the same time
    consumed     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, signal_id)
);

-- Every signal attempt: accepted, duplicate, rejected (and why). Never a secret.
CREATE TABLE signal_audit (
    id           INTEGER PRIMARY KEY,
    run_id       TEXT,                      -- NULL: the attempt named no known run
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

-- Schedules (runifold/stores/_schedule.py): a workflow started at every tick of a cron
-- expression or an interval, by whichever worker checks first (the tick is in the run's
-- checkpoint id, so each tick starts one run).
CREATE TABLE schedules (
    name            TEXT PRIMARY KEY,
    workflow        TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    input_json      TEXT    NOT NULL,          -- canonical JSON (sorted keys)
    cron            TEXT,                      -- five or six cron fields; NULL: every_seconds
    every_seconds   INTEGER,                   -- ticks at its multiples since the epoch; NULL: cron
    timezone        TEXT    NOT NULL,          -- the IANA zone cron's fields are read in
    catchup_seconds REAL    NOT NULL,          -- earlier due ticks at most this old start too
    paused          INTEGER NOT NULL DEFAULT 0,
    last_tick       REAL    NOT NULL,          -- invariant: only grows, except when replaced; ticks at or before it never start
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL
);
