//! What the engineers see when a session ends with changes: its branch, pushed by the
//! supervisor, and a draft pull request on the configured GitHub repository whose
//! description links the Plain thread and says what the agent found.
//!
//! The pull request is found by its head branch before one is opened, so ending the
//! same session again (a retry, a restart that ends it anew) updates the one pull
//! request instead of opening a second. Every text taken from the session (the agent's
//! latest internal note, else its latest diagnosis, else the branch's commit message)
//! passes through the redactor first: no stored secret value reaches GitHub.

use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;

use crate::connectors::GithubConnector;
use crate::connectors::github::PullRequest;
use crate::secrets::Redactor;
use crate::store::Db;

/// The most characters of the agent's findings a description carries.
const MAX_SUMMARY_CHARS: usize = 4000;

/// Publishes a thread's pushed branch for the engineers.
#[async_trait::async_trait]
pub trait BranchPublisher: Send + Sync {
    /// Opens or updates the thread's draft pull request from `branch`.
    /// `commit_message` is the branch tip's message, the summary of last resort.
    async fn publish(
        &self,
        thread_id: &str,
        branch: &str,
        commit_message: Option<&str>,
    ) -> anyhow::Result<PullRequest>;
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
}

/// Reads the agent's latest finding on a thread, in a read transaction.
pub type FindingReader = fn(&rusqlite::Connection, &str) -> rusqlite::Result<Option<String>>;

#[async_trait::async_trait]
impl BranchPublisher for GithubPublisher {
    async fn publish(
        &self,
        thread_id: &str,
        branch: &str,
        commit_message: Option<&str>,
    ) -> anyhow::Result<PullRequest> {
        let (thread, finding_of) = (thread_id.to_owned(), self.latest_finding);
        let (finding, workspace) = self
            .db
            .read(move |c| Ok((finding_of(c, &thread)?, workspace_of(c, &thread)?)))
            .await
            .context("reading the session's findings")?;
        let summary = finding
            .or_else(|| commit_message.map(str::to_owned))
            .unwrap_or_else(|| "The agent left no note or diagnosis.".into());
        let redactor = (self.redactor)();
        let body =
            redacted_description(&redactor, thread_id, workspace.as_deref(), branch, &summary);
        let title = format!("threadgate: Plain thread {thread_id}");
        let pull = self
            .github
            .upsert_draft_pull(&self.repo, branch, &self.base, &title, &body)
            .await
            .map_err(|e| anyhow::anyhow!(redactor.redact(&e.to_string()).into_owned()))?;
        Ok(pull)
    }
}

/// The description: the Plain thread's link, the agent's findings, the branch.
pub fn description(
    thread_id: &str,
    workspace: Option<&str>,
    branch: &str,
    summary: &str,
) -> String {
    let link = match workspace {
        Some(w) => format!("https://app.plain.com/workspace/{w}/thread/{thread_id}"),
        None => format!("(Plain thread id `{thread_id}`)"),
    };
    let summary: String = summary.chars().take(MAX_SUMMARY_CHARS).collect();
    format!(
        "Opened by threadgate when the support session of Plain thread `{thread_id}` ended.\n\n\
         Plain thread: {link}\n\n## What the agent found\n\n{summary}\n\n\
         Branch `{branch}`; a draft until an engineer reviews it.\n"
    )
}

/// [`description`] with every stored secret value replaced by its name.
pub fn redacted_description(
    redactor: &Redactor,
    thread_id: &str,
    workspace: Option<&str>,
    branch: &str,
    summary: &str,
) -> String {
    let body = description(thread_id, workspace, branch, summary);
    redactor.redact(&body).into_owned()
}

/// The Plain workspace of the thread, from its latest event.
fn workspace_of(c: &rusqlite::Connection, thread: &str) -> rusqlite::Result<Option<String>> {
    let body = crate::webhook::store::latest_body(c, thread)?;
    Ok(body
        .and_then(|b| serde_json::from_str::<Value>(&b).ok())
        .and_then(|v| v["workspaceId"].as_str().map(str::to_owned))
        .filter(|w| crate::connectors::is_plain_id(w)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretString;

    #[test]
    fn the_description_links_the_thread_and_carries_no_secret_value() {
        let key = "sk_live_publish_test_5f1e9a7c3b2d";
        let redactor = Redactor::new(vec![(
            "stripe_api_key".to_owned(),
            SecretString::from(key.to_owned()),
        )])
        .expect("redactor");
        let body = redacted_description(
            &redactor,
            "th_1",
            Some("w_2"),
            "threadgate/th_1",
            &format!("The agent found the key {key} in config.toml."),
        );
        assert!(!body.contains(key), "{body}");
        assert!(
            body.contains("https://app.plain.com/workspace/w_2/thread/th_1"),
            "{body}"
        );
        assert!(body.contains("in config.toml"), "{body}");
        let long = "x".repeat(MAX_SUMMARY_CHARS * 2);
        let body = description("th_1", None, "threadgate/th_1", &long);
        assert!(body.len() < MAX_SUMMARY_CHARS + 500);
        assert!(body.contains("`th_1`"));
    }
}
