//! A session's workspace in its pod, carried over the relay's `control` connections
//! (so only with the session's credential, and only for that session's thread):
//!
//! - `GET /relay/v1/workspace`: the thread's branch tip as a git bundle, which the
//!   relay writes into the agent's workspace volume before it opens the agent's socket
//!   (`Workspaces::hand_out`).
//! - `GET /relay/v1/workspace/wanted?after=N`: a long poll (at most [`WANTED_WAIT`])
//!   answering `{"seq": S, "if_changed": B}` once the gateway wants the pod's work
//!   (request `S > N`), else `{"seq": N}`. `if_changed` (a sync's request, once this
//!   gateway took a bundle of the session): the relay may answer that nothing changed.
//! - `PUT /relay/v1/workspace?seq=S`: the pod's work for request `S`, a bundle of one
//!   commit on the base handed out, verified and written into the thread's worktree
//!   (`Workspaces::receive`); 422 naming the refusal, 409 when no such request is open.
//!   `PUT /relay/v1/workspace?seq=S&unchanged=true` (no body) answers an `if_changed`
//!   request: the pod's tree is the one it last sent; nothing is written.
//!
//! [`PodWorkspaces`] is the session's [`PodSync`]: before a checkpoint's or a stop's
//! commit the supervisor asks for the pod's work and waits (at most
//! [`PodWorkspaces::wait`]) until it is in the worktree. A session whose relay never
//! asked for its workspace (a Docker container) has nothing to bring: its commits are
//! as they always were.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::api_error::ApiError;
use crate::ids::SessionId;
use crate::session::{PodSync, SessionScope};
use crate::workspace::{BundleError, BundleLimits, Received, Workspaces};

/// The workspace's path on a control connection.
pub const WORKSPACE_PATH: &str = "/relay/v1/workspace";
/// The long poll's path.
pub const WANTED_PATH: &str = "/relay/v1/workspace/wanted";
/// The longest a `wanted` long poll waits before answering that nothing is wanted.
pub const WANTED_WAIT: Duration = Duration::from_secs(20);
/// The longest a pull waits for the relay by default.
pub const PULL_WAIT: Duration = Duration::from_secs(60);
/// The media type of a bundle.
pub const BUNDLE_TYPE: &str = "application/x-git-bundle";

/// The answer of a `wanted` long poll.
#[derive(Debug, Serialize, Deserialize)]
pub struct Wanted {
    /// The latest request (the one asked for when greater than `after`).
    pub seq: u64,
    /// The request is a sync's: the relay may answer `unchanged` when its tree is the
    /// one it last sent.
    #[serde(default)]
    pub if_changed: bool,
}

/// The answer of a received bundle.
#[derive(Debug, Serialize, Deserialize)]
pub struct Taken {
    /// `mirrored` (in the worktree), `diverged` (kept under a backup ref) or
    /// `unchanged` (the relay's tree was the one it last sent).
    pub outcome: String,
}

/// The query of `wanted` and `PUT`.
#[derive(Debug, Deserialize)]
struct Seq {
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    unchanged: bool,
}

/// The pods' workspaces of the sessions served here.
pub struct PodWorkspaces {
    workspaces: Workspaces,
    limits: BundleLimits,
    wait: Duration,
    sync_every: Option<Duration>,
    sessions: Mutex<HashMap<SessionId, Arc<Channel>>>,
}

/// One session's requests and what became of them.
struct Channel {
    /// The latest request's number, and whether it is a sync's (`if_changed`).
    wanted: watch::Sender<(u64, bool)>,
    /// The latest request answered, and how (a refusal's text).
    done: watch::Sender<(u64, Result<(), String>)>,
    /// One bundle received at a time per session.
    receiving: tokio::sync::Mutex<()>,
    /// Whether a bundle of the session was taken here.
    taken: watch::Sender<bool>,
}

