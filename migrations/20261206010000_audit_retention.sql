-- Audit retention. The audit trail stays append-only — no UPDATE, no DELETE — except for one
-- purge: `sshmode_audit_purge(keep_days, batch)` deletes up to `batch` rows older than
-- `keep_days` days (at least 1). It marks its own transaction (`sshmode.audit_purge_days`,
-- SET LOCAL), and the guard lets a DELETE through only while that mark is set and only for a
-- row older than the marked age; any other DELETE, and every UPDATE, is refused as before.
--
-- Executed commands are audited too (action `command.run`: target, section, actor, command,
-- exit, duration), so `at` gets its own index for the purge and for `sshmode audit list --since`.

CREATE INDEX audit_log_at ON audit_log (at);

CREATE FUNCTION sshmode_audit_guard() RETURNS trigger AS $$
DECLARE
    marked TEXT := current_setting('sshmode.audit_purge_days', true);
BEGIN
    IF TG_OP = 'DELETE' AND marked IS NOT NULL AND marked <> ''
       AND OLD.at < now() - make_interval(days => marked::int) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
END
$$ LANGUAGE plpgsql;

CREATE FUNCTION sshmode_audit_purge(keep_days INTEGER, batch INTEGER) RETURNS BIGINT AS $$
DECLARE
    n BIGINT;
BEGIN
    IF keep_days IS NULL OR keep_days < 1 THEN
        RAISE EXCEPTION 'audit retention must be at least one day, not %', keep_days;
    END IF;
    PERFORM set_config('sshmode.audit_purge_days', keep_days::text, true);
    DELETE FROM audit_log
     WHERE id IN (SELECT id FROM audit_log
                   WHERE at < now() - make_interval(days => keep_days)
                   ORDER BY at LIMIT batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('sshmode.audit_purge_days', '', true);
    RETURN n;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER audit_log_append_only ON audit_log;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION sshmode_audit_guard();
