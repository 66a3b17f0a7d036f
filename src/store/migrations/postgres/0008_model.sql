-- The model proxy (src/model): what each session spent on the model, and the runner's
-- conversation, kept here (not in the container) so an idle stop and resume goes on
-- with the same conversation.
CREATE TABLE model_usage (
    session_id    TEXT PRIMARY KEY,
    thread_id     TEXT NOT NULL,
    tokens_used   BIGINT NOT NULL DEFAULT 0,
    turns_used    BIGINT NOT NULL DEFAULT 0,
    -- Set once, when the budget ran out and the note was queued.
    exhausted_at_ms BIGINT
);

CREATE TABLE transcripts (
    session_id      TEXT PRIMARY KEY,
    messages        TEXT NOT NULL,     -- JSON array of OpenAI messages
    events_consumed BIGINT NOT NULL,
    bytes           BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL
);
