-- Agent turns: durable requests, one running turn per section across replicas, and the stored
-- conversation every step of a turn is written to before the next one starts.
--
-- A section's row in `turn_sections` is its lease: a runner holds it while `lease_until` is in
-- the future; every claim bumps `generation`, and every write of a turn checks the generation it
-- was claimed with (FOR SHARE on this row), so a runner that lost its lease cannot write.

CREATE TABLE turn_sections (
    section_id   TEXT PRIMARY KEY,
    -- Bumped by every claim: the fencing token of the holder.
    generation   BIGINT NOT NULL DEFAULT 0,
    holder       TEXT,
    lease_until  TIMESTAMPTZ,
    -- Queued requests or a running turn exist (kept true while a holder works; recomputed at
    -- release under the row lock, so an enqueue racing a release is never lost).
    pending      BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX turn_sections_pending ON turn_sections (section_id) WHERE pending;

CREATE TABLE turns (
    id                 BIGSERIAL PRIMARY KEY,
    section_id         TEXT NOT NULL,
    chat_id            TEXT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running'
                       CHECK (state IN ('running', 'done', 'failed', 'stopped', 'bounded')),
    started_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at           TIMESTAMPTZ,
    -- Wall-clock time spent running, across every runner that held it (the turn budget).
    spent_ms           BIGINT NOT NULL DEFAULT 0,
    -- Claims of this turn (1 = never resumed); bounded.
    attempts           INTEGER NOT NULL DEFAULT 0,
    stop_requested_at  TIMESTAMPTZ,
    stop_requested_by  TEXT,
    -- How it ended, in a sentence (for the log and the answer).
    outcome            TEXT,
    -- Set once the final answer has been sent (a resumed turn does not send it again).
    answered_at        TIMESTAMPTZ
);
CREATE UNIQUE INDEX turns_one_running ON turns (section_id) WHERE state = 'running';

CREATE TABLE turn_requests (
    id                 BIGSERIAL PRIMARY KEY,
    section_id         TEXT NOT NULL,
    message_id         TEXT NOT NULL UNIQUE,
    chat_id            TEXT NOT NULL,
    sender             TEXT NOT NULL,
    text               TEXT NOT NULL,
    in_thread          BOOLEAN NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The turn that took this request; NULL while it waits.
    turn_id            BIGINT REFERENCES turns (id),
    -- Set by a second /stop: the request will not run.
    dropped_at         TIMESTAMPTZ,
    -- The receipt reaction's id (to remove it at the end) and the final reaction.
    receipt_reaction   TEXT,
    final_reaction     TEXT
);
CREATE INDEX turn_requests_waiting ON turn_requests (section_id, id)
    WHERE turn_id IS NULL AND dropped_at IS NULL;

-- The conversation of a section: user, assistant, tool messages (OpenAI wire shape) and the
-- start marks of tool calls. Append-only: context compaction never deletes from it.
CREATE TABLE agent_messages (
    id          BIGSERIAL PRIMARY KEY,
    section_id  TEXT NOT NULL,
    turn_id     BIGINT NOT NULL REFERENCES turns (id),
    -- 'user', 'assistant', 'tool', or 'tool_started' (a call about to run; not sent to the model).
    kind        TEXT NOT NULL CHECK (kind IN ('user', 'assistant', 'tool', 'tool_started')),
    -- For 'tool' and 'tool_started': the call's id.
    call_id     TEXT,
    message     JSONB NOT NULL,
    bytes       INTEGER NOT NULL,
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX agent_messages_section ON agent_messages (section_id, id);
CREATE UNIQUE INDEX agent_messages_one_result ON agent_messages (turn_id, call_id, kind)
    WHERE call_id IS NOT NULL;
CREATE TRIGGER agent_messages_append_only BEFORE UPDATE OR DELETE ON agent_messages
    FOR EACH ROW EXECUTE FUNCTION sshmode_forbid_change();

-- Summaries of the oldest part of a section's conversation: messages up to `through_id` are
-- represented by `summary` in the context. Stored before those messages leave the context.
CREATE TABLE agent_summaries (
    id          BIGSERIAL PRIMARY KEY,
    section_id  TEXT NOT NULL,
    through_id  BIGINT NOT NULL,
    summary     TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX agent_summaries_section ON agent_summaries (section_id, through_id);

-- A section's working directory per backend ('local' or a target alias), so a restart or
-- another replica continues where the last command left off.
CREATE TABLE section_cwds (
    section_id  TEXT NOT NULL,
    backend     TEXT NOT NULL,
    dir         TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (section_id, backend)
);
