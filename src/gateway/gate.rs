//! The gate: decides a session's tool call against the policy, records it, and runs it
//! with the connector's credentials, holds it for a person, or blocks it.

use std::sync::{Arc, RwLock};

use serde_json::Value;
use tokio::sync::{Notify, broadcast};

use super::refusal::Refusal;
use crate::connectors::{Connector, GithubConnector, HelpdeskConnector, StripeConnector};
use crate::executions::Execution;
use crate::policy::{Catalog, Policy};
use crate::secrets::{Redactor, RedactorSource};
use crate::session::{AgentBook, SupervisorHandle};
use crate::store::Db;

/// The connectors threadgate calls tools through; any may be absent (not configured),
/// in which case its tools fail cleanly.
#[derive(Default, Clone)]
pub struct Connectors {
    pub stripe: Option<Arc<StripeConnector>>,
    pub helpdesk: Option<Arc<HelpdeskConnector>>,
    pub github: Option<Arc<GithubConnector>>,
}

impl Connectors {
    /// The connector serving `tool` (by its prefix).
    pub fn for_tool(&self, tool: &str) -> Option<Arc<dyn Connector>> {
        let prefix = tool.split('.').next().unwrap_or_default();
        let connector = match prefix {
            "stripe" => self.stripe.clone().map(|c| c as Arc<dyn Connector>),
            "helpdesk" => self.helpdesk.clone().map(|c| c as Arc<dyn Connector>),
            "github" => self.github.clone().map(|c| c as Arc<dyn Connector>),
            _ => None,
        };
        connector.map(crate::connectors::metered)
    }
}

/// The policy in force, with what the audit records about it.
pub struct LoadedPolicy {
    pub policy: Policy,
    /// The policy's name as people and the agent see it (the file's name, e.g.
    /// `support.yaml`): never the host's path, which says nothing to a reviewer and
    /// too much to an agent.
    pub name: String,
    pub hash_hex: String,
}

impl LoadedPolicy {
    pub fn new(policy: Policy, name: String) -> LoadedPolicy {
        let hash_hex = hex::encode(policy.hash());
        LoadedPolicy {
            policy,
            name,
            hash_hex,
        }
    }
}

/// The name a policy file is shown by: its file name, without the directories.
pub fn policy_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "policy".into())
}

/// A tool call as the agent sends it (the sandbox API's type).
pub use threadgate_api::CallRequest;

/// The gate's answer to a call, before it becomes HTTP.
#[derive(Debug)]
pub enum CallReply {
    Ran {
        execution_id: String,
        result: Value,
        replayed: bool,
    },
    Failed {
        execution_id: String,
        error: String,
        retry_after_ms: Option<u64>,
    },
    Held {
        execution: Box<Execution>,
        approval_url: String,
    },
    Blocked {
        execution_id: String,
        rule: String,
    },
    /// Refused before any decision (or its answer dropped as out of scope).
    Refused(Refusal),
}

/// Everything the gate needs; shared by the sandbox API and the approvals service.
pub struct Gate {
    pub db: Db,
    pub policy: RwLock<Arc<LoadedPolicy>>,
    pub catalog: Catalog,
    pub connectors: Connectors,
    pub redactor: RwLock<Arc<Redactor>>,
    /// Rebuilds `redactor` when a secret was set or deleted (checked before each call
    /// and before a result is redacted); `None` keeps `redactor` as it is.
    pub redactor_source: Option<RedactorSource>,
    pub agents: Arc<AgentBook>,
    pub public_url: String,
    pub clock: crate::clock::Clock,
    /// Execution ids whose status changed (long polls wait on this).
    pub changes: broadcast::Sender<String>,
    /// Wakes the note outbox.
    pub outbox: Notify,
    /// The supervisor, created before the gate (its channel first, its task later).
    pub supervisor: SupervisorHandle,
    /// The sessions that may have a call waiting for a person (loaded at start).
    pub holds: Arc<super::holds::HoldMarks>,
    /// Calls of one session waiting for a person at most (`[sessions]
    /// max_pending_holds`; 0: no limit).
    pub max_pending_holds: usize,
}

impl Gate {
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn current_policy(&self) -> Arc<LoadedPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn current_redactor(&self) -> Arc<Redactor> {
        self.redactor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Brings `redactor` up to date with the secret store (one small read when nothing
    /// changed), so a secret stored a moment ago is already found.
    pub async fn refresh_redactor(&self) {
        if let Some(source) = &self.redactor_source {
            source.refresh(&self.redactor).await;
        }
    }

    /// The link a person follows to a held call (a pointer: using it needs a reviewer's
    /// credential).
    pub fn approval_url(&self, execution_id: &str) -> String {
        format!(
            "{}/approvals/{execution_id}",
            self.public_url.trim_end_matches('/')
        )
    }

    pub(super) fn notify(&self, execution_id: &str) {
        let _ = self.changes.send(execution_id.to_owned());
    }
}
