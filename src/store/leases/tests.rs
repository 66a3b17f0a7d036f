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

/// The expiry of `thread`'s lease row.
async fn expiry(db: &Db, thread_id: &str) -> i64 {
    let t = thread(thread_id);
    db.read(move |c| {
        c.query_row(
            "SELECT expires_at_ms FROM session_leases WHERE thread_id = ?1",
            [&t],
            |r| r.get(0),
        )
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_renewal_round_renews_what_it_holds_and_answers_what_was_taken_over() {
    let (_dir, db) = db();
    let kept = acquire_at(&db, "th_k", "inst-a", 1_000).await.unwrap();
    let lost = acquire_at(&db, "th_l", "inst-a", 1_000).await.unwrap();
    // th_l expires and is taken over; th_k is renewed in time.
    let taker = acquire_at(&db, "th_l", "inst-b", 20_000).await.unwrap();
    let mut renewed = Vec::new();
    let round = vec![kept.clone(), lost.clone()];
    let refused = renew_all(&db, round, 15_000, LEASE_MS, |l, ok| {
        renewed.push((l.clone(), ok))
    })
    .await;
    assert_eq!(refused, vec![lost.clone()]);
    renewed.sort_by_key(|(l, _)| l.thread_id.to_string());
    assert_eq!(renewed, vec![(kept.clone(), true), (lost.clone(), false)]);
    assert_eq!(expiry(&db, "th_k").await, 15_000 + LEASE_MS);
    assert_eq!(
        expiry(&db, "th_l").await,
        20_000 + LEASE_MS,
        "{taker:?} kept"
    );
}

/// On Postgres a decision holds its lease's row for its transaction
/// (`fence_exclusive`): a renewal round waits for that lease alone; the others are
/// renewed and committed meanwhile. (One transaction renewing them all committed none
/// until the decision ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decision_holding_one_lease_delays_the_renewal_of_that_lease_alone() {
    let Some(test_db) = crate::store::testing::TestDb::postgres_from_env() else {
        eprintln!("renewal beside a decision: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let db = test_db.open().unwrap();
    let deciding = test_db.open().unwrap();
    let busy = acquire_at(&db, "th_busy", "inst-a", 1_000).await.unwrap();
    let idle: Vec<Lease> = {
        let mut idle = Vec::new();
        for i in 0..6 {
            idle.push(
                acquire_at(&db, &format!("th_idle{i}"), "inst-a", 1_000)
                    .await
                    .unwrap(),
            );
        }
        idle
    };
    // A decision of th_busy: its lease's row locked, until told to end.
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (end, ended) = std::sync::mpsc::channel::<()>();
    let signals = std::sync::Arc::new(std::sync::Mutex::new((locked_tx, ended)));
    let decision = tokio::spawn({
        let busy = busy.clone();
        async move {
            deciding
                .write_locking(move |c| {
                    fence_exclusive(c, &busy)?;
                    let signals = signals.lock().unwrap();
                    signals.0.send(()).unwrap();
                    signals.1.recv().unwrap();
                    Ok(())
                })
                .await
                .unwrap()
        }
    });
    tokio::task::spawn_blocking(move || locked.recv())
        .await
        .unwrap()
        .unwrap();
    // The busy lease first: one transaction would wait on it before the others.
    let mut round = vec![busy.clone()];
    round.extend(idle.iter().cloned());
    let renewing = tokio::spawn({
        let db = db.clone();
        async move { renew_all(&db, round, 5_000, LEASE_MS, |_, _| {}).await }
    });
    let renewed_meanwhile = async {
        loop {
            let mut all = true;
            for i in 0..6 {
                all &= expiry(&db, &format!("th_idle{i}")).await == 5_000 + LEASE_MS;
            }
            if all {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), renewed_meanwhile)
        .await
        .expect("the idle leases are renewed while the decision holds the busy one");
    assert_eq!(
        expiry(&db, "th_busy").await,
        1_000 + LEASE_MS,
        "the busy lease waits for its decision"
    );
    end.send(()).unwrap();
    decision.await.unwrap();
    let refused = renewing.await.unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(expiry(&db, "th_busy").await, 5_000 + LEASE_MS);
}
