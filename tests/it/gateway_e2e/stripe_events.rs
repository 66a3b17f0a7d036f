//! The read path remembers customer emails only while Stripe's webhook events keep them
//! true: with `[stripe] webhook_secret`, a read answered once is answered from memory,
//! and localstripe's real, signed `customer.updated` delivery to `POST /webhooks/stripe`
//! makes the next read ask again (and be refused when the customer is no longer the
//! thread's). A forged event forgets nothing. Without the secret, nothing is remembered.

use serde_json::json;
use threadgate::connectors::stripe::events::sign;

use crate::support::wait::eventually;
use crate::support::world::World;

const WEBHOOK_SECRET: &str = "whsec_threadgate_test_0123456789";

/// Gives Ada's Stripe customer another email, as a person editing it in Stripe would.
async fn set_email(world: &World, customer: &str, email: &str) {
    world
        .stripe
        .post(&format!("customers/{customer}"), &[("email", email)])
        .await;
}

/// Ada's customer object, read from her own thread.
async fn read_ada(session: &crate::support::world::Session, ada: &str) -> (u16, String) {
    let (status, body) = session
        .call("stripe.get_customer", json!({"customer": ada}), None)
        .await;
    (status, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_change_reaches_the_read_scope_through_stripes_signed_event() {
    let mut world = World::new().await;
    world.use_stripe_events(WEBHOOK_SECRET).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let session = &ada.session;

    let (status, body) = read_ada(session, &ada.id).await;
    assert_eq!(status, 200, "{body}");

    // Ada's Stripe customer moves to another person's email while Stripe's events are
    // not delivered yet: the memory still answers (this is what it saves).
    set_email(&world, &ada.id, "mallory@example.com").await;
    let (status, body) = read_ada(session, &ada.id).await;
    assert_eq!(status, 200, "answered from memory: {body}");

    // A forged customer.updated (wrong secret) is refused and forgets nothing.
    let event = json!({
        "id": "evt_forged", "type": "customer.updated",
        "data": {"object": {"id": ada.id, "object": "customer"}},
    })
    .to_string();
    let now = chrono::Utc::now().timestamp();
    for signature in [
        sign(event.as_bytes(), b"whsec_guessed", now),
        sign(event.as_bytes(), WEBHOOK_SECRET.as_bytes(), now - 3600),
        String::new(),
    ] {
        let response = app
            .http
            .post(format!("http://{}/webhooks/stripe", app.addr))
            .header("Stripe-Signature", &signature)
            .body(event.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{signature}");
        let text = response.text().await.unwrap();
        assert!(!text.contains(WEBHOOK_SECRET), "{text}");
    }
    let (status, body) = read_ada(session, &ada.id).await;
    assert_eq!(status, 200, "a forged event forgets nothing: {body}");

    // localstripe delivers its real, signed events to threadgate from now on; the next
    // change of the customer arrives as customer.updated and the read asks again.
    let http = reqwest::Client::new();
    let registered = http
        .post(format!(
            "{}/_config/webhooks/threadgate",
            world.stripe.base_url()
        ))
        .form(&[
            ("url", format!("http://{}/webhooks/stripe", app.addr)),
            ("secret", WEBHOOK_SECRET.to_owned()),
        ])
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success());
    set_email(&world, &ada.id, "mallory@example.net").await;
    eventually(
        "the read is refused once Stripe's event arrived",
        || async {
            let (status, body) = read_ada(session, &ada.id).await;
            status == 403 && body.contains("out_of_scope") && !body.contains("mallory")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_stripes_events_every_read_asks_and_the_endpoint_is_absent() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let (status, body) = read_ada(&ada.session, &ada.id).await;
    assert_eq!(status, 200, "{body}");
    set_email(&world, &ada.id, "mallory@example.com").await;
    let (status, body) = read_ada(&ada.session, &ada.id).await;
    assert_eq!(status, 403, "the very next read asks Stripe: {body}");
    assert!(!body.contains("mallory"), "{body}");

    let response = app
        .http
        .post(format!("http://{}/webhooks/stripe", app.addr))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// A `Stripe-Signature` of thousands of `v1` entries over a 1 MiB body (issue 17 item 1:
/// each entry used to cost one HMAC of the whole body on a runtime worker, before
/// anything was authenticated).
fn flood_request(app: &crate::support::app::TestApp) -> reqwest::RequestBuilder {
    let now = chrono::Utc::now().timestamp();
    let header = format!("t={now}{}", format!(",v1={}", "ab".repeat(32)).repeat(6000));
    app.http
        .post(format!("http://{}/webhooks/stripe", app.addr))
        .header("Stripe-Signature", header)
        .body(vec![b'x'; 1 << 20])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signature_of_thousands_of_entries_is_refused_and_healthz_answers_during_a_flood() {
    let mut world = World::new().await;
    world.use_stripe_events(WEBHOOK_SECRET).await;
    let app = world.start().await;

    // A figure, not an assertion: how long one such request takes to be refused.
    let started = std::time::Instant::now();
    let response = flood_request(&app).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    eprintln!(
        "refused a 6,000-entry Stripe-Signature over a 1 MiB body in {:?}",
        started.elapsed()
    );
    assert!(
        text.contains("webhook_max_signature_bytes (1024)"),
        "{text}"
    );

    // Four clients send such requests in a loop while /healthz is probed: every probe
    // answers (the timeout is a generous liveness guard; before the fix a probe waited
    // for tens of seconds of MACs on both runtime workers).
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let request = flood_request(&app);
        flood.spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..10 {
                let sent = request.try_clone().unwrap().send().await.unwrap();
                statuses.push(sent.status().as_u16());
            }
            statuses
        });
    }
    let probe = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    let mut probes = 0;
    while probes < 10 || !flood.is_empty() && probes < 1000 {
        let health = probe
            .get(format!("http://{}/healthz", app.addr))
            .send()
            .await
            .expect("/healthz answers during the flood");
        assert_eq!(health.status(), 200);
        probes += 1;
        while let Some(done) = flood.try_join_next() {
            assert!(done.unwrap().iter().all(|s| *s == 400));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    while let Some(done) = flood.join_next().await {
        assert!(done.unwrap().iter().all(|s| *s == 400));
    }
}

/// Two instances on one Postgres: Stripe's event reaches one, and the other, which
/// remembered the email, forgets it at its next call (through the database, with no
/// round trip added to the read) instead of keeping it up to `email_max_age`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_change_sent_to_one_instance_reaches_anothers_read_scope() {
    let Some(pg) = threadgate::store::testing::TestDb::postgres_from_env() else {
        eprintln!("THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let mut world = World::new().await;
    world.use_postgres(pg.url().expect("a postgres url")).await;
    world.use_stripe_events(WEBHOOK_SECRET).await;
    // The instance that reads, with the session running before the other starts: with
    // both running, either could take the new thread's lease, and the session's socket
    // is in the data directory of the one that did.
    let reads = world.start().await;
    let ada = world
        .customer_session(&reads, "ada@example.com", &[5000])
        .await;
    // The second instance, which Stripe tells: its own data directory (and instance
    // id), the same database.
    world.settings.data_dir = world.dir.path().join("data-second");
    std::fs::create_dir_all(&world.settings.data_dir).expect("data dir");
    let told = world.start().await;

    let (status, body) = read_ada(&ada.session, &ada.id).await;
    assert_eq!(status, 200, "{body}");
    set_email(&world, &ada.id, "mallory@example.com").await;
    let (status, body) = read_ada(&ada.session, &ada.id).await;
    assert_eq!(status, 200, "answered from memory: {body}");

    // Stripe tells the other instance.
    let event = json!({
        "id": "evt_elsewhere", "type": "customer.updated",
        "data": {"object": {"id": ada.id, "object": "customer"}},
    })
    .to_string();
    let signature = sign(
        event.as_bytes(),
        WEBHOOK_SECRET.as_bytes(),
        chrono::Utc::now().timestamp(),
    );
    let response = told
        .http
        .post(format!("http://{}/webhooks/stripe", told.addr))
        .header("Stripe-Signature", signature)
        .body(event)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    // The very next read on the instance that was not told asks Stripe again.
    let (status, body) = read_ada(&ada.session, &ada.id).await;
    assert_eq!(status, 403, "forgotten through the database: {body}");
    assert!(
        body.contains("out_of_scope") && !body.contains("mallory"),
        "{body}"
    );
    reads.stop().await;
    told.stop().await;
    drop(pg);
}
