-- A sandbox's egress log (issue 13, ADR 0063): one row per connection (written when it
-- closes) and per DNS answer. `seq` orders a sandbox's rows and is what `?after=` pages
-- on. Rows go with their sandbox (ON DELETE CASCADE) and only the newest N per sandbox are
-- kept (the writer trims).
CREATE TABLE net_log (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id       TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    at_ms            INTEGER NOT NULL,
    kind             TEXT NOT NULL,              -- tcp | dns
    name             TEXT,
    ip               TEXT,
    port             INTEGER NOT NULL,
    bytes_up         INTEGER NOT NULL DEFAULT 0,
    bytes_down       INTEGER NOT NULL DEFAULT 0,
    decision         TEXT NOT NULL,              -- allow | deny
    reason           TEXT NOT NULL,
    rule             INTEGER,
    name_ip_mismatch INTEGER NOT NULL DEFAULT 0,
    qtype            TEXT,
    answers          INTEGER
);
CREATE INDEX net_log_sandbox ON net_log(sandbox_id, seq);

-- Egress bytes in the meter: over a sandbox's life, and per tenant and UTC day.
ALTER TABLE sandbox_usage ADD COLUMN net_bytes_up INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandbox_usage ADD COLUMN net_bytes_down INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN net_bytes_up INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN net_bytes_down INTEGER NOT NULL DEFAULT 0;
