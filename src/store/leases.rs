//! The `session_leases` table: which instance runs a thread's live session, with a
//! fencing token. Its only owner: nothing else runs SQL on it (other tables' statements
//! carry [`fence_clause`] in their `WHERE`).
//!
//! A lease is acquired by one conditional statement (a new row, or a row whose lease
//! has expired, taken over with its token bumped), renewed only by its owner with its
//! token, and released by expiring it (the row and its token stay, so a token is never
//! handed out twice for a thread). Every write a session owner makes for the thread
//! carries `(thread, owner, token)`: the database refuses it once another instance has
//! taken the lease, whatever the old owner believes.
//!
//! SQL is kept portable (SQLite and Postgres): `ON CONFLICT`, `RETURNING`, numbered
//! parameters, no functions of one engine.

use crate::store::{Conn, params};

use crate::ids::ThreadId;

/// A lease this instance holds: the thread, its owner's instance id and the fencing
/// token it was acquired with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub thread_id: ThreadId,
    pub owner: String,
    pub token: i64,
}

/// A write refused because its lease is no longer the thread's current one (another
/// instance took it over, or it was released): the caller must drop the session
/// locally, never retry the write.
#[derive(Debug, thiserror::Error)]
#[error("the lease on thread {thread_id} (token {token}) is no longer held by {owner}")]
pub struct LeaseLost {
    pub thread_id: ThreadId,
    pub owner: String,
    pub token: i64,
}

impl Lease {
    /// The error a fenced statement returns when the database refused it.
    pub fn lost(&self) -> crate::store::SqlError {
        crate::store::SqlError::other(LeaseLost {
            thread_id: self.thread_id.clone(),
            owner: self.owner.clone(),
            token: self.token,
        })
    }
}

/// Whether `err` is a write refused by its lease's fence (see [`Lease::lost`]).
pub fn is_lost(err: &super::StoreError) -> bool {
    match err {
        super::StoreError::Sql(e) => is_lost_sql(e),
        _ => false,
    }
}

/// Whether `err` is a write refused by its lease's fence.
pub fn is_lost_sql(err: &crate::store::SqlError) -> bool {
    matches!(err, crate::store::SqlError::Other(inner) if inner.is::<LeaseLost>())
}

/// The condition a fenced statement adds to its `WHERE`: the lease named by the
/// parameters `?thread`, `?owner` and `?token` is still the thread's current one.
pub fn fence_clause(thread: usize, owner: usize, token: usize) -> String {
    format!(
        "EXISTS (SELECT 1 FROM session_leases WHERE thread_id = ?{thread} \
         AND owner = ?{owner} AND token = ?{token})"
    )
}

/// As [`fence_clause`], for a statement sent with no transaction around it
/// (`Db::write_single`): on Postgres, where it runs READ COMMITTED, the lease row is
/// read `FOR SHARE`, so a takeover or renewal that changed the row while the statement
/// waited for it is seen (the row is checked again at its newest version, and a new
/// token no longer matches), and one not yet begun waits for the statement's commit.
/// On SQLite it is [`fence_clause`]: the writer is alone.
pub fn fence_clause_shared(
    dialect: crate::store::Dialect,
    thread: usize,
    owner: usize,
    token: usize,
) -> String {
    match dialect {
        crate::store::Dialect::Sqlite => fence_clause(thread, owner, token),
        crate::store::Dialect::Postgres => format!(
            "EXISTS (SELECT 1 FROM session_leases WHERE thread_id = ?{thread} \
             AND owner = ?{owner} AND token = ?{token} FOR SHARE)"
        ),
    }
}

