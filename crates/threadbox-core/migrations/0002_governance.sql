-- Governance: tenants, API keys, quotas, metering, the audit log.

-- Sandboxes gain a tenant; names become unique per tenant. SQLite cannot drop the old
-- UNIQUE(name) in place, so the table is rebuilt.
CREATE TABLE sandboxes_new (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL DEFAULT 'default',
    name            TEXT,
    state           TEXT NOT NULL,
    labels          TEXT NOT NULL,
    image           TEXT NOT NULL,
    memory_bytes    INTEGER NOT NULL,
    cpus            REAL NOT NULL,
    pids            INTEGER NOT NULL,
    idle_pause_secs INTEGER,
    ttl_secs        INTEGER,
    ttl_action      TEXT NOT NULL,
    slot            INTEGER NOT NULL UNIQUE,
    agent_pid       INTEGER,
    created_at      INTEGER NOT NULL,
    last_active_at  INTEGER NOT NULL,
    UNIQUE (tenant, name)
);
INSERT INTO sandboxes_new (id, tenant, name, state, labels, image, memory_bytes, cpus, pids,
    idle_pause_secs, ttl_secs, ttl_action, slot, agent_pid, created_at, last_active_at)
SELECT id, 'default', name, state, labels, image, memory_bytes, cpus, pids,
    idle_pause_secs, ttl_secs, ttl_action, slot, agent_pid, created_at, last_active_at
FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;
CREATE INDEX sandboxes_state ON sandboxes(state);
CREATE INDEX sandboxes_tenant ON sandboxes(tenant);

-- API keys: only the SHA-256 of the key is kept.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    scopes       TEXT NOT NULL,            -- JSON array of scope strings
    key_hash     TEXT NOT NULL,            -- hex SHA-256 of the whole key
    created_at   INTEGER NOT NULL,         -- unix ms
    expires_at   INTEGER,
    revoked_at   INTEGER,
    last_used_at INTEGER
);

-- Per-tenant limits; NULL = unlimited.
CREATE TABLE quotas (
    tenant              TEXT PRIMARY KEY,
    max_running         INTEGER,
    max_sandboxes       INTEGER,
    max_memory_bytes    INTEGER,
    max_cpus            REAL,
    cpu_seconds_per_day INTEGER,
    disk_bytes          INTEGER,
    updated_at          INTEGER NOT NULL
);

-- Metering of each sandbox over its life (kept after delete, for the tenant's totals).
CREATE TABLE sandbox_usage (
    sandbox_id       TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    name             TEXT,
    cpu_usec         INTEGER NOT NULL DEFAULT 0,
    mem_byte_ms      REAL NOT NULL DEFAULT 0,   -- bytes x milliseconds
    peak_mem_bytes   INTEGER NOT NULL DEFAULT 0,
    disk_bytes       INTEGER NOT NULL DEFAULT 0,
    running_ms       INTEGER NOT NULL DEFAULT 0,
    paused_ms        INTEGER NOT NULL DEFAULT 0,
    last_cgroup_usec INTEGER NOT NULL DEFAULT 0, -- last reading of the cgroup's counter
    sampled_at       INTEGER NOT NULL,
    deleted_at       INTEGER
);
CREATE INDEX sandbox_usage_tenant ON sandbox_usage(tenant);

-- Per tenant and UTC day: what the daily CPU cap and `usage --since` count.
CREATE TABLE usage_daily (
    tenant      TEXT NOT NULL,
    day         TEXT NOT NULL,               -- YYYY-MM-DD (UTC)
    cpu_usec    INTEGER NOT NULL DEFAULT 0,
    mem_byte_ms REAL NOT NULL DEFAULT 0,
    running_ms  INTEGER NOT NULL DEFAULT 0,
    paused_ms   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day)
);

-- The audit log: a hash chain. hash = SHA-256(prev_hash || canonical form of the entry).
CREATE TABLE audit_log (
    seq       INTEGER PRIMARY KEY,
    ts        INTEGER NOT NULL,              -- unix ms
    tenant    TEXT NOT NULL,
    key_id    TEXT,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    result    TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
-- The chain's head (count and last hash), updated in the same transaction as each
-- append, so removing the newest entries is detected too.
CREATE TABLE audit_head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    count     INTEGER NOT NULL,
    last_hash TEXT NOT NULL
);
INSERT INTO audit_head (id, count, last_hash) VALUES (1, 0, '');
