//! `threadgate relay`: the sidecar beside an agent in a pod ([`crate::relay::client`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::relay::{Relay, RelayOptions, client::DEFAULT_MAX_CONNECTIONS};
use crate::workspace::BundleLimits;

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
    /// Bytes of the workspace bundle the relay takes (`[relay.workspace] max_bytes`;
    /// at least 1024).
    #[arg(long, default_value_t = BundleLimits::default().max_bytes)]
    pub workspace_max_bytes: usize,
    /// Objects its pack may declare (`max_objects`; at least 1).
    #[arg(long, default_value_t = BundleLimits::default().max_objects)]
    pub workspace_max_objects: u32,
    /// Entries of its tree as written out (`max_entries`; at least 1).
    #[arg(long, default_value_t = BundleLimits::default().max_entries)]
    pub workspace_max_entries: usize,
    /// Bytes of file content of its tree as written out (`max_tree_bytes`; at least 1).
    #[arg(long, default_value_t = BundleLimits::default().max_tree_bytes)]
    pub workspace_max_tree_bytes: u64,
    /// Time to verify and write it (`max_time`, e.g. `2m`; at least 1s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub workspace_max_time: Duration,
}

impl RelayArgs {
    /// The workspace caps the flags give; an error names the flag out of range.
    pub fn workspace_limits(&self) -> anyhow::Result<BundleLimits> {
        anyhow::ensure!(
            self.workspace_max_bytes >= 1024,
            "--workspace-max-bytes must be at least 1024 (1 KiB)"
        );
        anyhow::ensure!(
            self.workspace_max_objects >= 1,
            "--workspace-max-objects must be at least 1"
        );
        anyhow::ensure!(
            self.workspace_max_entries >= 1,
            "--workspace-max-entries must be at least 1"
        );
        anyhow::ensure!(
            self.workspace_max_tree_bytes >= 1,
            "--workspace-max-tree-bytes must be at least 1"
        );
        anyhow::ensure!(
            self.workspace_max_time >= Duration::from_secs(1),
            "--workspace-max-time must be at least 1s"
        );
        Ok(BundleLimits {
            max_bytes: self.workspace_max_bytes,
            max_objects: self.workspace_max_objects,
            max_entries: self.workspace_max_entries,
            max_tree_bytes: self.workspace_max_tree_bytes,
            max_time: self.workspace_max_time,
        })
    }
}

/// Runs the relay until SIGTERM or Ctrl-C.
pub(super) fn relay(args: RelayArgs) -> ExitCode {
    if let Err(e) = crate::telemetry::init() {
        eprintln!("threadgate: {e}");
        return ExitCode::FAILURE;
    }
    let workspace_limits = match args.workspace_limits() {
        Ok(limits) => limits,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let options = RelayOptions {
        workspace_limits,
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::sandbox::k8s::{KubernetesSettings, relay_args};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Relay(RelayArgs),
    }

    fn parse(args: &[String]) -> Result<RelayArgs, clap::Error> {
        let argv = std::iter::once("threadgate".to_owned()).chain(args.iter().cloned());
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Relay(args) => args,
        })
    }

    /// The caps the gateway's `[relay.workspace]` sets reach the pod's relay: the pod's
    /// relay arguments parse back to them; without any, the relay's defaults are the
    /// configuration's.
    #[test]
    fn the_configured_workspace_caps_reach_the_relay_through_its_arguments() {
        let defaults = parse(&relay_args(&KubernetesSettings::default())).expect("args");
        assert_eq!(
            defaults.workspace_limits().expect("limits"),
            crate::relay::RelaySettings::default().workspace.limits()
        );
        let configured = BundleLimits {
            max_bytes: 4096,
            max_objects: 10,
            max_entries: 20,
            max_tree_bytes: 30,
            max_time: Duration::from_secs(5),
        };
        let settings = KubernetesSettings {
            relay_workspace_limits: configured,
            ..KubernetesSettings::default()
        };
        let args = parse(&relay_args(&settings)).expect("args");
        assert_eq!(args.workspace_limits().expect("limits"), configured);
    }

    #[test]
    fn a_workspace_cap_out_of_range_is_refused_naming_its_flag() {
        let base = relay_args(&KubernetesSettings::default());
        for (flag, value) in [
            ("--workspace-max-bytes", "1023"),
            ("--workspace-max-objects", "0"),
            ("--workspace-max-entries", "0"),
            ("--workspace-max-tree-bytes", "0"),
            ("--workspace-max-time", "500ms"),
        ] {
            let mut args = base.clone();
            args.extend([flag.to_owned(), value.to_owned()]);
            let e = parse(&args)
                .expect("parses")
                .workspace_limits()
                .expect_err(flag)
                .to_string();
            assert!(e.contains(flag), "{e}");
        }
    }
}
