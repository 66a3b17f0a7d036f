//! The `threadgate` command line: a clap [`Cli`] with one [`Command`] variant per
//! subcommand, each implemented in its own module.
//!
//! To add a subcommand, add a variant holding its clap `Args` struct and a module with a
//! `run(args) -> ExitCode` function, and dispatch it in [`run`].

mod policy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// threadgate: one sandboxed agent session per support thread, every tool call through a
/// policy gate.
#[derive(Debug, Parser)]
#[command(name = "threadgate", version, about)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resolve a list of calls against a policy file without running anything.
    Check(policy::CheckArgs),
    /// Report errors and suspicious rules in a policy file.
    Lint(policy::LintArgs),
}

/// Parses the command line and runs the subcommand; the process exit code.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => policy::check(&args),
        Command::Lint(args) => policy::lint(&args),
    }
}