impl PodWorkspaces {
    /// Pods' workspaces over `workspaces`, each bundle within `limits`, each pull
    /// waiting at most `wait` for the relay, running sessions synced every `sync_every`
    /// (never when `None`).
    pub fn new(
        workspaces: Workspaces,
        limits: BundleLimits,
        wait: Duration,
        sync_every: Option<Duration>,
    ) -> PodWorkspaces {
        PodWorkspaces {
            workspaces,
            limits,
            wait,
            sync_every,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// How long a pull waits for the relay.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    fn channel(&self, session: &SessionId, make: bool) -> Option<Arc<Channel>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = sessions.get(session) {
            return Some(channel.clone());
        }
        if !make {
            return None;
        }
        let channel = Arc::new(Channel {
            wanted: watch::Sender::new((0, false)),
            done: watch::Sender::new((0, Ok(()))),
            receiving: tokio::sync::Mutex::new(()),
            taken: watch::Sender::new(false),
        });
        sessions.insert(session.clone(), channel.clone());
        Some(channel)
    }
}

impl PodWorkspaces {
    /// One request for the session's work and its answer; `if_changed` when the relay
    /// may answer that nothing changed.
    async fn request(&self, session_id: &SessionId, if_changed: bool) -> anyhow::Result<bool> {
        let Some(channel) = self.channel(session_id, false) else {
            return Ok(false);
        };
        // Only once this gateway holds a bundle of the session: a fresh instance's
        // worktree (a takeover) must get the pod's work whatever the relay sent before.
        let if_changed = if_changed && *channel.taken.borrow();
        let mut seq = 0;
        channel.wanted.send_modify(|wanted| {
            wanted.0 += 1;
            wanted.1 = if_changed;
            seq = wanted.0;
        });
        let mut done = channel.done.subscribe();
        let answered = tokio::time::timeout(self.wait, done.wait_for(|(at, _)| *at >= seq)).await;
        let outcome = match answered {
            Ok(Ok(answer)) => answer.1.clone(),
            Ok(Err(_)) => anyhow::bail!("the session's pod workspace was forgotten"),
            Err(_) => anyhow::bail!(
                "the pod's relay did not send its workspace within {:?}",
                self.wait
            ),
        };
        outcome.map_err(|refused| anyhow::anyhow!("the pod's workspace was refused: {refused}"))?;
        Ok(true)
    }
}

#[async_trait::async_trait]
impl PodSync for PodWorkspaces {
    async fn pull(&self, session_id: &SessionId) -> anyhow::Result<bool> {
        self.request(session_id, false).await
    }

    async fn sync(&self, session_id: &SessionId) -> anyhow::Result<bool> {
        self.request(session_id, true).await
    }

    fn sync_every(&self) -> Option<Duration> {
        self.sync_every
    }

    fn forget(&self, session_id: &SessionId) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
    }
}

#[derive(Clone)]
struct Served {
    scope: SessionScope,
    pods: Arc<PodWorkspaces>,
}

/// The workspace routes of `scope`'s session, merged into its control routes.
pub(super) fn routes(scope: &SessionScope, pods: &Arc<PodWorkspaces>) -> Router {
    Router::new()
        .route(WORKSPACE_PATH, get(hand_out).put(take))
        .route(WANTED_PATH, get(wanted))
        .with_state(Served {
            scope: scope.clone(),
            pods: pods.clone(),
        })
}

async fn hand_out(State(served): State<Served>) -> Response {
    let workspaces = served.pods.workspaces.clone();
    let thread = served.scope.thread_id.clone();
    let bundle = crate::tasks::Tasks::spawn_blocking(move || workspaces.hand_out(&thread)).await;
    match bundle {
        Ok(Ok(bytes)) => {
            served.pods.channel(&served.scope.session_id, true);
            tracing::info!(session = %served.scope.session_id, bytes = bytes.len(), "the thread's workspace handed to its pod");
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, BUNDLE_TYPE),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                bytes,
            )
                .into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(session = %served.scope.session_id, error = %e, "cannot hand the thread's workspace out");
            ApiError::internal().into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "handing the workspace out did not finish");
            ApiError::internal().into_response()
        }
    }
}

