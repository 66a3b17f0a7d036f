//! The `meta` table: small facts about this installation, one value per key. Its only
//! owner: nothing else runs SQL on it.

use rusqlite::Connection;

/// The key of this installation's instance id (the label on its containers).
pub const INSTANCE_ID: &str = "instance_id";

/// The value under `key`, setting it to `fresh` first when there is none (the first
/// writer wins; later calls read what it stored).
pub fn get_or_insert(conn: &Connection, key: &str, fresh: &str) -> rusqlite::Result<String> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
        [key, fresh],
    )?;
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
}
