//! The relay end to end: a real threadgate serving its relay listener over TLS (a
//! certificate made in the test), a real `threadgate relay` for one session carrying an
//! agent's HTTP from its own unix socket, against localstripe and the Plain fake.
//!
//! A call through the relay is decided exactly as through the session's unix socket; a
//! credential reaches only its own session, and an expired, tampered or stopped
//! session's credential reaches none; the relay renews its credential, caps its
//! connections, refuses a gateway its CA did not sign, and writes the session's
//! secrets as files without logging them, and carries the session's workspace into
//! the pod and its work back to the thread's branch. A parked pod's relay is told of its
//! adoption by the one wait it holds.
//!
//! Needs `.venv-peers`: run `scripts/localstripe.sh setup` once.

#[path = "relay/adoption_wait.rs"]
mod adoption_wait;
#[path = "relay/calls.rs"]
mod calls;
#[path = "relay/caps.rs"]
mod caps;
#[path = "relay/credentials.rs"]
mod credentials;
#[path = "relay/owners.rs"]
mod owners;
#[path = "relay/pod_tokens.rs"]
mod pod_tokens;
#[path = "relay/secrets.rs"]
mod secrets;
#[path = "relay/workspace.rs"]
mod workspace;

use serde_json::Value;

/// `body` without the fields that differ from call to call (execution ids, times).
fn stable(mut body: Value) -> Value {
    if let Some(map) = body.as_object_mut() {
        for key in ["execution_id", "expires_at", "created_at"] {
            map.remove(key);
        }
    }
    body
}
