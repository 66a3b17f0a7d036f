//! Anchoring the head of the audit chain outside the database, so that deleting the
//! newest rows (which leaves a valid, shorter chain) is detected.
//!
//! An [`Anchor`] is the hash of row `count` and `count`, written `HEX:COUNT`.
//! `threadgate audit --verify` prints the current head for the operator to keep, checks
//! an anchor given on the command line, and checks and then advances the anchor file
//! (`audit_anchor_file`, by default `audit.anchor` in the data directory). The server
//! does the same with the anchor file at start and every minute. A chain that does not
//! extend an anchor is reported and the anchor file is left as it was, as evidence.

use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::str::FromStr;

use crate::store::{Conn, OptionalExtension as _};

use super::AuditError;

/// The head of the chain at some moment: `count` rows, the last one with `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    /// The hash of row `count` (32 zero bytes for an empty chain).
    pub hash: [u8; 32],
    /// The number of rows.
    pub count: i64,
}

impl fmt::Display for Anchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", hex::encode(self.hash), self.count)
    }
}

/// Errors reading an anchor or checking the chain against one.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    /// Not `HEX:COUNT` with 64 hex digits and a count of zero or more.
    #[error(
        "invalid audit anchor {text:?}: expected HASH:COUNT (64 hex digits, a colon, a row count)"
    )]
    Malformed {
        /// The text given (hashes are not secret).
        text: String,
    },
    /// The chain no longer extends the anchor.
    #[error("the audit chain does not extend anchor {anchor}: {reason}")]
    Diverged {
        /// The anchor checked.
        anchor: Anchor,
        /// What was found instead.
        reason: String,
    },
    /// The anchor file could not be read or written.
    #[error("audit anchor file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The chain itself failed to verify or could not be read.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The database's log could not be synced past the head.
    #[error("cannot sync the database's log before anchoring: {0}")]
    Store(String),
}

impl FromStr for Anchor {
    type Err = AnchorError;

    fn from_str(text: &str) -> Result<Anchor, AnchorError> {
        let malformed = || AnchorError::Malformed {
            text: text.trim().to_owned(),
        };
        let (hash, count) = text.trim().split_once(':').ok_or_else(malformed)?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hash, &mut bytes).map_err(|_| malformed())?;
        let count: i64 = count.parse().map_err(|_| malformed())?;
        if count < 0 || (count == 0 && bytes != [0; 32]) {
            return Err(malformed());
        }
        Ok(Anchor { hash: bytes, count })
    }
}

/// The current head: the last row's id and hash (an empty chain is `0…0:0`). On
/// Postgres it is answered only once it is durable: the chaining step commits without
/// waiting for its WAL flush (`super::chain_pending`), so this waits until the WAL is
/// flushed past every commit this snapshot sees (the WAL writer flushes within a few
/// hundred milliseconds), and an anchor kept outside never names a head a crash could
/// take back.
pub fn head(conn: &Conn<'_>) -> Result<Anchor, AuditError> {
    let last: Option<(i64, Vec<u8>)> = conn
        .query_row(
            "SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if conn.dialect() == crate::store::Dialect::Postgres {
        wait_for_wal_flush(conn)?;
    }
    let Some((count, hash)) = last else {
        return Ok(Anchor {
            hash: [0; 32],
            count: 0,
        });
    };
    let hash: [u8; 32] = hash.try_into().map_err(|_| AuditError::Broken {
        id: count,
        reason: "its hash is not 32 bytes".into(),
    })?;
    Ok(Anchor { hash, count })
}

