//! Waiting on something a test can observe (a row, a file, an answer), polled, with a
//! deadline that turns a hang into a failure naming what never happened. Never a bare
//! sleep before asserting that something did not happen.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// Waits until `check` holds, polling; panics with `what` after [`DEFAULT_WAIT`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(DEFAULT_WAIT, what, check).await;
}

/// Waits until `check` holds, polling; panics with `what` after `timeout`.
pub async fn eventually_within<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let found = wait_for(timeout, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await;
    assert!(
        found.is_some(),
        "timed out after {timeout:?} waiting: {what}"
    );
}

/// Polls `probe` until it returns `Some` (answered) or `timeout` passes (`None`).
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
