-- Jump hosts: a target may be reached through another registered target (`target add …
-- --jump <alias>`), whose pooled connection carries a `direct-tcpip` channel to it. Chains are
-- allowed; the service refuses a loop when a jump is set and bounds the hops when connecting.
-- A jump host cannot be removed while a target is reached through it (RESTRICT): remove or
-- move those targets first (`target set <alias> --jump …|--no-jump`).
ALTER TABLE targets ADD COLUMN jump TEXT REFERENCES targets (alias) ON DELETE RESTRICT;
ALTER TABLE targets ADD CONSTRAINT targets_jump_not_self CHECK (jump IS NULL OR jump <> alias);
CREATE INDEX targets_jump ON targets (jump) WHERE jump IS NOT NULL;
