//! One unix socket per session, bind-mounted into its container: the session's only
//! way out, and its identity. Each socket serves the sandbox API with the scope of the
//! session it belongs to; nothing for people is routed here.
//!
//! A session whose sandbox runs elsewhere (a pod) reaches the same router through the
//! relay listener: [`SocketHost::service`] hands it the very router the socket serves,
//! the session's connection cap and the signal of its close, for as long as the
//! session is open.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::UnixListener;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use crate::ids::SessionId;
use crate::server::{ConnLimits, LimitedRouter, serve};
use crate::session::{SessionApi, SessionScope};
use crate::tasks::Tasks;

/// The file name of a session's socket inside its socket directory (mounted at
/// `/run/threadgate` in the container).
pub const SOCKET_NAME: &str = "api.sock";

/// Builds the router a session's socket serves.
pub trait SandboxRouter: Send + Sync {
    fn router(&self, scope: SessionScope) -> Router;
}

struct Listener {
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    service: SessionService,
}

/// What serves an open session's relayed connections: the router its socket serves
/// (same scope, same routes, same limits), a cap on its relayed connections (the
/// socket's own cap, counted apart), and the signal of its close.
#[derive(Clone)]
pub struct SessionService {
    pub scope: SessionScope,
    pub router: LimitedRouter,
    pub slots: Arc<Semaphore>,
    pub closed: CancellationToken,
}

/// Runs the sessions' socket listeners.
pub struct SocketHost {
    routes: Arc<dyn SandboxRouter>,
    listeners: Mutex<HashMap<SessionId, Listener>>,
    limits: ConnLimits,
    tasks: Tasks,
}

/// The limits each session's socket gets unless told otherwise.
pub const DEFAULT_SOCKET_LIMITS: ConnLimits = ConnLimits {
    max_connections: 32,
    max_per_address: 0,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(30),
};

impl SocketHost {
    /// Sockets that serve what `routes` builds for each session; each socket's listener
    /// runs in `tasks` and stops at its session's close or at shutdown.
    pub fn new(routes: Arc<dyn SandboxRouter>, tasks: Tasks) -> SocketHost {
        SocketHost {
            routes,
            listeners: Mutex::new(HashMap::new()),
            limits: DEFAULT_SOCKET_LIMITS,
            tasks,
        }
    }

    /// Sets the connection cap and timeouts of every session's socket.
    pub fn with_limits(mut self, limits: ConnLimits) -> SocketHost {
        self.limits = limits;
        self
    }

    /// Whether the session's listener is running.
    pub fn is_open(&self, session_id: &str) -> bool {
        lock(&self.listeners)
            .get(session_id)
            .is_some_and(|l| !l.task.is_finished())
    }

    /// The service of an open session, for a relayed connection; `None` once the
    /// session has closed (or was never opened here).
    pub fn service(&self, session_id: &str) -> Option<SessionService> {
        lock(&self.listeners)
            .get(session_id)
            .filter(|l| !l.task.is_finished() && !l.service.closed.is_cancelled())
            .map(|l| l.service.clone())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl SessionApi for SocketHost {
    async fn open(&self, scope: SessionScope, socket_dir: PathBuf) -> anyhow::Result<()> {
        let same = lock(&self.listeners)
            .get(&scope.session_id)
            .is_some_and(|l| !l.task.is_finished() && l.service.scope == scope);
        if same {
            return Ok(());
        }
        // A listener still open under another scope (the thread's lease was lost and
        // taken back, so its token changed): closed first, so nothing is served under
        // the stale token.
        SessionApi::close(self, &scope.session_id).await;
        let listener = bind_private(&socket_dir)?;
        let app = first_request_logged(self.routes.router(scope.clone()), &scope.session_id);
        let service = SessionService {
            scope: scope.clone(),
            router: LimitedRouter::new(app.clone(), self.limits),
            slots: Arc::new(Semaphore::new(self.limits.max_connections)),
            closed: CancellationToken::new(),
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let session = scope.session_id.clone();
        let limits = self.limits;
        // At the session's close the socket stops accepting and its open requests
        // drain; at shutdown it stops at once, its connections with it.
        let task = self.tasks.spawn_until_shutdown(async move {
            serve(listener, app, limits, async move {
                let _ = stopped.await;
            })
            .await;
            tracing::debug!(session = %session, "session socket closed");
        });
        let listener = Listener {
            shutdown,
            task,
            service,
        };
        if let Some(earlier) = lock(&self.listeners).insert(scope.session_id, listener) {
            // A listener that had ended on its own: its relayed connections end too.
            earlier.service.closed.cancel();
        }
        Ok(())
    }

    async fn close(&self, session_id: &str) {
        let listener = lock(&self.listeners).remove(session_id);
        if let Some(l) = listener {
            // The socket stops accepting and drains its open requests (serve's own
            // deadline) in the background; nothing waits for it here. Its relayed
            // connections drain the same way, and no new one is let in.
            l.service.closed.cancel();
            let _ = l.shutdown.send(());
        }
    }
}

/// Logs the first request on a session's socket once, with how long after the socket
/// opened it came: when the agent began working (a warm start's adoption, or a cold
/// start's container and runner start, included).
fn first_request_logged(router: Router, session: &SessionId) -> Router {
    let first = Arc::new(std::sync::Once::new());
    let opened = std::time::Instant::now();
    let session = session.clone();
    router.layer(tower::util::MapRequestLayer::new(
        move |request: axum::extract::Request| {
            first.call_once(|| {
                let waited_ms = crate::clock::ms_u64(opened.elapsed());
                tracing::info!(session = %session, waited_ms, "first request on the session's socket");
            });
            request
        },
    ))
}

/// Binds `dir/api.sock`, reachable only by the directory's owner (the container's user,
/// to whom the sandbox runtime gives the directory) and threadgate: the directory is
/// 0700 and the socket 0600, owned like the directory.
fn bind_private(dir: &Path) -> anyhow::Result<UnixListener> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let path = dir.join(SOCKET_NAME);
    // A socket left by an earlier run of threadgate: the container keeps the
    // directory mounted, so a new socket at the same path reaches it again.
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let owner = std::fs::metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if owner.uid() != me && me == 0 {
        // Rebound after a restart: hand the socket to the container's user again.
        rustix::fs::chown(
            &path,
            Some(rustix::fs::Uid::from_raw(owner.uid())),
            Some(rustix::fs::Gid::from_raw(owner.gid())),
        )?;
    }
    Ok(listener)
}
