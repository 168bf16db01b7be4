-- Sections and order in the inbox, and the state of SSH Mode in chats: bindings, pending
-- bindings, grants, the target allow-list, approval cards and card decisions. The audit log
-- gains columns for the section, the target and the outcome of a chat-side change.

-- Inbox: the section (thread_id, else chat_id) and message_id are taken from the verified
-- envelope; `seq` is the recording order the INSERT assigns. Express events (/stop, card
-- actions) are never held behind their section.
ALTER TABLE inbox_events
    ADD COLUMN seq        BIGSERIAL,
    ADD COLUMN section    TEXT,
    ADD COLUMN message_id TEXT,
    ADD COLUMN express    BOOLEAN NOT NULL DEFAULT false;
-- A message redelivered under a new event id acts once.
CREATE UNIQUE INDEX inbox_events_message ON inbox_events (message_id) WHERE message_id IS NOT NULL;
-- "Is there an older unfinished ordered event of this section?"
CREATE INDEX inbox_events_section_seq ON inbox_events (section, seq)
    WHERE state = 'pending' AND NOT express;

-- One alias rule: letters, digits, `.`, `_`, `-`, a letter or digit first, at most 63
-- (the existing CHECK), and never a reserved word. NOT VALID: rows from before are kept.
ALTER TABLE targets ADD CONSTRAINT targets_alias_not_reserved
    CHECK (lower(alias) NOT IN ('all', 'local', 'off', 'help')) NOT VALID;

-- An optional allow-list of chats per target; a target without rows is usable in every chat.
CREATE TABLE target_chats (
    alias   TEXT NOT NULL REFERENCES targets (alias) ON DELETE CASCADE,
    chat_id TEXT NOT NULL,
    PRIMARY KEY (alias, chat_id)
);

-- Live grants: `/ssh yolo on <alias>|all` in one section. Closed (revoked or expired) rows stay
-- for the record; at most one open grant per section and scope.
CREATE TABLE grants (
    id          BIGSERIAL PRIMARY KEY,
    section     TEXT NOT NULL,
    scope       TEXT NOT NULL,            -- a target alias, or '*' for all
    granted_by  TEXT NOT NULL,
    granted_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    closed_at   TIMESTAMPTZ,
    closed_by   TEXT,
    CHECK (expires_at > granted_at)
);
CREATE UNIQUE INDEX grants_one_open ON grants (section, scope) WHERE closed_at IS NULL;

-- One binding per section. A sticky binding is a user's; a model-made one names the grant that
-- allowed it and lives no longer than that grant.
CREATE TABLE bindings (
    section   TEXT PRIMARY KEY,
    -- No foreign key: a removed target leaves its threads bound to a name that fails, never
    -- quietly local (invariant 2).
    alias     TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('sticky', 'model')),
    owner     TEXT NOT NULL,              -- open_id of the user, or 'model'
    bound_at  TIMESTAMPTZ NOT NULL,
    grant_id  BIGINT REFERENCES grants (id),
    CHECK ((kind = 'model') = (grant_id IS NOT NULL))
);

-- `/ssh use` in a parent chat, between the reply request and its answer: keyed by the user's
-- message id, which becomes the new thread's root_id.
CREATE TABLE pending_bindings (
    root_message_id TEXT PRIMARY KEY,
    chat_id         TEXT NOT NULL,
    alias           TEXT NOT NULL,
    owner           TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL
);

-- Approval cards sent to admins for a pending target (one per target generation and admin).
CREATE TABLE approval_cards (
    generation  BIGINT NOT NULL,
    alias       TEXT NOT NULL,
    admin       TEXT NOT NULL,
    message_id  TEXT,
    sent_at     TIMESTAMPTZ,
    created_at  TIMESTAMPTZ NOT NULL,
    decided_by  TEXT,
    decision    TEXT,
    decided_at  TIMESTAMPTZ,
    PRIMARY KEY (generation, admin)
);
CREATE INDEX approval_cards_message ON approval_cards (message_id);

-- Card clicks acted on: a duplicate (same message, operator and value) acts once.
CREATE TABLE card_decisions (
    message_id TEXT NOT NULL,
    operator   TEXT NOT NULL,
    value      TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (message_id, operator, value)
);

ALTER TABLE audit_log
    ADD COLUMN section TEXT,
    ADD COLUMN target  TEXT,
    ADD COLUMN outcome TEXT;
CREATE INDEX audit_log_section ON audit_log (section, at) WHERE section IS NOT NULL;
