-- Claimable heads: one row per section that has an unfinished ordered event (pending, not
-- express), kept by the inbox's writes. A claim reads the rows due now through
-- `inbox_sections_due` and finds each one's head from `floor`, so its cost follows the
-- sections it can claim, not the busy (leased) ones nor the events queued behind their heads.
--
-- The write that records a section's first unfinished event inserts the row (that write wakes
-- a worker); a claim moves `available_at` to the end of its lease; `inbox_finish`, run by the
-- worker holding the section, marks its run done and moves the row to the next head, or
-- deletes it when the section has nothing unfinished. Writes in flight hold their sections'
-- rows `FOR KEY SHARE`, and `inbox_finish` takes `FOR UPDATE` before it looks for the next
-- head, so it sees every event those writes recorded and never deletes a row an event needs.
CREATE TABLE inbox_sections (
    section      TEXT PRIMARY KEY,
    -- No unfinished ordered event of the section has a smaller seq (a write whose events
    -- commit after the floor passed them lowers it).
    floor        BIGINT NOT NULL,
    -- When its head may next be claimed: the head's own time, or a lease's end while held.
    available_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX inbox_sections_due ON inbox_sections (available_at);

INSERT INTO inbox_sections (section, floor, available_at)
SELECT DISTINCT ON (section) section, seq, available_at FROM inbox_events
WHERE state = 'pending' AND NOT express AND section IS NOT NULL
ORDER BY section, seq;

-- Marks a run's events done (each with the attempts it was handled as) and lets go of the
-- sections `held`: each moves to its next unfinished event, with that event's time, or is
-- deleted when there is none. One call, so the done marks and the hand-over commit together.
CREATE FUNCTION inbox_finish(done_ids TEXT[], done_attempts INT[], held TEXT[], done_at TIMESTAMPTZ)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE inbox_events e SET state = 'done', finished_at = done_at, last_error = NULL,
           attempts = GREATEST(e.attempts, d.n)
      FROM UNNEST(done_ids, done_attempts) AS d(id, n)
     WHERE e.event_id = d.id AND e.state = 'pending';
    -- Waits for the writes in flight to these sections (they hold their rows FOR KEY SHARE);
    -- the next statements take a new snapshot, which sees what those writes recorded.
    PERFORM 1 FROM inbox_sections WHERE section = ANY (held) ORDER BY section FOR UPDATE;
    UPDATE inbox_sections s SET floor = h.seq, available_at = h.available_at
      FROM inbox_sections c CROSS JOIN LATERAL (
           SELECT e.seq, e.available_at FROM inbox_events e
            WHERE e.section = c.section AND e.seq >= c.floor
              AND e.state = 'pending' AND NOT e.express
            ORDER BY e.seq LIMIT 1) h
     WHERE c.section = ANY (held) AND s.section = c.section;
    DELETE FROM inbox_sections s
     WHERE s.section = ANY (held) AND NOT EXISTS (
           SELECT 1 FROM inbox_events e
            WHERE e.section = s.section AND e.seq >= s.floor
              AND e.state = 'pending' AND NOT e.express);
END $$;
