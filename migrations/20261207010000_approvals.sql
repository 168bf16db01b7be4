-- Approvals in chat: a tool call the guard asks about is parked here until a person decides,
-- the wait times out, or /stop ends it. While a call of a running turn waits (and its deadline
-- has not passed, and no stop is requested), no runner claims the section: the turn holds no
-- lease and no worker, and the section stays occupied (its turn is still `running`).

CREATE TABLE call_approvals (
    turn_id          BIGINT NOT NULL REFERENCES turns (id),
    -- The call's key in `agent_messages.call_id` ('<assistant row id>:<call id>').
    call_key         TEXT NOT NULL,
    section_id       TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'waiting'
                     CHECK (state IN ('waiting', 'allowed', 'denied', 'expired', 'stopped')),
    -- For 'allowed': 'once' or 'thread' (the same command shape, in this thread, until the
    -- thread's yolo TTL).
    scope            TEXT CHECK (scope IN ('once', 'thread')),
    command          TEXT NOT NULL,
    -- The command's shape (`shell::shape`): what an allowance in this thread covers. NULL when
    -- it has none (it then covers nothing but itself).
    shape            TEXT,
    -- For scope 'thread': the allowance holds until then (the yolo TTL; `/ssh yolo off` ends
    -- it at once).
    thread_until     TIMESTAMPTZ,
    reason           TEXT NOT NULL,
    -- Where it would run (`local`, `web · deploy@10.0.0.5`) and in which directory.
    location         TEXT NOT NULL,
    cwd              TEXT NOT NULL,
    -- The sender of the turn's latest message, and who may answer: 'admins' or 'requester'.
    requester        TEXT NOT NULL,
    approvers        TEXT NOT NULL CHECK (approvers IN ('admins', 'requester')),
    deadline         TIMESTAMPTZ NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    decided_by       TEXT,
    decided_at       TIMESTAMPTZ,
    -- Set, before the call runs, once it was allowed: an approved call with this set and no
    -- result has an unknown outcome and is never run again.
    started_at       TIMESTAMPTZ,
    -- The card's message id, once posted (a resumed runner never posts it twice).
    card_message_id  TEXT,
    PRIMARY KEY (turn_id, call_key)
);
CREATE INDEX call_approvals_waiting ON call_approvals (section_id) WHERE state = 'waiting';
CREATE INDEX call_approvals_thread ON call_approvals (section_id, shape) WHERE scope = 'thread';

-- Set when a turn parks a call; the claim that resumes it after the decision is not counted
-- as another attempt.
ALTER TABLE turns ADD COLUMN parked BOOLEAN NOT NULL DEFAULT false;

-- Per target: who answers its approval cards, and what a command the guard asks about does
-- there ('ask' a person, 'refuse' it, 'allow' it without asking).
ALTER TABLE targets
    ADD COLUMN approvers TEXT NOT NULL DEFAULT 'admins' CHECK (approvers IN ('admins', 'requester')),
    ADD COLUMN risky TEXT NOT NULL DEFAULT 'ask' CHECK (risky IN ('ask', 'refuse', 'allow'));
