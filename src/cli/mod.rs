//! The `threadgate` command line: a clap [`Cli`] with one [`Command`] variant per
//! subcommand, each implemented in its own module.
//!
//! To add a subcommand, add a variant holding its clap `Args` struct and a module with a
//! `run(args) -> ExitCode` function, and dispatch it in [`run`].

mod agents;
mod ops;
mod policy;
mod relay;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// threadgate: one sandboxed agent session per support thread, every tool call through a
/// policy gate.
#[derive(Debug, Parser)]
#[command(name = "threadgate", version, about)]
pub struct Cli {
    /// Where the settings come from.
    #[command(flatten)]
    pub config: ops::ConfigArgs,
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resolve a list of calls against a policy file without running anything.
    Check(policy::CheckArgs),
    /// Report errors and suspicious rules in a policy file; given a directory
    /// (`threadgate lint agents/`), check the agent files and their skills instead.
    Lint(policy::LintArgs),
    /// Run the orchestrator: webhooks, sessions, the gateway and approvals.
    Serve,
    /// List, stop or pause sessions.
    #[command(subcommand)]
    Sessions(ops::SessionsCommand),
    /// Manage the encrypted secrets store.
    #[command(subcommand)]
    Secrets(ops::SecretsCommand),
    /// Manage the people who approve held calls.
    #[command(subcommand)]
    Reviewers(ops::ReviewersCommand),
    /// Print or verify the audit log.
    Audit(ops::AuditArgs),
    /// Apply the database migrations (SQLite in the data directory, or `[store] url`'s
    /// Postgres) and exit; `serve` applies them at start as well.
    Migrate,
    /// Run the scripted model server (not a real model) for the demo and tests.
    ScriptedModel(agents::ScriptedModelArgs),
    /// Run as the relay beside an agent in a pod: its unix socket, carried to the
    /// gateway over TLS with the session's credential.
    Relay(relay::RelayArgs),
}

/// Parses the command line and runs the subcommand; the process exit code.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => policy::check(&args),
        Command::Lint(args) if args.policy.is_dir() => agents::lint(&cli.config, &args.policy),
        Command::Lint(args) => policy::lint(&args),
        Command::Serve => ops::serve(&cli.config),
        Command::Sessions(cmd) => ops::sessions(&cli.config, &cmd),
        Command::Secrets(cmd) => ops::secrets(&cli.config, &cmd),
        Command::Reviewers(cmd) => ops::reviewers(&cli.config, &cmd),
        Command::Audit(args) => ops::audit(&cli.config, &args),
        Command::Migrate => ops::migrate(&cli.config),
        Command::ScriptedModel(args) => agents::scripted_model(&args),
        Command::Relay(args) => relay::relay(args),
    }
}
