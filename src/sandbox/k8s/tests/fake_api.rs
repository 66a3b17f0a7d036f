//! An in-process Kubernetes API server for the runtime's tests: it answers the real
//! request shapes (`/api/v1/namespaces/NS/pods`, `/apis/GROUP/VERSION/namespaces/NS/
//! sandboxclaims`, lists with label and field selectors, `watch=true` streams of JSON
//! lines, `Status` bodies with 404, 409, 410 and 422), checks every created object
//! against its type (the agent-sandbox kinds refuse unknown fields), and plays the
//! kubelet and the agent-sandbox controller: a created pod or claim becomes ready after
//! a delay, never, or fails to pull its image; a claim made ready is bound to a pod the
//! "controller" makes with the claim's labels and annotations, owned by the claim.
//! `POST /apis/authentication.k8s.io/v1/tokenreviews` reviews the pod-bound tokens it
//! issued ([`FakeApi::pod_token`]) as the real server does (audiences intersected,
//! the service account as the user, the pod in `extra`). `PATCH` applies a JSON merge
//! patch, with a `metadata.resourceVersion` in it as a precondition (409 Conflict when
//! the object has moved on). Faults are switched on per test: watches closed as soon as
//! they open, watches answered 410 Gone, reviews answered 503, another writer's change
//! just before the next patch.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse as _, Response};
use futures::SinkExt as _;
use serde_json::{Value, json};

use crate::sandbox::k8s::crd::{GROUP, SandboxClaim, SandboxWarmPool, VERSION};

/// How created pods and claims behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kubelet {
    /// Ready after this long.
    ReadyAfter(Duration),
    /// Scheduled, never ready.
    Never,
    /// The agent's image cannot be pulled.
    ImagePullFails,
}

struct Store {
    rv: u64,
    /// `(plural, name)` to the stored object.
    objects: BTreeMap<(String, String), Value>,
    /// Every change: `(resourceVersion, plural, type, object)`.
    events: Vec<(u64, String, &'static str, Value)>,
    claims_served: bool,
    kubelet: Kubelet,
    /// Upcoming watch requests closed as soon as they open.
    drop_watches: usize,
    /// Upcoming watch requests answered with a 410 Gone event.
    gone_watches: usize,
    /// Every list and watch of pods is refused (403), as RBAC without `list` would.
    forbid_watches: bool,
    /// `METHOD path?query` of every request.
    requests: Vec<String>,
    /// Issued pod tokens: token to (pod name, pod uid, service account, audience).
    tokens: HashMap<String, IssuedToken>,
    /// Token reviews are answered 503, as an API server that cannot be reached.
    fail_reviews: bool,
    /// A merge patch another writer applies just before each of the next PATCHes is
    /// served (the race a conditional patch must lose), and how many more times.
    race_next_patch: Option<(Value, usize)>,
}

/// What the fake API server issued a pod token for.
#[derive(Debug, Clone)]
pub(crate) struct IssuedToken {
    pub(crate) pod_name: String,
    pub(crate) pod_uid: String,
    pub(crate) service_account: String,
    pub(crate) audience: String,
}

/// The fake API server, serving until dropped with its runtime.
#[derive(Clone)]
pub(crate) struct FakeApi {
    store: Arc<Mutex<Store>>,
    changed: tokio::sync::watch::Sender<u64>,
    pub(crate) addr: SocketAddr,
}

impl FakeApi {
    /// Serves on a free loopback port.
    pub(crate) async fn start(claims_served: bool) -> FakeApi {
        let store = Arc::new(Mutex::new(Store {
            rv: 100,
            objects: BTreeMap::new(),
            events: Vec::new(),
            claims_served,
            kubelet: Kubelet::ReadyAfter(Duration::from_millis(50)),
            drop_watches: 0,
            gone_watches: 0,
            forbid_watches: false,
            requests: Vec::new(),
            tokens: HashMap::new(),
            fail_reviews: false,
            race_next_patch: None,
        }));
        let (changed, _) = tokio::sync::watch::channel(100);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let fake = FakeApi {
            store,
            changed,
            addr,
        };
        let app = Router::new().fallback(handle).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        fake
    }

    /// A client of this server whose default namespace is `threadgate`.
    pub(crate) fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        let mut config = kube::Config::new(url);
        config.default_namespace = "threadgate".into();
        kube::Client::try_from(config).expect("client")
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_kubelet(&self, kubelet: Kubelet) {
        self.lock().kubelet = kubelet;
    }

