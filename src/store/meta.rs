//! The `meta` table: small facts about this installation, one value per key. Its only
//! owner: nothing else runs SQL on it.

use super::{Conn, OptionalExtension, cached_execute, cached_query_row};

/// The key under which versions before several instances kept the instance id (the
/// label on its containers). Read once, by [`take`], when a data directory without an
/// instance id file starts: the id is kept per data directory now, since every instance
/// sharing one database would read the same row.
pub const INSTANCE_ID: &str = "instance_id";
/// The key of the global pause of new sessions (`1` paused).
pub const PAUSED: &str = "paused";
/// The key of the last time [`super::Db::sync_log`] synced SQLite's log (ms).
pub const LOG_SYNCED_AT: &str = "log_synced_at_ms";

/// The value under `key`, if any.
pub fn get(conn: &Conn<'_>, key: &str) -> super::Result<Option<String>> {
    cached_query_row(conn, "SELECT value FROM meta WHERE key = ?1", [key], |r| {
        r.get(0)
    })
    .optional()
}

/// The values under `keys` that are set, as (key, value), in one statement outside any
/// transaction ([`super::Db::query_inline`]: one round trip on Postgres), on the calling
/// thread: for the small marks read at every gated call and provider request.
pub fn get_inline<const N: usize>(
    db: &super::Db,
    keys: [&str; N],
) -> Result<Vec<(String, String)>, super::StoreError> {
    let marks = vec!["?"; N]
        .iter()
        .enumerate()
        .map(|(i, _)| format!("?{}", i + 1))
        .collect::<Vec<_>>()
        .join(", ");
    db.query_inline(
        &format!("SELECT key, value FROM meta WHERE key IN ({marks})"),
        keys,
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Adds one to the counter under `key` (absent: it becomes 1).
pub fn increment(conn: &Conn<'_>, key: &str) -> super::Result<()> {
    cached_execute(
        conn,
        "INSERT INTO meta (key, value) VALUES (?1, '1') \
         ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)",
        [key],
    )?;
    Ok(())
}

/// Every key starting with `prefix` and its value, by key.
pub fn with_prefix(conn: &Conn<'_>, prefix: &str) -> super::Result<Vec<(String, String)>> {
    // `_`, `%` and `\` in the prefix are plain characters; SQLite's LIKE ignores ASCII
    // case, so the prefix is checked again exactly.
    let pattern = format!(
        "{}%",
        prefix
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let rows: Vec<(String, String)> = conn
        .prepare_cached("SELECT key, value FROM meta WHERE key LIKE ?1 ESCAPE '\\' ORDER BY key")?
        .query_map([pattern.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::Result<_>>()?;
    Ok(rows
        .into_iter()
        .filter(|(key, _)| key.starts_with(prefix))
        .collect())
}

/// Removes `key`.
pub fn delete(conn: &Conn<'_>, key: &str) -> super::Result<()> {
    cached_execute(conn, "DELETE FROM meta WHERE key = ?1", [key])?;
    Ok(())
}

/// Sets `key` to `value`, replacing what was there.
pub fn set(conn: &Conn<'_>, key: &str, value: &str) -> super::Result<()> {
    cached_execute(
        conn,
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
