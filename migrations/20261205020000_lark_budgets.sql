-- Lark's call budgets for the whole deployment, not per process: one GCRA bucket per key
-- (the app, the app's message APIs, a chat), shared by every replica. `tat` is the bucket's
-- theoretical arrival time on the database's clock, so replicas need no clock agreement. A
-- row whose `tat` has passed is as good as no row, so idle rows may be deleted at any time.
CREATE TABLE lark_budgets (
    key TEXT PRIMARY KEY,
    tat TIMESTAMPTZ NOT NULL
);

-- Takes one call's place in every bucket of `keys` at one instant: the earliest at which each
-- bucket has room (`tat - tolerance`), so that no bucket is ever granted two calls closer than
-- its rate allows. Returns the seconds to wait before sending (>= 0) when the place is within
-- `horizon` seconds, else takes nothing and returns minus the seconds until it would be
-- (< 0). Rows are locked in key order, so concurrent takers never deadlock.
CREATE FUNCTION lark_budget_take(
    keys TEXT[], steps DOUBLE PRECISION[], tolerances DOUBLE PRECISION[],
    horizon DOUBLE PRECISION
) RETURNS DOUBLE PRECISION LANGUAGE plpgsql AS $$
DECLARE
    now_ts TIMESTAMPTZ := clock_timestamp();
    at_ts TIMESTAMPTZ := clock_timestamp();
    r RECORD;
BEGIN
    INSERT INTO lark_budgets (key, tat)
        SELECT k, now_ts FROM unnest(keys) AS k ORDER BY k
        ON CONFLICT DO NOTHING;
    FOR r IN
        SELECT b.tat, k.tolerance
        FROM lark_budgets b JOIN unnest(keys, tolerances) AS k(key, tolerance) ON b.key = k.key
        ORDER BY b.key FOR UPDATE OF b
    LOOP
        at_ts := GREATEST(at_ts, r.tat - make_interval(secs => r.tolerance));
    END LOOP;
    IF at_ts > now_ts + make_interval(secs => horizon) THEN
        RETURN -extract(epoch FROM at_ts - now_ts);
    END IF;
    UPDATE lark_budgets b SET tat = GREATEST(b.tat, at_ts) + make_interval(secs => k.step)
        FROM unnest(keys, steps) AS k(key, step) WHERE b.key = k.key;
    RETURN extract(epoch FROM at_ts - now_ts);
END $$;
