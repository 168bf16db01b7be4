-- A binding names the chat it was made in and the target generation it was made for, so every
-- tool call can check, in the read that resolves the binding, that the target still exists in
-- that generation and still allows that chat. A binding that no longer passes stays bound and
-- fails; `told_at` records that its thread was told (once).
ALTER TABLE bindings
    ADD COLUMN chat_id    TEXT,
    ADD COLUMN generation BIGINT,
    ADD COLUMN told_at    TIMESTAMPTZ;

-- Rows from before: the generation is known only when the target row existed at binding time
-- (a re-added alias has a later `created_at`); the chat from the thread the bot is in, the
-- section's turns, or the section itself when it is a chat. What stays NULL fails until a user
-- binds again (`/ssh use`) or releases (`/ssh local`).
UPDATE bindings b SET generation = t.generation
    FROM targets t WHERE t.alias = b.alias AND t.created_at <= b.bound_at;
UPDATE bindings b SET chat_id = COALESCE(
    (SELECT bt.chat_id FROM bot_threads bt WHERE bt.thread_id = b.section),
    (SELECT tu.chat_id FROM turns tu WHERE tu.section_id = b.section ORDER BY tu.id DESC LIMIT 1),
    CASE WHEN b.section LIKE 'oc\_%' OR b.section LIKE 'console:%' THEN b.section END);

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

-- A pending `/ssh use` records the generation it was checked against; the thread's binding is
-- made for that one (NULL: a row from before, bound to the generation current at completion).
ALTER TABLE pending_bindings ADD COLUMN generation BIGINT;
