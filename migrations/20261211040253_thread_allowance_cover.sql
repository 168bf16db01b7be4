-- "Allow in this thread" no longer covers every command of the same shape. A later call is
-- covered when its cover key (`shell::cover`: operands that are data — paths of the same
-- class, names — may differ; code, URLs fed to a shell and other path classes never do; the
-- call's environment and, where it matters, its directory are part of it) equals the allowed
-- call's. Expand-only: the new columns are added beside `shape`, which is no longer written
-- (NULL), so the previous version, which compares `shape`, takes no new row for an allowance.
-- A row without `cover` (written before) covers only its own command, in its directory, for a
-- call without environment variables of its own.
ALTER TABLE call_approvals
    -- SHA-256 (hex) of the cover key.
    ADD COLUMN cover TEXT,
    -- What the allowance covers, as the approval card says it.
    ADD COLUMN covers TEXT;
CREATE INDEX call_approvals_cover ON call_approvals (section_id, cover) WHERE scope = 'thread';
