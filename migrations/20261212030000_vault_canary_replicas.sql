-- The vault's canary: one record sealed under the master key, written when a key is first used
-- on this database and re-sealed by every rotation in the same transaction as the targets'
-- secrets. A key that does not open it is not this database's key.
CREATE TABLE vault_canary (
    id          SMALLINT PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    sealed      BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The processes running the service (`serve`, `sshmode chat`) on this database, each with a
-- heartbeat on the database's clock. A row is deleted when its process stops; one whose
-- heartbeat is old belongs to a process that died. `vault rotate-key` refuses while a row is
-- live.
CREATE TABLE replicas (
    id          TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX replicas_seen_at ON replicas (seen_at);
