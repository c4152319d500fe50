-- Interpreter contexts as the daemon last knew them (issue 15, ADR 0084): one row per
-- context name of a sandbox, so a context the sandbox's agent no longer has (after a
-- stop/start, an agent that was restarted) is reported `lost` with a reason instead of
-- vanishing, and the next get-or-create of its name says `recreated`. Rows go with their
-- sandbox.
CREATE TABLE contexts (
    sandbox_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    context_id  TEXT NOT NULL,
    language    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    lost_reason TEXT,
    lost_at     INTEGER,
    PRIMARY KEY (sandbox_id, name)
);
CREATE TRIGGER contexts_go_with_their_sandbox AFTER DELETE ON sandboxes
BEGIN
    DELETE FROM contexts WHERE sandbox_id = OLD.id;
END;
