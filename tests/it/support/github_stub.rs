//! A local stand-in for GitHub's REST API (search code, repository contents, issues,
//! pull requests) and the one GraphQL mutation threadgate uses (ready for review),
//! answering as GitHub does: JSON shapes, base64 file content wrapped at 60 columns,
//! `{"message", "errors"}` errors, and rate limits as 403 with `x-ratelimit-remaining: 0`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{Value, json};

/// The token the stub accepts.
pub const TOKEN: &str = "ghp_test_threadgate_stub_token_0b7e";

/// A request the stub received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub accept: Option<String>,
    pub api_version: Option<String>,
}

/// How the stub fails the next request.
#[derive(Debug, Clone)]
pub enum Failure {
    /// 403 with `x-ratelimit-remaining: 0` and this `x-ratelimit-reset` (Unix seconds).
    RateLimited { reset_unix: i64 },
    /// 502.
    BadGateway,
}

#[derive(Default)]
struct StubState {
    /// (repo, ref, path) -> content.
    files: Mutex<BTreeMap<(String, String, String), Vec<u8>>>,
    issues: Mutex<Vec<Value>>,
    /// Pull requests, with `repo`, `head` and `base` as plain strings.
    pulls: Mutex<Vec<Value>>,
    requests: Mutex<Vec<Recorded>>,
    failures: Mutex<VecDeque<Failure>>,
}

/// A running stub, stopped when dropped.
pub struct GithubStub {
    base_url: String,
    state: Arc<StubState>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for GithubStub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl GithubStub {
    /// Starts the stub on a free loopback port.
    pub async fn start() -> Self {
        let state = Arc::new(StubState::default());
        let app = Router::new()
            .route("/search/code", get(search_code))
            .route("/repos/{owner}/{repo}/contents/{*path}", get(contents))
            .route("/repos/{owner}/{repo}/issues", post(create_issue))
            .route(
                "/repos/{owner}/{repo}/pulls",
                get(list_pulls).post(create_pull),
            )
            .route(
                "/repos/{owner}/{repo}/pulls/{number}",
                axum::routing::patch(update_pull),
            )
            .route("/graphql", post(graphql))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("github stub serves");
        });
        Self {
            base_url,
            state,
            server,
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Stores a file at `path` of `repo` (`owner/name`) on `git_ref`.
    pub fn add_file(&self, repo: &str, git_ref: &str, path: &str, content: &[u8]) {
        self.state.files.lock().expect("lock").insert(
            (repo.to_owned(), git_ref.to_owned(), path.to_owned()),
            content.to_vec(),
        );
    }

    /// Issues created so far.
    pub fn issues(&self) -> Vec<Value> {
        self.state.issues.lock().expect("lock").clone()
    }

    /// Pull requests opened so far (with their latest title and body).
    pub fn pulls(&self) -> Vec<Value> {
        self.state.pulls.lock().expect("lock").clone()
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// Fails the next request.
    pub fn fail_next(&self, failure: Failure) {
        self.state.failures.lock().expect("lock").push_back(failure);
    }
}

fn error(status: StatusCode, message: &str, errors: Value) -> Response {
    let body = json!({"message": message, "errors": errors,
                      "documentation_url": "https://docs.github.com/rest"});
    (status, Json(body)).into_response()
}

/// Records the request, then applies authentication and any injected failure: `Some`
/// is the answer that replaces the normal one.
fn admit(
    state: &StubState,
    headers: &HeaderMap,
    method: &str,
    path: String,
    query: &HashMap<String, String>,
) -> Option<Response> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    state.requests.lock().expect("lock").push(Recorded {
        method: method.to_owned(),
        path,
        query: query.clone(),
        accept: header("accept"),
        api_version: header("x-github-api-version"),
    });
    if header("authorization").as_deref() != Some(&format!("Bearer {TOKEN}")) {
        return Some(error(
            StatusCode::UNAUTHORIZED,
            "Bad credentials",
            json!([]),
        ));
    }
    match state.failures.lock().expect("lock").pop_front() {
        Some(Failure::RateLimited { reset_unix }) => {
            let mut response = error(StatusCode::FORBIDDEN, "API rate limit exceeded", json!([]));
            let headers = response.headers_mut();
            headers.insert("x-ratelimit-remaining", "0".parse().expect("header"));
            headers.insert(
                "x-ratelimit-reset",
                reset_unix.to_string().parse().expect("header"),
            );
            Some(response)
        }
        Some(Failure::BadGateway) => Some((StatusCode::BAD_GATEWAY, "bad gateway").into_response()),
        None => None,
    }
}

async fn search_code(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Some(response) = admit(&state, &headers, "GET", "/search/code".into(), &query) {
        return response;
    }
    let q = query.get("q").cloned().unwrap_or_default();
    let repo_filter = q
        .split_whitespace()
        .find_map(|term| term.strip_prefix("repo:"));
    let terms: Vec<&str> = q
        .split_whitespace()
        .filter(|term| !term.contains(':'))
        .collect();
    if terms.is_empty() {
        let errors = json!([{"resource": "Search", "field": "q", "code": "missing"}]);
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed",
            errors,
        );
    }
    let files = state.files.lock().expect("lock");
    let items: Vec<Value> = files
        .iter()
        .filter(|((repo, git_ref, _), _)| {
            git_ref == "main" && repo_filter.is_none_or(|r| r == repo)
        })
        .filter(|(_, content)| {
            let text = String::from_utf8_lossy(content);
            terms.iter().all(|term| text.contains(term))
        })
        .map(|((repo, _, path), _)| {
            json!({
                "name": path.rsplit('/').next(),
                "path": path,
                "sha": format!("sha-{path}"),
                "url": format!("https://api.github.test/repos/{repo}/contents/{path}"),
                "html_url": format!("https://github.test/{repo}/blob/main/{path}"),
                "repository": {"full_name": repo, "private": true},
                "score": 1.0,
            })
        })
        .collect();
    Json(json!({"total_count": items.len(), "incomplete_results": false, "items": items}))
        .into_response()
}

