//! A stand-in for the Kubernetes API server's TokenReview
//! (`POST /apis/authentication.k8s.io/v1/tokenreviews`), for the relay listener's tests
//! of claimed pods' tokens: it vouches for the pod-bound tokens it issued
//! ([`FakeTokenReview::issue`]: a JWT whose payload names the pod, as the kubelet
//! projects it) when asked with their audience, answering as the real server does
//! (the service account as the user, the pod in `extra`), and answers 503 while
//! [`FakeTokenReview::set_failing`] says so. The runtime's own tests review against
//! the fuller fake API server of `sandbox::k8s`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use threadgate::secrets::SecretString;

/// A token's pod, account and audience.
#[derive(Debug, Clone)]
pub struct PodToken {
    pub pod_name: String,
    pub pod_uid: String,
    pub service_account: String,
    pub audience: String,
}

impl PodToken {
    /// A token of `pod_name`/`pod_uid` as a claimed sandbox's relay holds it.
    pub fn sandbox(pod_name: &str, pod_uid: &str) -> PodToken {
        PodToken {
            pod_name: pod_name.to_owned(),
            pod_uid: pod_uid.to_owned(),
            service_account: "threadgate-sandbox".to_owned(),
            audience: "threadgate-relay".to_owned(),
        }
    }
}

#[derive(Default)]
struct Reviews {
    issued: Mutex<HashMap<String, PodToken>>,
    failing: AtomicBool,
    asked: AtomicUsize,
}

/// The TokenReview stand-in, serving until the test's runtime ends.
#[derive(Clone)]
pub struct FakeTokenReview {
    reviews: Arc<Reviews>,
    pub addr: SocketAddr,
}

impl FakeTokenReview {
    pub async fn start() -> FakeTokenReview {
        let reviews = Arc::new(Reviews::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new()
            .route("/apis/authentication.k8s.io/v1/tokenreviews", post(review))
            .with_state(reviews.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeTokenReview { reviews, addr }
    }

    /// A kube client of this server.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        kube::Client::try_from(kube::Config::new(url)).expect("client")
    }

    /// Issues a token for `pod`.
    pub fn issue(&self, pod: PodToken) -> SecretString {
        let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string().as_bytes());
        let exp = threadgate::clock::Clock::system().now_ms() / 1000 + 600;
        let payload = json!({"aud": [pod.audience], "exp": exp,
            "kubernetes.io": {"namespace": "threadgate",
                "pod": {"name": pod.pod_name, "uid": pod.pod_uid},
                "serviceaccount": {"name": pod.service_account, "uid": "sa-uid"}}});
        let token = format!(
            "{}.{}.{}",
            b64(&json!({"alg": "RS256", "kid": "fake"})),
            b64(&payload),
            uuid::Uuid::new_v4().simple()
        );
        self.reviews
            .issued
            .lock()
            .expect("lock")
            .insert(token.clone(), pod);
        SecretString::from(token)
    }

    /// Answers 503 (`true`), as an API server that cannot serve, or reviews again.
    pub fn set_failing(&self, failing: bool) {
        self.reviews.failing.store(failing, Ordering::SeqCst);
    }

    /// How many reviews were asked.
    pub fn asked(&self) -> usize {
        self.reviews.asked.load(Ordering::SeqCst)
    }
}

async fn review(State(reviews): State<Arc<Reviews>>, body: axum::body::Bytes) -> Response {
    reviews.asked.fetch_add(1, Ordering::SeqCst);
    if reviews.failing.load(Ordering::SeqCst) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "ServiceUnavailable", "code": 503,
            "message": "the server is currently unable to handle the request"});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(status)).into_response();
    }
    let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let token = asked["spec"]["token"].as_str().unwrap_or_default();
    let audiences = asked["spec"]["audiences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let issued = reviews
        .issued
        .lock()
        .expect("lock")
        .get(token)
        .filter(|pod| audiences.contains(&json!(pod.audience)))
        .cloned();
    let status = match issued {
        Some(pod) => json!({"authenticated": true, "audiences": [pod.audience],
            "user": {"username": format!("system:serviceaccount:threadgate:{}", pod.service_account),
                "uid": "sa-uid", "groups": ["system:serviceaccounts"],
                "extra": {"authentication.kubernetes.io/pod-name": [pod.pod_name],
                          "authentication.kubernetes.io/pod-uid": [pod.pod_uid]}}}),
        None => json!({"authenticated": false, "user": {}, "error": "invalid bearer token"}),
    };
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {}, "spec": {}, "status": status});
    (StatusCode::CREATED, axum::Json(review)).into_response()
}
