-- Bearer tokens of the MCP endpoint (`sshmode mcp token create|list|revoke`). A token is
-- `smcp_<id>_<secret>`: the id finds the row, and the SHA-256 of the whole token is compared in
-- constant time; the token itself is never stored. Revoking deletes the row (audited).

CREATE TABLE mcp_tokens (
    name         TEXT PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    -- The token's public part: 16 hex digits, unique.
    token_id     TEXT NOT NULL UNIQUE,
    -- SHA-256 of the whole token.
    token_hash   BYTEA NOT NULL CHECK (length(token_hash) = 32),
    -- The targets it may use (each must also be approved when used); `all_targets` = every one.
    targets      TEXT[] NOT NULL DEFAULT '{}',
    all_targets  BOOLEAN NOT NULL DEFAULT false,
    -- Whether `local` (the service's own machine) is a target for it.
    local        BOOLEAN NOT NULL DEFAULT false,
    -- The highest workspace permission its calls get.
    permission   TEXT NOT NULL CHECK (permission IN ('read', 'read-write', 'full')),
    expires_at   TIMESTAMPTZ,
    created_by   TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