async fn contents(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Path((owner, repo, path)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let full_path = format!("/repos/{owner}/{repo}/contents/{path}");
    if let Some(response) = admit(&state, &headers, "GET", full_path, &query) {
        return response;
    }
    let repo = format!("{owner}/{repo}");
    let git_ref = query.get("ref").cloned().unwrap_or_else(|| "main".into());
    let files = state.files.lock().expect("lock");
    if let Some(content) = files.get(&(repo.clone(), git_ref.clone(), path.clone())) {
        let encoded = base64::engine::general_purpose::STANDARD.encode(content);
        let wrapped: Vec<&str> = encoded
            .as_bytes()
            .chunks(60)
            .map(|chunk| std::str::from_utf8(chunk).expect("base64 is ascii"))
            .collect();
        return Json(json!({
            "type": "file", "encoding": "base64", "size": content.len(),
            "name": path.rsplit('/').next(), "path": path, "sha": format!("sha-{path}"),
            "content": wrapped.join("\n") + "\n",
        }))
        .into_response();
    }
    let prefix = format!("{path}/");
    let entries: Vec<Value> = files
        .keys()
        .filter(|(r, g, p)| *r == repo && *g == git_ref && p.starts_with(&prefix))
        .map(|(_, _, p)| json!({"type": "file", "name": p.rsplit('/').next(), "path": p}))
        .collect();
    if entries.is_empty() {
        return error(StatusCode::NOT_FOUND, "Not Found", json!([]));
    }
    Json(Value::Array(entries)).into_response()
}

async fn create_issue(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/issues");
    if let Some(response) = admit(&state, &headers, "POST", path, &HashMap::new()) {
        return response;
    }
    if body["title"].as_str().is_none_or(str::is_empty) {
        let errors = json!([{"resource": "Issue", "field": "title", "code": "missing_field"}]);
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed",
            errors,
        );
    }
    let mut issues = state.issues.lock().expect("lock");
    let number = issues.len() + 1;
    let issue = json!({
        "id": 1000 + number,
        "number": number,
        "title": body["title"],
        "body": body["body"],
        "labels": body["labels"].as_array().cloned().unwrap_or_default()
            .into_iter().map(|name| json!({"name": name})).collect::<Vec<_>>(),
        "state": "open",
        "html_url": format!("https://github.test/{owner}/{repo}/issues/{number}"),
    });
    issues.push(issue.clone());
    (StatusCode::CREATED, Json(issue)).into_response()
}

