-- Rich input. A section quotes a message once: `quoted_messages` remembers which messages a
-- section's requests quoted, so a later reply to the same message does not repeat it. An image
-- a person sent is kept with its request's message for the turn that answers it: a route whose
-- model sees images gets it as image content. Images are kept two days (a turn runs long before
-- that), and removed as new ones are stored.
CREATE TABLE quoted_messages (
    section_id text NOT NULL,
    message_id text NOT NULL,
    quoted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (section_id, message_id)
);

CREATE TABLE message_images (
    -- The message of the turn request that carried the image.
    message_id text NOT NULL,
    -- Where it was placed, as the model was told.
    path text NOT NULL,
    mime text NOT NULL,
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, path)
);

CREATE INDEX message_images_created ON message_images (created_at);
