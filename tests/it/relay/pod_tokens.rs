//! A claimed pod's relay presents its projected service-account token instead of a
//! minted credential: over the real relay listener, the token of the pod adopted for a
//! session reaches that session (and the relay then renews into a minted credential);
//! a token of an unknown pod, of a pod recreated under the adopted one's name, of the
//! wrong audience or of a stopped session reaches nothing; and while the API server
//! cannot review, tokens are refused (`NO unavailable`), never let through.

use std::sync::Arc;

use serde_json::json;
use threadgate::ids::{SessionId, ThreadId};
use threadgate::sandbox::k8s::{Adopted, Adoptions, TokenReviewer};
use threadgate::secrets::ExposeSecret as _;

use crate::support::logs::captured_text;
use crate::support::relay::{RunningRelay, greet};
use crate::support::token_review::{FakeTokenReview, PodToken};
use crate::support::world::World;

fn greeting(token: &str) -> String {
    format!("TGR1 stream {token}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_pods_token_reaches_its_session_and_no_other_token_does() {
    let reviews = FakeTokenReview::start().await;
    let adoptions = Adoptions::default();
    let mut world = World::new().await;
    world
        .sandbox
        .set_pod_token_verifier(Arc::new(TokenReviewer::new(
            reviews.client(),
            "threadgate",
            adoptions.clone(),
        )));
    let tls = world.use_relay();
    let app = world.start().await;
    let (ada, bob) = world.ada_and_bob(&app).await;
    let adopt = |pod: &str, uid: &str, session: &str| {
        adoptions.record(
            uid.to_owned(),
            Adopted {
                pod_name: pod.to_owned(),
                session: SessionId::parse(session).expect("session id"),
            },
        );
    };
    adopt("pool-ada", "uid-ada", &ada.session.id);
    adopt("pool-bob", "uid-bob", &bob.session.id);
    let ada_token = reviews.issue(PodToken::sandbox("pool-ada", "uid-ada"));

    // The relay of Ada's pod, greeted with the pod's token: Ada's thread, not Bob's.
    let relay = RunningRelay::presenting(
        &app,
        world.dir.path(),
        "ada",
        &tls.ca_file,
        ada_token.clone(),
    )
    .await;
    let pod = relay.session(&ada.session);
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, ada_feed) = ada.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, ada_feed);
    let (status, body) = pod
        .call("stripe.get_charge", json!({"charge": bob.charges[0]}), None)
        .await;
    assert_eq!(status, 403, "Bob's charge is out of Ada's scope: {body}");
    let (status, body) = pod
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    relay.stop().await;
    let reviewed = reviews.asked();
    assert!(reviewed >= 1);

    // Refused, each before any session is reached.
    let refused = [
        (
            "an unknown pod",
            reviews.issue(PodToken::sandbox("stranger", "uid-stranger")),
            "NO invalid\n",
        ),
        (
            "a pod recreated under the adopted name",
            reviews.issue(PodToken::sandbox("pool-ada", "uid-new")),
            "NO invalid\n",
        ),
        (
            "the wrong audience",
            reviews.issue(PodToken {
                audience: "https://kubernetes.default.svc".into(),
                ..PodToken::sandbox("pool-ada", "uid-ada")
            }),
            "NO invalid\n",
        ),
        (
            "another service account",
            reviews.issue(PodToken {
                service_account: "default".into(),
                ..PodToken::sandbox("pool-ada", "uid-ada")
            }),
            "NO invalid\n",
        ),
    ];
    for (what, token, want) in refused {
        let (answer, _) = greet(&app, &tls.ca_file, &greeting(token.expose_secret())).await;
        assert_eq!(answer, want, "{what}");
    }

    // Bob's pod's token reaches Bob's session, whatever relay presents it.
    let bob_token = reviews.issue(PodToken::sandbox("pool-bob", "uid-bob"));
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(bob_token.expose_secret())).await;
    assert_eq!(answer, "OK\n");

    // The API server cannot review: a token not reviewed before is refused.
    reviews.set_failing(true);
    let fresh = reviews.issue(PodToken::sandbox("pool-ada", "uid-ada"));
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(fresh.expose_secret())).await;
    assert_eq!(answer, "NO unavailable\n");
    reviews.set_failing(false);
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(fresh.expose_secret())).await;
    assert_eq!(answer, "OK\n");

    // A stopped session: its pod's token (reviewed and cached) reaches nothing.
    let thread = ThreadId::parse(ada.session.thread_id.as_str()).expect("thread");
    app.supervisor.stop(&thread).await.expect("stop");
    app.session_stops(&ada.session.thread_id).await;
    let (answer, _) = greet(&app, &tls.ca_file, &greeting(fresh.expose_secret())).await;
    assert_eq!(answer, "NO stopped\n");

    let logs = captured_text();
    for token in [&ada_token, &bob_token, &fresh] {
        assert!(!logs.contains(token.expose_secret()), "a token was logged");
    }
    app.stop().await;
}