    pub(crate) fn drop_next_watches(&self, n: usize) {
        self.lock().drop_watches = n;
    }

    pub(crate) fn gone_next_watches(&self, n: usize) {
        self.lock().gone_watches = n;
    }

    pub(crate) fn forbid_watches(&self) {
        self.lock().forbid_watches = true;
    }

    /// Token reviews answer 503 (`true`) or are served again (`false`).
    pub(crate) fn fail_reviews(&self, fail: bool) {
        self.lock().fail_reviews = fail;
    }

    /// Before the next PATCH is served, `patch` is merged into its object as another
    /// writer's change (its resourceVersion moves on).
    pub(crate) fn race_next_patch(&self, patch: Value) {
        self.race_next_patches(patch, 1);
    }

    /// As [`FakeApi::race_next_patch`], before each of the next `n` PATCHes.
    pub(crate) fn race_next_patches(&self, patch: Value, n: usize) {
        self.lock().race_next_patch = (n > 0).then_some((patch, n));
    }

    /// A pod-bound token as the kubelet projects it (a JWT whose payload names the pod),
    /// which this server's TokenReview vouches for.
    pub(crate) fn pod_token(&self, issued: IssuedToken) -> String {
        use base64::Engine as _;
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("time")
            .as_secs()
            + 600;
        let payload = json!({"aud": [issued.audience], "exp": exp, "iss": "https://kubernetes.default.svc",
            "kubernetes.io": {"namespace": "threadgate",
                "pod": {"name": issued.pod_name, "uid": issued.pod_uid},
                "serviceaccount": {"name": issued.service_account, "uid": "sa-uid"}},
            "sub": format!("system:serviceaccount:threadgate:{}", issued.service_account)});
        let token = format!(
            "{}.{}.{}",
            b64(&json!({"alg": "RS256", "kid": "fake"})),
            b64(&payload),
            uuid::Uuid::new_v4().simple()
        );
        self.lock().tokens.insert(token.clone(), issued);
        token
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// The stored objects of a kind, by name.
    pub(crate) fn objects(&self, plural: &str) -> BTreeMap<String, Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((p, _), _)| p == plural)
            .map(|((_, name), object)| (name.clone(), object.clone()))
            .collect()
    }

    /// Stores an object as if someone else had made it (no kubelet behaviour).
    pub(crate) fn insert(&self, plural: &str, mut object: Value) {
        let mut store = self.lock();
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        stamp(&mut store, &mut object);
        store.record(plural, "ADDED", &object);
        store.objects.insert((plural.to_string(), name), object);
        let rv = store.rv;
        drop(store);
        self.changed.send_replace(rv);
    }

    /// Replaces an object's status, as the kubelet or a controller would.
    fn set_status(&self, plural: &str, name: &str, status: Value) {
        let mut store = self.lock();
        let key = (plural.to_string(), name.to_string());
        let Some(mut object) = store.objects.get(&key).cloned() else {
            return;
        };
        object["status"] = status;
        store.rv += 1;
        object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        store.record(plural, "MODIFIED", &object);
        store.objects.insert(key, object);
        let rv = store.rv;
        drop(store);
        self.changed.send_replace(rv);
    }

    /// Plays the kubelet (pods) or the controller (claims) for a created object.
    fn schedule(&self, plural: &str, name: &str) {
        let kubelet = self.lock().kubelet;
        let (fake, plural, name) = (self.clone(), plural.to_string(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let pending = if plural == "pods" {
                json!({"phase": "Pending"})
            } else {
                json!({"conditions": [condition("False")]})
            };
            fake.set_status(&plural, &name, pending);
            match kubelet {
                Kubelet::Never => {}
                Kubelet::ImagePullFails => {
                    let status = json!({"phase": "Pending", "containerStatuses": [{
                        "name": "agent", "image": "x", "imageID": "", "ready": false,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ImagePullBackOff"}}
                    }]});
                    fake.set_status(&plural, &name, status);
                }
                Kubelet::ReadyAfter(delay) => {
                    tokio::time::sleep(delay).await;
                    if plural == "sandboxclaims" {
                        fake.bind_claim(&name);
                    }
                    let ready = if plural == "pods" {
                        json!({"phase": "Running", "conditions": [condition("True")]})
                    } else {
                        json!({"conditions": [condition("True")], "sandbox": {"name": name}})
                    };
                    fake.set_status(&plural, &name, ready);
                }
            }
        });
    }
}

