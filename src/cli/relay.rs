//! `threadgate relay`: the sidecar beside an agent in a pod ([`crate::relay::client`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::relay::{Relay, RelayOptions, client::DEFAULT_MAX_CONNECTIONS};

/// The relay's flags.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The unix socket the agent connects to.
    #[arg(long, default_value = "/run/threadgate/api.sock")]
    pub listen: PathBuf,
    /// The gateway's relay listener, `https://HOST:PORT`.
    #[arg(long)]
    pub gateway: String,
    /// The file holding the session's relay credential.
    #[arg(long)]
    pub token_file: PathBuf,
    /// The CA certificate (PEM) the gateway's certificate must chain to.
    #[arg(long)]
    pub ca_file: PathBuf,
    /// Where to write the session's granted secrets as read-only files.
    #[arg(long)]
    pub secrets_dir: Option<PathBuf>,
    /// The agent's workspace volume: the thread's branch is written there before the
    /// socket opens, and sent back when the gateway asks (needs --workspace-git).
    #[arg(long, requires = "workspace_git")]
    pub workspace_dir: Option<PathBuf>,
    /// The relay's own git directory (a volume the agent does not mount).
    #[arg(long, requires = "workspace_dir")]
    pub workspace_git: Option<PathBuf>,
    /// The agent's connections carried at once; more are closed at once.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
}

/// Runs the relay until SIGTERM or Ctrl-C.
pub(super) fn relay(args: RelayArgs) -> ExitCode {
    if let Err(e) = crate::telemetry::init() {
        eprintln!("threadgate: {e}");
        return ExitCode::FAILURE;
    }
    let options = RelayOptions {
        listen: args.listen,
        gateway: args.gateway,
        token_file: args.token_file,
        ca_file: args.ca_file,
        secrets_dir: args.secrets_dir,
        max_connections: args.max_connections,
        workspace: args
            .workspace_dir
            .zip(args.workspace_git)
            .map(|(work_dir, git_dir)| crate::workspace::PodWorkspace { work_dir, git_dir }),
    };
    let ran = Relay::new(options).and_then(|relay| {
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(relay.run(super::ops::shutdown_signal()))
    });
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
