-- Threads the bot takes part in: it opened them (`/ssh use` in a parent chat) or answered in
-- them. Every message in such a thread is for the agent, with or without an @mention (Lark
-- delivers those only with the `im:message.group_msg` scope).
CREATE TABLE bot_threads (
    thread_id  TEXT PRIMARY KEY,
    chat_id    TEXT NOT NULL,
    -- How the bot came in: 'opened' or 'answered' (the first one is kept).
    reason     TEXT NOT NULL CHECK (reason IN ('opened', 'answered')),
    since      TIMESTAMPTZ NOT NULL
);
