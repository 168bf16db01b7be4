-- Host keys seen at `target add` and pinned by approval; vault records bound to their row.
--
-- `host_key_source = 'seen'`: the key `target add` saw on its one connection, shown to the
-- admin and pinned (`'pinned'`) when the target is approved.
--
-- `seal_version`: 1 = the sealed columns are vault records bound to the alias alone; 2 = bound
-- to (alias, generation, field). SQL cannot re-seal, so the service re-seals version 1 rows
-- at start (idempotent: it only touches rows still at 1, each in its own transaction).
ALTER TABLE targets DROP CONSTRAINT targets_host_key_source_check;
ALTER TABLE targets ADD CONSTRAINT targets_host_key_source_check
    CHECK (host_key_source IN ('tofu', 'pinned', 'seen'));
ALTER TABLE targets ADD COLUMN seal_version SMALLINT NOT NULL DEFAULT 1
    CHECK (seal_version IN (1, 2));
