//! `/healthz` and `/readyz` on the people's listener.
//!
//! `/healthz` says only that the process answers. `/readyz` checks what a session
//! needs: the database commits a write, the Docker engine answers, the sandbox image
//! exists there, and the policy file the gate runs still parses as it did at start.
//! Each check has its own time limit (`[telemetry] ready_timeout`), so a stuck
//! dependency makes the answer a clear 503, never a hang. The body names each check
//! and, for a failed one, what failed; it carries no secret (no key, no setting value
//! beyond the image and the policy's name) and no path of the host: it is not
//! authenticated.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use crate::sandbox::{SandboxError, SandboxRuntime};
use crate::store::Db;

/// The policy the gate runs now.
pub type LoadedPolicyInfo = Arc<dyn Fn() -> PolicyInfo + Send + Sync>;

/// The policy the gate runs: where to read it again, the name it is shown by, and its
/// hash (hex).
#[derive(Debug, Clone)]
pub struct PolicyInfo {
    /// Read to see whether it still parses; never shown.
    pub path: PathBuf,
    /// What the body shows (the file's name).
    pub name: String,
    pub hash: String,
}

/// What `/readyz` checks.
#[derive(Clone)]
pub struct Readiness {
    /// The database a probe write goes to.
    pub db: Db,
    /// The engine sessions run on.
    pub sandbox: Arc<dyn SandboxRuntime>,
    /// The image every session starts from.
    pub image: String,
    /// The policy loaded now.
    pub policy: LoadedPolicyInfo,
    /// How long each check may take.
    pub timeout: Duration,
    /// Now, in unix milliseconds (written by the probe).
    pub clock: crate::clock::Clock,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// `database`, `docker`, `sandbox_image` or `policy`.
    pub name: &'static str,
    /// `None` when it passed; what failed otherwise.
    pub error: Option<String>,
    /// What a passing check wants to say (the policy's name and hash).
    pub detail: Option<Value>,
}

impl Check {
    fn ok(name: &'static str) -> Check {
        Check {
            name,
            error: None,
            detail: None,
        }
    }

    fn failed(name: &'static str, error: impl Into<String>) -> Check {
        Check {
            name,
            error: Some(error.into()),
            detail: None,
        }
    }
}

/// Runs `f` within `limit`, turning a timeout into an error naming the limit.
async fn within<T>(
    limit: Duration,
    what: &str,
    f: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{what} did not answer within {}",
            humantime::format_duration(limit)
        )),
    }
}

impl Readiness {
    /// Runs every check, at the same time.
    pub async fn check(&self) -> Vec<Check> {
        let (database, engine, policy) =
            tokio::join!(self.database(), self.engine(), self.policy());
        let mut checks = vec![database];
        checks.extend(engine);
        checks.push(policy);
        checks
    }

    /// A real write (a row in `meta`), committed and synced like any other.
    async fn database(&self) -> Check {
        let now = self.clock.now_ms().to_string();
        let probe = self
            .db
            .write(move |c| crate::store::meta::set(c, "ready_probe_ms", &now));
        let result = within(self.timeout, "a database write", async {
            probe.await.map_err(|e| e.to_string())
        })
        .await;
        match result {
            Ok(_) => Check::ok("database"),
            Err(e) => Check::failed("database", e),
        }
    }

    /// The engine, then the image in it.
    async fn engine(&self) -> [Check; 2] {
        let ready = within(self.timeout, "the docker engine", async {
            match self.sandbox.check_ready(&self.image).await {
                Err(SandboxError::ImageMissing { .. }) => Ok(false),
                Err(e) => Err(e.to_string()),
                Ok(()) => Ok(true),
            }
        })
        .await;
        match ready {
            Ok(true) => [Check::ok("docker"), Check::ok("sandbox_image")],
            Ok(false) => [
                Check::ok("docker"),
                Check::failed(
                    "sandbox_image",
                    SandboxError::ImageMissing {
                        image: self.image.clone(),
                    }
                    .to_string(),
                ),
            ],
            Err(e) => [
                Check::failed("docker", e),
                Check::failed(
                    "sandbox_image",
                    "not checked: the docker engine does not answer",
                ),
            ],
        }
    }

