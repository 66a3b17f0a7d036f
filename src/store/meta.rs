//! The `meta` table: small facts about this installation, one value per key. Its only
//! owner: nothing else runs SQL on it.

use super::{Conn, OptionalExtension};

/// The key under which versions before several instances kept the instance id (the
/// label on its containers). Read once, by [`take`], when a data directory without an
/// instance id file starts: the id is kept per data directory now, since every instance
/// sharing one database would read the same row.
pub const INSTANCE_ID: &str = "instance_id";
/// The key of the global pause of new sessions (`1` paused).
pub const PAUSED: &str = "paused";

/// The value under `key`, if any.
pub fn get(conn: &Conn<'_>, key: &str) -> super::Result<Option<String>> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
}

/// Adds one to the counter under `key` (absent: it becomes 1).
pub fn increment(conn: &Conn<'_>, key: &str) -> super::Result<()> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, '1') \
         ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)",
        [key],
    )?;
    Ok(())
}

/// Sets `key` to `value`, replacing what was there.
pub fn set(conn: &Conn<'_>, key: &str, value: &str) -> super::Result<()> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )?;
    Ok(())
}

/// The value under `key`, setting it to `fresh` first when there is none (the first
/// writer wins; later calls read what it stored).
pub fn get_or_insert(conn: &Conn<'_>, key: &str, fresh: &str) -> super::Result<String> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
        [key, fresh],
    )?;
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
}

/// Removes `key` and answers the value it had: the first caller gets it, every later
/// one `None` (one statement, so two instances starting at once cannot both get it).
pub fn take(conn: &Conn<'_>, key: &str) -> crate::store::Result<Option<String>> {
    conn.query_row(
        "DELETE FROM meta WHERE key = ?1 RETURNING value",
        [key],
        |r| r.get(0),
    )
    .optional()
}