async fn wanted(State(served): State<Served>, Query(query): Query<Seq>) -> Response {
    let after = query.after.unwrap_or(0);
    let Some(channel) = served.pods.channel(&served.scope.session_id, true) else {
        return ApiError::internal().into_response();
    };
    let mut wanted = channel.wanted.subscribe();
    let (seq, if_changed) =
        match tokio::time::timeout(WANTED_WAIT, wanted.wait_for(|(s, _)| *s > after)).await {
            Ok(Ok(wanted)) => *wanted,
            _ => (after, false),
        };
    json(&Wanted { seq, if_changed })
}

async fn take(State(served): State<Served>, Query(query): Query<Seq>, body: Body) -> Response {
    let session = &served.scope.session_id;
    let Some(seq) = query.seq else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "seq is required",
        )
        .into_response();
    };
    let Some(channel) = served.pods.channel(session, false) else {
        return not_asked();
    };
    let _one = channel.receiving.lock().await;
    let ((wanted, if_changed), done) = (*channel.wanted.borrow(), channel.done.borrow().0);
    if seq > wanted || seq <= done {
        return not_asked();
    }
    if query.unchanged {
        // Only a sync's request may be answered so: a checkpoint's or a stop's takes
        // the pod's work whatever the relay last sent.
        if seq != wanted || !if_changed {
            return not_asked();
        }
        channel.done.send_modify(|d| *d = (seq, Ok(())));
        return json(&Taken {
            outcome: "unchanged".to_owned(),
        });
    }
    let limits = served.pods.limits;
    let bytes = match axum::body::to_bytes(body, limits.max_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let refused = BundleError::TooLarge {
                limit: limits.max_bytes,
            };
            return refuse(&channel, seq, session, &refused);
        }
    };
    let workspaces = served.pods.workspaces.clone();
    let thread = served.scope.thread_id.clone();
    let received =
        crate::tasks::Tasks::spawn_blocking(move || workspaces.receive(&thread, &bytes, &limits))
            .await;
    let received = match received {
        Ok(received) => received,
        Err(e) => {
            tracing::error!(error = %e, "receiving the pod's workspace did not finish");
            return ApiError::internal().into_response();
        }
    };
    match received {
        Ok(outcome) => {
            channel.taken.send_replace(true);
            channel.done.send_modify(|d| *d = (seq, Ok(())));
            let outcome = match outcome {
                Received::Mirrored { .. } => "mirrored",
                Received::Diverged { .. } => "diverged",
            };
            json(&Taken {
                outcome: outcome.to_owned(),
            })
        }
        Err(e) if e.is_refusal() => refuse(&channel, seq, session, &e),
        Err(e) => {
            channel.done.send_modify(|d| *d = (seq, Err(e.to_string())));
            tracing::error!(session = %session, error = %e, "cannot take the pod's workspace");
            ApiError::internal().into_response()
        }
    }
}

fn refuse(channel: &Channel, seq: u64, session: &SessionId, e: &BundleError) -> Response {
    tracing::warn!(session = %session, error = %e, "the pod's workspace refused");
    channel.done.send_modify(|d| *d = (seq, Err(e.to_string())));
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "workspace_refused",
        e.to_string(),
    )
    .into_response()
}

fn not_asked() -> Response {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_asked",
        "no request for the workspace is open with this seq",
    )
    .into_response()
}

