//! Operator subcommands: `serve`, `sessions`, `secrets`, `reviewers`, `audit`. Each
//! reads the same settings as the server (`threadgate.toml` and `THREADGATE_*`) and works
//! on the same database; `sessions stop` and `sessions pause` are picked up by a
//! running server within a second.

use crate::secrets::ExposeSecret as _;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::app::{self, Application, Overrides};
use crate::audit::{self, AuditEvent, AuditFilter};
use crate::config::Settings;
use crate::reviewers;
use crate::reviewers::hasher::Hasher;
use crate::secrets::SecretString;
use crate::session::store as sessions;
use crate::store::Db;

/// Where the settings come from.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// A TOML settings file (default: ./threadgate.toml when it exists).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

/// `threadgate sessions ...`
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List sessions: thread, state, container, branch, age.
    List,
    /// Stop a thread's session: container removed, work committed, worktree removed.
    Stop { thread: crate::ids::ThreadId },
    /// Stop starting new sessions (webhooks are still stored and acknowledged).
    Pause,
    /// Start sessions again, beginning with those that waited.
    Resume,
}

/// `threadgate secrets ...`
#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Store a secret; the value is read from standard input.
    Set { name: String },
    /// List secret names and their grants (never values).
    List,
    /// Let an agent's sessions have a secret.
    Grant { name: String, agent: String },
    /// Take a grant back.
    Revoke { name: String, agent: String },
    /// Delete a secret.
    Delete { name: String },
}

/// `threadgate reviewers ...`
#[derive(Debug, Subcommand)]
pub enum ReviewersCommand {
    /// Create a reviewer and print their API credential (shown once).
    Add {
        name: String,
        /// Also set their sign-in password for the review page, read from standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a reviewer's sign-in password for the review page (read from standard
    /// input, 12 to 1024 characters).
    Passwd { name: String },
    /// List reviewers.
    List,
    /// Remove a reviewer.
    Remove { name: String },
}

/// `threadgate audit`
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this thread.
    #[arg(long)]
    pub thread: Option<String>,
    /// Only this decision: run, hold or block.
    #[arg(long)]
    pub decision: Option<String>,
    /// Only this event (requested, decided, held, approved, ran, ...).
    #[arg(long)]
    pub event: Option<String>,
    /// Only this execution.
    #[arg(long)]
    pub execution: Option<String>,
    /// The newest N rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Check the hash chain instead of printing; prints the head (HASH:COUNT) to keep,
    /// checks the anchor file and advances it. On Postgres, rows a crash left waiting
    /// to be chained are chained first.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: an anchor printed earlier (HASH:COUNT) the chain must still extend.
    #[arg(long, value_name = "HASH:COUNT", requires = "verify")]
    pub anchor: Option<String>,
    /// With --verify: the anchor file to check and advance (default: the setting
    /// `audit_anchor_file`, else audit.anchor in the data directory).
    #[arg(long, value_name = "PATH", requires = "verify")]
    pub anchor_file: Option<PathBuf>,
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes joined with `: `, leaving out a cause whose text the message
/// already holds (many errors print their source in their own message too).
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Runs a command's work on a runtime of its own: the store is async, and a command
/// uses it the one way the server does.
fn block_on(work: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(work)
}

fn open(config: &ConfigArgs) -> anyhow::Result<(Settings, Db)> {
    let settings = Settings::load(config.config.as_deref())?;
    let db = app::open_db(&settings)?;
    Ok((settings, db))
}

/// `threadgate migrate`: applies pending migrations (opening the store does) and says
/// where.
pub(super) fn migrate(config: &ConfigArgs) -> ExitCode {
    finish((|| {
        let settings = Settings::load(config.config.as_deref())?;
        let db = app::open_db(&settings)?;
        println!("the database at {} is up to date", db.location());
        Ok(())
    })())
}

/// `threadgate serve`: runs until SIGINT or SIGTERM.
pub(super) fn serve(config: &ConfigArgs) -> ExitCode {
    finish((|| {
        let settings = Settings::load(config.config.as_deref())?;
        let endpoint = settings.telemetry.otlp_endpoint.clone();
        let _export =
            crate::telemetry::init_serving(endpoint.as_deref()).map_err(anyhow::Error::msg)?;
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async move {
            let app = Application::build(settings, Overrides::default()).await?;
            app.run_until(shutdown_signal()).await
        })
    })())
}

pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// The `sessions list` table: thread, session id, state, container, age, branch, and
/// the session's socket (where its agent reaches the gateway).
fn sessions_table(settings: &Settings, rows: &[sessions::SessionRow], now_ms: i64) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<32} {:<16} {:<9} {:<12} {:<10} {:<44} socket\n",
        "thread", "session", "state", "container", "age", "branch"
    );
    for r in rows {
        let container = r
            .container_id
            .as_deref()
            .map_or("-", |c| &c[..c.len().min(12)]);
        let age = humantime::format_duration(std::time::Duration::from_secs(
            ((now_ms - r.created_at_ms).max(0) / 1000) as u64,
        ));
        let socket = settings
            .sockets_dir()
            .join(&r.session_id)
            .join(crate::gateway::SOCKET_NAME);
        let _ = writeln!(
            out,
            "{:<32} {:<16} {:<9} {:<12} {:<10} {:<44} {}",
            r.thread_id,
            r.session_id,
            r.state.as_str(),
            container,
            age.to_string(),
            r.branch,
            socket.display()
        );
    }
    out
}

/// `threadgate sessions ...`
pub(super) fn sessions(config: &ConfigArgs, cmd: &SessionsCommand) -> ExitCode {
    finish(block_on(async {
        let (settings, db) = open(config)?;
        match cmd {
            SessionsCommand::List => {
                let rows = db.read(sessions::list).await?;
                let now = chrono::Utc::now().timestamp_millis();
                print!("{}", sessions_table(&settings, &rows, now));
                Ok(())
            }
            SessionsCommand::Stop { thread } => {
                let t = thread.clone();
                let asked = db.write(move |c| sessions::request_stop(c, &t)).await?;
                anyhow::ensure!(asked, "no live session for thread {thread}");
                println!("asked the server to stop the session of thread {thread}");
                Ok(())
            }
            SessionsCommand::Pause => {
                db.write(|c| sessions::set_paused(c, true)).await?;
                println!(
                    "paused: no new sessions start; webhooks are still stored and acknowledged"
                );
                Ok(())
            }
            SessionsCommand::Resume => {
                db.write(|c| sessions::set_paused(c, false)).await?;
                println!("resumed: waiting sessions start as slots free");
                Ok(())
            }
        }
    }))
}

/// `threadgate secrets ...`
pub(super) fn secrets(config: &ConfigArgs, cmd: &SecretsCommand) -> ExitCode {
    finish(block_on(async {
        let (settings, db) = open(config)?;
        let store = app::open_secrets(&db, &settings)?;
        match cmd {
            SecretsCommand::Set { name } => {
                let mut value = String::new();
                std::io::stdin()
                    .read_to_string(&mut value)
                    .context("cannot read the secret from standard input")?;
                let value = value.trim_end_matches(['\n', '\r']).to_owned();
                anyhow::ensure!(!value.is_empty(), "the value on standard input is empty");
                store.set(name, SecretString::from(value)).await?;
                println!("stored secret {name}");
            }
            SecretsCommand::List => {
                for meta in store.list().await? {
                    let grants = if meta.grants.is_empty() {
                        "-".to_owned()
                    } else {
                        meta.grants.join(",")
                    };
                    println!(
                        "{:<32} updated {}  granted to {grants}",
                        meta.name,
                        meta.updated_at.format("%Y-%m-%d %H:%M:%S")
                    );
                }
            }
            SecretsCommand::Grant { name, agent } => {
                store.grant(name, agent).await?;
                println!("granted {name} to agent {agent}");
            }
            SecretsCommand::Revoke { name, agent } => {
                store.revoke(name, agent).await?;
                println!("revoked {name} from agent {agent}");
            }
            SecretsCommand::Delete { name } => {
                store.delete(name).await?;
                println!("deleted secret {name}");
            }
        }
        Ok(())
    }))
}

