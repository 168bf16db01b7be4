-- Model router: the cooldown state of each provider/model entry, shared by every replica and
-- kept across restarts. One row per entry that has ever failed; an entry without a row is ok.
-- The key is a digest of (base URL, model, key fingerprint), so a corrected API key or URL
-- starts from a clean state.

CREATE TABLE llm_entry_state (
    entry_key            TEXT PRIMARY KEY,
    provider             TEXT NOT NULL,          -- for people reading the table
    model                TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('ok', 'cooling', 'disabled')),
    cooling_until        TIMESTAMPTZ,            -- set while state = 'cooling'
    reason               TEXT,                   -- failure class that set the state
    consecutive_failures INTEGER NOT NULL DEFAULT 0,  -- transient failures in a row
    last_error_class     TEXT,
    last_error_message   TEXT,                   -- scrubbed of secrets, bounded
    last_error_at        TIMESTAMPTZ,
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now()
);
