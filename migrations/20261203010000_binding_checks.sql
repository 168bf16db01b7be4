-- The owner of a thread: who opened it with `/ssh use` from its parent chat, else the first
-- user to bind it. Kept when the thread returns to local, so only the owner (or an admin) may
-- bind it again. A chat's parent section has no owner and no row.
CREATE TABLE section_owners (
    section TEXT PRIMARY KEY,
    owner   TEXT NOT NULL,
    how     TEXT NOT NULL CHECK (how IN ('opened', 'bound')),
    since   TIMESTAMPTZ NOT NULL
);
INSERT INTO section_owners (section, owner, how, since)
    SELECT b.section, b.owner, CASE bt.reason WHEN 'opened' THEN 'opened' ELSE 'bound' END,
           b.bound_at
    FROM bindings b JOIN bot_threads bt ON bt.thread_id = b.section
    WHERE b.kind = 'sticky'
    ON CONFLICT DO NOTHING;
