//! Claimed pods' relay tokens against the fake API server's TokenReview: the adopted
//! pod's token reaches its session only; a wrong audience, another service account,
//! an unknown pod, a recreated pod of the same name and a stopped session are refused;
//! an API server that cannot be reached refuses (fails closed); positive reviews are
//! cached, junk is never sent for review. A parked pod's relay waits for its
//! adoption: woken by it, one wait per pod, capped, only with an authentic token.

use std::time::{Duration, Instant};

use super::fake_api::{FakeApi, IssuedToken};
use super::{INSTANCE, runtime, settings, spec};
use crate::sandbox::k8s::{MAX_ADOPTION_WAITERS, MAX_WAIT_REVIEWS_IN_FLIGHT};
use crate::sandbox::{
    AdoptionWait, MAX_POD_TOKEN_LEN, PodTokenError, PodTokenVerifier as _, SandboxRuntime as _,
};
use crate::secrets::SecretString;

fn reviews(fake: &FakeApi) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"))
        .count()
}

/// The one pod the claim of `session` was bound to: (name, uid).
fn bound_pod(fake: &FakeApi, session: &str) -> (String, String) {
    let pods = fake.objects("pods");
    let (name, pod) = pods
        .iter()
        .find(|(_, p)| p["metadata"]["annotations"]["threadgate.session"] == session)
        .expect("a bound pod");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    (name.clone(), uid)
}

fn token(fake: &FakeApi, (pod_name, pod_uid): &(String, String)) -> SecretString {
    SecretString::from(fake.pod_token(IssuedToken {
        pod_name: pod_name.clone(),
        pod_uid: pod_uid.clone(),
        service_account: "threadgate-sandbox".into(),
        audience: "threadgate-relay".into(),
    }))
}

#[tokio::test]
async fn the_adopted_pods_token_reaches_its_session_and_nothing_else_does() {
    let fake = FakeApi::start(true).await;
    let rt = runtime(&fake, settings()).await;
    let reviewer = rt.token_reviewer();
    rt.start(&spec("ca")).await.expect("start ca");
    rt.start(&spec("cb")).await.expect("start cb");
    let (pod_a, pod_b) = (bound_pod(&fake, "ca"), bound_pod(&fake, "cb"));

    // Each pod's token reaches its own session, and only that one.
    let a = token(&fake, &pod_a);
    assert_eq!(reviewer.session_of(&a).await.expect("a").as_str(), "ca");
    let b = token(&fake, &pod_b);
    assert_eq!(reviewer.session_of(&b).await.expect("b").as_str(), "cb");
    assert_eq!(reviews(&fake), 2);

    // A positive review is cached: no second review for the same token.
    assert_eq!(reviewer.session_of(&a).await.expect("a").as_str(), "ca");
    assert_eq!(reviews(&fake), 2);
    assert_eq!(reviewer.cached(), 2);

    // Wrong audience, another service account: the API server says no, or says it of
    // someone else.
    let wrong_audience = SecretString::from(fake.pod_token(IssuedToken {
        pod_name: pod_a.0.clone(),
        pod_uid: pod_a.1.clone(),
        service_account: "threadgate-sandbox".into(),
        audience: "https://kubernetes.default.svc".into(),
    }));
    assert_eq!(
        reviewer.session_of(&wrong_audience).await,
        Err(PodTokenError::Invalid)
    );
    let other_account = SecretString::from(fake.pod_token(IssuedToken {
        pod_name: pod_a.0.clone(),
        pod_uid: pod_a.1.clone(),
        service_account: "default".into(),
        audience: "threadgate-relay".into(),
    }));
    assert_eq!(
        reviewer.session_of(&other_account).await,
        Err(PodTokenError::Invalid)
    );

    // A pod of the same name recreated (another uid) is no adopted pod: not reviewed.
    let before = reviews(&fake);
    let recreated = token(&fake, &(pod_a.0.clone(), "another-uid".into()));
    assert_eq!(
        reviewer.session_of(&recreated).await,
        Err(PodTokenError::Unknown)
    );
    // A token the API server never issued that claims an adopted pod: reviewed, refused.
    let forged = {
        let text = token(&fake, &pod_b);
        let text = crate::secrets::ExposeSecret::expose_secret(&text).to_owned();
        let (rest, _signature) = text.rsplit_once('.').expect("jwt");
        SecretString::from(format!("{rest}.forged"))
    };
    assert_eq!(
        reviewer.session_of(&forged).await,
        Err(PodTokenError::Invalid)
    );
    // Junk and an overlong token are refused without asking the API server.
    for junk in [
        String::new(),
        "not-a-jwt".into(),
        "a.b.c".into(),
        "x".repeat(MAX_POD_TOKEN_LEN + 1),
    ] {
        assert!(
            reviewer
                .session_of(&SecretString::from(junk))
                .await
                .is_err()
        );
    }
    assert_eq!(
        reviews(&fake),
        before + 1,
        "only the forged token was reviewed"
    );

    // A stopped session's pod is forgotten: its cached token reaches nothing.
    let name_a = crate::sandbox::k8s::object_name(super::INSTANCE, "ca");
    rt.stop(&name_a).await.expect("stop");
    assert_eq!(reviewer.session_of(&a).await, Err(PodTokenError::Unknown));
    assert_eq!(reviewer.session_of(&b).await.expect("b").as_str(), "cb");
}