impl FakeApi {
    /// Plays the agent-sandbox controller binding a claim: a running pod from the warm
    /// pool, given the claim's pod labels and annotations and owned by the claim.
    fn bind_claim(&self, claim: &str) {
        let Some(object) = self.objects("sandboxclaims").remove(claim) else {
            return;
        };
        let pod_meta = &object["spec"]["additionalPodMetadata"];
        let mut labels = pod_meta["labels"].clone();
        labels["app.kubernetes.io/name"] = json!("threadgate-sandbox");
        let name = format!(
            "threadgate-sandbox-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        self.insert(
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name,
                "labels": labels, "annotations": pod_meta["annotations"].clone(),
                "ownerReferences": [{"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                    "kind": "SandboxClaim", "name": claim, "uid": object["metadata"]["uid"].clone()}]},
                "spec": {"serviceAccountName": "threadgate-sandbox", "containers": [{"name": "agent"}]},
                "status": {"phase": "Running"}}),
        );
    }
}

impl Store {
    fn record(&mut self, plural: &str, kind: &'static str, object: &Value) {
        self.events
            .push((self.rv, plural.to_string(), kind, object.clone()));
    }
}

fn condition(status: &str) -> Value {
    json!({"type": "Ready", "status": status, "lastTransitionTime": "2026-12-02T12:00:00Z",
           "reason": "Fake", "message": ""})
}

fn stamp(store: &mut Store, object: &mut Value) {
    store.rv += 1;
    let meta = &mut object["metadata"];
    meta["resourceVersion"] = json!(store.rv.to_string());
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string());
}

/// `(apiVersion, kind)` of each served plural.
fn kind_of(plural: &str) -> Option<(&'static str, &'static str)> {
    Some(match plural {
        "pods" => ("v1", "Pod"),
        "secrets" => ("v1", "Secret"),
        "sandboxclaims" => ("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim"),
        "sandboxwarmpools" => ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool"),
        "sandboxtemplates" => ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"),
        _ => return None,
    })
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

async fn handle(
    State(fake): State<FakeApi>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let line = format!(
        "{method} {}",
        uri.path_and_query().map_or("", |p| p.as_str())
    );
    let (claims_served, forbidden) = {
        let mut store = fake.lock();
        store.requests.push(line);
        (store.claims_served, store.forbid_watches)
    };
    let path = uri.path().to_string();
    if path == "/apis/authentication.k8s.io/v1/tokenreviews" && method == Method::POST {
        return token_review(&fake, &body);
    }
    if path == "/version" {
        return axum::Json(json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0",
            "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}))
        .into_response();
    }
    let group_version = format!("/apis/{GROUP}/{VERSION}");
    if path == group_version {
        if !claims_served {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
            );
        }
        let resource = |name: &str, kind: &str| {
            json!({"name": name, "singularName": "", "namespaced": true, "kind": kind,
                   "verbs": ["create", "delete", "get", "list", "watch"]})
        };
        return axum::Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{GROUP}/{VERSION}"),
            "resources": [resource("sandboxclaims", "SandboxClaim"),
                          resource("sandboxtemplates", "SandboxTemplate"),
                          resource("sandboxwarmpools", "SandboxWarmPool")]}))
        .into_response();
    }
    let rest = if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
        rest.to_string()
    } else if let Some(rest) = path.strip_prefix(&format!("{group_version}/namespaces/")) {
        if !claims_served {
            return status(StatusCode::NOT_FOUND, "NotFound", "no such group".into());
        }
        rest.to_string()
    } else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        );
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let (plural, name) = match parts.as_slice() {
        [_ns, plural] => (plural.to_string(), None),
        [_ns, plural, name] => (plural.to_string(), Some(name.to_string())),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no route {path}"),
            );
        }
    };
    if kind_of(&plural).is_none() {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no resource {plural}"),
        );
    }
    if forbidden && method == Method::GET && name.is_none() && query.contains_key("fieldSelector") {
        let message = format!("{plural} is forbidden: cannot watch");
        return status(StatusCode::FORBIDDEN, "Forbidden", message);
    }
    match (method, name) {
        (Method::GET, None)
            if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) =>
        {
            watch(&fake, &plural, &query)
        }
        (Method::GET, None) => list(&fake, &plural, &query),
        (Method::POST, None) => create(&fake, &plural, &body),
        (Method::GET, Some(name)) => {
            match fake.lock().objects.get(&(plural.clone(), name.clone())) {
                Some(object) => axum::Json(object.clone()).into_response(),
                None => not_found(&plural, &name),
            }
        }
        (Method::DELETE, Some(name)) => delete(&fake, &plural, &name),
        (Method::PATCH, Some(name)) => patch(&fake, &plural, &name, &body),
        (method, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} not served"),
        ),
    }
}

