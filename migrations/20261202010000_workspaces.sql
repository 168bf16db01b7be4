-- Workspaces: per section and backend, a directory, a permission the tools enforce, and a
-- mode that shapes the prompt. Targets carry the highest permission a chat may choose on them
-- and the directory their sections start in.
ALTER TABLE targets ADD COLUMN max_permission TEXT NOT NULL DEFAULT 'read-write'
    CHECK (max_permission IN ('read', 'read-write', 'full'));
ALTER TABLE targets ADD COLUMN workspace TEXT
    CHECK (workspace IS NULL OR (length(workspace) BETWEEN 1 AND 4096));

-- A section's chosen workspace on one backend ('local' or a target alias). A row for a target
-- holds the target's generation when it was set: a removed and re-added alias starts afresh.
CREATE TABLE workspaces (
    section_id  TEXT NOT NULL,
    backend     TEXT NOT NULL,
    generation  BIGINT,
    dir         TEXT NOT NULL CHECK (length(dir) BETWEEN 1 AND 4096),
    permission  TEXT NOT NULL CHECK (permission IN ('read', 'read-write', 'full')),
    mode        TEXT NOT NULL CHECK (mode IN ('dev', 'office', 'design')),
    set_by      TEXT NOT NULL,
    set_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (section_id, backend),
    CHECK ((backend = 'local') = (generation IS NULL))
);
