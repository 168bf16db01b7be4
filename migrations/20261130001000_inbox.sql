-- The durable inbox: every verified Lark callback is recorded here before it is acknowledged.
-- `event_id` (v2 header.event_id, v1 uuid) de-duplicates redeliveries. A row is claimed by
-- moving `available_at` past the lease (FOR UPDATE SKIP LOCKED); a failure moves it to the
-- backoff time; too many failures move it to 'dead'. Done rows are deleted after the
-- de-duplication retention.

CREATE TABLE inbox_events (
    event_id      TEXT PRIMARY KEY,
    event_type    TEXT NOT NULL,
    payload       JSONB NOT NULL,          -- the decrypted envelope, verification token removed
    received_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    state         TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    available_at  TIMESTAMPTZ NOT NULL DEFAULT now(),  -- pending: when it may next be claimed
    last_error    TEXT,
    finished_at   TIMESTAMPTZ
);
CREATE INDEX inbox_events_ready ON inbox_events (available_at) WHERE state = 'pending';
CREATE INDEX inbox_events_finished ON inbox_events (finished_at) WHERE state = 'done';
