-- What each running process is: its version and the newest migration it carries, written with
-- its heartbeat. Nullable: a replica of a version from before this column keeps writing its
-- heartbeat without it during a rolling upgrade (`sshmode doctor` shows it as earlier).
ALTER TABLE replicas ADD COLUMN version TEXT;
