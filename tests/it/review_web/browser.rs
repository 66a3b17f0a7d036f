//! In a real browser: sign in from a note's link, deny with a message, approve a lower
//! amount, lose a race to a second reviewer, see a hostile diagnosis as text, post a
//! form without its CSRF token, and be throttled after five wrong passwords.

use fantoccini::Locator;
use serde_json::json;

use super::web::{Browser, PASSWORD, add_reviewer, note_link};
use crate::support::world::{World, refunds};

const HOSTILE: &str =
    "Refund it.<script>window.__pwned = 1</script>\"><img src=x onerror=\"window.__pwned = 2\">";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviewers_deny_and_approve_a_lower_amount_in_a_browser() {
    let world = World::new().await;
    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    add_reviewer(&app, "bob").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 3000])
        .await;
    let hold = |charge: &str, amount: u64| json!({"charge": charge, "amount": amount, "reason": "requested_by_customer"});
    let (status, first) = ada
        .session
        .call(
            "stripe.create_refund",
            hold(&ada.charges[0], 1000),
            Some("the customer cancelled in the trial"),
        )
        .await;
    assert_eq!(status, 202, "{first}");
    let (status, second) = ada
        .session
        .call(
            "stripe.create_refund",
            hold(&ada.charges[1], 2000),
            Some(HOSTILE),
        )
        .await;
    assert_eq!(status, 202, "{second}");
    let (first, second) = (
        first["execution_id"].as_str().expect("id").to_owned(),
        second["execution_id"].as_str().expect("id").to_owned(),
    );

    // The note's link goes through sign-in and straight back to that approval.
    let link = note_link(&world, &app, &ada.session.thread_id, &first).await;
    let alice = Browser::start().await;
    alice.open(&link).await;
    alice.sign_in("alice", PASSWORD).await;
    alice.wait_for("form[action$='/decide']").await;
    let url = alice.client.current_url().await.expect("url");
    assert_eq!(url.path(), format!("/approvals/{first}"));
    assert!(alice.text("pre.args").await.contains("\"amount\": 1000"));

    // Screenshots of one approval and of the queue, at phone and desktop widths.
    alice.screenshot("approval-phone", 390, 844).await;
    alice.screenshot("approval-desktop", 1280, 900).await;
    alice.open(&format!("http://{}/approvals", app.addr)).await;
    alice.wait_for("ul.rows").await;
    assert_eq!(
        alice
            .client
            .find_all(Locator::Css("ul.rows > li"))
            .await
            .expect("rows")
            .len(),
        2
    );
    alice.screenshot("queue-phone", 390, 844).await;
    alice.screenshot("queue-desktop", 1280, 900).await;

    // Deny with a message: the agent's execution returns the denial and the message.
    alice.open(&link).await;
    let message = "Offer store credit instead; no refund after the trial.";
    alice
        .wait_for("textarea[name=message]")
        .await
        .send_keys(message)
        .await
        .expect("type");
    alice.submit("button[value=deny]").await;
    assert!(alice.text("p.banner").await.starts_with("Denied."));
    let seen = ada.session.wait(&first, 30).await;
    assert_eq!(seen["status"], "denied", "{seen}");
    assert_eq!(seen["message"], message);
    assert_eq!(seen["reviewer"], "alice");

    // The hostile diagnosis is text: no element made of it, nothing ran.
    let page = format!("http://{}/approvals/{second}", app.addr);
    alice.open(&page).await;
    let shown = alice.text("blockquote.diagnosis").await;
    assert!(
        shown.contains("<script>window.__pwned = 1</script>"),
        "{shown}"
    );
    assert!(shown.contains("<img src=x onerror="), "{shown}");
    let scripts = alice
        .client
        .find_all(Locator::Css("script, main img"))
        .await
        .expect("find");
    assert!(scripts.is_empty(), "the page has script or img elements");
    assert_eq!(
        alice.script("return typeof window.__pwned").await,
        "undefined"
    );

    // Bob opens the same approval in his own browser.
    let bob = Browser::start().await;
    bob.open(&page).await;
    bob.sign_in("bob", PASSWORD).await;
    bob.wait_for("button[value=deny]").await;

    // Alice approves a lower amount; then Bob's denial finds it already decided.
    let amount = alice.wait_for("input[name='lower.amount']").await;
    amount.clear().await.expect("clear");
    amount.send_keys("8.00").await.expect("type");
    alice.submit("button[value=approve]").await;
    assert!(alice.text("p.banner").await.starts_with("Approved."));
    bob.submit("button[value=deny]").await;
    let told = bob.text("p.banner").await;
    assert!(told.contains("alice already approved this at"), "{told}");
    assert!(
        bob.client
            .find_all(Locator::Css("button[value=deny]"))
            .await
            .expect("find")
            .is_empty()
    );

    // The agent's wait returns what ran: one refund of the lower amount.
    let done = ada.session.wait(&second, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["amount"], 800, "{done}");
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["amount"], 800);
    assert_eq!(made[0]["charge"], ada.charges[1].as_str());

    // The history and the thread's trail show both decisions.
    alice
        .open(&format!("http://{}/approvals/history", app.addr))
        .await;
    let history = alice.text("ul.rows").await;
    assert!(
        // Statuses are upper-cased by the style sheet.
        history.to_lowercase().contains("denied") && history.contains(message),
        "{history}"
    );
    assert!(
        history.contains("approved narrower: amount 20.00 USD -> 8.00 USD"),
        "{history}"
    );
    alice
        .open(&format!(
            "http://{}/threads/{}",
            app.addr, ada.session.thread_id
        ))
        .await;
    let trail = alice.text("table.calls").await;
    assert!(
        trail.contains("approved") && trail.contains("denied") && trail.contains("ran"),
        "{trail}"
    );

    alice.close().await;
    bob.close().await;
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_csrf_is_refused_and_wrong_passwords_are_throttled_in_a_browser() {
    let world = World::new().await;
    let app = world.start().await;
    add_reviewer(&app, "carol").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 700).await;
    let base = format!("http://{}", app.addr);

    let b = Browser::start().await;
    b.open(&format!("{base}/approvals/{id}")).await;
    b.sign_in("carol", PASSWORD).await;
    b.wait_for("form[action$='/decide']").await;
    // Take the CSRF field out of the form, then submit it.
    b.script("document.querySelectorAll('form[action$=\"/decide\"] input[name=csrf]').forEach(e => e.remove())")
        .await;
    b.submit("button[value=deny]").await;
    assert_eq!(b.text("h1").await, "Refused");
    assert!(b.text("main").await.contains("CSRF"));
    assert_eq!(app.execution(&id).await.status, "held");

    // Five wrong passwords, then even the right one is refused for a while.
    b.open(&format!("{base}/approvals")).await;
    b.submit("button.link").await;
    for i in 0..5 {
        b.sign_in("carol", &format!("wrong password {i}")).await;
        let said = b.text("p.banner").await;
        assert_eq!(said, "Wrong name or password.", "attempt {i}");
        // The form keeps the name: clear it before the next attempt.
        b.wait_for("input[name=name]")
            .await
            .clear()
            .await
            .expect("clear");
    }
    b.sign_in("carol", PASSWORD).await;
    let said = b.text("p.banner").await;
    assert!(said.starts_with("Too many failed sign-ins"), "{said}");
    assert!(
        b.client
            .find_all(Locator::Css("button.link"))
            .await
            .expect("find")
            .is_empty(),
        "not signed in"
    );

    b.close().await;
    app.stop().await;
}
