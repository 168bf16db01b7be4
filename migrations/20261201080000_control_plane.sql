-- The local control plane: notes per chat (memory) and runbooks shared by the deployment
-- (skills). The built-in skill `ssh-mode` ships with the binary and is never a row.

CREATE TABLE memory_notes (
    id          BIGSERIAL PRIMARY KEY,
    chat_id     TEXT NOT NULL,
    section_id  TEXT NOT NULL,
    content     TEXT NOT NULL CHECK (char_length(content) BETWEEN 1 AND 400),
    created_by  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX memory_notes_chat ON memory_notes (chat_id, id);

CREATE TABLE skills (
    name        TEXT PRIMARY KEY
                CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,63}$' AND name <> 'ssh-mode'),
    description TEXT NOT NULL CHECK (char_length(description) BETWEEN 1 AND 200),
    body        TEXT NOT NULL CHECK (char_length(body) BETWEEN 1 AND 16000),
    updated_by  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
