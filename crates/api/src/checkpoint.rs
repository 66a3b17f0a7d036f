//! `POST /v1/checkpoint`: the agent asks threadgate to commit its workspace onto the
//! thread's branch and push the branch now, so that the work survives this instance.

use serde::{Deserialize, Serialize};

/// What the checkpoint did: `{"branch", "commit", "left_out", "push"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointAnswer {
    /// The thread's branch, e.g. `threadgate/th_…`.
    pub branch: String,
    /// The new commit, or `null` when the workspace matched the branch already.
    pub commit: Option<String>,
    /// How many files were left out of the commit (a stored secret in them, a cap).
    #[serde(default)]
    pub left_out: u64,
    /// `pushed`, `not_needed` (nothing new), `no_remote` (branches stay on this
    /// instance) or `failed` (tried again at the next checkpoint).
    pub push: String,
}
