-- Lark counts its frequency limits per API, per second and per minute. The per-second part is a
-- GCRA bucket in `lark_budgets` (one per API, per chat); the per-minute part is an allowance
-- over a sliding window, in which a burst is allowed as long as the window's total stays under
-- the allowance. A window is kept as calls per second of the database's clock: `counts[1]` is
-- the second `base` (whole seconds since the epoch), `counts[i]` the second `base + i - 1`;
-- seconds that have left the window are dropped on the next take, so an idle row holds
-- nothing and may be deleted at any time.
CREATE TABLE lark_budget_windows (
    key TEXT PRIMARY KEY,
    base BIGINT NOT NULL,
    counts INTEGER[] NOT NULL
);

-- Takes one call's place in every GCRA bucket of `keys` (as `lark_budget_take` does) and in
-- every window of `window_keys` (at most `window_max` calls within any `window_secs` seconds,
-- the calls already booked ahead counted too) at one instant. Returns the seconds to wait
-- before sending (>= 0) when the place is within `horizon` seconds and every window has room,
-- else takes nothing and returns minus the seconds until it might be (< 0). Buckets are
-- locked before windows, each in key order, so concurrent takers never deadlock.
CREATE FUNCTION lark_budget_take_windowed(
    keys TEXT[], steps DOUBLE PRECISION[], tolerances DOUBLE PRECISION[],
    window_keys TEXT[], window_secs INTEGER[], window_max INTEGER[],
    horizon DOUBLE PRECISION
) RETURNS DOUBLE PRECISION LANGUAGE plpgsql AS $$
DECLARE
    now_ts TIMESTAMPTZ := clock_timestamp();
    at_ts TIMESTAMPTZ := clock_timestamp();
    now_sec BIGINT := floor(extract(epoch FROM clock_timestamp()));
    r RECORD;
    lo BIGINT;
    kept INTEGER[];
    kept_base BIGINT;
    wait_until DOUBLE PRECISION := NULL;
    first_used INTEGER;
    at_sec BIGINT;
    idx INTEGER;
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

    INSERT INTO lark_budget_windows (key, base, counts)
        SELECT k, 0, '{}'::INTEGER[] FROM unnest(window_keys) AS k ORDER BY k
        ON CONFLICT DO NOTHING;
    -- Drop the seconds that left each window, then see whether it has room.
    FOR r IN
        SELECT w.key, w.base, w.counts, k.secs, k.most
        FROM lark_budget_windows w
        JOIN unnest(window_keys, window_secs, window_max) AS k(key, secs, most) ON w.key = k.key
        ORDER BY w.key FOR UPDATE OF w
    LOOP
        lo := now_sec - r.secs + 1;
        IF r.base >= lo THEN
            kept := r.counts;
            kept_base := r.base;
        ELSIF lo - r.base >= coalesce(array_length(r.counts, 1), 0) THEN
            kept := '{}'::INTEGER[];
            kept_base := lo;
        ELSE
            kept := r.counts[(lo - r.base + 1):];
            kept_base := lo;
        END IF;
        UPDATE lark_budget_windows SET base = kept_base, counts = kept WHERE key = r.key;
        IF coalesce((SELECT sum(c) FROM unnest(kept) AS c), 0) >= r.most THEN
            -- Full: it has room again when its oldest counted second leaves it.
            SELECT min(i) INTO first_used FROM generate_subscripts(kept, 1) AS i WHERE kept[i] > 0;
            wait_until := GREATEST(
                coalesce(wait_until, 0),
                (kept_base + first_used - 1 + r.secs)::DOUBLE PRECISION
            );
        END IF;
    END LOOP;
    IF wait_until IS NOT NULL THEN
        RETURN LEAST(-0.001, -(wait_until - extract(epoch FROM now_ts)));
    END IF;
    IF at_ts > now_ts + make_interval(secs => horizon) THEN
        RETURN -extract(epoch FROM at_ts - now_ts);
    END IF;

    UPDATE lark_budgets b SET tat = GREATEST(b.tat, at_ts) + make_interval(secs => k.step)
        FROM unnest(keys, steps) AS k(key, step) WHERE b.key = k.key;
    at_sec := floor(extract(epoch FROM at_ts));
    FOR r IN
        SELECT w.key, w.base, w.counts FROM lark_budget_windows w
        WHERE w.key = ANY(window_keys) ORDER BY w.key
    LOOP
        -- A taker whose clock read came just before another's may land before `base`: it
        -- counts in the first second kept.
        idx := GREATEST(1, (at_sec - r.base + 1)::INTEGER);
        kept := r.counts;
        IF idx > coalesce(array_length(kept, 1), 0) THEN
            kept := kept || array_fill(0, ARRAY[idx - coalesce(array_length(kept, 1), 0)]);
        END IF;
        kept[idx] := kept[idx] + 1;
        UPDATE lark_budget_windows SET counts = kept WHERE key = r.key;
    END LOOP;
    RETURN extract(epoch FROM at_ts - now_ts);
END $$;
