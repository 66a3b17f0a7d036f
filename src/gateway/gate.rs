//! The gate: decides a session's tool call against the policy, records it, and runs it
//! with the connector's credentials, holds it for a person, or blocks it.

use std::sync::{Arc, RwLock};

use serde_json::Value;
use tokio::sync::broadcast;

use super::refusal::Refusal;
use crate::clock::Clock;
use crate::connectors::{Connector, GithubConnector, HelpdeskConnector, StripeConnector};
use crate::executions::Execution;
use crate::ids::ExecutionId;
use crate::notes::Outbox;
use crate::policy::{Catalog, Policy, ToolSpec};
use crate::secrets::{Redactor, RedactorSource};
use crate::session::{AgentBook, AgentDefinition, SupervisorHandle};
use crate::store::Db;
use crate::tasks::Tasks;

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

/// Whether a call whose outcome was lost may be sent again ([`Gate::may_resend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    Yes,
    /// Its provider does not deduplicate (or no connector serves it): a person checks.
    NoKey,
    /// Its idempotency key may be gone at the provider: a person checks.
    KeyExpired,
}

/// [`Gate::may_resend`]'s rule: a read at any age; a call on a provider that
/// deduplicates by idempotency key while under [`crate::connectors::RESEND_WITHIN_MS`]
/// have passed since `decided_ms` (its decision, or its creation when it never had
/// one: never later than its first send); nothing else.
fn resend(is_read: bool, deduplicates: bool, decided_ms: i64, now_ms: i64) -> Resend {
    if is_read {
        Resend::Yes
    } else if !deduplicates {
        Resend::NoKey
    } else if now_ms.saturating_sub(decided_ms) < crate::connectors::RESEND_WITHIN_MS {
        Resend::Yes
    } else {
        Resend::KeyExpired
    }
}

/// The gate's answer to a call, before it becomes HTTP.
#[derive(Debug)]
pub enum CallReply {
    Ran {
        execution_id: ExecutionId,
        result: Value,
        replayed: bool,
    },
    Failed {
        execution_id: ExecutionId,
        error: String,
        retry_after_ms: Option<u64>,
    },
    Held {
        execution: Box<Execution>,
        approval_url: String,
    },
    Blocked {
        execution_id: ExecutionId,
        rule: String,
    },
    /// Refused before any decision (or its answer dropped as out of scope).
    Refused(Refusal),
}

/// Writes of one session waiting for an identical call still being sent, at most (the
/// instance's cap is [`super::slots::IN_ALL`]).
pub const TWIN_WAITS_PER_SESSION: usize = 4;

/// Calls under way at most on this instance, all sessions together, when
/// [`GateParts::max_calls_in_all`] is not larger (each session's own cap is
/// [`GateParts::max_calls_per_session`]; see `slots.rs`).
pub const CALLS_IN_ALL: usize = 1024;

/// What the gate is built from (at start, by `app`).
pub struct GateParts {
    pub db: Db,
    pub policy: Arc<LoadedPolicy>,
    pub connectors: Connectors,
    pub redactor: Arc<Redactor>,
    /// Rebuilds the redactor when a secret was set or deleted; `None` keeps it as it is.
    pub redactor_source: Option<RedactorSource>,
    pub agents: Arc<AgentBook>,
    pub public_url: String,
    pub clock: Clock,
    /// The supervisor, created before the gate (its channel first, its task later).
    pub supervisor: SupervisorHandle,
    /// Calls of one session waiting for a person at most (`[sessions]
    /// max_pending_holds`; 0: no limit).
    pub max_pending_holds: usize,
    /// Calls of one session under way at most, answered or not
    /// ([`Gate::call_to_the_end`]): `app` gives twice `[sessions]
    /// socket_max_connections`, as the socket's and the relayed connections are capped
    /// apart.
    pub max_calls_per_session: usize,
    /// Calls under way at most on the instance: `app` gives the session cap times
    /// `[sessions] max_live`, so sessions that hang up and call again to their cap
    /// leave room for every other live one; never below [`CALLS_IN_ALL`].
    pub max_calls_in_all: usize,
    /// Each session's pace of calls (`[sessions] calls_per_second`, `calls_burst`;
    /// `per_second` 0: no limit).
    pub call_rate: super::rate::CallRate,
    /// This instance's id: recorded on every call it sends, so a restart recovers only
    /// its own calls and those of instances no longer alive.
    pub instance_id: String,
    /// The application's tasks: a read's outcome written after its answer runs on them
    /// (`trailing`), so a clean stop waits for it.
    pub tasks: Tasks,
}