/// Takes the lease on `thread` for `owner` until `now_ms + lease_ms`: a thread without
/// a lease row gets token 1; a row whose lease has expired is taken over with its token
/// bumped by one. One statement, so two instances racing get one winner. `None`: another
/// instance holds an unexpired lease (or `owner` does, under a token it must already
/// know).
pub fn acquire(
    conn: &Conn<'_>,
    thread: &ThreadId,
    owner: &str,
    now_ms: i64,
    lease_ms: i64,
) -> crate::store::Result<Option<Lease>> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO session_leases (thread_id, owner, token, expires_at_ms) \
         VALUES (?1, ?2, 1, ?3) \
         ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, \
         token = session_leases.token + 1, expires_at_ms = excluded.expires_at_ms \
         WHERE session_leases.expires_at_ms <= ?4 \
         RETURNING token",
    )?;
    let mut rows = stmt.query(params![
        thread,
        owner,
        now_ms.saturating_add(lease_ms),
        now_ms
    ])?;
    let Some(row) = rows.next()? else {
        return Ok(None);
    };
    Ok(Some(Lease {
        thread_id: thread.clone(),
        owner: owner.to_owned(),
        token: row.get(0)?,
    }))
}

/// Extends `lease` to `now_ms + lease_ms` if it is still the thread's current one.
/// `false`: it is not (taken over or released); the holder must drop the session.
pub fn renew(
    conn: &Conn<'_>,
    lease: &Lease,
    now_ms: i64,
    lease_ms: i64,
) -> crate::store::Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE session_leases SET expires_at_ms = ?4 \
         WHERE thread_id = ?1 AND owner = ?2 AND token = ?3",
        )?
        .execute(params![
            lease.thread_id,
            lease.owner,
            lease.token,
            now_ms.saturating_add(lease_ms)
        ])?;
    Ok(changed > 0)
}

/// Renewals of one [`renew_all`] in flight at once, each a statement of its own.
const RENEWALS_AT_ONCE: usize = 4;

/// Renews each of `leases` to `now_ms + lease_ms` ([`renew`]), each by a write of one
/// statement of its own ([`crate::store::Db::write_single`]: on Postgres one round trip
/// and no transaction around it), [`RENEWALS_AT_ONCE`] at a time, and answers the leases
/// the database refused (taken over or released: their sessions must be dropped). Each
/// lease is handed to `done` as soon as its statement ends, with whether it was
/// renewed. A renewal that fails for another reason is logged and left for the next
/// round.
///
/// A renewal that waits for a decision holding its lease's row ([`fence_exclusive`])
/// delays that lease only: one transaction renewing every lease waited for each such
/// decision in turn before any renewal committed. On SQLite the renewals share group
/// commits.
pub async fn renew_all(
    db: &crate::store::Db,
    leases: Vec<Lease>,
    now_ms: i64,
    lease_ms: i64,
    mut done: impl FnMut(&Lease, bool),
) -> Vec<Lease> {
    use futures::StreamExt as _;
    let mut renewals = futures::stream::iter(leases.into_iter().map(|lease| async move {
        let held = lease.clone();
        let renewed = db
            .write_single(move |c| renew(c, &held, now_ms, lease_ms))
            .await;
        (lease, renewed)
    }))
    .buffer_unordered(RENEWALS_AT_ONCE);
    let mut refused = Vec::new();
    while let Some((lease, outcome)) = renewals.next().await {
        done(&lease, matches!(outcome, Ok(true)));
        match outcome {
            Ok(true) => {}
            Ok(false) => refused.push(lease),
            Err(e) => tracing::error!(
                thread = %lease.thread_id,
                error = %e,
                "cannot renew a session lease; retried at the next round"
            ),
        }
    }
    refused
}

/// Gives `lease` up: it expires now (its row and token stay, so the next owner's token
/// is larger). `false`: it was not held any more.
pub fn release(conn: &Conn<'_>, lease: &Lease) -> crate::store::Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE session_leases SET expires_at_ms = 0 \
             WHERE thread_id = ?1 AND owner = ?2 AND token = ?3",
        )?
        .execute(params![lease.thread_id, lease.owner, lease.token])?;
    Ok(changed > 0)
}

