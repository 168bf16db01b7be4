-- Skills belong to a chat. A skill the model writes is visible only in the chat that wrote it
-- (`chat_id`); an admin makes one visible in every chat with `sshmode skill promote <name>`
-- (`promoted_by`, `promoted_at`; audited as `skill.promote`). A row with neither a chat nor a
-- promotion is hidden from every chat until promoted.
ALTER TABLE skills
    ADD COLUMN chat_id     TEXT,
    ADD COLUMN promoted_by TEXT,
    ADD COLUMN promoted_at TIMESTAMPTZ,
    ADD CONSTRAINT skills_promoted CHECK ((promoted_by IS NULL) = (promoted_at IS NULL));

-- Skills written before: the chat of the latest `skill.create` audit row naming them. A chat
-- section's id is its chat id; a thread (`omt_…`) belongs to the chat its turns or
-- `bot_threads` name; a console section (`console:…`) is its own chat. No row, or a thread
-- whose chat is unknown: hidden until promoted.
UPDATE skills s SET chat_id = (
    SELECT CASE
               WHEN a.section LIKE 'omt\_%' THEN COALESCE(
                   (SELECT t.chat_id FROM turns t WHERE t.section_id = a.section
                     ORDER BY t.id DESC LIMIT 1),
                   (SELECT b.chat_id FROM bot_threads b WHERE b.thread_id = a.section))
               ELSE a.section
           END
      FROM audit_log a
     WHERE a.action = 'skill.create' AND a.detail ->> 'skill' = s.name
     ORDER BY a.id DESC
     LIMIT 1);

CREATE INDEX skills_chat ON skills (chat_id, name);
