//! What the engineers see when a session ends with changes: its branch, pushed by the
//! supervisor, and a draft pull request on the configured GitHub repository whose
//! description says what an engineer needs to review it: the Plain thread (link and
//! subject), what the agent found, every gated call of the thread with its decision,
//! the files the branch changed and what the model cost.
//!
//! The pull request is found by its head branch before one is opened, so ending the
//! same session again (a follow-up, a retry, a restart that ends it anew) replaces the
//! one pull request's description instead of opening a second. Its link goes on the
//! thread as an internal note once per pull request. Every text taken from the session
//! passes through the redactor first: no stored secret value reaches GitHub. Agent- and
//! customer-written text cannot forge the description's structure: the agent's findings
//! are quoted line by line, and one-line texts (the subject, a call's summary, a path)
//! are Markdown-escaped. Once published, `[github] on_done` says whether the pull
//! request stays a draft, is marked ready for review, or is closed.

use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;

use super::SessionScope;
use super::agent_text::{agent_lines, escape_markdown, one_line};
use crate::connectors::GithubConnector;
use crate::connectors::github::PullRequest;
use crate::secrets::Redactor;
use crate::store::Db;
use crate::workspace::ChangedFiles;

/// The most characters of the agent's findings a description carries.
const MAX_SUMMARY_CHARS: usize = 4000;
/// The most characters of the thread's subject a description carries.
const MAX_SUBJECT_CHARS: usize = 200;
/// The most gated calls a description lists (the rest are counted).
pub const MAX_LISTED_CALLS: usize = 100;
/// The most changed files a description lists (the rest are counted).
pub const MAX_LISTED_FILES: usize = 100;

/// Publishes a thread's pushed branch for the engineers.
#[async_trait::async_trait]
pub trait BranchPublisher: Send + Sync {
    /// Opens or updates the thread's draft pull request from `branch`.
    /// `commit_message` is the branch tip's message, the summary of last resort; `files`
    /// what the branch changed against the default branch.
    async fn publish(
        &self,
        scope: &SessionScope,
        branch: &str,
        commit_message: Option<&str>,
        files: &ChangedFiles,
    ) -> anyhow::Result<PullRequest>;
}

/// What becomes of a session's pull request when its thread is done (`[github]
/// on_done`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDone {
    /// Left as it is (a draft, unless someone changed it).
    #[default]
    Draft,
    /// Marked ready for review.
    Ready,
    /// Closed (a follow-up's session reopens and updates it).
    Close,
}

impl OnDone {
    /// The value as `[github] on_done` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDone::Draft => "draft",
            OnDone::Ready => "ready",
            OnDone::Close => "close",
        }
    }
}

/// Leaves the internal note that tells the thread's people a pull request waits for an
/// engineer (through the note outbox, which lives above this module).
#[async_trait::async_trait]
pub trait PullNotes: Send + Sync {
    /// Queues the note durably, once per pull request: a later update queues nothing.
    async fn opened(&self, scope: &SessionScope, pull: &PullRequest) -> anyhow::Result<()>;
}

/// The current redactor (the gate's, refreshed as secrets change).
pub type RedactorSource = Arc<dyn Fn() -> Arc<Redactor> + Send + Sync>;

/// Draft pull requests on one GitHub repository.
pub struct GithubPublisher {
    /// The connector, limited to the configured repositories.
    pub github: Arc<GithubConnector>,
    /// `owner/name` of the repository the branch is pushed to.
    pub repo: String,
    /// The branch pull requests target (the default branch).
    pub base: String,
    /// Where the session's notes, diagnoses and events are read.
    pub db: Db,
    /// Scrubs stored secret values from every text sent.
    pub redactor: RedactorSource,
    /// The agent's latest finding on a thread (its note, else its diagnosis), read by
    /// the executions table's owner, which sits above this module.
    pub latest_finding: FindingReader,
    /// The thread's gated calls, read by the executions table's owner.
    pub thread_calls: CallsReader,
    /// Resolves once the gate has recorded the outcome of every read of the session it
    /// answered before (`gateway::slots`): the call list then shows none of them
    /// still running.
    pub outcomes_settled: OutcomesSettled,
    /// What the model cost on the thread, read by the model proxy's tables' owner.
    pub thread_cost: CostReader,
    /// Queues the pull request's note on the thread.
    pub notes: Arc<dyn PullNotes>,
    /// What becomes of the pull request once published (the thread is done).
    pub on_done: OnDone,
}

