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

mod agent;
mod api;
mod calls;
mod local;
mod prompt;
mod tools;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_local;

use std::path::PathBuf;
use std::time::Duration;

use agent::{Runner, Settings};

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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let settings = settings();
    while !settings.socket.exists() {
        tokio::time::sleep(Duration::from_millis(200)).await;
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
    // The budget is spent: stay (the session ends by idleness) without working.
    eprintln!("threadgate-agent-runner: stopped; a person takes the thread over");
    std::future::pending::<()>().await;
}
