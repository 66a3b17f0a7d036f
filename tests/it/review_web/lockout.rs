//! Issue 17 item 5: five wrong guesses for a reviewer's name from any address used to
//! refuse her right password from every address for 15 minutes. Now the guesser's own
//! address is locked, and the name elsewhere only backs off briefly; time moves on the
//! app's clock, not by sleeping.

use std::net::IpAddr;
use std::time::Duration;

use super::web::{PASSWORD, add_reviewer, csrf_of, set_cookie};
use crate::support::app::TestApp;
use crate::support::world::World;

/// Posts the sign-in form from the loopback address `from` (127.0.0.0/8 all reach the
/// listener); returns the status and the page.
async fn sign_in_from(app: &TestApp, from: &str, name: &str, password: &str) -> (u16, String) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(from.parse::<IpAddr>().unwrap())
        .build()
        .unwrap();
    let base = format!("http://{}", app.addr);
    let form = http.get(format!("{base}/login")).send().await.unwrap();
    let (login_cookie, _) = set_cookie(&form, "tg_login").expect("login cookie");
    let csrf = csrf_of(&form.text().await.unwrap());
    let answer = http
        .post(format!("{base}/login"))
        .header("Cookie", login_cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", name),
            ("password", password),
            ("next", "/approvals"),
        ])
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_from_one_address_lock_that_address_and_not_the_reviewer() {
    let world = World::new().await;
    let (app, clock) = world.start_with_clock().await;
    add_reviewer(&app, "alice").await;
    let (stranger, alice) = ("127.0.0.2", "127.0.0.3");
    for i in 0..5 {
        let (status, page) = sign_in_from(&app, stranger, "alice", &format!("guess {i}")).await;
        assert_eq!(status, 401, "guess {i}: {page}");
    }
    // The name backs off for a second after the fifth failure, no more.
    clock.advance(Duration::from_secs(2));
    let (status, page) = sign_in_from(&app, alice, "alice", PASSWORD).await;
    assert_eq!(
        status, 303,
        "alice's right password from her address: {page}"
    );
    // The stranger's address is locked, even with the right password.
    let (status, page) = sign_in_from(&app, stranger, "alice", PASSWORD).await;
    assert_eq!(status, 429, "{page}");
    assert!(page.contains("Too many failed sign-ins"), "{page}");
    clock.advance(Duration::from_secs(15 * 60));
    let (status, page) = sign_in_from(&app, stranger, "alice", PASSWORD).await;
    assert_eq!(status, 303, "the lock ends with its window: {page}");
    app.stop().await;
}
