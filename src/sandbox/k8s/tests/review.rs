//! Claimed pods' relay tokens against the fake API server's TokenReview: the adopted
//! pod's token reaches its session only; a wrong audience, another service account,
//! an unknown pod, a recreated pod of the same name and a stopped session are refused;
//! an API server that cannot be reached refuses (fails closed); positive reviews are
//! cached, junk is never sent for review.

use super::fake_api::{FakeApi, IssuedToken};
use super::{runtime, settings, spec};
use crate::sandbox::{
    MAX_POD_TOKEN_LEN, PodTokenError, PodTokenVerifier as _, SandboxRuntime as _,
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