/// `threadgate reviewers ...`
pub(super) fn reviewers(config: &ConfigArgs, cmd: &ReviewersCommand) -> ExitCode {
    finish(block_on(async {
        let (_, db) = open(config)?;
        // One password at a time: the command sets at most one.
        let hasher = Hasher::new(1, 1);
        match cmd {
            ReviewersCommand::Add {
                name,
                password_stdin,
            } => {
                let password = password_stdin.then(read_password).transpose()?;
                let created = reviewers::add(&db, name).await?;
                if let Some(pw) = password {
                    reviewers::set_password(&db, &hasher, name, pw).await?;
                    println!("reviewer {name} can sign in to the review page with that password.");
                }
                println!(
                    "reviewer {name} added. Their API credential (shown once; send it as `Authorization: Bearer ...`):"
                );
                println!("{}", created.token.expose_secret());
            }
            ReviewersCommand::Passwd { name } => {
                let pw = read_password()?;
                reviewers::set_password(&db, &hasher, name, pw).await?;
                println!("password of reviewer {name} set");
            }
            ReviewersCommand::List => {
                for r in reviewers::list(&db).await? {
                    println!(
                        "{:<32} added {}",
                        r.name,
                        r.created_at.format("%Y-%m-%d %H:%M:%S")
                    );
                }
            }
            ReviewersCommand::Remove { name } => {
                reviewers::remove(&db, name).await?;
                println!("removed reviewer {name}");
            }
        }
        Ok(())
    }))
}

/// `threadgate audit --verify`: the whole chain, then the anchor given and the anchor
/// file; only when all hold is the file advanced to the current head.
async fn verify_audit(settings: &Settings, db: &Db, args: &AuditArgs) -> anyhow::Result<()> {
    let given: Option<audit::Anchor> = args.anchor.as_deref().map(str::parse).transpose()?;
    let file = args
        .anchor_file
        .clone()
        .unwrap_or_else(|| settings.audit_anchor_path());
    let waiting = audit::chain_waiting(db)
        .await
        .context("chaining the audit rows waiting to be chained")?;
    if waiting > 0 {
        eprintln!("{waiting} audit rows are still waiting to be chained; not checked");
    }
    let anchor_file = file.clone();
    let checked = db
        .read(move |c| {
            Ok((|| -> anyhow::Result<(usize, audit::Anchor)> {
                let rows = audit::verify(c)?;
                if let Some(anchor) = &given {
                    audit::anchor::extends(c, anchor)?;
                }
                let head = audit::anchor::checked_head(c, &file)
                    .with_context(|| format!("checking anchor file {}", file.display()))?;
                Ok((rows, head))
            })())
        })
        .await?;
    let (rows, head) = checked?;
    let head = audit::anchor::advance(db, &anchor_file, head)
        .await
        .with_context(|| format!("advancing anchor file {}", anchor_file.display()))?;
    println!("audit chain intact: {rows} rows");
    println!("head: {head}");
    println!("keep it; later: threadgate audit --verify --anchor {head}");
    Ok(())
}

/// A password from standard input: its first line, without the line ending.
fn read_password() -> anyhow::Result<SecretString> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the password from standard input")?;
    Ok(SecretString::from(
        line.trim_end_matches(['\r', '\n']).to_owned(),
    ))
}

/// `threadgate audit ...`
pub(super) fn audit(config: &ConfigArgs, args: &AuditArgs) -> ExitCode {
    finish(block_on(async {
        let (settings, db) = open(config)?;
        if args.verify {
            return verify_audit(&settings, &db, args).await;
        }
        let event = match &args.event {
            Some(name) => Some(
                name.parse::<AuditEvent>()
                    .ok()
                    .with_context(|| format!("unknown audit event {name:?}"))?,
            ),
            None => None,
        };
        let filter = AuditFilter {
            thread_id: args.thread.clone(),
            execution_id: args.execution.clone(),
            session_id: None,
            decision: args.decision.clone(),
            event,
            limit: args.limit,
        };
        let rows = db.read(move |c| audit::query(c, &filter)).await?;
        print!("{}", audit::format_table(&rows));
        Ok(())
    }))
}
