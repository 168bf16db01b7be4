-- Content lifecycle: retention, erasure and recalled messages.
--
-- The event log (`session_events`) and the stored conversation (`agent_messages`) stay
-- append-only to every statement but the three functions below. Each marks its own transaction
-- (`sshmode.content_change`, SET LOCAL, cleared before it returns), and the guard lets a change
-- through only while that mark is set; an UPDATE may change only the content column
-- (`payload`, `message`), never a row's section, order, kind or time. The two functions that
-- remove content on someone's word write their own audit row — that it happened, who asked and
-- how much it touched, never what the content said:
--
--   sshmode_content_purge(keep_days, batch)       retention: rows older than keep_days go
--   sshmode_redact_message(message, actor, mark)   one message's text and images, everywhere
--   sshmode_erase_content(chat, person, actor, mark) a chat's or a person's content
--
-- `message_files`: the files a message brought, where they were placed (the backend and the
-- path), so a recall, an erasure or retention finds them. `recalled_messages`: messages whose
-- sender recalled them, so a message event handled after its recall is not acted on.

CREATE TABLE message_files (
    message_id  TEXT NOT NULL,
    section_id  TEXT NOT NULL,
    -- 'local' or a target's alias.
    backend     TEXT NOT NULL,
    path        TEXT NOT NULL,
    placed_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, path)
);
CREATE INDEX message_files_placed ON message_files (placed_at);
CREATE INDEX message_files_section ON message_files (section_id);

