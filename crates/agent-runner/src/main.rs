//! `threadgate-agent-runner`: the agent inside a session's sandbox.
//!
//! It reaches threadgate only through the session's socket (the container has no
//! network and holds no model key): it loads the agent, follows the thread's events,
//! asks the model through threadgate's proxy, runs the tools the model chooses (the
//! gateway's, through the policy, and local ones on /workspace), and saves the
//! transcript after each turn. It uses nothing of the server library.
//!
//! Environment: `THREADGATE_SOCKET` (default `/run/threadgate/api.sock`),
//! `THREADGATE_WORKSPACE` (default `/workspace`), `THREADGATE_RUNNER_STATE` (default
//! `/tmp/threadgate`: `events.jsonl` there journals the events read, capped at 4 MiB).
//!
//! In a parked sandbox (warm start) the runner waits for its socket to appear: that is
//! its assignment to a thread, whose workspace and secrets are in place by then.
//!
//! When the agent file names a `harness:`, the runner runs that command instead of its
//! own loop, with its bridge from `127.0.0.1:PORT` to the socket ([`harness`]).

mod agent;
mod api;
mod bridge;
mod calls;
mod harness;
mod local;
mod prompt;
mod tools;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_harness;
#[cfg(test)]
mod tests_local;

use std::path::PathBuf;
use std::time::Duration;

use agent::{Runner, Settings};

/// How often a parked runner looks for its socket: a stat every 5 ms costs nothing
/// and keeps the adoption-to-first-request time short.
const SOCKET_POLL: Duration = Duration::from_millis(5);

fn settings() -> Settings {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    Settings {
        socket: PathBuf::from(env("THREADGATE_SOCKET", "/run/threadgate/api.sock")),
        workspace: PathBuf::from(env("THREADGATE_WORKSPACE", "/workspace")),
        poll_wait: 30,
        journal: Some(
            PathBuf::from(env("THREADGATE_RUNNER_STATE", "/tmp/threadgate")).join("events.jsonl"),
        ),
    }
}

/// The harness the agent file names, with the agent's model; `None` for the built-in
/// loop. Retries until the socket answers.
async fn chosen_harness(settings: &Settings) -> Option<(harness::Harness, String)> {
    let api = api::Api::new(settings.socket.clone());
    loop {
        match api.get("/v1/agent").await {
            Ok(r) if r.ok() => match r.read::<threadgate_api::AgentView>() {
                Ok(agent) => {
                    let model = agent.model.clone().unwrap_or_default();
                    return harness::Harness::of(&agent).map(|h| (h, model));
                }
                Err(e) => eprintln!("threadgate-agent-runner: GET /v1/agent: {e:#}"),
            },
            Ok(r) => eprintln!("threadgate-agent-runner: GET /v1/agent: {}", r.status),
            Err(e) => eprintln!("threadgate-agent-runner: GET /v1/agent: {e:#}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let settings = settings();
    // A parked sandbox (warm start) has no socket until a thread adopts it: the
    // socket appears last, after the workspace and secrets, and is the assignment.
    while !settings.socket.exists() {
        tokio::time::sleep(SOCKET_POLL).await;
    }
    // The workspace was mounted over the directory the runner started in: enter the
    // thread's, so that what it starts works there.
    if let Err(e) = std::env::set_current_dir(&settings.workspace) {
        eprintln!("threadgate-agent-runner: cannot enter the workspace: {e}");
    }
    if let Some((h, model)) = chosen_harness(&settings).await {
        match h
            .run(settings.socket.clone(), settings.workspace.clone(), &model)
            .await
        {
            Ok(status) => eprintln!("threadgate-agent-runner: the harness ended: {status}"),
            Err(e) => eprintln!("threadgate-agent-runner: {e:#}"),
        }
        // The bridge stays up; the session ends by idleness or when the thread is done.
        std::future::pending::<()>().await;
    }
    let mut runner = loop {
        match Runner::load(settings.clone()).await {
            Ok(r) => break r,
            Err(e) => {
                eprintln!("threadgate-agent-runner: cannot load the agent: {e:#}; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    eprintln!(
        "threadgate-agent-runner: agent {:?}: conversation of {} messages loaded",
        runner.agent_name(),
        runner.messages().len()
    );
    if let Err(e) = runner.run().await {
        eprintln!("threadgate-agent-runner: {e:#}");
    }
    // The proxy stopped the session (budget, a secret in the prompt): stay (the session
    // ends by idleness) without working.
    eprintln!("threadgate-agent-runner: stopped; a person takes the thread over");
    std::future::pending::<()>().await;
}
