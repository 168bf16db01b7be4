-- A turn whose call waits for a person's approval reads `awaiting_approval` (it was `running`
-- with `parked` set). It keeps its section occupied as a running turn does: one running or
-- awaiting turn per section. On resume it is `running` again, and that claim is not counted as
-- another attempt. The state replaces the `parked` flag.

ALTER TABLE turns DROP CONSTRAINT turns_state_check;
ALTER TABLE turns ADD CONSTRAINT turns_state_check
    CHECK (state IN ('running', 'awaiting_approval', 'done', 'failed', 'stopped', 'bounded'));

DROP INDEX turns_one_running;
CREATE UNIQUE INDEX turns_one_running ON turns (section_id)
    WHERE state IN ('running', 'awaiting_approval');

UPDATE turns SET state = 'awaiting_approval' WHERE state = 'running' AND parked;
ALTER TABLE turns DROP COLUMN parked;

-- A waiting call whose card is not recorded yet (its post failed, or its runner died before
-- recording it) does not keep its section parked: a runner claims the section again and the
-- resumed turn posts the card (idempotent per turn and call, so a post that did land is not
-- repeated). After a failed post the next try waits until `card_retry_at` (backing off with
-- `card_tries`).
ALTER TABLE call_approvals
    ADD COLUMN card_tries INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN card_retry_at TIMESTAMPTZ;
