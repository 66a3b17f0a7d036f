//! The relay's side of the session's workspace (`--workspace-dir`): before the agent's
//! socket opens, the thread's branch tip is fetched and written into the workspace
//! volume (the agent, which waits for its socket, never starts on an empty one); then
//! a long poll waits for the gateway to want the pod's work (a checkpoint, a sync, a
//! stop) and answers each request with a bundle of what the agent left there, or, to a
//! sync's request, `unchanged` when the workspace's tree is the one last taken.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tracing::Instrument as _;

use super::{Dialer, Purpose};
use crate::relay::pod_workspace::{BUNDLE_TYPE, WANTED_PATH, WANTED_WAIT, WORKSPACE_PATH, Wanted};
use crate::workspace::{BundleLimits, CommitLimits, PodWork, PodWorkspace};

/// Time for a workspace to go either way, beyond the long poll's own wait.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);
/// The largest answer read that is not a bundle.
const MAX_SMALL_ANSWER: usize = 64 << 10;

impl Dialer {
    /// One request with `body` on a fresh control connection: the status and the
    /// body of the answer, at most `max_answer` bytes, all within `timeout`.
    pub(super) async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        max_answer: usize,
        timeout: Duration,
    ) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        let stream = self.dial_retrying(Purpose::Control).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("control connection")?;
        let driving = tokio::spawn(conn.in_current_span());
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "threadgate")
            .header(hyper::header::CONTENT_TYPE, BUNDLE_TYPE)
            .body(Full::new(Bytes::from(body)))
            .context("control request")?;
        let answered = async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), max_answer)
                .collect()
                .await
                .map_err(|e| match e.downcast::<LengthLimitError>() {
                    Ok(over) => anyhow::Error::from(*over),
                    Err(e) => anyhow::anyhow!("control answer: {e}"),
                })?
                .to_bytes();
            anyhow::Ok((status, body))
        };
        let answered = tokio::time::timeout(timeout, answered)
            .await
            .map_err(|_| anyhow::anyhow!("{path} was not answered in time"))?;
        driving.abort();
        answered
    }

    /// Fetches the handed-out workspace and writes it, unless an earlier run of the
    /// relay in this pod already did. A bundle past any of `limits` (read no further
    /// than `max_bytes`) is refused, naming the cap, before anything is written.
    pub(super) async fn fetch_workspace(
        &self,
        workspace: &PodWorkspace,
        limits: BundleLimits,
    ) -> anyhow::Result<()> {
        if workspace.base()?.is_some() {
            tracing::info!(
                "the workspace was written by an earlier run; kept as the agent left it"
            );
            return Ok(());
        }
        let refused = "the session's workspace was refused under the relay's caps \
                       (--workspace-max-*); nothing was written";
        let fetched = self
            .exchange(
                "GET",
                WORKSPACE_PATH,
                Vec::new(),
                limits.max_bytes,
                TRANSFER_TIMEOUT,
            )
            .await;
        let (status, bundle) = match fetched {
            Err(e) if over_length_limit(&e) => {
                let too_large = crate::workspace::BundleError::TooLarge {
                    limit: limits.max_bytes,
                };
                return Err(anyhow::Error::from(too_large).context(refused));
            }
            other => other?,
        };
        anyhow::ensure!(status.is_success(), "{WORKSPACE_PATH} answered {status}");
        let workspace = workspace.clone();
        crate::tasks::Tasks::spawn_blocking(move || workspace.receive_base(&bundle, &limits))
            .await?
            .context(refused)?;
        Ok(())
    }

    /// Answers the gateway's requests for the pod's work until aborted.
    pub(super) async fn keep_synced(self: Arc<Self>, workspace: PodWorkspace) {
        let mut after = 0;
        let mut failed = 0;
        // The tree of the last bundle the gateway took.
        let mut sent = None;
        loop {
            match self.serve_one(&workspace, after, &mut sent).await {
                Ok(seq) => {
                    after = seq;
                    failed = 0;
                }
                Err(e) => {
                    failed += 1;
                    let wait = crate::retry::SESSION_START
                        .wait(failed)
                        .max(Duration::from_secs(1));
                    tracing::warn!(error = %format!("{e:#}"), retry_in = ?wait, "cannot serve the gateway's request for the workspace");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One long poll and, when the gateway wants the pod's work, one bundle sent.
    async fn serve_one(
        &self,
        workspace: &PodWorkspace,
        after: u64,
        sent: &mut Option<git2::Oid>,
    ) -> anyhow::Result<u64> {
        let path = format!("{WANTED_PATH}?after={after}");
        let (status, body) = self
            .exchange(
                "GET",
                &path,
                Vec::new(),
                MAX_SMALL_ANSWER,
                WANTED_WAIT + TRANSFER_TIMEOUT,
            )
            .await?;
        anyhow::ensure!(status.is_success(), "{WANTED_PATH} answered {status}");
        let wanted: Wanted =
            serde_json::from_slice(&body).context("the wanted answer is not one")?;
        if wanted.seq <= after {
            return Ok(after);
        }
        let packing = workspace.clone();
        let unless = if wanted.if_changed { *sent } else { None };
        let work = crate::tasks::Tasks::spawn_blocking(move || {
            packing.bundle_changes_unless(CommitLimits::default(), unless)
        })
        .await??;
        let (tree, bundle, path) = match work {
            PodWork::Unchanged => (
                None,
                Vec::new(),
                format!("{WORKSPACE_PATH}?seq={}&unchanged=true", wanted.seq),
            ),
            PodWork::Bundle { tree, bytes } => (
                Some(tree),
                bytes,
                format!("{WORKSPACE_PATH}?seq={}", wanted.seq),
            ),
        };
        let bytes = bundle.len();
        let (status, body) = self
            .exchange("PUT", &path, bundle, MAX_SMALL_ANSWER, TRANSFER_TIMEOUT)
            .await?;
        if !status.is_success() {
            // The gateway's refusal names what was wrong; the request is answered.
            tracing::warn!(%status, answer = %String::from_utf8_lossy(&body), "the gateway refused the workspace");
        } else if let Some(tree) = tree {
            *sent = Some(tree);
            tracing::info!(seq = wanted.seq, bytes, "the workspace was sent back");
        } else {
            tracing::debug!(seq = wanted.seq, "the workspace is as last sent");
        }
        Ok(wanted.seq)
    }
}

/// Whether `error` is an answer longer than the bytes it was read with.
fn over_length_limit(error: &anyhow::Error) -> bool {
    error.downcast_ref::<LengthLimitError>().is_some()
}
