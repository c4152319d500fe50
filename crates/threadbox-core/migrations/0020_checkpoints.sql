-- Checkpoints of a sandbox's disk (issue 14, ADR 0100). The clone itself is the driver's
-- (sandboxes/<id>/checkpoints/<id>.img on the jail); it is made before the row is inserted
-- and removed after the row is deleted, so a row always has its clone.
CREATE TABLE checkpoints (
    id          TEXT PRIMARY KEY,
    sandbox     TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    label       TEXT,
    parent      TEXT,
    size_bytes  INTEGER NOT NULL,
    method      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    -- Orders checkpoints of one sandbox (created_at can tie).
    seq         INTEGER NOT NULL,
    UNIQUE (sandbox, label)
);
CREATE INDEX checkpoints_by_sandbox ON checkpoints (sandbox, seq);
-- The checkpoint a sandbox's disk last descended from (taken or rewound to): the parent
-- of its next checkpoint.
CREATE TABLE checkpoint_heads (
    sandbox     TEXT PRIMARY KEY,
    checkpoint  TEXT NOT NULL
);
