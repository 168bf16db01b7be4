-- Scheduled turns: `/cron add` in a thread (or a one-to-one chat), fired by whichever replica
-- claims the due row first. The row's `next_due` and the firing's inbox event are written in
-- one transaction, the event keyed by schedule and due time, so a due time fires once.
CREATE TABLE schedules (
    id              BIGSERIAL PRIMARY KEY,
    chat_id         TEXT NOT NULL,
    -- The section the turns run in: a thread, or a one-to-one chat itself.
    section_id      TEXT NOT NULL,
    -- The thread's root message, which an anchor message replies to in the thread (NULL for a
    -- chat's own section: the anchor is sent to the chat).
    root_message_id TEXT,
    in_thread       BOOLEAN NOT NULL,
    -- A one-to-one chat's own section (its person manages its schedules).
    direct          BOOLEAN NOT NULL DEFAULT false,
    -- As written: a 5-field cron expression or `every <n>s|m|h|d`.
    spec            TEXT NOT NULL,
    -- The zone the expression is read in (`Area/City`), fixed when the schedule was added.
    tz              TEXT NOT NULL,
    prompt          TEXT NOT NULL,
    creator         TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    next_due        TIMESTAMPTZ NOT NULL,
    paused_at       TIMESTAMPTZ,
    paused_by       TEXT,
    paused_reason   TEXT,
    removed_at      TIMESTAMPTZ,
    -- The chat message that added it (`/cron add`): a retried message adds nothing twice.
    added_by_message TEXT UNIQUE,
    -- A firing was skipped because the previous run was still going, and the thread was told;
    -- cleared by the next firing that runs.
    skip_told       BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX schedules_due ON schedules (next_due) WHERE paused_at IS NULL AND removed_at IS NULL;
CREATE INDEX schedules_chat ON schedules (chat_id) WHERE removed_at IS NULL;

-- One row per due time fired (or `/cron run`): what became of it.
CREATE TABLE schedule_firings (
    schedule_id     BIGINT NOT NULL REFERENCES schedules (id),
    due_at          TIMESTAMPTZ NOT NULL,
    claimed_at      TIMESTAMPTZ NOT NULL,
    -- How late the claim was after the due time (downtime collapses into one late firing).
    late_ms         BIGINT NOT NULL DEFAULT 0,
    -- `queued` (the inbox event is written), `fired` (the anchor is posted and the turn
    -- queued), `skipped` (the previous run was still going), `paused` (the schedule no longer
    -- passes), `gone` (paused or removed before it fired).
    state           TEXT NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'fired', 'skipped', 'paused', 'gone')),
    -- The anchor message the turn answers (its turn request is keyed by it).
    anchor_message_id TEXT,
    -- Who asked for it now (`/cron run`), else NULL.
    run_by          TEXT,
    PRIMARY KEY (schedule_id, due_at)
);

-- A chat's time zone for new schedules (`/cron tz`).
CREATE TABLE chat_timezones (
    chat_id   TEXT PRIMARY KEY,
    tz        TEXT NOT NULL,
    set_by    TEXT NOT NULL,
    set_at    TIMESTAMPTZ NOT NULL
);

-- A schedule the model proposed, waiting for a person's click on its card.
CREATE TABLE schedule_proposals (
    id              BIGSERIAL PRIMARY KEY,
    chat_id         TEXT NOT NULL,
    section_id      TEXT NOT NULL,
    root_message_id TEXT,
    in_thread       BOOLEAN NOT NULL,
    direct          BOOLEAN NOT NULL DEFAULT false,
    spec            TEXT NOT NULL,
    tz              TEXT NOT NULL,
    prompt          TEXT NOT NULL,
    -- The sender of the turn that proposed it.
    asked_by        TEXT NOT NULL,
    proposed_at     TIMESTAMPTZ NOT NULL,
    card_message_id TEXT,
    -- `added` (with the schedule it became) or `cancelled`, by whom and when.
    decision        TEXT CHECK (decision IN ('added', 'cancelled')),
    decided_by      TEXT,
    decided_at      TIMESTAMPTZ,
    schedule_id     BIGINT REFERENCES schedules (id)
);

-- A turn request made by a firing: it runs as a turn of its own, never merged with people's
-- messages (its actor is the schedule's creator).
ALTER TABLE turn_requests ADD COLUMN schedule_id BIGINT;
CREATE INDEX turn_requests_schedule ON turn_requests (schedule_id) WHERE schedule_id IS NOT NULL;

-- A thread may get its owner by a schedule: the first person to add one in a thread nobody
-- owns.
ALTER TABLE section_owners DROP CONSTRAINT section_owners_how_check;
ALTER TABLE section_owners ADD CONSTRAINT section_owners_how_check
    CHECK (how IN ('opened', 'bound', 'scheduled'));

-- The one-to-one chats the bot has been asked something in: a chat's own section there is its
-- person's (who may confirm a schedule the model proposed in it).
CREATE TABLE direct_chats (
    chat_id  TEXT PRIMARY KEY,
    since    TIMESTAMPTZ NOT NULL
);
