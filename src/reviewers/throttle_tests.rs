//! The throttle's rules, on the clock the caller passes (milliseconds), without sleeps.

use std::net::IpAddr;

use super::*;

const MINUTE: i64 = 60 * 1000;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn keys(name: &str, addr: &str) -> SignInKeys {
    SignInKeys::new(name, &client_key(ip(addr)))
}

#[test]
fn five_failures_lock_the_key_until_the_window_passes() {
    let t = Throttle::new(5, 1000, 10);
    for i in 0..4 {
        t.fail(&["addr:a"], i);
        assert_eq!(t.check(&["addr:a"], i), Ok(()));
    }
    t.fail(&["addr:a"], 4);
    assert_eq!(t.check(&["addr:a"], 5), Err(1));
    assert_eq!(t.check(&["addr:b"], 5), Ok(()));
    assert_eq!(t.check(&["addr:b", "addr:a"], 5), Err(1));
    assert_eq!(t.check(&["addr:a"], 1004), Ok(()));
}

#[test]
fn a_full_table_refuses_new_keys() {
    let t = Throttle::new(5, 1000, 2);
    t.fail(&["a", "b"], 0);
    assert!(t.check(&["c"], 1).is_err());
    assert_eq!(t.check(&["a"], 1), Ok(()));
    // Once the entries age out, they are pruned and new keys are tracked again.
    t.fail(&["c"], 5000);
    assert_eq!(t.check(&["c"], 5001), Ok(()));
}

/// Issue 17 item 5: five wrong guesses for alice's name from A used to refuse her right
/// password from every address for 15 minutes.
#[test]
fn guesses_from_one_address_do_not_refuse_the_name_from_another() {
    let t = Throttle::default();
    let (from_a, from_b) = (keys("alice", "198.51.100.7"), keys("alice", "203.0.113.9"));
    for i in 0..5 {
        assert_eq!(t.check_sign_in(&from_a, i), Ok(()));
        t.fail_sign_in(&from_a, i);
    }
    // The name's back-off has started (one second), and nothing more: after it, her
    // right password from B is checked.
    let wait = t.check_sign_in(&from_b, 5).unwrap_err();
    assert!(wait <= 1, "waits {wait} s");
    assert_eq!(t.check_sign_in(&from_b, 5 + BACKOFF_BASE_MS), Ok(()));
    assert_eq!(t.check_sign_in(&from_b, 10 * MINUTE), Ok(()));
}

#[test]
fn guesses_from_one_address_lock_that_address() {
    let t = Throttle::default();
    let from_a = keys("alice", "198.51.100.7");
    for i in 0..5 {
        t.fail_sign_in(&from_a, i);
    }
    // A is refused for the window, for alice and for any other name.
    let at = 10 * MINUTE;
    let wait = t.check_sign_in(&from_a, at).unwrap_err();
    assert!((5 * 60..=5 * 60 + 1).contains(&wait), "waits {wait} s");
    assert!(t.check_sign_in(&keys("bob", "198.51.100.7"), at).is_err());
    assert_eq!(t.check_sign_in(&from_a, 15 * MINUTE + 4), Ok(()));
}

#[test]
fn addresses_in_one_ipv6_slash_64_count_as_one() {
    let t = Throttle::default();
    for i in 0..5 {
        let addr = format!("2001:db8:1:2::{:x}", i + 1);
        t.fail_sign_in(&keys("alice", &addr), i);
    }
    let at = MINUTE;
    assert!(
        t.check_sign_in(&keys("alice", "2001:db8:1:2:ffff::9"), at)
            .is_err()
    );
    assert!(
        t.check_sign_in(&keys("bob", "2001:db8:1:2::77"), at)
            .is_err()
    );
    // The next /64 is another client.
    assert_eq!(
        t.check_sign_in(&keys("alice", "2001:db8:1:3::1"), at),
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
#[test]
fn the_names_back_off_slows_a_distributed_guesser_without_locking_the_name_out() {
    let t = Throttle::default().with_backoff_max(15_000);
    let alice = keys("alice", "192.0.2.1");
    let mut guesses = 0;
    let mut longest_wait = 0;
    for second in 0..15 * 60 {
        let now = second * 1000;
        let guesser = keys(
            "alice",
            &format!("198.18.{}.{}", second / 250, second % 250),
        );
        if t.check_sign_in(&guesser, now).is_ok() {
            guesses += 1;
            t.fail_sign_in(&guesser, now);
        }
        match t.check_sign_in(&alice, now) {
            Ok(()) => {}
            Err(wait) => longest_wait = longest_wait.max(wait),
        }
    }
    assert!(guesses < 80, "{guesses} guesses got through");
    assert!(longest_wait <= 15, "alice waited up to {longest_wait} s");
    // Her address never failed: once the delay has passed, her password is checked.
    let after = 15 * 60 * 1000 + 15_000;
    assert_eq!(t.check_sign_in(&alice, after), Ok(()));
}

#[test]
fn the_back_off_doubles_up_to_its_most() {
    let t = Throttle::default().with_backoff_max(8_000);
    let delays: Vec<i64> = (5..12).map(|f| t.backoff_ms(f)).collect();
    assert_eq!(delays, [1000, 2000, 4000, 8000, 8000, 8000, 8000]);
}

#[test]
fn a_successful_sign_in_clears_its_pair_only() {
    let t = Throttle::default();
    let from_a = keys("alice", "198.51.100.7");
    for i in 0..4 {
        t.fail_sign_in(&from_a, i);
    }
    t.clear_sign_in(&from_a);
    // Four more failures do not lock the pair, only the address's count goes on.
    for i in 0..4 {
        t.fail_sign_in(&keys("alice", "198.51.100.7"), 10 + i);
    }
    assert!(
        t.check_sign_in(&from_a, 20).is_err(),
        "the address has 8 failures"
    );
    assert_eq!(
        t.check_sign_in(&keys("alice", "203.0.113.9"), 20 + 8 * 1000),
        Ok(())
    );
}