    /// The policy file the gate runs must still parse: a restart would fail otherwise.
    async fn policy(&self) -> Check {
        let PolicyInfo { path, name, hash } = (self.policy)();
        let shown = name.clone();
        let parsed = crate::tasks::Tasks::spawn_blocking(move || {
            // The errors name the policy, never its path: this answer is public.
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read policy file {shown}: {}", e.kind()))?;
            crate::policy::Policy::parse(&text, &shown)
                .map(|p| hex::encode(p.hash()))
                .map_err(|e| format!("the policy file no longer parses: {e}"))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match parsed {
            Ok(on_disk) => Check {
                detail: Some(json!({
                    "file": name,
                    "hash": hash,
                    "changed_on_disk": on_disk != hash,
                })),
                ..Check::ok("policy")
            },
            Err(e) => Check::failed("policy", e),
        }
    }
}

/// The `/readyz` body: `status` (`ready` or `not_ready`), the names of the `failed`
/// checks, and each check with `ok` and its `error` or details.
pub fn body(checks: &[Check]) -> Value {
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.error.is_some())
        .map(|c| c.name)
        .collect();
    let mut each = Map::new();
    for c in checks {
        let mut entry = json!({ "ok": c.error.is_none() });
        if let Some(e) = &c.error
            && let Some(fields) = entry.as_object_mut()
        {
            fields.insert("error".into(), json!(e));
        }
        if let (Some(Value::Object(detail)), Some(fields)) = (&c.detail, entry.as_object_mut()) {
            for (k, v) in detail {
                fields.insert(k.clone(), v.clone());
            }
        }
        each.insert(c.name.to_owned(), entry);
    }
    let status = if failed.is_empty() {
        "ready"
    } else {
        "not_ready"
    };
    json!({ "status": status, "failed": failed, "checks": each })
}

/// The routes: `GET /healthz` and `GET /readyz`.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(r): State<Readiness>) -> Response {
    let checks = r.check().await;
    let body = body(&checks);
    let status = if body
        .get("failed")
        .and_then(Value::as_array)
        .is_some_and(|f| f.is_empty())
    {
        StatusCode::OK
    } else {
        for c in checks.iter().filter(|c| c.error.is_some()) {
            tracing::warn!(check = c.name, error = ?c.error, "not ready");
        }
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::FakeRuntime;

    fn readiness(dir: &std::path::Path, policy: PathBuf) -> (Readiness, Arc<FakeRuntime>) {
        let db = Db::open(&dir.join("t.db")).expect("open");
        let fake = Arc::new(FakeRuntime::new());
        let text = std::fs::read_to_string(&policy).expect("policy");
        let loaded = crate::policy::Policy::parse(&text, "p").expect("parses");
        let hash = hex::encode(loaded.hash());
        let r = Readiness {
            db,
            sandbox: fake.clone(),
            image: "threadgate-sandbox:latest".into(),
            policy: Arc::new(move || PolicyInfo {
                path: policy.clone(),
                name: crate::gateway::policy_name(&policy),
                hash: hash.clone(),
            }),
            timeout: Duration::from_secs(5),
            clock: crate::clock::Clock::fixed(1_000),
        };
        (r, fake)
    }

    fn repo_policy() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies/support.yaml")
    }

    #[tokio::test]
    async fn ready_when_everything_answers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (r, _) = readiness(dir.path(), repo_policy());
        let body = body(&r.check().await);
        assert_eq!(body["status"], "ready", "{body}");
        assert_eq!(body["checks"]["policy"]["changed_on_disk"], false, "{body}");
        let probe: String =
            r.db.read(|c| {
                c.query_row(
                    "SELECT value FROM meta WHERE key = 'ready_probe_ms'",
                    (),
                    |row| row.get(0),
                )
            })
            .await
            .expect("the probe wrote");
        assert_eq!(probe, "1000");
    }

    #[tokio::test]
    async fn a_missing_image_and_a_broken_policy_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy = dir.path().join("policy.yaml");
        std::fs::copy(repo_policy(), &policy).expect("copy");
        let (r, fake) = readiness(dir.path(), policy.clone());
        fake.remove_image("threadgate-sandbox:latest");
        std::fs::write(&policy, "rules:\n  - [unclosed\n").expect("break it");
        let body = body(&r.check().await);
        assert_eq!(body["status"], "not_ready");
        assert_eq!(body["failed"], json!(["sandbox_image", "policy"]), "{body}");
        let image = body["checks"]["sandbox_image"]["error"]
            .as_str()
            .unwrap_or("");
        assert!(image.contains("threadgate-sandbox:latest"), "{body}");
        let policy_error = body["checks"]["policy"]["error"].as_str().unwrap_or("");
        assert!(policy_error.contains("policy.yaml"), "{body}");
        let dir_text = dir.path().display().to_string();
        assert!(!body.to_string().contains(&dir_text), "no path: {body}");
        assert_eq!(body["checks"]["docker"]["ok"], true);
    }
}