/// Everything the gate needs; shared by the sandbox API, MCP, the model proxy and the
/// approvals service, each through the methods below. Its fields are the gateway's own.
pub struct Gate {
    pub(super) db: Db,
    policy: RwLock<Arc<LoadedPolicy>>,
    pub(super) catalog: Catalog,
    pub(super) connectors: Connectors,
    /// Shared with the note outbox, which redacts with what it holds at the time.
    pub(super) redactor: Arc<RwLock<Arc<Redactor>>>,
    /// Rebuilds `redactor` when a secret was set or deleted (checked before each call
    /// and before a result is redacted); `None` keeps `redactor` as it is.
    pub(super) redactor_source: Option<RedactorSource>,
    pub(super) agents: Arc<AgentBook>,
    public_url: String,
    clock: Clock,
    /// Execution ids whose status changed (long polls wait on this).
    changes: broadcast::Sender<ExecutionId>,
    /// The note outbox: queued notes and trail events are posted by it once woken.
    pub(super) outbox: Arc<Outbox>,
    /// The supervisor, created before the gate (its channel first, its task later).
    pub(super) supervisor: SupervisorHandle,
    /// The sessions that may have a call waiting for a person (loaded at start).
    pub(super) holds: Arc<super::holds::HoldMarks>,
    /// Calls of one session waiting for a person at most (`[sessions]
    /// max_pending_holds`; 0: no limit).
    pub(super) max_pending_holds: usize,
    /// This instance's id, recorded as the runner of the calls it sends.
    runner: Arc<str>,
    /// Reads' outcomes written after their answer, capped per session and in all.
    pub(super) trailing: Arc<super::slots::SessionSlots>,
    pub(super) tasks: Tasks,
    /// The calls this process is sending now, until their outcome is written.
    pub(super) sending: super::sending::Sending,
    /// Writes waiting for an identical call still being sent (`run`'s `await_twin`):
    /// the same per-session and per-instance slot caps as trailing outcomes, so a
    /// hostile agent's retries cannot pile up waits (one past the cap is answered at
    /// once from the twin as it is).
    pub(super) twin_waits: Arc<super::slots::SessionSlots>,
    /// Calls of the sandbox API and MCP from before they are checked until their
    /// outcome is recorded, capped per session and in all: a call whose client hung up
    /// holds its slot until it ends.
    pub(super) under_way: Arc<super::slots::SessionSlots>,
    /// Each session's pace of calls (`rate.rs`); `None`: no limit.
    pace: Option<super::rate::CallPace>,
}

impl Gate {
    /// The gate over `parts`, with its note outbox (over the same database, Plain
    /// connector, clock and redactor) and no session marked as holding yet.
    pub fn new(parts: GateParts) -> Gate {
        let (changes, _) = broadcast::channel(1024);
        let redactor = Arc::new(RwLock::new(parts.redactor));
        let outbox = Arc::new(Outbox::new(
            parts.db.clone(),
            parts.connectors.helpdesk.clone(),
            parts.clock.clone(),
            redactor.clone(),
        ));
        Gate {
            db: parts.db,
            policy: RwLock::new(parts.policy),
            catalog: Catalog::builtin(),
            connectors: parts.connectors,
            redactor,
            redactor_source: parts.redactor_source,
            agents: parts.agents,
            public_url: parts.public_url,
            clock: parts.clock,
            changes,
            outbox,
            supervisor: parts.supervisor,
            holds: Arc::default(),
            max_pending_holds: parts.max_pending_holds,
            runner: Arc::from(parts.instance_id),
            trailing: Arc::default(),
            tasks: parts.tasks,
            sending: Default::default(),
            twin_waits: Arc::new(super::slots::SessionSlots::with_caps(
                TWIN_WAITS_PER_SESSION,
                super::slots::IN_ALL,
            )),
            under_way: Arc::new(super::slots::SessionSlots::with_caps(
                parts.max_calls_per_session,
                parts.max_calls_in_all.max(CALLS_IN_ALL),
            )),
            pace: super::rate::CallPace::new(parts.call_rate),
        }
    }