/// The API server cannot be asked: a token not reviewed before is refused, never let
/// through; once it answers again the same token is accepted.
#[tokio::test]
async fn an_unreachable_api_server_fails_closed() {
    let fake = FakeApi::start(true).await;
    let rt = runtime(&fake, settings()).await;
    let reviewer = rt.token_reviewer();
    rt.start(&spec("cc")).await.expect("start");
    let pod = bound_pod(&fake, "cc");
    let fresh = token(&fake, &pod);
    fake.fail_reviews(true);
    assert_eq!(
        reviewer.session_of(&fresh).await,
        Err(PodTokenError::Unavailable)
    );
    assert_eq!(reviewer.cached(), 0, "a failure is never cached");
    fake.fail_reviews(false);
    assert_eq!(
        reviewer.session_of(&fresh).await.expect("ok").as_str(),
        "cc"
    );

    // No API server at all (a closed port): refused too.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let url = format!("http://{closed}").parse().expect("url");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
    let unreachable = crate::sandbox::k8s::TokenReviewer::new(client, "threadgate", rt.adoptions());
    let again = token(&fake, &pod);
    assert_eq!(
        unreachable.session_of(&again).await,
        Err(PodTokenError::Unavailable)
    );
}

/// A parked pod's relay waits for its adoption: the wait is answered by the adoption
/// (not by its hold passing), one wait per pod is held (a second takes the first one's
/// place), and a token the API server does not vouch for never waits.
#[tokio::test]
async fn a_parked_pods_wait_is_answered_by_its_adoption_and_held_once() {
    let fake = FakeApi::start(false).await;
    let rt = std::sync::Arc::new(runtime(&fake, settings()).await);
    let reviewer = std::sync::Arc::new(rt.token_reviewer());
    let parked = rt.park(&super::park_spec("support")).await.expect("park");
    let pod = fake.objects("pods").remove(&parked.name).expect("the pod");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    let pod_token = token(&fake, &(parked.name.clone(), uid.clone()));
    let hold = Duration::from_secs(25);

    // Not adopted: a wait ends when its hold passes, and leaves no waiter behind.
    let waited = reviewer
        .wait_adopted(&pod_token, Duration::from_millis(50))
        .await;
    assert_eq!(waited, Ok(AdoptionWait::NotYet));
    assert_eq!(rt.adoptions().waiting(), 0);

    // A second wait for the same pod takes the first one's place.
    let wait = |reviewer: std::sync::Arc<crate::sandbox::k8s::TokenReviewer>| {
        let pod_token = pod_token.clone();
        tokio::spawn(async move { reviewer.wait_adopted(&pod_token, hold).await })
    };
    let first = wait(reviewer.clone());
    super::until("the first wait held", || rt.adoptions().waiting() == 1).await;
    let started = Instant::now();
    let second = wait(reviewer.clone());
    assert_eq!(
        first.await.expect("first"),
        Ok(AdoptionWait::Superseded),
        "one wait per pod"
    );
    assert_eq!(rt.adoptions().waiting(), 1);

    // The adoption answers the held wait, long before its hold.
    rt.adopt(&parked, &spec("s1")).await.expect("adopt");
    let adopted = second.await.expect("second");
    let session = crate::ids::SessionId::parse("s1").expect("id");
    assert_eq!(adopted, Ok(AdoptionWait::Adopted(session.clone())));
    assert!(started.elapsed() < hold, "woken, not timed out");
    assert_eq!(rt.adoptions().waiting(), 0);
    // Adopted already: answered at once.
    assert_eq!(
        reviewer.wait_adopted(&pod_token, hold).await,
        Ok(AdoptionWait::Adopted(session))
    );

    // A token the API server does not vouch for is refused and holds nothing.
    let forged = {
        let text = crate::secrets::ExposeSecret::expose_secret(&pod_token).to_owned();
        let (rest, _signature) = text.rsplit_once('.').expect("jwt");
        SecretString::from(format!("{rest}.forged"))
    };
    assert_eq!(
        reviewer.wait_adopted(&forged, hold).await,
        Err(PodTokenError::Invalid)
    );
    assert_eq!(rt.adoptions().waiting(), 0);

    // A pod another instance parked is waited for there, not held here.
    fake.insert(
        "pods",
        super::parked_object("other01", "tg-theirs", "slot-9", super::IMAGE, Some("True")),
    );
    let theirs = fake.objects("pods").remove("tg-theirs").expect("theirs");
    let their_uid = theirs["metadata"]["uid"].as_str().expect("uid").to_owned();
    let their_token = token(&fake, &("tg-theirs".to_owned(), their_uid));
    assert_eq!(
        reviewer.wait_adopted(&their_token, hold).await,
        Ok(AdoptionWait::Elsewhere("other01".to_owned()))
    );
    assert_eq!(rt.adoptions().waiting(), 0);
}

