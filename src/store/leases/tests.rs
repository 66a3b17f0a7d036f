//! The lease functions against a real database: acquisition, renewal, takeover,
//! release, and a stale token's write refused by the database.

use super::*;
use crate::store::Db;

const LEASE_MS: i64 = 15_000;

fn db() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("t.db")).unwrap();
    (dir, db)
}

fn thread(id: &str) -> ThreadId {
    ThreadId::parse(id).unwrap()
}

async fn acquire_at(db: &Db, t: &str, owner: &str, now: i64) -> Option<Lease> {
    let (t, owner) = (thread(t), owner.to_owned());
    db.write(move |c| acquire(c, &t, &owner, now, LEASE_MS))
        .await
        .unwrap()
}

#[tokio::test]
async fn one_instance_gets_a_free_lease_and_the_other_is_refused_until_it_expires() {
    let (_dir, db) = db();
    let a = acquire_at(&db, "th_1", "inst-a", 1_000).await.unwrap();
    assert_eq!(a.token, 1);
    assert_eq!(a.owner, "inst-a");
    // Held and unexpired: refused to another instance, and to its own owner (which
    // already knows its token).
    assert_eq!(acquire_at(&db, "th_1", "inst-b", 2_000).await, None);
    assert_eq!(acquire_at(&db, "th_1", "inst-a", 2_000).await, None);
    // Renewed by its owner with its token: still refused at the old expiry.
    let renewed = {
        let a = a.clone();
        db.write(move |c| renew(c, &a, 10_000, LEASE_MS))
            .await
            .unwrap()
    };
    assert!(renewed);
    assert_eq!(acquire_at(&db, "th_1", "inst-b", 17_000).await, None);
    // Expired (the owner stopped renewing): taken over with a larger token.
    let b = acquire_at(&db, "th_1", "inst-b", 25_000).await.unwrap();
    assert_eq!((b.owner.as_str(), b.token), ("inst-b", 2));
    // The old owner cannot renew, release or pass the fence any more.
    let stale = a.clone();
    assert!(
        !db.write(move |c| renew(c, &stale, 25_001, LEASE_MS))
            .await
            .unwrap()
    );
    let stale = a.clone();
    assert!(!db.write(move |c| release(c, &stale)).await.unwrap());
    let stale = a.clone();
    let err = db.write(move |c| fence(c, &stale)).await.unwrap_err();
    assert!(is_lost(&err), "{err}");
    let current = b.clone();
    db.write(move |c| fence(c, &current)).await.unwrap();
    // The holder as stored.
    let t = thread("th_1");
    let held = db.read(move |c| holder(c, &t, 26_000)).await.unwrap();
    assert_eq!(held, Some(("inst-b".to_owned(), 2, true)));
}

#[tokio::test]
async fn a_token_only_grows_through_releases_and_takeovers() {
    let (_dir, db) = db();
    let mut last = 0;
    for (i, owner) in ["a", "b", "a", "a", "c", "b"].iter().enumerate() {
        let now = 1_000 + i64::try_from(i).unwrap();
        let lease = acquire_at(&db, "th_m", owner, now).await.unwrap();
        assert!(lease.token > last, "{} after {last}", lease.token);
        last = lease.token;
        // A released lease is free at once, but keeps its token.
        let l = lease.clone();
        assert!(db.write(move |c| release(c, &l)).await.unwrap());
        let t = thread("th_m");
        let held = db.read(move |c| holder(c, &t, now)).await.unwrap();
        assert_eq!(held, Some(((*owner).to_owned(), lease.token, false)));
    }
    assert_eq!(last, 6);
    // Another thread's tokens are its own.
    assert_eq!(
        acquire_at(&db, "th_other", "a", 1_000).await.unwrap().token,
        1
    );
}

#[tokio::test]
async fn two_instances_racing_for_one_lease_get_one_winner() {
    let (_dir, db) = db();
    let mut racers = Vec::new();
    for i in 0..16 {
        let db = db.clone();
        racers.push(tokio::spawn(async move {
            acquire_at(&db, "th_race", &format!("inst-{i}"), 5_000).await
        }));
    }
    let mut winners = Vec::new();
    for racer in racers {
        if let Some(lease) = racer.await.unwrap() {
            winners.push(lease);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
}

#[tokio::test]
async fn reclaim_takes_back_the_owners_unreleased_leases_with_fresh_tokens() {
    let (_dir, db) = db();
    let kept = acquire_at(&db, "th_kept", "inst-a", 1_000).await.unwrap();
    let expired = acquire_at(&db, "th_expired", "inst-a", 1_000)
        .await
        .unwrap();
    let released = acquire_at(&db, "th_released", "inst-a", 1_000)
        .await
        .unwrap();
    let r = released.clone();
    db.write(move |c| release(c, &r)).await.unwrap();
    acquire_at(&db, "th_other", "inst-b", 1_000).await.unwrap();
    // Long after: th_expired's lease has expired but no one took it over.
    let mut back = db
        .write(|c| reclaim(c, "inst-a", 60_000, LEASE_MS))
        .await
        .unwrap();
    back.sort_by(|x, y| x.thread_id.as_str().cmp(y.thread_id.as_str()));
    let threads: Vec<(&str, i64)> = back
        .iter()
        .map(|l| (l.thread_id.as_str(), l.token))
        .collect();
    assert_eq!(threads, [("th_expired", 2), ("th_kept", 2)]);
    // The tokens of the earlier run are stale now.
    for stale in [kept, expired] {
        let err = db.write(move |c| fence(c, &stale)).await.unwrap_err();
        assert!(is_lost(&err));
    }
}

#[tokio::test]
async fn a_stale_tokens_fenced_write_changes_nothing() {
    let (_dir, db) = db();
    db.write(|c| {
        c.execute_batch("CREATE TABLE probe (thread_id TEXT PRIMARY KEY, value TEXT NOT NULL)")?;
        c.execute("INSERT INTO probe VALUES ('th_f', 'start')", ())
    })
    .await
    .unwrap();
    let old = acquire_at(&db, "th_f", "inst-a", 1_000).await.unwrap();
    let new = acquire_at(&db, "th_f", "inst-b", 20_000).await.unwrap();
    let write = |lease: Lease, value: &'static str| {
        let db = db.clone();
        async move {
            db.write(move |c| {
                let sql = format!(
                    "UPDATE probe SET value = ?4 WHERE thread_id = ?1 AND {}",
                    fence_clause(1, 2, 3)
                );
                c.execute(
                    &sql,
                    params![lease.thread_id, lease.owner, lease.token, value],
                )
            })
            .await
            .unwrap()
        }
    };
    assert_eq!(write(old.clone(), "stale").await, 0);
    assert_eq!(write(new.clone(), "fresh").await, 1);
    assert_eq!(write(old, "stale again").await, 0);
    let value: String = db
        .read(|c| c.query_row("SELECT value FROM probe", (), |r| r.get(0)))
        .await
        .unwrap();
    assert_eq!(value, "fresh");
}