/// Reads the agent's latest finding on a thread, in a read transaction.
pub type FindingReader = fn(&crate::store::Conn<'_>, &str) -> crate::store::Result<Option<String>>;
/// Reads the first `limit` gated calls of a thread (oldest first) and their count.
pub type CallsReader =
    fn(&crate::store::Conn<'_>, &str, usize) -> crate::store::Result<ThreadCalls>;
/// Waits until the gate has recorded every read's outcome of a session it answered.
pub type OutcomesSettled = Arc<
    dyn Fn(crate::ids::SessionId) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;
/// Reads what the model cost on a thread.
pub type CostReader = fn(&crate::store::Conn<'_>, &str) -> crate::store::Result<SessionCost>;

/// One gated call of the thread, as its pull request lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedCall {
    /// The tool, as the catalog names it.
    pub tool: String,
    /// The stored one-line summary (a held call has one).
    pub summary: Option<String>,
    /// What was decided and became of it: "ran, succeeded", "denied by ana", ...
    pub decision: String,
}

/// The first gated calls of a thread and how many it has in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadCalls {
    pub calls: Vec<GatedCall>,
    pub total: usize,
}

/// What the model cost on a thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCost {
    pub turns: u64,
    pub tokens: u64,
}

/// Everything a pull request's description says.
#[derive(Debug, Clone, Default)]
pub struct PullFacts {
    pub thread_id: String,
    /// The Plain workspace of the thread, for its link.
    pub workspace: Option<String>,
    /// The thread's title (its subject), as Plain last sent it.
    pub subject: Option<String>,
    pub branch: String,
    /// The agent's latest note or diagnosis (else the commit message).
    pub finding: String,
    pub calls: ThreadCalls,
    pub files: ChangedFiles,
    pub cost: SessionCost,
}

#[async_trait::async_trait]
impl BranchPublisher for GithubPublisher {
    async fn publish(
        &self,
        scope: &SessionScope,
        branch: &str,
        commit_message: Option<&str>,
        files: &ChangedFiles,
    ) -> anyhow::Result<PullRequest> {
        (self.outcomes_settled)(scope.session_id.clone()).await;
        let thread = scope.thread_id.clone();
        let (finding_of, calls_of, cost_of) =
            (self.latest_finding, self.thread_calls, self.thread_cost);
        let (finding, (workspace, subject), calls, cost) = self
            .db
            .read(move |c| {
                Ok((
                    finding_of(c, &thread)?,
                    thread_of(c, &thread)?,
                    calls_of(c, &thread, MAX_LISTED_CALLS)?,
                    cost_of(c, &thread)?,
                ))
            })
            .await
            .context("reading the session's findings")?;
        let facts = PullFacts {
            thread_id: scope.thread_id.to_string(),
            workspace,
            subject,
            branch: branch.to_owned(),
            finding: finding
                .or_else(|| commit_message.map(str::to_owned))
                .unwrap_or_else(|| "The agent left no note or diagnosis.".into()),
            calls,
            files: files.clone(),
            cost,
        };
        let redactor = (self.redactor)();
        let body = redacted_description(&redactor, &facts);
        let title = format!("threadgate: Plain thread {}", scope.thread_id);
        let pull = self
            .github
            .upsert_draft_pull(&self.repo, branch, &self.base, &title, &body)
            .await
            .map_err(|e| anyhow::anyhow!(redactor.redact(&e.to_string()).into_owned()))?;
        self.notes
            .opened(scope, &pull)
            .await
            .context("queueing the pull request's note")?;
        let done = match self.on_done {
            // One already ready (an earlier end, a person) is left as it is.
            OnDone::Draft => Ok(()),
            OnDone::Ready if !pull.draft => Ok(()),
            OnDone::Ready => self.github.mark_ready(&pull).await,
            OnDone::Close => self.github.close_pull(&self.repo, pull.number).await,
        };
        done.map_err(|e| {
            anyhow::anyhow!(
                "the pull request is published, but [github] on_done ({}) failed: {}",
                self.on_done.as_str(),
                redactor.redact(&e.to_string())
            )
        })?;
        Ok(pull)
    }
}

