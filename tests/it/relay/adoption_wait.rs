//! A parked pod's relay learns of its pod's adoption without polling: it holds one
//! `wait` the gateway answers the moment the pod is adopted. Over the real relay
//! listener and a real relay: exactly one wait, answered by the adoption (long before
//! the gateway's hold), after which the relay fetches its secrets and serves its
//! socket; one wait per pod (a second supersedes the first), a token the API server
//! does not vouch for waits for nothing, and a minted credential is answered at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use threadgate::ids::SessionId;
use threadgate::relay::wire::ADOPTION_WAIT_HOLD;
use threadgate::sandbox::k8s::{Adopted, Adoptions, TokenReviewer};
use threadgate::sandbox::{AdoptionWait, PodTokenError, PodTokenVerifier};
use threadgate::secrets::{ExposeSecret as _, SecretString};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use crate::support::relay::{RelaySetup, RunningRelay, greet, tls_connect};
use crate::support::token_review::{FakeTokenReview, PodToken};
use crate::support::wait::wait_for;
use crate::support::world::World;

/// The pod-token verifier the gateway is given, counting what the listener asks of it.
struct Counting {
    inner: TokenReviewer,
    sessions_asked: AtomicUsize,
    waits: AtomicUsize,
}

#[async_trait::async_trait]
impl PodTokenVerifier for Counting {
    async fn session_of(&self, token: &SecretString) -> Result<SessionId, PodTokenError> {
        self.sessions_asked.fetch_add(1, Ordering::SeqCst);
        self.inner.session_of(token).await
    }

    async fn wait_adopted(
        &self,
        token: &SecretString,
        hold: Duration,
    ) -> Result<AdoptionWait, PodTokenError> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.inner.wait_adopted(token, hold).await
    }
}

struct Gateway {
    world: World,
    app: crate::support::app::TestApp,
    tls: crate::support::relay::TlsFiles,
    reviews: FakeTokenReview,
    adoptions: Adoptions,
    verifier: Arc<Counting>,
}

async fn gateway() -> Gateway {
    let reviews = FakeTokenReview::start().await;
    let adoptions = Adoptions::default();
    let verifier = Arc::new(Counting {
        inner: TokenReviewer::new(reviews.client(), "threadgate", adoptions.clone()),
        sessions_asked: AtomicUsize::new(0),
        waits: AtomicUsize::new(0),
    });
    let mut world = World::new().await;
    world.sandbox.set_pod_token_verifier(verifier.clone());
    let tls = world.use_relay();
    let app = world.start().await;
    Gateway {
        world,
        app,
        tls,
        reviews,
        adoptions,
        verifier,
    }
}

