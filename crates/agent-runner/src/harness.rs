//! A team's own agent harness instead of the built-in loop, as the agent file's
//! `harness:` says: the runner opens the bridge and runs the harness's command with
//! the MCP URL and the model proxy's base URL.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use threadgate_api::AgentView;

use crate::bridge;

/// What the agent file's `harness:` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Harness {
    pub command: Vec<String>,
    pub port: u16,
}

impl Harness {
    /// The harness of the agent definition `agent` (`GET /v1/agent`), if it names one
    /// with a command.
    pub(crate) fn of(agent: &AgentView) -> Option<Harness> {
        let h = agent.harness.as_ref()?;
        if h.command.is_empty() {
            return None;
        }
        Some(Harness {
            command: h.command.clone(),
            port: h.port,
        })
    }

    /// `http://127.0.0.1:PORT/mcp`.
    pub(crate) fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The model proxy as an OpenAI-compatible base URL (`.../chat/completions` under it).
    pub(crate) fn model_base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/model", self.port)
    }

    /// The command with `{mcp_url}` and `{model_base_url}` replaced.
    pub(crate) fn argv(&self) -> Vec<String> {
        self.command
            .iter()
            .map(|a| {
                a.replace("{mcp_url}", &self.mcp_url())
                    .replace("{model_base_url}", &self.model_base_url())
            })
            .collect()
    }

    /// Opens the bridge, runs the command to its end, and answers how it ended. The
    /// bridge keeps serving until the runner exits.
    pub(crate) async fn run(
        &self,
        socket: PathBuf,
        workspace: PathBuf,
        model: &str,
    ) -> anyhow::Result<String> {
        let listener = bridge::bind(self.port)
            .await
            .with_context(|| format!("bridge: bind 127.0.0.1:{}", self.port))?;
        tokio::spawn(bridge::serve(listener, socket));
        let argv = self.argv();
        let Some((program, args)) = argv.split_first() else {
            anyhow::bail!("the harness command is empty");
        };
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .current_dir(workspace)
            .env("THREADGATE_MCP_URL", self.mcp_url())
            .env("THREADGATE_MODEL_BASE_URL", self.model_base_url())
            .env("THREADGATE_MODEL", model)
            .env("OPENAI_BASE_URL", self.model_base_url())
            // Harnesses insist on a key; the proxy holds the real one and ignores this.
            .env("OPENAI_API_KEY", "threadgate-model-proxy")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start the harness {program:?}"))?;
        let status = child.wait().await.context("wait for the harness")?;
        Ok(status.to_string())
    }
}
