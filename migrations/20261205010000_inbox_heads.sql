-- Claims driven by section heads. An ordered event is claimed only as its section's head, found
-- through `inbox_events_section_seq`; express and unsectioned events (which never wait) get an
-- index of their own, so that no claim walks the ordered events queued behind a leased head
-- (which `inbox_events_ready` holds, all of them due).
CREATE INDEX inbox_events_free ON inbox_events (available_at)
    WHERE state = 'pending' AND (express OR section IS NULL);
