-- Control-plane foundations: the audit trail and the per-section event log.
-- Both are append-only; a trigger refuses UPDATE and DELETE on them.

CREATE FUNCTION sshmode_forbid_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
END
$$ LANGUAGE plpgsql;

CREATE TABLE audit_log (
    id       BIGSERIAL PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor    TEXT NOT NULL,            -- open_id, 'cli', 'model:<section>', 'system'
    action   TEXT NOT NULL,            -- dotted: target.add, binding.set, hostkey.mismatch, …
    subject  TEXT NOT NULL,            -- what it acted on: a target alias, a section id, …
    detail   JSONB NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_subject ON audit_log (subject, at);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION sshmode_forbid_change();

CREATE TABLE session_events (
    id          BIGSERIAL PRIMARY KEY,
    section_id  TEXT NOT NULL,         -- thread_id (omt_…) or chat_id (oc_…)
    seq         BIGINT NOT NULL,       -- 1, 2, 3 … within the section
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    kind        TEXT NOT NULL,
    payload     JSONB NOT NULL,
    UNIQUE (section_id, seq)
);
CREATE TRIGGER session_events_append_only BEFORE UPDATE OR DELETE ON session_events
    FOR EACH ROW EXECUTE FUNCTION sshmode_forbid_change();