async fn list_pulls(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/pulls");
    if let Some(response) = admit(&state, &headers, "GET", path, &query) {
        return response;
    }
    let full = format!("{owner}/{repo}");
    let head = query.get("head").cloned();
    let wanted_state = query.get("state").cloned().unwrap_or_else(|| "open".into());
    let pulls = state.pulls.lock().expect("lock");
    let found: Vec<Value> = pulls
        .iter()
        .filter(|p| {
            p["repo"] == full.as_str()
                && (wanted_state == "all" || p["state"] == wanted_state.as_str())
        })
        .filter(|p| {
            head.as_deref()
                .is_none_or(|h| Some(h) == p["head_label"].as_str())
        })
        .cloned()
        .collect();
    Json(Value::Array(found)).into_response()
}

async fn create_pull(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/pulls");
    if let Some(response) = admit(&state, &headers, "POST", path, &HashMap::new()) {
        return response;
    }
    let (Some(head), Some(base)) = (body["head"].as_str(), body["base"].as_str()) else {
        let errors = json!([{"resource": "PullRequest", "field": "head", "code": "missing_field"}]);
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed",
            errors,
        );
    };
    let mut pulls = state.pulls.lock().expect("lock");
    let label = format!("{owner}:{head}");
    if pulls
        .iter()
        .any(|p| p["head_label"] == label.as_str() && p["state"] == "open")
    {
        let errors = json!([{"resource": "PullRequest", "code": "custom",
                             "message": format!("A pull request already exists for {label}.")}]);
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed",
            errors,
        );
    }
    let number = pulls.len() + 1;
    let pull = json!({
        "id": 2000 + number,
        "number": number,
        "repo": format!("{owner}/{repo}"),
        "head_label": label,
        "head": head,
        "base": base,
        "title": body["title"],
        "body": body["body"],
        "draft": body["draft"].as_bool().unwrap_or(false),
        "state": "open",
        "merged_at": null,
        "node_id": format!("PR_node{number}"),
        "updates": 0,
        "html_url": format!("https://github.test/{owner}/{repo}/pull/{number}"),
    });
    pulls.push(pull.clone());
    (StatusCode::CREATED, Json(pull)).into_response()
}

async fn update_pull(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Path((owner, repo, number)): Path<(String, String, u64)>,
    Json(body): Json<Value>,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/pulls/{number}");
    if let Some(response) = admit(&state, &headers, "PATCH", path, &HashMap::new()) {
        return response;
    }
    let mut pulls = state.pulls.lock().expect("lock");
    let full = format!("{owner}/{repo}");
    let Some(pull) = pulls
        .iter_mut()
        .find(|p| p["repo"] == full.as_str() && p["number"] == number)
    else {
        return error(StatusCode::NOT_FOUND, "Not Found", json!([]));
    };
    for key in ["title", "body"] {
        if let Some(v) = body.get(key) {
            pull[key] = v.clone();
        }
    }
    match body["state"].as_str() {
        None => {}
        Some(state @ ("open" | "closed")) => pull["state"] = json!(state),
        Some(_) => {
            let errors = json!([{"resource": "PullRequest", "field": "state", "code": "invalid"}]);
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation Failed",
                errors,
            );
        }
    }
    pull["updates"] = json!(pull["updates"].as_u64().unwrap_or(0) + 1);
    Json(pull.clone()).into_response()
}

/// GitHub's GraphQL endpoint, knowing one mutation: `markPullRequestReadyForReview`
/// with the pull request's node id in `variables.id`. As GitHub does, a query it cannot
/// answer is a 200 with `errors`.
async fn graphql(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(response) = admit(&state, &headers, "POST", "/graphql".into(), &HashMap::new()) {
        return response;
    }
    let query = body["query"].as_str().unwrap_or_default();
    let node = body["variables"]["id"].as_str().unwrap_or_default();
    let graphql_error = |message: String| {
        Json(json!({"data": null, "errors": [{"type": "NOT_FOUND", "message": message}]}))
            .into_response()
    };
    if !query.contains("markPullRequestReadyForReview") {
        return graphql_error("the stub knows only markPullRequestReadyForReview".into());
    }
    let mut pulls = state.pulls.lock().expect("lock");
    let Some(pull) = pulls.iter_mut().find(|p| p["node_id"] == node) else {
        return graphql_error(format!(
            "Could not resolve to a node with the global id of '{node}'"
        ));
    };
    pull["draft"] = json!(false);
    Json(json!({"data": {"markPullRequestReadyForReview":
        {"pullRequest": {"isDraft": false, "number": pull["number"]}}}}))
    .into_response()
}
