-- SSH targets: where a thread's work may run. Secrets are vault-sealed (AES-256-GCM, the alias
-- as associated data); no path to a key file is ever stored. The host key is the one recorded
-- on first use (tofu) or pinned by an operator (strict); a later mismatch refuses to connect.

CREATE TABLE targets (
    alias                TEXT PRIMARY KEY CHECK (alias ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    -- A new generation per add: connections made for a removed-and-re-added alias are dropped.
    generation           BIGSERIAL NOT NULL UNIQUE,
    host                 TEXT NOT NULL,
    port                 INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    username             TEXT NOT NULL,
    description          TEXT,
    auth_kind            TEXT NOT NULL CHECK (auth_kind IN ('key', 'password', 'agent')),
    sealed_key           BYTEA,   -- OpenSSH private key, stored decrypted then vault-sealed
    sealed_cert          BYTEA,   -- OpenSSH user certificate (`-cert.pub`), vault-sealed
    sealed_password      BYTEA,
    host_key_policy      TEXT NOT NULL CHECK (host_key_policy IN ('tofu', 'strict')),
    host_key_fingerprint TEXT CHECK (host_key_fingerprint LIKE 'SHA256:%'),
    host_key_algorithm   TEXT,
    host_key_source      TEXT CHECK (host_key_source IN ('tofu', 'pinned')),
    host_key_at          TIMESTAMPTZ,
    status               TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'disabled')),
    added_by             TEXT NOT NULL,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((auth_kind = 'key') = (sealed_key IS NOT NULL)),
    CHECK ((auth_kind = 'password') = (sealed_password IS NOT NULL)),
    CHECK (sealed_cert IS NULL OR auth_kind = 'key')
);