/// The longest [`head`] waits for the WAL to be flushed: the WAL writer's own rounds
/// (`wal_writer_delay`, 200 ms by default) flush an unflushed commit within three.
const WAL_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until Postgres has flushed its WAL up to where it was inserting now: every
/// commit visible before this call is then durable.
fn wait_for_wal_flush(conn: &Conn<'_>) -> Result<(), AuditError> {
    let target: String =
        conn.query_row("SELECT pg_current_wal_insert_lsn()::text", (), |r| r.get(0))?;
    let began = std::time::Instant::now();
    loop {
        let flushed: bool = conn.query_row(
            "SELECT pg_current_wal_flush_lsn() >= ?1::text::pg_lsn",
            [target.as_str()],
            |r| r.get(0),
        )?;
        if flushed {
            return Ok(());
        }
        if began.elapsed() > WAL_FLUSH_WAIT {
            return Err(AuditError::NotDurable {
                target,
                waited: WAL_FLUSH_WAIT,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Checks that the chain still holds row `anchor.count` with `anchor.hash` (so nothing
/// at or before the anchor was deleted or rewritten). Cheap: one row is read. Combine
/// with [`super::verify`], which checks that every row links to the one before.
pub fn extends(conn: &Conn<'_>, anchor: &Anchor) -> Result<(), AnchorError> {
    if anchor.count == 0 {
        return Ok(());
    }
    let diverged = |reason: String| AnchorError::Diverged {
        anchor: anchor.clone(),
        reason,
    };
    let row: Option<Vec<u8>> = conn
        .query_row(
            "SELECT hash FROM audit WHERE id = ?1",
            [anchor.count],
            |r| r.get(0),
        )
        .optional()
        .map_err(AuditError::from)?;
    match row {
        Some(hash) if hash == anchor.hash => Ok(()),
        Some(_) => Err(diverged(format!(
            "row {} has another hash: the chain was rewritten",
            anchor.count
        ))),
        None => {
            let now = head(conn)?.count;
            Err(diverged(format!(
                "the chain has {now} rows, fewer than the anchor's {}: the newest rows were deleted",
                anchor.count
            )))
        }
    }
}

/// The anchor stored in `path`, or `None` when the file does not exist.
pub fn read_file(path: &Path) -> Result<Option<Anchor>, AnchorError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.parse()?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(file_error(path, source)),
    }
}

/// Replaces the anchor in `path` (written to a temporary file, synced, then renamed;
/// mode 0600).
pub fn write_file(path: &Path, anchor: &Anchor) -> Result<(), AnchorError> {
    let tmp = path.with_extension("anchor.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let written = (|| {
        let mut file = options.open(&tmp)?;
        writeln!(file, "{anchor}")?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|source| file_error(path, source))
}

/// Checks the chain against the anchor file (when there is one) and then advances the
/// file to the current head. Returns the head. On a divergence the file is left as it
/// was. The head must be durable: through a [`crate::store::Db`], use [`advance`].
pub fn check_and_advance(conn: &Conn<'_>, path: &Path) -> Result<Anchor, AnchorError> {
    let now = checked_head(conn, path)?;
    write_file(path, &now)?;
    Ok(now)
}

/// Checks the chain against the anchor file (when there is one) and answers the head,
/// writing nothing.
pub fn checked_head(conn: &Conn<'_>, path: &Path) -> Result<Anchor, AnchorError> {
    if let Some(kept) = read_file(path)? {
        extends(conn, &kept)?;
    }
    Ok(head(conn)?)
}

/// Writes `head`, read by [`checked_head`], to the anchor file once the database's log
/// is synced past it ([`crate::store::Db::sync_log`]): on SQLite a read's outcome, with
/// its audit row, commits without its fsync (`Db::write_unflushed`), and the file must
/// never name a row a crash of the machine could take back.
pub async fn advance(
    db: &crate::store::Db,
    path: &Path,
    head: Anchor,
) -> Result<Anchor, AnchorError> {
    db.sync_log()
        .await
        .map_err(|e| AnchorError::Store(e.to_string()))?;
    write_file(path, &head)?;
    Ok(head)
}

fn file_error(path: &Path, source: std::io::Error) -> AnchorError {
    AnchorError::File {
        path: path.display().to_string(),
        source,
    }
}

/// The server's side: checks and advances the anchor file now and then every `every`.
/// A divergence is logged as an error at each round (the file keeps the old anchor).
/// Each round first chains the rows waiting on Postgres (`super::chain_waiting`): rows a
/// crash left between a commit and its chaining are chained at start and within `every`
/// even when nothing else is written.
pub async fn keep(db: crate::store::Db, path: std::path::PathBuf, every: std::time::Duration) {
    loop {
        if let Err(e) = super::chain_waiting(&db).await {
            tracing::warn!(error = %e, "cannot chain the audit rows waiting");
        }
        let file = path.clone();
        let advanced = match db.read(move |c| Ok(checked_head(c, &file))).await {
            Ok(Ok(head)) => advance(&db, &path, head).await,
            Ok(Err(e)) => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the audit log for its anchor");
                tokio::time::sleep(every).await;
                continue;
            }
        };
        match advanced {
            Ok(anchor) => tracing::debug!(%anchor, "audit anchor advanced"),
            Err(e) => {
                tracing::error!(error = %e, path = %path.display(), "audit anchor check failed")
            }
        }
        tokio::time::sleep(every).await;
    }
}