    /// Whether this process is sending the call `id` now (from its `running` commit
    /// until its outcome is written).
    pub fn is_sending(&self, id: &ExecutionId) -> bool {
        self.sending.contains(id)
    }

    /// [`Gate::call`] on a task of the application's own, awaited: a client that hangs
    /// up mid-call (its decision recorded, its request to the provider on its way) does
    /// not cut the call; it runs to its outcome, and only the answer is lost. A clean
    /// stop waits for it; the shutdown deadline may cut it (recovery then finds it).
    ///
    /// Each call holds one of the session's slots of calls under way until it ends,
    /// its client gone or not; one past the session's cap is refused `too_many_calls`,
    /// one past the instance's `instance_busy` (`slots.rs`), and one past the session's
    /// pace `rate_limited` (`rate.rs`), none of them recorded or sent.
    pub async fn call_to_the_end(
        self: &Arc<Self>,
        scope: &crate::session::SessionScope,
        req: CallRequest,
    ) -> CallReply {
        let slot = match self.under_way.try_take(&scope.session_id) {
            Ok(slot) => slot,
            Err(super::slots::Full::Session(limit)) => {
                return CallReply::Refused(super::refusal::Refusal::TooManyCalls { limit });
            }
            Err(super::slots::Full::Instance(limit)) => {
                return CallReply::Refused(super::refusal::Refusal::InstanceBusy { limit });
            }
        };
        // After the slot: a call refused for the cap spends none of the session's pace.
        if let Some(pace) = &self.pace
            && let Err(wait) = pace.admit(&scope.session_id, std::time::Instant::now())
        {
            let rate = pace.rate();
            // Rounded up: a client that waits as long as it is told is let through.
            let retry_after_ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000))
                .unwrap_or(u64::MAX)
                .max(1);
            return CallReply::Refused(super::refusal::Refusal::RateLimited {
                per_second: rate.per_second,
                burst: rate.burst,
                retry_after_ms,
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (gate, scope) = (self.clone(), scope.clone());
        self.tasks.spawn(async move {
            let reply = gate.call(&scope, req).await;
            drop(slot);
            let _ = tx.send(reply);
        });
        rx.await
            .unwrap_or(CallReply::Refused(super::refusal::Refusal::Internal))
    }

    /// Calls of one session under way at most, and of the whole instance (what an
    /// MCP wait's caps follow too).
    pub fn call_caps(&self) -> (usize, usize) {
        (self.under_way.per_session(), self.under_way.in_all())
    }

    /// The application's tasks: work spawned here outlives the request that began it,
    /// and a clean stop waits for it.
    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// This instance's id, as recorded on the calls it sends.
    pub fn runner(&self) -> Arc<str> {
        self.runner.clone()
    }

    /// The time by the gate's clock, in unix milliseconds.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The database calls are recorded in, for those that read or decide them.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The tool catalog calls are checked against.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The agent definition called `name`, if there is one.
    pub fn agent(&self, name: &str) -> Option<&AgentDefinition> {
        self.agents.get(name)
    }

    /// The tools `agent` is offered, in the catalog's order: those it is granted, less
    /// those the policy in force blocks outright. `None` for an unknown agent.
    pub fn offered_tools(&self, agent: &str) -> Option<Vec<&'static ToolSpec>> {
        let agent = self.agents.get(agent)?;
        let loaded = self.current_policy();
        let tools = self
            .catalog
            .tools()
            .iter()
            .filter(|t| agent.grants(t.name))
            .filter(|t| !loaded.policy.always_blocks(t.name, &self.catalog))
            .collect();
        Some(tools)
    }

    /// Whether `exec`, a call whose outcome was lost, may be sent again at `now_ms`: a
    /// read (catalog risk class `read`: it changes nothing at the provider), or a call
    /// whose connector deduplicates by idempotency key while its key is still alive there
    /// ([`crate::connectors::RESEND_WITHIN_MS`] of its decision).
    pub fn may_resend(&self, exec: &Execution, now_ms: i64) -> Resend {
        let Some(connector) = self.connectors.for_tool(&exec.tool) else {
            return Resend::NoKey;
        };
        let is_read = self
            .catalog
            .get(&exec.tool)
            .is_some_and(|spec| spec.risk == crate::policy::Risk::Read);
        let decided = exec.decided_at_ms.unwrap_or(exec.created_at_ms);
        resend(is_read, connector.supports_idempotency(), decided, now_ms)
    }

