//! `threadgate lint agents/` (a directory: agent files rather than a policy file) and
//! `threadgate scripted-model --listen ADDR`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use super::ops::ConfigArgs;
use crate::config::Settings;
use crate::policy::Catalog;
use crate::session::AgentBook;

/// Arguments of `threadgate scripted-model`.
#[derive(Debug, clap::Args)]
pub struct ScriptedModelArgs {
    /// Where to listen (OpenAI format under `/v1/chat/completions`, Anthropic under
    /// `/v1/messages`).
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
}

/// Checks every agent in `dir` and the skills beside it (`dir/../skills`, or the
/// configured skills directory) against the catalog and `[model].allowed`; prints one
/// `file:line: problem` per line.
pub(super) fn lint(config: &ConfigArgs, dir: &Path) -> ExitCode {
    let settings = match Settings::load(config.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sibling = dir.parent().map(|p| p.join("skills"));
    let skills = match sibling {
        Some(s) if s.is_dir() => s,
        _ => settings.skills_dir.clone(),
    };
    match AgentBook::load_checked(dir, &skills, &Catalog::builtin(), &settings.model) {
        Ok(book) => {
            println!("{}: {} agents, no problems", dir.display(), book.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            for problem in &e.0 {
                println!("{problem}");
            }
            println!("{}: {} problems", dir.display(), e.0.len());
            ExitCode::FAILURE
        }
    }
}

/// Runs the scripted model server (not a real model) until the process stops.
pub(super) fn scripted_model(args: &ScriptedModelArgs) -> ExitCode {
    if let Err(e) = crate::telemetry::init() {
        eprintln!("threadgate: {e}");
        return ExitCode::FAILURE;
    }
    let served = tokio::runtime::Runtime::new()
        .and_then(|rt| rt.block_on(crate::model::scripted::ScriptedModel::serve(args.listen)));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: scripted model server on {}: {e}", args.listen);
            ExitCode::FAILURE
        }
    }
}