fn json(value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(_) => ApiError::internal().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::{CommitLimits, RepoConfig};
    use axum::http::Request;
    use tower::ServiceExt as _;

    struct Setup {
        _dir: tempfile::TempDir,
        pods: Arc<PodWorkspaces>,
        router: Router,
        session: SessionId,
    }

    fn setup(wait: Duration) -> Setup {
        setup_with(wait, BundleLimits::default())
    }

    fn setup_with(wait: Duration, limits: BundleLimits) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let repo_path = dir.path().join("repo");
        let repo = git2::Repository::init(&repo_path).unwrap();
        let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        root.insert("README", repo.blob(b"hello\n").unwrap(), 0o100644)
            .unwrap();
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "init", &tree, &[])
            .unwrap();
        let workspaces = Workspaces::open(RepoConfig {
            repo_path,
            default_branch: Some("main".into()),
            worktrees_dir: dir.path().join("worktrees"),
            remote: None,
            commit_limits: CommitLimits::default(),
        })
        .unwrap();
        let thread = crate::ids::ThreadId::parse("th_1").unwrap();
        workspaces.prepare(&thread).unwrap();
        let session = SessionId::parse("s_1").unwrap();
        let pods = Arc::new(PodWorkspaces::new(workspaces, limits, wait, None));
        let scope = SessionScope {
            session_id: session.clone(),
            thread_id: thread.clone(),
            agent: "support".into(),
            customer_id: None,
            customer_email: None,
            lease: crate::store::leases::Lease {
                thread_id: thread,
                owner: "inst".into(),
                token: 1,
            },
        };
        let router = routes(&scope, &pods);
        Setup {
            _dir: dir,
            pods,
            router,
            session,
        }
    }

    async fn send(router: &Router, method: &str, uri: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body.to_vec())
    }

    #[tokio::test]
    async fn a_session_whose_relay_never_asked_has_nothing_to_pull() {
        let s = setup(Duration::from_secs(60));
        assert!(!s.pods.pull(&s.session).await.unwrap());
    }

    #[tokio::test]
    async fn a_relay_that_does_not_answer_fails_the_pull_in_time() {
        let s = setup(Duration::from_millis(100));
        let (status, _) = send(&s.router, "GET", WORKSPACE_PATH, Vec::new()).await;
        assert_eq!(status, 200);
        let e = s.pods.pull(&s.session).await.unwrap_err().to_string();
        assert!(e.contains("did not send its workspace"), "{e}");
    }

    #[tokio::test]
    async fn a_refused_bundle_fails_the_pull_and_one_not_asked_for_is_409() {
        let s = setup(Duration::from_secs(30));
        let (status, handed) = send(&s.router, "GET", WORKSPACE_PATH, Vec::new()).await;
        assert_eq!(status, 200);
        assert!(handed.starts_with(b"# v2 git bundle\n"));
        // Nothing asked yet: a bundle is refused unread.
        let (status, _) = send(&s.router, "PUT", "/relay/v1/workspace?seq=1", b"x".to_vec()).await;
        assert_eq!(status, 409);

        let pods = s.pods.clone();
        let session = s.session.clone();
        let pulling = tokio::spawn(async move { pods.pull(&session).await });
        let (status, wanted) = send(
            &s.router,
            "GET",
            &format!("{WANTED_PATH}?after=0"),
            Vec::new(),
        )
        .await;
        assert_eq!(status, 200);
        let wanted: Wanted = serde_json::from_slice(&wanted).unwrap();
        assert_eq!(wanted.seq, 1);
        let (status, answer) = send(
            &s.router,
            "PUT",
            "/relay/v1/workspace?seq=1",
            b"garbage".to_vec(),
        )
        .await;
        assert_eq!(status, 422, "{}", String::from_utf8_lossy(&answer));
        let e = pulling.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("refused") && e.contains("not one"), "{e}");
        // Answered: the same request cannot be answered again.
        let (status, _) = send(&s.router, "PUT", "/relay/v1/workspace?seq=1", handed).await;
        assert_eq!(status, 409);
    }

    #[tokio::test]
    async fn an_oversize_body_is_refused_while_it_is_read() {
        let limits = BundleLimits {
            max_bytes: 1024,
            ..BundleLimits::default()
        };
        let s = setup_with(Duration::from_secs(30), limits);
        send(&s.router, "GET", WORKSPACE_PATH, Vec::new()).await;
        let pods = s.pods.clone();
        let session = s.session.clone();
        let pulling = tokio::spawn(async move { pods.pull(&session).await });
        send(
            &s.router,
            "GET",
            &format!("{WANTED_PATH}?after=0"),
            Vec::new(),
        )
        .await;
        let (status, answer) = send(
            &s.router,
            "PUT",
            "/relay/v1/workspace?seq=1",
            vec![b'x'; 4096],
        )
        .await;
        assert_eq!(status, 422);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.contains("larger than 1024 bytes"), "{answer}");
        let e = pulling.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("larger than 1024 bytes"), "{e}");
    }

    /// A sync asks for the pod's work `if_changed` only once this gateway took a bundle
    /// of the session; such a request may be answered `unchanged` (nothing written),
    /// a checkpoint's may not.
    #[tokio::test]
    async fn a_sync_may_be_answered_unchanged_once_a_bundle_was_taken() {
        let s = setup(Duration::from_secs(30));
        let (_, handed) = send(&s.router, "GET", WORKSPACE_PATH, Vec::new()).await;
        let dir = tempfile::tempdir().unwrap();
        let pod = crate::workspace::PodWorkspace {
            work_dir: dir.path().join("work"),
            git_dir: dir.path().join("git"),
        };
        pod.receive_base(&handed, &BundleLimits::default()).unwrap();
        std::fs::write(pod.work_dir.join("FINDINGS.md"), "found\n").unwrap();

        // The first sync: a full request, answered with a bundle.
        let pods = s.pods.clone();
        let session = s.session.clone();
        let syncing = tokio::spawn(async move { pods.sync(&session).await });
        let (_, wanted) = send(
            &s.router,
            "GET",
            &format!("{WANTED_PATH}?after=0"),
            Vec::new(),
        )
        .await;
        let wanted: Wanted = serde_json::from_slice(&wanted).unwrap();
        assert_eq!((wanted.seq, wanted.if_changed), (1, false));
        let (status, _) = send(
            &s.router,
            "PUT",
            "/relay/v1/workspace?seq=1&unchanged=true",
            Vec::new(),
        )
        .await;
        assert_eq!(status, 409, "a full request takes no 'unchanged'");
        let bundle = pod.bundle_changes(CommitLimits::default()).unwrap();
        let (status, _) = send(&s.router, "PUT", "/relay/v1/workspace?seq=1", bundle).await;
        assert_eq!(status, 200);
        assert!(syncing.await.unwrap().unwrap());

        // The next sync may be answered unchanged; the worktree stays as it is.
        let worktree = s._dir.path().join("worktrees/th_1");
        std::fs::write(worktree.join("FINDINGS.md"), "kept\n").unwrap();
        let pods = s.pods.clone();
        let session = s.session.clone();
        let syncing = tokio::spawn(async move { pods.sync(&session).await });
        let (_, wanted) = send(
            &s.router,
            "GET",
            &format!("{WANTED_PATH}?after=1"),
            Vec::new(),
        )
        .await;
        let wanted: Wanted = serde_json::from_slice(&wanted).unwrap();
        assert_eq!((wanted.seq, wanted.if_changed), (2, true));
        let (status, answer) = send(
            &s.router,
            "PUT",
            "/relay/v1/workspace?seq=2&unchanged=true",
            Vec::new(),
        )
        .await;
        assert_eq!(status, 200);
        let answer: Taken = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer.outcome, "unchanged");
        assert!(syncing.await.unwrap().unwrap());
        assert_eq!(
            std::fs::read(worktree.join("FINDINGS.md")).unwrap(),
            b"kept\n"
        );

        // A checkpoint's pull is never answered so.
        let pods = s.pods.clone();
        let session = s.session.clone();
        let pulling = tokio::spawn(async move { pods.pull(&session).await });
        let (_, wanted) = send(
            &s.router,
            "GET",
            &format!("{WANTED_PATH}?after=2"),
            Vec::new(),
        )
        .await;
        let wanted: Wanted = serde_json::from_slice(&wanted).unwrap();
        assert_eq!((wanted.seq, wanted.if_changed), (3, false));
        let (status, _) = send(
            &s.router,
            "PUT",
            "/relay/v1/workspace?seq=3&unchanged=true",
            Vec::new(),
        )
        .await;
        assert_eq!(status, 409);
        let bundle = pod.bundle_changes(CommitLimits::default()).unwrap();
        let (status, _) = send(&s.router, "PUT", "/relay/v1/workspace?seq=3", bundle).await;
        assert_eq!(status, 200);
        assert!(pulling.await.unwrap().unwrap());
        assert_eq!(
            std::fs::read(worktree.join("FINDINGS.md")).unwrap(),
            b"found\n"
        );
    }
}
