-- Secrets (issue 13 scope 4, ADR 0068). A tenant's secret: the host and header it goes in,
-- and its value sealed with the daemon's key (ChaCha20-Poly1305, nonce || ciphertext; the
-- additional data binds it to tenant and name). The value is never stored in clear.
CREATE TABLE secrets (
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    host        TEXT NOT NULL,
    header      TEXT NOT NULL,
    format      TEXT NOT NULL,
    sealed      BLOB NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
-- The secrets a sandbox was created with and its placeholder for each (random per
-- sandbox); gone with the sandbox.
CREATE TABLE sandbox_secrets (
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    placeholder TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, name)
);
