//! One unix socket per session, bind-mounted into its container: the session's only
//! way out, and its identity. Each socket serves the sandbox API with the scope of the
//! session it belongs to; nothing for people is routed here.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use tokio::net::UnixListener;
use tokio::sync::oneshot;

use crate::session::{SessionApi, SessionScope};

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
}

/// Runs the sessions' socket listeners.
pub struct SocketHost {
    routes: OnceLock<Arc<dyn SandboxRouter>>,
    listeners: Mutex<HashMap<String, Listener>>,
}

impl Default for SocketHost {
    fn default() -> Self {
        Self::new()
    }
}

impl SocketHost {
    pub fn new() -> SocketHost {
        SocketHost {
            routes: OnceLock::new(),
            listeners: Mutex::new(HashMap::new()),
        }
    }

    /// Sets what the sockets serve; done once, before the first session opens.
    pub fn set_router(&self, routes: Arc<dyn SandboxRouter>) {
        // A second call keeps the first router: the wiring happens once at start.
        let _ = self.routes.set(routes);
    }

    /// Whether the session's listener is running.
    pub fn is_open(&self, session_id: &str) -> bool {
        lock(&self.listeners)
            .get(session_id)
            .is_some_and(|l| !l.task.is_finished())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl SessionApi for SocketHost {
    async fn open(&self, scope: SessionScope, socket_dir: PathBuf) -> anyhow::Result<()> {
        if self.is_open(&scope.session_id) {
            return Ok(());
        }
        let routes = self
            .routes
            .get()
            .ok_or_else(|| anyhow::anyhow!("the sandbox API router is not set"))?;
        std::fs::create_dir_all(&socket_dir)?;
        let path = socket_dir.join(SOCKET_NAME);
        // A socket left by an earlier run of threadgate: the container keeps the
        // directory mounted, so a new socket at the same path reaches it again.
        if path.exists() {
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        // The container's user must be able to connect; the directory's owner and mode
        // keep everyone else out.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let app = routes.router(scope.clone());
        let (shutdown, stopped) = oneshot::channel::<()>();
        let session = scope.session_id.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(session, error = %e, "session socket failed");
            }
        });
        lock(&self.listeners).insert(scope.session_id, Listener { shutdown, task });
        Ok(())
    }

    async fn close(&self, session_id: &str) {
        let listener = lock(&self.listeners).remove(session_id);
        if let Some(l) = listener {
            let _ = l.shutdown.send(());
            // Long polls end at their own timeout; do not wait for them here.
            l.task.abort();
        }
    }
}
