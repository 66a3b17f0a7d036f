//! The throttle's rules, on the clock the caller passes (milliseconds), without sleeps.

use std::net::IpAddr;

use super::*;
use crate::store::testing::each_backend;

const MINUTE: i64 = 60 * 1000;

/// A throttle over a fresh SQLite database (its directory is kept by the caller).
fn sqlite() -> (tempfile::TempDir, Throttle) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("t.db")).unwrap();
    (dir, Throttle::new(db, "test"))
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn keys(name: &str, addr: &str) -> SignInKeys {
    SignInKeys::new(name, &client_key(ip(addr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_failures_lock_the_key_until_the_window_passes() {
    let (_dir, t) = sqlite();
    let t = t.with_limits(5, 1000, 10);
    for i in 0..4 {
        t.fail(&["addr:a"], i).await;
        assert_eq!(t.check(&["addr:a"], i).await, Ok(()));
    }
    t.fail(&["addr:a"], 4).await;
    assert_eq!(t.check(&["addr:a"], 5).await, Err(1));
    assert_eq!(t.check(&["addr:b"], 5).await, Ok(()));
    assert_eq!(t.check(&["addr:b", "addr:a"], 5).await, Err(1));
    assert_eq!(t.check(&["addr:a"], 1004).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_refuses_new_keys() {
    let (_dir, t) = sqlite();
    let t = t.with_limits(5, 1000, 2);
    t.fail(&["a", "b"], 0).await;
    assert!(t.check(&["c"], 1).await.is_err());
    assert_eq!(t.check(&["a"], 1).await, Ok(()));
    // Once the entries age out, they are pruned and new keys are tracked again.
    t.fail(&["c"], 5000).await;
    assert_eq!(t.check(&["c"], 5001).await, Ok(()));
}

/// Issue 17 item 5: five wrong guesses for alice's name from A used to refuse her right
/// password from every address for 15 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_from_one_address_do_not_refuse_the_name_from_another() {
    let (_dir, t) = sqlite();
    let (from_a, from_b) = (keys("alice", "198.51.100.7"), keys("alice", "203.0.113.9"));
    for i in 0..5 {
        assert_eq!(t.check_sign_in(&from_a, i).await, Ok(()));
        t.fail_sign_in(&from_a, i).await;
    }
    // The name's back-off has started (one second), and nothing more: after it, her
    // right password from B is checked.
    let wait = t.check_sign_in(&from_b, 5).await.unwrap_err();
    assert!(wait <= 1, "waits {wait} s");
    assert_eq!(t.check_sign_in(&from_b, 5 + BACKOFF_BASE_MS).await, Ok(()));
    assert_eq!(t.check_sign_in(&from_b, 10 * MINUTE).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_from_one_address_lock_that_address() {
    let (_dir, t) = sqlite();
    let from_a = keys("alice", "198.51.100.7");
    for i in 0..5 {
        t.fail_sign_in(&from_a, i).await;
    }
    // A is refused for the window, for alice and for any other name.
    let at = 10 * MINUTE;
    let wait = t.check_sign_in(&from_a, at).await.unwrap_err();
    assert!((5 * 60..=5 * 60 + 1).contains(&wait), "waits {wait} s");
    assert!(
        t.check_sign_in(&keys("bob", "198.51.100.7"), at)
            .await
            .is_err()
    );
    assert_eq!(t.check_sign_in(&from_a, 15 * MINUTE + 4).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_in_one_ipv6_slash_64_count_as_one() {
    let (_dir, t) = sqlite();
    for i in 0..5 {
        let addr = format!("2001:db8:1:2::{:x}", i + 1);
        t.fail_sign_in(&keys("alice", &addr), i).await;
    }
    let at = MINUTE;
    assert!(
        t.check_sign_in(&keys("alice", "2001:db8:1:2:ffff::9"), at)
            .await
            .is_err()
    );
    assert!(
        t.check_sign_in(&keys("bob", "2001:db8:1:2::77"), at)
            .await
            .is_err()
    );
    // The next /64 is another client.
    assert_eq!(
        t.check_sign_in(&keys("alice", "2001:db8:1:3::1"), at).await,
        Ok(())
    );
    // An IPv4-mapped address is its IPv4.
    assert_eq!(
        client_key(ip("::ffff:198.51.100.7")),
        client_key(ip("198.51.100.7"))
    );
}

/// A guesser with 900 addresses, each trying alice's name whenever it may, once a
/// second for 15 minutes: the name's back-off lets only a few dozen guesses through,
/// and alice, trying from her own address at any moment, waits at most the back-off's
/// most before her right password is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_names_back_off_slows_a_distributed_guesser_without_locking_the_name_out() {
    let (_dir, t) = sqlite();
    let t = t.with_backoff_max(15_000);
    let alice = keys("alice", "192.0.2.1");
    let mut guesses = 0;
    let mut longest_wait = 0;
    for second in 0..15 * 60 {
        let now = second * 1000;
        let guesser = keys(
            "alice",
            &format!("198.18.{}.{}", second / 250, second % 250),
        );
        if t.check_sign_in(&guesser, now).await.is_ok() {
            guesses += 1;
            t.fail_sign_in(&guesser, now).await;
        }
        match t.check_sign_in(&alice, now).await {
            Ok(()) => {}
            Err(wait) => longest_wait = longest_wait.max(wait),
        }
    }
    assert!(guesses < 80, "{guesses} guesses got through");
    assert!(longest_wait <= 15, "alice waited up to {longest_wait} s");
    // Her address never failed: once the delay has passed, her password is checked.
    let after = 15 * 60 * 1000 + 15_000;
    assert_eq!(t.check_sign_in(&alice, after).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_off_doubles_up_to_its_most() {
    let (_dir, t) = sqlite();
    let t = t.with_backoff_max(8_000);
    let delays: Vec<i64> = (5..12).map(|f| t.backoff_ms(f)).collect();
    assert_eq!(delays, [1000, 2000, 4000, 8000, 8000, 8000, 8000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_sign_in_clears_its_pair_only() {
    let (_dir, t) = sqlite();
    let from_a = keys("alice", "198.51.100.7");
    for i in 0..4 {
        t.fail_sign_in(&from_a, i).await;
    }
    t.clear_sign_in(&from_a).await;
    // Four more failures do not lock the pair, only the address's count goes on.
    for i in 0..4 {
        t.fail_sign_in(&keys("alice", "198.51.100.7"), 10 + i).await;
    }
    assert!(
        t.check_sign_in(&from_a, 20).await.is_err(),
        "the address has 8 failures"
    );
    assert_eq!(
        t.check_sign_in(&keys("alice", "203.0.113.9"), 20 + 8 * 1000)
            .await,
        Ok(())
    );
}

/// Every row of the table: (key digest, failures).
async fn stored(db: &Db) -> Vec<(String, i64)> {
    db.read(|c| {
        let mut stmt = c.prepare("SELECT key_digest, failures FROM auth_failures")?;
        let rows = stmt.query_map(params![], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    })
    .await
    .unwrap()
}

/// Guesses from one address split across three instances (three handles on one
/// database) lock that address everywhere after five, as on one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_split_across_instances_are_counted_together() {
    let dir = tempfile::tempdir().unwrap();
    for backend in each_backend(dir.path()) {
        let instances: Vec<Throttle> = (0..3)
            .map(|_| Throttle::new(backend.open().unwrap(), "review_sign_in"))
            .collect();
        let from_a = keys("alice", "198.51.100.7");
        for i in 0..5 {
            let on = &instances[i % 3];
            let now = i64::try_from(i).unwrap();
            assert_eq!(on.check_sign_in(&from_a, now).await, Ok(()), "guess {i}");
            on.fail_sign_in(&from_a, now).await;
        }
        for (n, on) in instances.iter().enumerate() {
            assert!(
                on.check_sign_in(&keys("bob", "198.51.100.7"), 10)
                    .await
                    .is_err(),
                "instance {n} refuses the address"
            );
        }
        // The approvals API counts apart: its namespace has no failure of this address.
        let api = Throttle::new(backend.open().unwrap(), "approvals_api");
        assert_eq!(
            api.check(&[&client_key(ip("198.51.100.7"))], 10).await,
            Ok(())
        );
    }
}

/// A flood of made-up names from made-up addresses never grows the table past its
/// cap: once it is full, new keys are refused (fail closed) and not stored; once rows
/// expire they are pruned and new keys are tracked again. Nothing of a typed name is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_names_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    for backend in each_backend(dir.path()) {
        let db = backend.open().unwrap();
        let t = Throttle::new(db.clone(), "review_sign_in").with_limits(5, 1000, 60);
        for i in 0..400 {
            let flood = keys(
                &format!("made-up-{i}"),
                &format!("198.18.{}.{}", i / 200, i % 200),
            );
            t.fail_sign_in(&flood, 100).await;
        }
        let rows = stored(&db).await;
        assert_eq!(rows.len(), 60, "the table holds its cap, no more");
        assert!(
            rows.iter()
                .all(|(k, _)| k.len() == 64 && !k.contains("made-up")),
            "only digests are stored"
        );
        // Full: a key not tracked yet is refused for the window.
        let newcomer = keys("carol", "192.0.2.44");
        assert_eq!(t.check_sign_in(&newcomer, 200).await, Err(1));
        t.fail_sign_in(&newcomer, 200).await;
        assert_eq!(stored(&db).await.len(), 60);
        // Past the window the flood's rows are dead: the next failure prunes them.
        assert_eq!(t.check_sign_in(&newcomer, 1200).await, Ok(()));
        t.fail_sign_in(&newcomer, 1200).await;
        assert_eq!(stored(&db).await.len(), 3, "the newcomer's three keys");
    }
}