/// TokenReview as the API server answers it: authenticated only for a token it issued
/// whose audience is among those asked, with the intersection as `audiences`.
fn token_review(fake: &FakeApi, body: &Bytes) -> Response {
    let (issued, fail) = {
        let store = fake.lock();
        let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let token = asked["spec"]["token"].as_str().unwrap_or_default();
        let audiences: Vec<String> = asked["spec"]["audiences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let issued = store
            .tokens
            .get(token)
            .filter(|t| audiences.contains(&t.audience))
            .cloned();
        (issued, store.fail_reviews)
    };
    if fail {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request".into(),
        );
    }
    let status_ = match issued {
        Some(t) => json!({"authenticated": true, "audiences": [t.audience],
            "user": {"username": format!("system:serviceaccount:threadgate:{}", t.service_account),
                "uid": "sa-uid", "groups": ["system:serviceaccounts"],
                "extra": {"authentication.kubernetes.io/pod-name": [t.pod_name],
                          "authentication.kubernetes.io/pod-uid": [t.pod_uid]}}}),
        None => json!({"authenticated": false, "user": {}, "error": "invalid bearer token"}),
    };
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {"creationTimestamp": null}, "spec": {}, "status": status_});
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

fn not_found(plural: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{plural} \"{name}\" not found"),
    )
}

/// Whether `object` matches the request's label and field selectors (equality only).
fn selected(object: &Value, query: &HashMap<String, String>) -> bool {
    let labels = &object["metadata"]["labels"];
    let labels_ok = query.get("labelSelector").is_none_or(|selector| {
        selector.split(',').filter(|s| !s.is_empty()).all(|term| {
            let (key, value) = term.split_once('=').unwrap_or((term, ""));
            labels[key].as_str() == Some(value)
        })
    });
    let fields_ok = query.get("fieldSelector").is_none_or(|selector| {
        selector
            .split(',')
            .filter(|s| !s.is_empty())
            .all(|term| match term.split_once('=') {
                Some(("metadata.name", name)) => object["metadata"]["name"].as_str() == Some(name),
                _ => false,
            })
    });
    labels_ok && fields_ok
}

fn list(fake: &FakeApi, plural: &str, query: &HashMap<String, String>) -> Response {
    let store = fake.lock();
    let (api_version, kind) = kind_of(plural).unwrap_or(("v1", "Unknown"));
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|((p, _), object)| p == plural && selected(object, query))
        .map(|(_, object)| object.clone())
        .collect();
    axum::Json(
        json!({"apiVersion": api_version, "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
    )
    .into_response()
}

fn create(fake: &FakeApi, plural: &str, body: &Bytes) -> Response {
    let mut object: Value = match serde_json::from_slice(body) {
        Ok(object) => object,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    // The schema: what the real server (or the CRD's OpenAPI schema) would refuse.
    let checked = match plural {
        "pods" => serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(object.clone())
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "secrets" => serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(object.clone())
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "sandboxclaims" => serde_json::from_value::<SandboxClaim>(object.clone())
            .map_err(|e| e.to_string())
            .and_then(|claim| {
                if claim.spec.warm_pool_ref.name.is_empty() {
                    Err("spec.warmPoolRef.name: Required value".into())
                } else if claim.api_version != format!("{GROUP}/{VERSION}")
                    || claim.kind != "SandboxClaim"
                {
                    Err("apiVersion/kind mismatch".into())
                } else {
                    Ok(())
                }
            }),
        "sandboxwarmpools" => serde_json::from_value::<SandboxWarmPool>(object.clone())
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => Ok(()),
    };
    if let Err(reason) = checked {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", reason);
    }
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required value".into(),
        );
    };
    let mut store = fake.lock();
    let key = (plural.to_string(), name.clone());
    if store.objects.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{plural} \"{name}\" already exists"),
        );
    }
    stamp(&mut store, &mut object);
    store.record(plural, "ADDED", &object);
    store.objects.insert(key, object.clone());
    let rv = store.rv;
    drop(store);
    fake.changed.send_replace(rv);
    if plural == "pods" || plural == "sandboxclaims" {
        fake.schedule(plural, &name);
    }
    (StatusCode::CREATED, axum::Json(object)).into_response()
}

