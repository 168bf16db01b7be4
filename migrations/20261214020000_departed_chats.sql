-- Chats the bot is no longer in: removed from them (`im.chat.member.bot.deleted_v1`) or
-- disbanded (`im.chat.disbanded_v1`). While a chat's row is here nothing is posted there; the
-- bot added back (`im.chat.member.bot.added_v1`) deletes it, and the chat starts clean.
CREATE SEQUENCE departed_chats_seq;
CREATE TABLE departed_chats (
    chat_id   TEXT PRIMARY KEY,
    reason    TEXT NOT NULL CHECK (reason IN ('removed', 'disbanded')),
    -- Who removed the bot or disbanded the chat (an open_id), when the event says.
    operator  TEXT,
    at        TIMESTAMPTZ NOT NULL,
    -- Taken anew at each departure: every replica follows departures in this order and
    -- closes what it holds of the chat (its interactive shells, the pooled connections of the
    -- targets the chat's bindings held).
    seq       BIGINT NOT NULL DEFAULT nextval('departed_chats_seq'),
    -- The targets whose bindings the departure released.
    released  TEXT[] NOT NULL DEFAULT '{}'
);
CREATE INDEX departed_chats_by_seq ON departed_chats (seq);