CREATE TABLE recalled_messages (
    message_id   TEXT PRIMARY KEY,
    chat_id      TEXT,
    recalled_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX recalled_messages_at ON recalled_messages (recalled_at);

CREATE INDEX session_events_at ON session_events (at);
CREATE INDEX agent_messages_at ON agent_messages (at);
CREATE INDEX turn_requests_sender ON turn_requests (sender);
CREATE INDEX turn_requests_chat ON turn_requests (chat_id);

CREATE FUNCTION sshmode_content_guard() RETURNS trigger AS $$
BEGIN
    IF current_setting('sshmode.content_change', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        IF (to_jsonb(NEW) - 'payload' - 'message') = (to_jsonb(OLD) - 'payload' - 'message') THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER session_events_append_only ON session_events;
CREATE TRIGGER session_events_append_only BEFORE UPDATE OR DELETE ON session_events
    FOR EACH ROW EXECUTE FUNCTION sshmode_content_guard();
DROP TRIGGER agent_messages_append_only ON agent_messages;
CREATE TRIGGER agent_messages_append_only BEFORE UPDATE OR DELETE ON agent_messages
    FOR EACH ROW EXECUTE FUNCTION sshmode_content_guard();

-- Retention: deletes up to `batch` rows of each of the event log, the conversation (and its
-- summaries), finished turn requests and recall marks older than `keep_days` days (at least
-- 1). Returns the rows deleted.
CREATE FUNCTION sshmode_content_purge(keep_days INTEGER, batch INTEGER) RETURNS BIGINT AS $$
DECLARE
    cutoff TIMESTAMPTZ;
    n BIGINT := 0;
    m BIGINT;
BEGIN
    IF keep_days IS NULL OR keep_days < 1 THEN
        RAISE EXCEPTION 'content retention must be at least one day, not %', keep_days;
    END IF;
    cutoff := now() - make_interval(days => keep_days);
    PERFORM set_config('sshmode.content_change', 'on', true);
    DELETE FROM session_events WHERE id IN (
        SELECT id FROM session_events WHERE at < cutoff ORDER BY at LIMIT batch);
    GET DIAGNOSTICS m = ROW_COUNT; n := n + m;
    DELETE FROM agent_messages WHERE id IN (
        SELECT id FROM agent_messages WHERE at < cutoff ORDER BY at LIMIT batch);
    GET DIAGNOSTICS m = ROW_COUNT; n := n + m;
    DELETE FROM agent_summaries WHERE id IN (
        SELECT id FROM agent_summaries WHERE at < cutoff ORDER BY at LIMIT batch);
    GET DIAGNOSTICS m = ROW_COUNT; n := n + m;
    DELETE FROM turn_requests WHERE id IN (
        SELECT id FROM turn_requests
         WHERE created_at < cutoff AND (turn_id IS NOT NULL OR dropped_at IS NOT NULL)
         ORDER BY created_at LIMIT batch);
    GET DIAGNOSTICS m = ROW_COUNT; n := n + m;
    DELETE FROM recalled_messages WHERE message_id IN (
        SELECT message_id FROM recalled_messages WHERE recalled_at < cutoff LIMIT batch);
    GET DIAGNOSTICS m = ROW_COUNT; n := n + m;
    PERFORM set_config('sshmode.content_change', '', true);
    RETURN n;
END
$$ LANGUAGE plpgsql;

-- One message's content, everywhere it was stored, replaced by `mark`: its event-log entries
-- (`text`), the turn request's text and the conversation's user row holding it, the inbox's
-- copy of the event, the summaries quoting it, and its kept images (deleted). Audited
-- (`content.redact`). Returns what it touched, with the section and the turn request's state.
CREATE FUNCTION sshmode_redact_message(p_message TEXT, p_actor TEXT, p_mark TEXT)
RETURNS JSONB AS $$
DECLARE
    req RECORD;
    v_section TEXT;
    n_events BIGINT := 0;
    n_transcript BIGINT := 0;
    n_requests BIGINT := 0;
    n_inbox BIGINT := 0;
    n_images BIGINT := 0;
    n_summaries BIGINT := 0;
    result JSONB;
BEGIN
    PERFORM set_config('sshmode.content_change', 'on', true);
    SELECT section_id, turn_id, text INTO req FROM turn_requests WHERE message_id = p_message;
    v_section := req.section_id;
    IF v_section IS NULL THEN
        SELECT section INTO v_section FROM inbox_events WHERE message_id = p_message;
    END IF;
    IF v_section IS NOT NULL THEN
        UPDATE session_events SET payload = payload || jsonb_build_object('text', p_mark)
         WHERE section_id = v_section AND payload->>'message_id' = p_message
           AND payload ? 'text' AND payload->>'text' IS DISTINCT FROM p_mark;
        GET DIAGNOSTICS n_events = ROW_COUNT;
    END IF;
    IF req.text IS NOT NULL AND req.text <> p_mark THEN
        IF req.turn_id IS NOT NULL THEN
            UPDATE agent_messages SET message = jsonb_set(message, '{content}', to_jsonb(p_mark))
             WHERE section_id = req.section_id AND turn_id = req.turn_id AND kind = 'user'
               AND message->>'content' = req.text;
            GET DIAGNOSTICS n_transcript = ROW_COUNT;
        END IF;
        UPDATE agent_summaries SET summary = replace(summary, req.text, p_mark)
         WHERE section_id = req.section_id AND strpos(summary, req.text) > 0;
        GET DIAGNOSTICS n_summaries = ROW_COUNT;
        UPDATE turn_requests SET text = p_mark WHERE message_id = p_message;
        GET DIAGNOSTICS n_requests = ROW_COUNT;
    END IF;
    UPDATE inbox_events
       SET payload = jsonb_set(payload, '{event,message,content}',
                               to_jsonb(jsonb_build_object('text', p_mark)::text))
     WHERE message_id = p_message AND payload #> '{event,message,content}' IS NOT NULL
       AND payload #>> '{event,message,content}' <> jsonb_build_object('text', p_mark)::text;
    GET DIAGNOSTICS n_inbox = ROW_COUNT;
    DELETE FROM message_images WHERE message_id = p_message;
    GET DIAGNOSTICS n_images = ROW_COUNT;
    PERFORM set_config('sshmode.content_change', '', true);
    result := jsonb_build_object(
        'section', v_section, 'events', n_events, 'transcript', n_transcript,
        'summaries', n_summaries, 'requests', n_requests, 'inbox', n_inbox,
        'images', n_images);
    INSERT INTO audit_log (actor, action, subject, detail, section, outcome)
    VALUES (p_actor, 'content.redact', p_message, result, v_section, 'ok');
    RETURN result;
END
$$ LANGUAGE plpgsql;

-- A chat's content (`p_chat`), or a person's (`p_person`, their direct chats with the bot
-- wholly): event logs, conversations and summaries of the chat's sections deleted, the text of
-- its turn requests replaced by `mark`, its inbox rows deleted (a pending one's text replaced),
-- its images, notes and file records deleted. For a person in other chats: the text of what
-- they sent replaced wherever it was stored. Audit rows stay. Audited (`content.erase`).
-- Returns what it touched, with the sections erased whole and the files to remove.
CREATE FUNCTION sshmode_erase_content(p_chat TEXT, p_person TEXT, p_actor TEXT, p_mark TEXT)
RETURNS JSONB AS $$
DECLARE
    chats TEXT[];
    sections TEXT[];
    files JSONB;
    n_events BIGINT := 0;
    n_transcript BIGINT := 0;
    n_requests BIGINT := 0;
    n_inbox BIGINT := 0;
    n_images BIGINT := 0;
    n_notes BIGINT := 0;
    m BIGINT;
    result JSONB;
BEGIN
    IF (p_chat IS NULL) = (p_person IS NULL) THEN
        RAISE EXCEPTION 'erase takes a chat or a person';
    END IF;
    PERFORM set_config('sshmode.content_change', 'on', true);
    IF p_chat IS NOT NULL THEN
        chats := ARRAY[p_chat];
    ELSE
        -- A person's direct chats with the bot are theirs whole.
        chats := ARRAY(SELECT DISTINCT r.chat_id FROM turn_requests r
                        JOIN direct_chats d ON d.chat_id = r.chat_id
                       WHERE r.sender = p_person);
    END IF;
    sections := ARRAY(
        SELECT c FROM unnest(chats) c
        UNION SELECT section_id FROM turn_requests WHERE chat_id = ANY(chats)
        UNION SELECT section_id FROM turns WHERE chat_id = ANY(chats)
        UNION SELECT thread_id FROM bot_threads WHERE chat_id = ANY(chats));
    files := COALESCE((SELECT jsonb_agg(jsonb_build_object('backend', backend, 'path', path))
                         FROM message_files
                        WHERE section_id = ANY(sections)
                           OR message_id IN (SELECT message_id FROM turn_requests
                                              WHERE sender = p_person)), '[]'::jsonb);

    DELETE FROM session_events WHERE section_id = ANY(sections);
    GET DIAGNOSTICS n_events = ROW_COUNT;
    DELETE FROM agent_messages WHERE section_id = ANY(sections);
    GET DIAGNOSTICS n_transcript = ROW_COUNT;
    DELETE FROM agent_summaries WHERE section_id = ANY(sections);
    DELETE FROM message_images WHERE message_id IN (
        SELECT message_id FROM turn_requests WHERE section_id = ANY(sections) OR sender = p_person);
    GET DIAGNOSTICS n_images = ROW_COUNT;
    DELETE FROM memory_notes WHERE chat_id = ANY(chats);
    GET DIAGNOSTICS n_notes = ROW_COUNT;
    DELETE FROM inbox_events WHERE section = ANY(sections) AND state <> 'pending';
    GET DIAGNOSTICS n_inbox = ROW_COUNT;

    IF p_person IS NOT NULL THEN
        -- What they sent in chats shared with others: its text, wherever it was stored.
        UPDATE agent_messages a SET message = jsonb_set(a.message, '{content}', to_jsonb(p_mark))
          FROM turn_requests r
         WHERE r.sender = p_person AND r.turn_id IS NOT NULL AND a.turn_id = r.turn_id
           AND a.section_id = r.section_id AND a.kind = 'user'
           AND a.message->>'content' = r.text;
        GET DIAGNOSTICS m = ROW_COUNT; n_transcript := n_transcript + m;
        UPDATE session_events SET payload = payload || jsonb_build_object('text', p_mark)
         WHERE payload->>'sender' = p_person AND payload ? 'text';
        GET DIAGNOSTICS m = ROW_COUNT; n_events := n_events + m;
        DELETE FROM inbox_events
         WHERE payload #>> '{event,sender,sender_id,open_id}' = p_person AND state <> 'pending';
        GET DIAGNOSTICS m = ROW_COUNT; n_inbox := n_inbox + m;
    END IF;
    UPDATE inbox_events
       SET payload = jsonb_set(payload, '{event,message,content}',
                               to_jsonb(jsonb_build_object('text', p_mark)::text))
     WHERE state = 'pending' AND payload #> '{event,message,content}' IS NOT NULL
       AND (section = ANY(sections) OR payload #>> '{event,sender,sender_id,open_id}' = p_person);
    GET DIAGNOSTICS m = ROW_COUNT; n_inbox := n_inbox + m;
    UPDATE turn_requests SET text = p_mark
     WHERE (section_id = ANY(sections) OR sender = p_person) AND text <> p_mark;
    GET DIAGNOSTICS n_requests = ROW_COUNT;
    DELETE FROM message_files
     WHERE section_id = ANY(sections)
        OR message_id IN (SELECT message_id FROM turn_requests WHERE sender = p_person);
    PERFORM set_config('sshmode.content_change', '', true);

    result := jsonb_build_object(
        'events', n_events, 'transcript', n_transcript, 'requests', n_requests,
        'inbox', n_inbox, 'images', n_images, 'notes', n_notes);
    INSERT INTO audit_log (actor, action, subject, detail, outcome)
    VALUES (p_actor, 'content.erase', COALESCE(p_chat, p_person),
            result || jsonb_build_object('chat', p_chat, 'person', p_person,
                                         'sections', to_jsonb(sections)), 'ok');
    RETURN result || jsonb_build_object('sections', to_jsonb(sections), 'files', files);
END
$$ LANGUAGE plpgsql;