    /// Resolves once every read's outcome written after its answer is recorded (or
    /// failed): what a reader of a read's row right after its answer waits on.
    pub async fn outcomes_settled(&self) {
        self.trailing.settled().await;
    }

    /// Resolves once every read's outcome of `session_id` written after its answer is
    /// recorded (or failed), whatever other sessions do.
    pub async fn session_outcomes_settled(&self, session_id: &str) {
        self.trailing.session_settled(session_id).await;
    }

    /// How many reads' outcomes are being written after their answer now.
    pub fn outcomes_trailing(&self) -> usize {
        self.trailing.len()
    }

    /// The note outbox: to wake it after queuing a note, or to run it.
    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// The supervisor, to tell it of a thread's activity or stop a session.
    pub fn supervisor(&self) -> &SupervisorHandle {
        &self.supervisor
    }

    /// Execution ids as their status changes, for a long poll.
    pub fn changes(&self) -> broadcast::Receiver<ExecutionId> {
        self.changes.subscribe()
    }

    /// Announces a change of `exec` made outside the gate (a decision, an expiry, an
    /// approved run): long polls wake, the outbox posts the trail event queued with it,
    /// and the thread's session is resumed.
    pub fn changed(&self, exec: &Execution) {
        self.notify(&exec.id);
        self.outbox.wake();
        self.supervisor.resume(&exec.thread_id);
    }

    /// Marks every session with a held or approved call, before any session socket
    /// serves a call (reads rely on the marks).
    pub async fn load_holds(&self) -> Result<(), crate::store::StoreError> {
        self.holds.load(&self.db).await
    }

    /// Marks `session_id` if it has a held or approved call, before its socket serves a
    /// call on this instance (it may have run on another one until now).
    pub async fn load_session_holds(
        &self,
        session_id: &str,
    ) -> Result<(), crate::store::StoreError> {
        self.holds.load_session(&self.db, session_id).await
    }

    pub fn current_policy(&self) -> Arc<LoadedPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `loaded` in force for every call decided from now on.
    pub fn set_policy(&self, loaded: LoadedPolicy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
    }

    pub fn current_redactor(&self) -> Arc<Redactor> {
        self.redactor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `redactor` in force until the secret store's generation next moves.
    pub fn set_redactor(&self, redactor: Redactor) {
        *self.redactor.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(redactor);
    }

    /// The link a person follows to a held call (a pointer: using it needs a reviewer's
    /// credential).
    pub fn approval_url(&self, execution_id: &str) -> String {
        format!(
            "{}/approvals/{execution_id}",
            self.public_url.trim_end_matches('/')
        )
    }

    /// Where changed execution ids are announced, for a task that outlives the call.
    pub(super) fn changes_sender(&self) -> broadcast::Sender<ExecutionId> {
        self.changes.clone()
    }

    pub(super) fn notify(&self, execution_id: &ExecutionId) {
        let _ = self.changes.send(execution_id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::{Resend, resend};
    use crate::connectors::RESEND_WITHIN_MS;

    #[test]
    fn a_lost_call_is_resent_only_while_its_key_lives_and_a_read_always() {
        let decided = 1_000_000;
        let just_before = decided + RESEND_WITHIN_MS - 1;
        let at_the_edge = decided + RESEND_WITHIN_MS;
        assert_eq!(resend(false, true, decided, decided), Resend::Yes);
        assert_eq!(resend(false, true, decided, just_before), Resend::Yes);
        assert_eq!(
            resend(false, true, decided, at_the_edge),
            Resend::KeyExpired
        );
        assert_eq!(resend(false, true, decided, i64::MAX), Resend::KeyExpired);
        // A read changes nothing at the provider, whatever its age or provider.
        assert_eq!(resend(true, false, decided, i64::MAX), Resend::Yes);
        assert_eq!(resend(true, true, decided, i64::MAX), Resend::Yes);
        // No key: never, not even at once.
        assert_eq!(resend(false, false, decided, decided), Resend::NoKey);
        // A clock that went back is within the window.
        assert_eq!(resend(false, true, decided, decided - 5_000), Resend::Yes);
    }
}