/// A JSON merge patch (RFC 7386), as `application/merge-patch+json` is applied.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            if let Some(map) = target.as_object_mut() {
                map.remove(key);
            }
        } else {
            merge(&mut target[key.as_str()], value);
        }
    }
}

/// A merge patch; a `metadata.resourceVersion` in it is a precondition (409 Conflict
/// when the object has moved on), as the real server treats it.
fn patch(fake: &FakeApi, plural: &str, name: &str, body: &Bytes) -> Response {
    let patch: Value = match serde_json::from_slice(body) {
        Ok(patch) => patch,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let mut store = fake.lock();
    let key = (plural.to_string(), name.to_string());
    let race = store.race_next_patch.take().map(|(race, n)| {
        store.race_next_patch = (n > 1).then(|| (race.clone(), n - 1));
        race
    });
    if let Some(race) = race
        && let Some(mut object) = store.objects.get(&key).cloned()
    {
        merge(&mut object, &race);
        store.rv += 1;
        object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        store.record(plural, "MODIFIED", &object);
        store.objects.insert(key.clone(), object);
    }
    let Some(mut object) = store.objects.get(&key).cloned() else {
        return not_found(plural, name);
    };
    if let Some(wanted) = patch["metadata"]["resourceVersion"].as_str()
        && object["metadata"]["resourceVersion"].as_str() != Some(wanted)
    {
        let message = format!(
            "Operation cannot be fulfilled on {plural} \"{name}\": the object has been \
             modified; please apply your changes to the latest version and try again"
        );
        return status(StatusCode::CONFLICT, "Conflict", message);
    }
    merge(&mut object, &patch);
    if plural == "pods"
        && let Err(e) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(object.clone())
    {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string());
    }
    store.rv += 1;
    object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
    store.record(plural, "MODIFIED", &object);
    store.objects.insert(key, object.clone());
    let rv = store.rv;
    drop(store);
    fake.changed.send_replace(rv);
    axum::Json(object).into_response()
}

/// Deletes the object, and (as the garbage collector would) every object it owns.
fn delete(fake: &FakeApi, plural: &str, name: &str) -> Response {
    let mut store = fake.lock();
    let Some(object) = store
        .objects
        .remove(&(plural.to_string(), name.to_string()))
    else {
        return not_found(plural, name);
    };
    store.rv += 1;
    store.record(plural, "DELETED", &object);
    let uid = object["metadata"]["uid"].clone();
    let owned: Vec<(String, String)> = store
        .objects
        .iter()
        .filter(|(_, o)| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
        })
        .map(|(key, _)| key.clone())
        .collect();
    for key in owned {
        if let Some(dependent) = store.objects.remove(&key) {
            store.rv += 1;
            store.record(&key.0, "DELETED", &dependent);
        }
    }
    let rv = store.rv;
    drop(store);
    fake.changed.send_replace(rv);
    axum::Json(object).into_response()
}

fn watch(fake: &FakeApi, plural: &str, query: &HashMap<String, String>) -> Response {
    let (drop_it, gone) = {
        let mut store = fake.lock();
        let drop_it = store.drop_watches > 0;
        store.drop_watches = store.drop_watches.saturating_sub(1);
        let gone = !drop_it && store.gone_watches > 0;
        if gone {
            store.gone_watches -= 1;
        }
        (drop_it, gone)
    };
    if drop_it {
        return Body::empty().into_response();
    }
    if gone {
        let event = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "message": "too old resource version",
            "reason": "Expired", "code": 410}});
        return Body::from(format!("{event}\n")).into_response();
    }
    let mut cursor: u64 = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(16);
    let (fake, plural, query) = (fake.clone(), plural.to_string(), query.clone());
    tokio::spawn(async move {
        let mut changed = fake.changed.subscribe();
        loop {
            let due: Vec<(u64, Value)> = fake
                .lock()
                .events
                .iter()
                .filter(|(rv, p, _, object)| {
                    *rv > cursor && *p == plural && selected(object, &query)
                })
                .map(|(rv, _, kind, object)| (*rv, json!({"type": kind, "object": object})))
                .collect();
            for (rv, event) in due {
                cursor = rv;
                if tx
                    .send(Ok(Bytes::from(format!("{event}\n"))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    });
    Body::from_stream(rx).into_response()
}
