-- Which instance sent a call that is `running` (set in the transaction that made it
-- running: a `run` decision, or an approved call claimed). Recovery at start takes only
-- the running calls of this instance's earlier boot, of an instance no longer alive, or
-- with no runner (written before this column): never a call another live instance is
-- sending now.
ALTER TABLE executions ADD COLUMN runner TEXT;
