-- runifold SQLite schema, version 3: the commit trigger skips the signal update
-- when the commit consumes no signal (NEW.consumed is '[]', as the store sends it).
-- Evaluating that update for nothing cost CPU on every step. In a micro-benchmark
-- of the trigger alone (5,000 commits a round), a commit took 39-62 us against
-- 49-78 us over 15 rounds with synchronous=OFF (means 54 and 65 us), and 148-156
-- against 159-186 us over 3 rounds with synchronous=FULL. Everything else is
-- version 2's trigger.

DROP TRIGGER commit_request;

CREATE TRIGGER commit_request INSTEAD OF INSERT ON commit_requests
BEGIN
    SELECT RAISE(ABORT, 'runifold: lease or revision fenced off')
    WHERE NOT EXISTS (
        SELECT 1 FROM runs WHERE run_id = NEW.run_id AND status = 'running' AND lease_token = NEW.token
        AND lease_until > NEW.now AND revision = NEW.expected
    );
    INSERT INTO events (run_id, seq, type, key, at, body)
    SELECT NEW.run_id, NEW.expected + 1 + CAST(e.key AS INTEGER), json_extract(e.value, '$[0]'),
           json_extract(e.value, '$[1]'), NEW.now, json_extract(e.value, '$[2]')
    FROM json_each(NEW.events) AS e;
    UPDATE signals SET consumed = 1
    WHERE NEW.consumed <> '[]' AND run_id = NEW.run_id
      AND signal_id IN (SELECT value FROM json_each(NEW.consumed));
    UPDATE runs SET revision = NEW.expected + json_array_length(NEW.events), updated_at = NEW.now
    WHERE run_id = NEW.run_id AND NOT NEW.has_transition;
    UPDATE runs SET
        revision = NEW.expected + json_array_length(NEW.events), updated_at = NEW.now, status = NEW.status,
        -- invariant: a signal that arrived before the wait was committed wakes the run at once
        due_at = CASE WHEN NEW.status = 'waiting' AND EXISTS (
                    SELECT 1 FROM signals s WHERE s.run_id = NEW.run_id AND s.consumed = 0
                    AND s.name IN (SELECT value FROM json_each(NEW.wait_signals))
                 ) THEN NEW.now ELSE NEW.due_at END,
        wait_signals = NEW.wait_signals, reason = NEW.reason, lease_owner = NULL, lease_until = NULL
    WHERE run_id = NEW.run_id AND NEW.has_transition;
END;
