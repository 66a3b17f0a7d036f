//! What a relay credential reaches: its own session only; nothing when expired,
//! tampered, minted under another key or of a stopped session; and the relay keeps its
//! own credential alive by renewing it.

use std::time::Duration;

use serde_json::json;
use threadgate::clock::Clock;
use threadgate::ids::{SessionId, ThreadId};
use threadgate::relay::{CredentialError, RelayCredentials};
use threadgate::secrets::{ExposeSecret as _, MasterKey};
use tokio::io::AsyncReadExt as _;

use crate::support::logs::captured_text;
use crate::support::relay::{RunningRelay, greet};
use crate::support::wait::eventually;
use crate::support::world::World;

fn session_id(text: &str) -> SessionId {
    SessionId::parse(text).expect("session id")
}

fn greeting(credential: &str) -> String {
    format!("TGR1 stream {credential}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_reaches_its_own_session_and_no_other() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let app = world.start().await;
    let (ada, bob) = world.ada_and_bob(&app).await;
    let minted = app.relay_credentials.mint(&session_id(&ada.session.id));
    let relay =
        RunningRelay::presenting(&app, world.dir.path(), "ada", &tls.ca_file, minted.clone()).await;
    let pod = relay.session(&ada.session);

    // The feed through the relay is Ada's thread's, not Bob's.
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, ada_feed) = ada.session.get("/v1/events?after=0").await;
    let (_, bob_feed) = bob.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, ada_feed);
    assert_ne!(relayed, bob_feed);

    // Bob's charge is out of Ada's scope through the relay, in scope on Bob's socket.
    let args = json!({"charge": bob.charges[0]});
    let (status, body) = pod.call("stripe.get_charge", args.clone(), None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "out_of_scope", "{body}");
    let (status, body) = bob.session.call("stripe.get_charge", args, None).await;
    assert_eq!(status, 200, "{body}");

    // The credential alone names the session: renaming it to Bob's breaks it.
    let renamed = minted.expose_secret().replacen(
        &format!(".{}.", ada.session.id),
        &format!(".{}.", bob.session.id),
        1,
    );
    assert_ne!(renamed, minted.expose_secret());
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(&renamed)).await;
    assert_eq!(answer, "NO invalid\n");
    relay.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tampered_foreign_and_stopped_credentials_reach_no_session() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = session_id(&ada.session.id);
    let now = Clock::system().now_ms();
    let valid = app.relay_credentials.mint(&id);
    let expired = app.relay_credentials.mint_expiring(&id, now - 1);
    let mut tampered = valid.expose_secret().to_owned();
    let last = tampered.pop().expect("a last character");
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let foreign = RelayCredentials::new(
        &MasterKey::generate(),
        Duration::from_secs(900),
        Clock::system(),
    )
    .mint(&id);

    let refused = [
        ("expired", greeting(expired.expose_secret()), "NO expired\n"),
        ("tampered", greeting(&tampered), "NO invalid\n"),
        (
            "another key",
            greeting(foreign.expose_secret()),
            "NO invalid\n",
        ),
        (
            "not a greeting",
            "GET / HTTP/1.1\r\n".to_owned(),
            "NO malformed\n",
        ),
        (
            "another purpose",
            format!("TGR1 admin {}\n", valid.expose_secret()),
            "NO malformed\n",
        ),
    ];
    for (what, line, want) in refused {
        let (answer, mut stream) = greet(&app, &tls.ca_file, &line).await;
        assert_eq!(answer, want, "{what}");
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        assert!(
            rest.is_empty(),
            "{what}: the connection closes after the refusal"
        );
    }

    // A relay holding an expired credential answers its agent with a 502 and reaches
    // nothing of the session.
    let relay = RunningRelay::presenting(
        &app,
        world.dir.path(),
        "expired",
        &tls.ca_file,
        expired.clone(),
    )
    .await;
    let (status, body) = relay
        .session(&ada.session)
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"], "gateway_unreachable", "{body}");
    assert!(
        app.executions().await.is_empty(),
        "no call was recorded for any session"
    );
    relay.stop().await;

    // A connection open when the session stops is closed; a new one is refused.
    let (answer, mut open) = greet(&app, &tls.ca_file, &greeting(valid.expose_secret())).await;
    assert_eq!(answer, "OK\n");
    let thread = ThreadId::parse(ada.session.thread_id.as_str()).expect("thread");
    app.supervisor
        .stop(&thread)
        .await
        .expect("stop the session");
    app.session_stops(&ada.session.thread_id).await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), open.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the open relayed connection is closed at the stop"
    );
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(valid.expose_secret())).await;
    assert_eq!(answer, "NO stopped\n");

    let logs = captured_text();
    for credential in [valid.expose_secret(), expired.expose_secret(), &tampered] {
        assert!(!logs.contains(credential), "a credential was logged");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_renews_its_credential_before_it_expires() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    world.settings.relay.credential_ttl = Duration::from_secs(3);
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let minted = app.relay_credentials.mint(&session_id(&ada.session.id));
    let relay =
        RunningRelay::presenting(&app, world.dir.path(), "ada", &tls.ca_file, minted.clone()).await;
    let pod = relay.session(&ada.session);
    let args = json!({"charge": ada.charges[0]});
    let (status, body) = pod.call("stripe.get_charge", args.clone(), None).await;
    assert_eq!(status, 200, "{body}");

    // Once the credential the relay was given has expired, the relay still gets through:
    // it renewed its credential over a control connection before then.
    eventually("the first credential expires", || async {
        app.relay_credentials.verify(&minted) == Err(CredentialError::Expired)
    })
    .await;
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(minted.expose_secret())).await;
    assert_eq!(answer, "NO expired\n");
    let (status, body) = pod.call("stripe.get_charge", args, None).await;
    assert_eq!(status, 200, "through the renewed credential: {body}");
    let file = std::fs::read_to_string(&relay.token_file).expect("token file");
    assert_eq!(file, minted.expose_secret(), "the renewal stays in memory");
    assert!(
        captured_text().contains("relay credential renewed"),
        "the renewal is logged (without the credential)"
    );
    assert!(!captured_text().contains(minted.expose_secret()));
    relay.stop().await;
    app.stop().await;
}