/// Takes back, with fresh tokens, the leases `owner` still holds from an earlier run of
/// this instance (those no one took over and it did not release): called at start,
/// once the instance registry has shown that no other live process has this id, so
/// the sessions this instance left running are adopted rather than taken over.
pub fn reclaim(
    conn: &Conn<'_>,
    owner: &str,
    now_ms: i64,
    lease_ms: i64,
) -> crate::store::Result<Vec<Lease>> {
    let mut stmt = conn.prepare(
        "UPDATE session_leases SET token = token + 1, expires_at_ms = ?2 \
         WHERE owner = ?1 AND expires_at_ms > 0 RETURNING thread_id, token",
    )?;
    let rows = stmt.query_map(params![owner, now_ms.saturating_add(lease_ms)], |r| {
        Ok(Lease {
            thread_id: r.get(0)?,
            owner: owner.to_owned(),
            token: r.get(1)?,
        })
    })?;
    rows.collect()
}

/// Refuses the rest of a write transaction unless `lease` is still the thread's current
/// one. Returns [`Lease::lost`] when refused.
///
/// It only reads the lease row. On SQLite the writer's transaction excludes every other
/// writer. On Postgres every write runs SERIALIZABLE: a takeover or renewal committed
/// while this transaction runs makes this one serialize before it (harmless: the write
/// lands as if just before the takeover), and any new owner's transaction that missed
/// this one's rows closes a cycle that Postgres aborts. A no-op `UPDATE` of the row did
/// the same job but made two gated calls of one session, and each renewal, conflict on
/// the row and retry.
pub fn fence(conn: &Conn<'_>, lease: &Lease) -> crate::store::Result<()> {
    fence_by(conn, lease, FENCE)
}

/// The lease row's check, as [`fence`] and [`fence_exclusive`] send it.
const FENCE: &str =
    "SELECT 1 FROM session_leases WHERE thread_id = ?1 AND owner = ?2 AND token = ?3";

/// Refuses the rest of the transaction unless `sql` (the lease row's check) finds the row.
fn fence_by(conn: &Conn<'_>, lease: &Lease, sql: &str) -> crate::store::Result<()> {
    use crate::store::OptionalExtension as _;
    let current = conn
        .prepare_cached(sql)?
        .query_row(params![lease.thread_id, lease.owner, lease.token], |r| {
            r.get::<_, i64>(0)
        })
        .optional()?;
    if current.is_none() {
        return Err(lease.lost());
    }
    Ok(())
}

/// As [`fence`], for a [`crate::store::Db::write_locking`] transaction: on Postgres the
/// lease row is locked (`FOR NO KEY UPDATE`) until this transaction ends, so the
/// thread's other locking writes wait for it, and a takeover or renewal (an `UPDATE`
/// of the row) waits too: no new owner can begin while this write is undecided, and a
/// takeover that committed first is seen (the row's new token no longer matches and
/// the write is refused). On SQLite it is [`fence`]: the writer is alone.
pub fn fence_exclusive(conn: &Conn<'_>, lease: &Lease) -> crate::store::Result<()> {
    match conn.dialect() {
        crate::store::Dialect::Sqlite => fence(conn, lease),
        crate::store::Dialect::Postgres => {
            fence_by(conn, lease, &format!("{FENCE} FOR NO KEY UPDATE"))
        }
    }
}

/// The owner of `thread`'s lease and whether it is unexpired at `now_ms`, if the thread
/// ever had one.
pub fn holder(
    conn: &Conn<'_>,
    thread: &ThreadId,
    now_ms: i64,
) -> crate::store::Result<Option<(String, i64, bool)>> {
    use crate::store::OptionalExtension as _;
    conn.query_row(
        "SELECT owner, token, expires_at_ms FROM session_leases WHERE thread_id = ?1",
        [thread],
        |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? > now_ms)),
    )
    .optional()
}

#[cfg(test)]
mod tests;
