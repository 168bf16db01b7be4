-- Marking a run's events done, one row at a time by its primary key. The set-based update
-- (`FROM UNNEST(done_ids, …)`, with or without `event_id = ANY (done_ids)`) is planned once,
-- generically, for the function; its plan may read the pending events through a partial index
-- on `state = 'pending'`, and under a steady stream that index holds every row updated since
-- the last vacuum: 6 ms a call with a few thousand events a second, most of the workers'
-- database time. An update by the key alone reads its one row, however the table looks.
CREATE OR REPLACE FUNCTION inbox_finish(done_ids TEXT[], done_attempts INT[], held TEXT[], done_at TIMESTAMPTZ)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(done_ids, 1), 0) LOOP
        UPDATE inbox_events SET state = 'done', finished_at = done_at, last_error = NULL,
               attempts = GREATEST(attempts, done_attempts[i])
         WHERE event_id = done_ids[i] AND state = 'pending';
    END LOOP;
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
