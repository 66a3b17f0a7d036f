-- Which drainer syncs a thread's state labels now (src/notes/label_outbox.rs): a sync is
-- claimed until this time, so two instances sharing the database never sync one thread
-- at once (a slower one could leave Plain with an older version's labels). Cleared when
-- the sync is recorded; a drainer that died mid-sync leaves it to expire.
ALTER TABLE thread_label_state ADD COLUMN claimed_until_ms INTEGER NOT NULL DEFAULT 0;
