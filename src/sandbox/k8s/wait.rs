//! Waiting for a pod or claim to become ready, through kube-runtime's watcher: it
//! lists, then watches from the list's version, watches again where a watch ended
//! (the API server closes them every few minutes), and lists afresh when the server
//! answers 410 Gone (the version it resumed from was compacted away). Errors in between
//! are retried with backoff; the caller's deadline bounds the whole wait.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::crd::SandboxClaim;

/// What one observed state of the object says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Ready: the start is done.
    Ready,
    /// Not yet.
    Pending,
    /// It will never be ready: the reason.
    Failed(String),
}

/// Why waiting ended without a ready object.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotReady {
    /// The deadline passed; the last state seen.
    TimedOut(String),
    /// The object failed, or was deleted.
    Failed(String),
}

/// Waits until `check` says the object `name` is ready, it fails, or `deadline` passes.
pub(super) async fn until_ready<K>(
    api: Api<K>,
    name: &str,
    deadline: Duration,
    check: fn(&K) -> State,
) -> Result<(), NotReady>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut last = String::from("not seen yet");
    let waiting = async {
        let mut seen_in_list = false;
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(Event::Init) => {
                    seen_in_list = false;
                    continue;
                }
                Ok(Event::InitDone) if !seen_in_list => {
                    return Err("it no longer exists".to_string());
                }
                Ok(Event::InitDone) => continue,
                Ok(Event::InitApply(object)) => {
                    seen_in_list = true;
                    object
                }
                Ok(Event::Apply(object)) => object,
                Ok(Event::Delete(_)) => return Err("it was deleted".to_string()),
                Err(error) => {
                    // The watcher lists or watches again after its backoff; the error is
                    // kept for the message if the deadline passes first (a watch that
                    // RBAC forbids fails here every time).
                    tracing::debug!(%error, "sandbox watch interrupted; resuming");
                    last = format!("watch failed: {error}");
                    continue;
                }
            };
            match check(&object) {
                State::Ready => return Ok(()),
                State::Pending => last = "not ready".to_string(),
                State::Failed(reason) => return Err(reason),
            }
        }
        Err("the watch ended".to_string())
    };
    match tokio::time::timeout(deadline, waiting).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(reason)) => Err(NotReady::Failed(reason)),
        Err(_) => Err(NotReady::TimedOut(last)),
    }
}

/// Waiting reasons of a container that no wait will fix.
const HOPELESS: &[&str] = &[
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// A pod is ready when its `Ready` condition is true; it has failed when it ended, or
/// a container waits for something no wait will fix (an image that cannot be pulled).
pub(super) fn pod_state(pod: &Pod) -> State {
    if pod.metadata.deletion_timestamp.is_some() {
        return State::Failed("it is being deleted".to_string());
    }
    let Some(status) = &pod.status else {
        return State::Pending;
    };
    if let Some(phase @ ("Failed" | "Succeeded")) = status.phase.as_deref() {
        return State::Failed(format!("the pod ended ({phase})"));
    }
    for container in status.container_statuses.iter().flatten() {
        let waiting = container.state.as_ref().and_then(|s| s.waiting.as_ref());
        if let Some(reason) = waiting.and_then(|w| w.reason.as_deref())
            && HOPELESS.contains(&reason)
        {
            return State::Failed(format!("container {} is waiting: {reason}", container.name));
        }
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready { State::Ready } else { State::Pending }
}

/// A claim is ready when the controller says so.
pub(super) fn claim_state(claim: &SandboxClaim) -> State {
    if claim.metadata.deletion_timestamp.is_some() {
        return State::Failed("it is being deleted".to_string());
    }
    if claim.is_ready() {
        State::Ready
    } else {
        State::Pending
    }
}