fn adopt(adoptions: &Adoptions, pod: &str, uid: &str, session: &str) {
    adoptions.record(
        uid.to_owned(),
        Adopted {
            pod_name: pod.to_owned(),
            session: SessionId::parse(session).expect("session id"),
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_pods_relay_is_told_of_its_adoption_by_one_held_wait() {
    let gw = gateway().await;
    let ada = gw
        .world
        .customer_session(&gw.app, "ada@example.com", &[5000])
        .await;
    let pod_token = gw.reviews.issue(PodToken::sandbox("pool-ada", "uid-ada"));

    // Adopted only once the relay holds its wait; the relay serves its socket after.
    let adopted_at = {
        let (adoptions, session) = (gw.adoptions.clone(), ada.session.id.clone());
        tokio::spawn(async move {
            let held = wait_for(Duration::from_secs(20), || async {
                (adoptions.waiting() == 1).then_some(())
            })
            .await;
            assert!(held.is_some(), "the relay never held a wait");
            // Longer than the relay's old poll interval (250 ms): a poll would show.
            tokio::time::sleep(Duration::from_millis(600)).await;
            adopt(&adoptions, "pool-ada", "uid-ada", &session);
            Instant::now()
        })
    };
    let secrets_dir = gw.world.dir.path().join("ada-secrets");
    let relay = RunningRelay::start(
        &gw.app,
        gw.world.dir.path(),
        "ada",
        RelaySetup {
            credential: pod_token,
            secrets_dir: Some(secrets_dir.clone()),
            ..RelaySetup::minted(&gw.app, &gw.tls.ca_file, &ada.session)
        },
    )
    .await;
    let serving = Instant::now();
    let adopted_at = adopted_at.await.expect("adopted");
    assert!(secrets_dir.is_dir(), "the secrets were fetched first");
    assert!(
        serving.duration_since(adopted_at) < ADOPTION_WAIT_HOLD,
        "answered by the adoption, not by the hold passing"
    );
    assert_eq!(
        gw.verifier.waits.load(Ordering::SeqCst),
        1,
        "exactly one wait, answered by the adoption"
    );

    // The relay carries Ada's session.
    let pod = relay.session(&ada.session);
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, direct) = ada.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, direct);
    relay.stop().await;
    assert_eq!(gw.adoptions.waiting(), 0);
    gw.app.stop().await;
}

/// Sends a `wait` greeting with `token` and returns the task reading its answer.
async fn hold_wait(gw: &Gateway, token: &str) -> tokio::task::JoinHandle<String> {
    let mut stream = tls_connect(&gw.app, &gw.tls.ca_file)
        .await
        .expect("TLS to the relay listener");
    stream
        .write_all(format!("TGR1 wait {token}\n").as_bytes())
        .await
        .expect("send greeting");
    stream.flush().await.expect("flush");
    tokio::spawn(async move {
        let mut answer = String::new();
        stream.read_line(&mut answer).await.expect("read answer");
        answer
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wait_per_pod_is_held_and_only_an_authentic_token_waits() {
    let gw = gateway().await;
    let ada = gw
        .world
        .customer_session(&gw.app, "ada@example.com", &[5000])
        .await;
    let token = gw.reviews.issue(PodToken::sandbox("pool-ada", "uid-ada"));
    let held = |n: usize| {
        let adoptions = gw.adoptions.clone();
        async move {
            wait_for(Duration::from_secs(10), || async {
                (adoptions.waiting() == n).then_some(())
            })
            .await
            .is_some()
        }
    };

    // A flood of waits for one pod holds one: each new one supersedes the one before.
    let first = hold_wait(&gw, token.expose_secret()).await;
    assert!(held(1).await);
    let second = hold_wait(&gw, token.expose_secret()).await;
    assert_eq!(first.await.expect("first"), "NO superseded\n");
    let third = hold_wait(&gw, token.expose_secret()).await;
    assert_eq!(second.await.expect("second"), "NO superseded\n");
    assert!(held(1).await);
    assert_eq!(gw.adoptions.waiting(), 1, "one wait per pod");

    // The adoption answers the one held.
    adopt(&gw.adoptions, "pool-ada", "uid-ada", &ada.session.id);
    let answered = tokio::time::timeout(ADOPTION_WAIT_HOLD, third)
        .await
        .expect("answered before the hold")
        .expect("third");
    assert_eq!(answered, "OK\n");
    assert!(held(0).await);

    // Tokens the API server does not vouch for wait for nothing.
    for (what, token) in [
        (
            "the wrong audience",
            gw.reviews.issue(PodToken {
                audience: "https://kubernetes.default.svc".into(),
                ..PodToken::sandbox("pool-bob", "uid-bob")
            }),
        ),
        (
            "another service account",
            gw.reviews.issue(PodToken {
                service_account: "default".into(),
                ..PodToken::sandbox("pool-bob", "uid-bob")
            }),
        ),
    ] {
        let (answer, _) = greet(
            &gw.app,
            &gw.tls.ca_file,
            &format!("TGR1 wait {}\n", token.expose_secret()),
        )
        .await;
        assert_eq!(answer, "NO invalid\n", "{what}");
        assert_eq!(gw.adoptions.waiting(), 0, "{what}");
    }

    // A minted credential has nothing to wait for: answered at once.
    let id = SessionId::parse(ada.session.id.as_str()).expect("id");
    let minted = gw.app.relay_credentials.mint(&id);
    let (answer, _) = greet(
        &gw.app,
        &gw.tls.ca_file,
        &format!("TGR1 wait {}\n", minted.expose_secret()),
    )
    .await;
    assert_eq!(answer, "OK\n");
    gw.app.stop().await;
}

/// What the Kubernetes verifier answers on an instance that did not park the pod.
struct ParkedBy(String);

#[async_trait::async_trait]
impl PodTokenVerifier for ParkedBy {
    async fn session_of(&self, _token: &SecretString) -> Result<SessionId, PodTokenError> {
        Err(PodTokenError::Unknown)
    }

    async fn wait_adopted(
        &self,
        _token: &SecretString,
        _hold: Duration,
    ) -> Result<AdoptionWait, PodTokenError> {
        Ok(AdoptionWait::Elsewhere(self.0.clone()))
    }
}

/// Two instances: a relay whose wait reaches the instance that did not park its pod is
/// sent to the one that did (its registered address), waits there, and is served there
/// once that instance adopts the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_reaches_another_instance_is_sent_to_the_one_that_parked_the_pod() {
    let gw = gateway().await;
    let parker_addr = gw.app.relay_addr.expect("relay listener");
    let parker_id = gw
        .app
        .db
        .read(move |conn| {
            for (id, _) in threadgate::store::instances::list(conn)? {
                let addr = threadgate::store::instances::relay_addr(conn, &id, 0)?;
                if addr == Some(parker_addr.to_string()) {
                    return Ok(Some(id));
                }
            }
            Ok(None)
        })
        .await
        .expect("read")
        .expect("the parking instance is registered");
    let other = {
        let mut settings = gw.world.settings.clone();
        settings.data_dir = gw.world.dir.path().join("data-b");
        settings.database_file = gw.world.settings.database_path();
        std::fs::create_dir_all(&settings.data_dir).expect("data dir");
        let sandbox = threadgate::sandbox::FakeRuntime::new();
        sandbox.set_pod_token_verifier(Arc::new(ParkedBy(parker_id)));
        let overrides = threadgate::app::Overrides {
            sandbox: Some(Arc::new(sandbox)),
            clock: None,
        };
        crate::support::app::spawn_app(settings, overrides).await
    };
    let ada = gw
        .world
        .customer_session(&gw.app, "ada@example.com", &[5000])
        .await;
    let token = gw.reviews.issue(PodToken::sandbox("pool-ada", "uid-ada"));

    let (answer, _) = greet(
        &other,
        &gw.tls.ca_file,
        &format!("TGR1 wait {}\n", token.expose_secret()),
    )
    .await;
    assert_eq!(answer, format!("GO {parker_addr}\n"));
    assert_eq!(gw.adoptions.waiting(), 0, "nothing held by the redirect");

    // A relay given the other instance's address waits at the parker and is served there.
    let adopting = {
        let (adoptions, session) = (gw.adoptions.clone(), ada.session.id.clone());
        tokio::spawn(async move {
            let held = wait_for(Duration::from_secs(20), || async {
                (adoptions.waiting() == 1).then_some(())
            })
            .await;
            assert!(held.is_some(), "the relay never held a wait at the parker");
            adopt(&adoptions, "pool-ada", "uid-ada", &session);
        })
    };
    let relay = RunningRelay::start(
        &other,
        gw.world.dir.path(),
        "ada",
        RelaySetup {
            credential: token,
            secrets_dir: Some(gw.world.dir.path().join("ada-secrets")),
            ..RelaySetup::minted(&gw.app, &gw.tls.ca_file, &ada.session)
        },
    )
    .await;
    adopting.await.expect("adopted");
    assert_eq!(gw.verifier.waits.load(Ordering::SeqCst), 1);
    let pod = relay.session(&ada.session);
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, direct) = ada.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, direct);
    relay.stop().await;
    other.stop().await;
    gw.app.stop().await;
}
