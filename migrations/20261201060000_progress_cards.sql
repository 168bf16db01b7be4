-- A turn's live progress card: which card it streams to, how (CardKit streaming, a PATCHed
-- card message, or none), and the highest `sequence` number reserved for it. Numbers are
-- reserved in blocks before they are used, so a resumed turn continues the same card above
-- every number a previous runner could have sent.
ALTER TABLE turns
    ADD COLUMN progress_mode      TEXT CHECK (progress_mode IN ('cardkit', 'patch', 'none')),
    ADD COLUMN progress_card_id   TEXT,
    ADD COLUMN progress_message_id TEXT,
    ADD COLUMN progress_sequence  INTEGER NOT NULL DEFAULT 0;
