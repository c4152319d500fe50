-- Templates (issue 14 scope 5, ADR 0110): a named, immutable disk clone and the defaults
-- of the sandboxes made from it. The disk itself is the driver's (templates/<id>.img on
-- the jail); it is made before the row and removed after it, so a row always has its disk.
CREATE TABLE templates (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    name          TEXT NOT NULL,
    source        TEXT NOT NULL,
    image         TEXT NOT NULL,
    tier          TEXT NOT NULL,
    memory_bytes  INTEGER NOT NULL,
    cpus          REAL NOT NULL,
    pids          INTEGER NOT NULL,
    disk_bytes    INTEGER NOT NULL,
    labels        TEXT NOT NULL,
    -- The default egress policy (JSON of a NetworkPolicySpec), copied to each sandbox.
    network_policy TEXT,
    size_bytes    INTEGER NOT NULL,
    method        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    UNIQUE (tenant, name)
);
-- Which template a sandbox (or a pooled sandbox) was made from: for `template ls`'s count
-- and the warm pool. A sandbox does not depend on it (its disk is a clone); a row whose
-- sandbox is gone is ignored and swept on start.
CREATE TABLE template_uses (
    sandbox   TEXT PRIMARY KEY,
    template  TEXT NOT NULL
);
CREATE INDEX template_uses_by_template ON template_uses (template);