/// The description: the thread, the agent's findings, the gated calls, the files
/// changed, the cost and the branch.
pub fn description(facts: &PullFacts) -> String {
    let thread_id = &facts.thread_id;
    let link = match &facts.workspace {
        Some(w) => format!("https://app.plain.com/workspace/{w}/thread/{thread_id}"),
        None => format!("(Plain thread id `{thread_id}`)"),
    };
    let subject = match &facts.subject {
        Some(s) => {
            let s: String = one_line(s).chars().take(MAX_SUBJECT_CHARS).collect();
            escape_markdown(&s)
        }
        None => "(none known)".into(),
    };
    let finding: String = facts.finding.chars().take(MAX_SUMMARY_CHARS).collect();
    let quoted: String = agent_lines(&finding)
        .iter()
        .map(|l| format!("> {l}\n"))
        .collect();
    let SessionCost { turns, tokens } = facts.cost;
    format!(
        "Opened by threadgate when the support session of Plain thread `{thread_id}` ended.\n\n\
         ## The thread\n\nPlain thread: {link}\n\nSubject: {subject}\n\n\
         ## What the agent found\n\nWritten by the agent, not verified:\n\n{quoted}\n\
         ## Gated calls ({calls_total})\n\n{calls}\n\
         ## Files changed ({files_total})\n\n{files}\n\
         ## Cost\n\n{turns} model turns, {tokens} tokens.\n\n\
         Branch `{branch}`; a draft until an engineer reviews it.\n",
        calls_total = facts.calls.total,
        calls = calls_section(&facts.calls),
        files_total = facts.files.total,
        files = files_section(&facts.files),
        branch = facts.branch,
    )
}

/// [`description`] with every stored secret value replaced by its name.
pub fn redacted_description(redactor: &Redactor, facts: &PullFacts) -> String {
    let mut facts = facts.clone();
    facts.finding = redactor.redact(&facts.finding).into_owned();
    let body = description(&facts);
    redactor.redact(&body).into_owned()
}

/// One line per call: its summary (else its tool), then what was decided.
fn calls_section(calls: &ThreadCalls) -> String {
    if calls.total == 0 {
        return "None.\n".into();
    }
    let mut out: String = calls
        .calls
        .iter()
        .map(|call| {
            let what = call.summary.as_deref().unwrap_or(&call.tool);
            format!(
                "- {}: {}\n",
                escape_markdown(&one_line(what)),
                escape_markdown(&one_line(&call.decision))
            )
        })
        .collect();
    out.push_str(&more(calls.total, calls.calls.len()));
    out
}

/// One line per changed path, with how it changed.
fn files_section(files: &ChangedFiles) -> String {
    if files.total == 0 {
        return "None.\n".into();
    }
    let mut out: String = files
        .files
        .iter()
        .map(|(path, change)| {
            format!(
                "- {}: {}\n",
                change.as_str(),
                escape_markdown(&one_line(path))
            )
        })
        .collect();
    out.push_str(&more(files.total, files.files.len()));
    out
}

/// "- and N more" when `listed` of `total` were listed.
fn more(total: usize, listed: usize) -> String {
    match total.saturating_sub(listed) {
        0 => String::new(),
        n => format!("- and {n} more\n"),
    }
}

/// The Plain workspace and title of the thread, from its latest event.
fn thread_of(
    c: &crate::store::Conn<'_>,
    thread: &str,
) -> crate::store::Result<(Option<String>, Option<String>)> {
    let body = crate::webhook::store::latest_body(c, thread)?;
    let event = body.and_then(|b| serde_json::from_str::<Value>(&b).ok());
    let Some(event) = event else {
        return Ok((None, None));
    };
    let workspace = event
        .get("workspaceId")
        .and_then(Value::as_str)
        .filter(|w| crate::connectors::is_plain_id(w))
        .map(str::to_owned);
    let subject = event
        .pointer("/payload/thread/title")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .map(str::to_owned);
    Ok((workspace, subject))
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
