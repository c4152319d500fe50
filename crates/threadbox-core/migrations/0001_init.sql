-- Sandboxes: the source of truth for what exists and in which state.
CREATE TABLE sandboxes (
    id              TEXT PRIMARY KEY,
    name            TEXT UNIQUE,
    -- creating | running | paused | stopped | deleting (deleting is internal)
    state           TEXT NOT NULL,
    labels          TEXT NOT NULL,          -- JSON object
    image           TEXT NOT NULL,
    memory_bytes    INTEGER NOT NULL,
    cpus            REAL NOT NULL,
    pids            INTEGER NOT NULL,
    idle_pause_secs INTEGER,
    ttl_secs        INTEGER,
    ttl_action      TEXT NOT NULL,
    slot            INTEGER NOT NULL UNIQUE, -- uid range index
    agent_pid       INTEGER,
    created_at      INTEGER NOT NULL,        -- unix ms
    last_active_at  INTEGER NOT NULL         -- unix ms
);
CREATE INDEX sandboxes_state ON sandboxes(state);

CREATE TABLE images (
    name        TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,               -- host | rootfs
    path        TEXT,
    created_at  INTEGER NOT NULL
);
