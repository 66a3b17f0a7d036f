//! Stripe customer changes shared through the database, so every instance forgets a
//! customer's remembered email, not only the one Stripe's event reached.
//!
//! The instance that receives a verified `customer.updated` or `customer.deleted` records
//! it in the `meta` table: a counter (the mark, [`MARK_KEY`]) moves by one and the
//! customer's row (`stripe_customer_changed:<id>`) holds the mark it moved to and when.
//! Every instance reads the mark with the first look-up of each gated call (the secrets'
//! generation, in the same statement: `gateway::fresh`), so noticing costs no round
//! trip; only when the mark moved are the changed customers read and forgotten
//! ([`super::StripeConnector::catch_up`]). A row older than the emails' max age is
//! dropped when the next change is recorded: no memory keeps an email that long.

use crate::store::{Conn, SqlError, meta};

/// The `meta` key of the mark, moved by every recorded change.
pub const MARK_KEY: &str = "stripe_customer_changes";
/// The prefix of a changed customer's `meta` key.
const PREFIX: &str = "stripe_customer_changed:";

/// Records that `customer` changed at `now_ms`, and drops the changes older than
/// `keep_ms`; answers the new mark.
pub fn record(
    conn: &Conn<'_>,
    customer: &str,
    now_ms: i64,
    keep_ms: i64,
) -> crate::store::Result<u64> {
    meta::increment(conn, MARK_KEY)?;
    let mark = parse_mark(meta::get(conn, MARK_KEY)?.as_deref())?;
    for (key, value) in meta::with_prefix(conn, PREFIX)? {
        let at = value
            .split_once(' ')
            .and_then(|(_, at)| at.parse::<i64>().ok());
        if at.is_none_or(|at| at < now_ms.saturating_sub(keep_ms)) {
            meta::delete(conn, &key)?;
        }
    }
    meta::set(
        conn,
        &format!("{PREFIX}{customer}"),
        &format!("{mark} {now_ms}"),
    )?;
    Ok(mark)
}

/// The customers recorded as changed after mark `seen`.
pub fn since(conn: &Conn<'_>, seen: u64) -> crate::store::Result<Vec<String>> {
    let mut customers = Vec::new();
    for (key, value) in meta::with_prefix(conn, PREFIX)? {
        let mark = value
            .split_once(' ')
            .and_then(|(mark, _)| mark.parse::<u64>().ok());
        // INVARIANT: a row that cannot be read counts as changed: forgetting is safe.
        if mark.is_none_or(|mark| mark > seen)
            && let Some(customer) = key.strip_prefix(PREFIX)
        {
            customers.push(customer.to_owned());
        }
    }
    Ok(customers)
}

/// The mark as stored (absent: 0). Text that is not a number is an error naming it.
pub fn parse_mark(value: Option<&str>) -> crate::store::Result<u64> {
    value.map_or(Ok(0), |v| {
        v.parse().map_err(|e| SqlError::Decode {
            idx: 0,
            message: format!("{MARK_KEY} is not a number: {e}"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    #[tokio::test]
    async fn changes_are_read_since_a_mark_and_old_ones_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("t.db")).expect("open");
        let marks = db
            .write(|c| {
                let a = record(c, "cus_a", 1_000, 10_000)?;
                let b = record(c, "cus_b", 2_000, 10_000)?;
                Ok((a, b))
            })
            .await
            .expect("write");
        assert_eq!(marks, (1, 2));
        let after_a = db.read(|c| since(c, 1)).await.expect("read");
        assert_eq!(after_a, vec!["cus_b".to_owned()]);
        let all = db.read(|c| since(c, 0)).await.expect("read");
        assert_eq!(all.len(), 2);
        // cus_a's row is older than the 10 s kept when cus_c changes at 12 s.
        db.write(|c| record(c, "cus_c", 12_000, 10_000))
            .await
            .expect("write");
        let all = db.read(|c| since(c, 0)).await.expect("read");
        assert_eq!(all, vec!["cus_b".to_owned(), "cus_c".to_owned()]);
    }
}
