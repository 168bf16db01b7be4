-- Marking a run's events done joined the array of ids with the table; the function's cached
-- generic plan did that by reading the section's pending events, not the ids' rows (18 ms a
-- call with a few thousand events queued, most of the workers' database time under load). The
-- ids now also select the rows by the primary key (`= ANY`), so the update reads only them.
CREATE OR REPLACE FUNCTION inbox_finish(done_ids TEXT[], done_attempts INT[], held TEXT[], done_at TIMESTAMPTZ)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE inbox_events e SET state = 'done', finished_at = done_at, last_error = NULL,
           attempts = GREATEST(e.attempts, d.n)
      FROM UNNEST(done_ids, done_attempts) AS d(id, n)
     WHERE e.event_id = ANY (done_ids) AND e.event_id = d.id AND e.state = 'pending';
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
