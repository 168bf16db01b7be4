-- When a model entry was disabled (its key rejected), for doctor, /readyz and the start-up log.
-- Rows disabled before this column existed take their last update as the best known time.
ALTER TABLE llm_entry_state ADD COLUMN disabled_at timestamptz;
UPDATE llm_entry_state SET disabled_at = updated_at WHERE state = 'disabled';
