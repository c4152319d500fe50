-- Port previews (issue 13, scope 5; ADR 0072): one row per published port of a sandbox.
-- A private preview stores SHA-256 of its token and of the cookie the token is exchanged
-- for (hex); a public one stores neither. Rows go with their sandbox.
CREATE TABLE previews (
    sandbox_id  TEXT NOT NULL,
    port        INTEGER NOT NULL,
    public      INTEGER NOT NULL,
    token_hash  TEXT,
    cookie_hash TEXT,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
CREATE TRIGGER previews_go_with_their_sandbox AFTER DELETE ON sandboxes
BEGIN
    DELETE FROM previews WHERE sandbox_id = OLD.id;
END;