/// At most `MAX_ADOPTION_WAITERS` pods' waits are held: one more pod is refused, the
/// same pod again replaces its own, and a wait that ends frees its place.
#[tokio::test]
async fn adoption_waits_are_capped() {
    let adoptions = crate::sandbox::k8s::Adoptions::default();
    let mut held: Vec<_> = (0..MAX_ADOPTION_WAITERS)
        .map(|i| adoptions.waiter(&format!("uid-{i}")).expect("a place"))
        .collect();
    assert_eq!(adoptions.waiting(), MAX_ADOPTION_WAITERS);
    assert!(adoptions.waiter("uid-one-more").is_none(), "over the cap");
    let again = adoptions
        .waiter("uid-0")
        .expect("the same pod replaces its wait");
    assert_eq!(adoptions.waiting(), MAX_ADOPTION_WAITERS);
    drop(held.remove(0));
    assert_eq!(
        adoptions.waiting(),
        MAX_ADOPTION_WAITERS,
        "the replaced wait leaving does not remove its successor"
    );
    drop(again);
    assert_eq!(adoptions.waiting(), MAX_ADOPTION_WAITERS - 1);
    assert!(adoptions.waiter("uid-one-more").is_some(), "a place freed");
}

/// Reviews for waits (tokens of pods not adopted) have a small share of their own: past
/// it a wait is refused at once rather than queued, so a flood of waits with forged
/// tokens neither loads the API server further nor delays adopted pods' relays.
#[tokio::test]
async fn waits_get_a_bounded_share_of_reviews() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let reviewer = std::sync::Arc::new(rt.token_reviewer());
    let parked = rt.park(&super::park_spec("support")).await.expect("park");
    let pod = fake.objects("pods").remove(&parked.name).expect("the pod");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    // Reviews that hang (the API server answers 503, retried until the review's
    // timeout): each wait holds its share meanwhile.
    fake.fail_reviews(true);
    let stuck: Vec<_> = (0..MAX_WAIT_REVIEWS_IN_FLIGHT)
        .map(|_| {
            let (reviewer, token) = (
                reviewer.clone(),
                token(&fake, &(parked.name.clone(), uid.clone())),
            );
            tokio::spawn(async move {
                reviewer
                    .wait_adopted(&token, Duration::from_millis(50))
                    .await
            })
        })
        .collect();
    super::until("every share in review", || {
        reviews(&fake) >= MAX_WAIT_REVIEWS_IN_FLIGHT
    })
    .await;
    let one_more = token(&fake, &(parked.name.clone(), uid.clone()));
    assert_eq!(
        reviewer
            .wait_adopted(&one_more, Duration::from_secs(25))
            .await,
        Ok(AdoptionWait::TooMany),
        "refused at once: queued for a review it would have been `Unavailable`"
    );
    for wait in stuck {
        assert_eq!(
            wait.await.expect("wait"),
            Err(PodTokenError::Unavailable),
            "a review that cannot be had is refused, never let through"
        );
    }
    fake.fail_reviews(false);
    // With the shares free again, a wait is reviewed and held.
    assert_eq!(
        reviewer
            .wait_adopted(&one_more, Duration::from_millis(50))
            .await,
        Ok(AdoptionWait::NotYet)
    );
}

/// A wait for a pod no instance has claimed yet (a warm pool's pod, no instance label)
/// is held here; when another instance's claim binds it (its labels name that
/// instance), the wait is sent there instead of running out its hold.
#[tokio::test]
async fn a_wait_for_an_unclaimed_pod_follows_the_instance_that_claims_it() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let reviewer = std::sync::Arc::new(rt.token_reviewer());
    let mut warm = super::parked_object(INSTANCE, "tg-warm", "slot-w", super::IMAGE, Some("True"));
    let labels = warm["metadata"]["labels"].as_object_mut().expect("labels");
    labels.remove("threadgate.instance");
    fake.insert("pods", warm.clone());
    let uid = fake.objects("pods")["tg-warm"]["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let pod_token = token(&fake, &("tg-warm".to_owned(), uid.clone()));
    let hold = Duration::from_secs(25);
    let started = Instant::now();
    let waiting = {
        let (reviewer, pod_token) = (reviewer.clone(), pod_token.clone());
        tokio::spawn(async move { reviewer.wait_adopted(&pod_token, hold).await })
    };
    super::until("the wait held", || rt.adoptions().waiting() == 1).await;

    // Another instance's claim binds it: the pod now carries that instance's labels.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(fake.client(), "threadgate");
    let bound = serde_json::json!({"metadata": {"labels": {"threadgate.instance": "other01"}}});
    pods.patch(
        "tg-warm",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&bound),
    )
    .await
    .expect("the claim's labels");
    assert_eq!(
        waiting.await.expect("wait"),
        Ok(AdoptionWait::Elsewhere("other01".to_owned()))
    );
    assert!(started.elapsed() < hold, "sent on, not timed out");
    assert_eq!(rt.adoptions().waiting(), 0);
}
