//! Runs the built `threadgate` binary's operator commands against a data directory set
//! in a TOML file, from a working directory elsewhere: where the master key lands, how
//! an OS error prints, `audit --verify` with its anchor, `sessions list`, and what the
//! server's log looks like in a file.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use threadgate::audit::{self, AuditEvent, AuditRecord};
use threadgate::secrets::Redactor;
use threadgate::session::{SessionRow, SessionState, store as sessions};
use threadgate::store::Db;

/// A working directory and a config file whose `data_dir` is elsewhere.
struct Setup {
    _dir: tempfile::TempDir,
    cwd: PathBuf,
    data: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(extra: &str) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let cwd = root.join("cwd");
        let data = root.join("state");
        std::fs::create_dir_all(&cwd).expect("cwd");
        std::fs::create_dir_all(&data).expect("data dir");
        let config = root.join("threadgate.toml");
        std::fs::write(
            &config,
            format!("data_dir = {:?}\n{extra}", data.display().to_string()),
        )
        .expect("config");
        Setup {
            _dir: dir,
            cwd,
            data,
            config,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_threadgate"));
        command
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .current_dir(&self.cwd)
            .env_remove("THREADGATE_MASTER_KEY")
            .env_remove("THREADGATE_DATA_DIR")
            .env_remove("THREADGATE_MASTER_KEY_FILE")
            .env_remove("THREADGATE_LOG_FORMAT")
            .env_remove("THREADGATE_DATABASE_URL")
            .env_remove("THREADGATE_STORE__URL")
            .env_remove("RUST_LOG");
        command
    }

    fn run(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run threadgate");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("wait")
    }

    fn db(&self) -> Db {
        Db::open(&self.data.join("threadgate.db")).expect("open db")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_master_key_lands_in_the_configured_data_dir() {
    let setup = Setup::new("");
    let out = setup.run(
        &["secrets", "set", "stripe_api_key"],
        "sk_test_cli_key_123456\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(setup.data.join("master.key").exists(), "key in data_dir");
    assert!(
        !setup.cwd.join("data").exists(),
        "nothing under the working directory"
    );
    let listed = setup.run(&["secrets", "list"], "");
    assert!(text(&listed.stdout).contains("stripe_api_key"));
}

#[test]
fn an_os_error_is_printed_once() {
    let setup = Setup::new("master_key_file = \"/nonexistent-dir-4d1f/master.key\"\n");
    let out = setup.run(&["secrets", "list"], "");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("/nonexistent-dir-4d1f/master.key"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

/// The binary reads the process's `THREADGATE_*` variables over the file, and a wrong
/// value names its key and source (the variable, or the file and line), not the value.
#[test]
fn the_environment_overrides_the_file_and_a_wrong_value_names_its_source() {
    let setup = Setup::new("[sessions]\nmax_live = 2\n");
    let other = setup.data.with_extension("from-env");
    let out = setup
        .command(&["secrets", "list"])
        .env("THREADGATE_DATA_DIR", &other)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(other.join("master.key").exists(), "the variable's data_dir");
    assert!(!setup.data.join("master.key").exists(), "not the file's");

    let out = setup
        .command(&["secrets", "list"])
        .env("THREADGATE_SESSIONS__MAX_LIVE", "fake_key_wrong_value")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("environment variable THREADGATE_SESSIONS__MAX_LIVE: sessions.max_live"),
        "{stderr}"
    );
    assert!(!stderr.contains("fake_key"), "{stderr}");

    let setup = Setup::new("[server]\nmax_connections = \"fake_key_in_file\"\n");
    let out = setup.run(&["secrets", "list"], "");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("threadgate.toml:3: server.max_connections: expected usize"),
        "{stderr}"
    );
    assert!(!stderr.contains("fake_key"), "{stderr}");
}

/// Runs one store call from these synchronous tests (the CLI they drive runs its own).
fn block_on<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(work)
}

fn append(db: &Db, n: usize) {
    block_on(db.write(move |c| {
        for i in 0..n {
            let record = AuditRecord {
                execution_id: Some(format!("ex-{i}")),
                ..AuditRecord::new(AuditEvent::Requested)
            };
            audit::append(c, &record, &Redactor::empty())?;
        }
        Ok(())
    }))
    .expect("append");
}

/// The `head: HASH:COUNT` line of `audit --verify`.
fn printed_head(out: &Output) -> String {
    let stdout = text(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .unwrap_or_else(|| panic!("no head line in {stdout}"))
        .to_owned()
}

#[test]
fn audit_verify_catches_deleted_newest_rows_by_the_anchor() {
    let setup = Setup::new("");
    let db = setup.db();
    append(&db, 5);
    let first = setup.run(&["audit", "--verify"], "");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let anchor = printed_head(&first);
    assert!(anchor.ends_with(":5"), "{anchor}");
    let file = setup.data.join("audit.anchor");
    assert_eq!(
        std::fs::read_to_string(&file).expect("anchor file").trim(),
        anchor
    );

    append(&db, 2);
    let grown = setup.run(&["audit", "--verify", "--anchor", &anchor], "");
    assert!(grown.status.success(), "{}", text(&grown.stderr));
    let grown_head = printed_head(&grown);
    assert!(grown_head.ends_with(":7"), "{grown_head}");

    // An attacker with the database file drops the triggers and the newest rows.
    block_on(db.write(|c| {
        c.execute_batch("DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE id > 3;")
    }))
    .expect("tamper");
    drop(db);

    let against_anchor = setup.run(
        &[
            "audit",
            "--verify",
            "--anchor",
            &anchor,
            "--anchor-file",
            &setup.data.join("elsewhere.anchor").display().to_string(),
        ],
        "",
    );
    assert!(!against_anchor.status.success());
    let stderr = text(&against_anchor.stderr);
    assert!(
        stderr.contains("fewer than the anchor's 5") && stderr.contains(&anchor),
        "{stderr}"
    );
    let against_file = setup.run(&["audit", "--verify"], "");
    assert!(!against_file.status.success());
    let stderr = text(&against_file.stderr);
    assert!(stderr.contains("fewer than the anchor's 7"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&file).expect("anchor file").trim(),
        grown_head,
        "the file still holds the last good head"
    );
    let bad = setup.run(&["audit", "--verify", "--anchor", "nonsense"], "");
    assert!(text(&bad.stderr).contains("HASH:COUNT"));
}

#[test]
fn sessions_list_shows_the_session_id_and_its_socket() {
    let setup = Setup::new("");
    let db = setup.db();
    let row = SessionRow {
        thread_id: threadgate::ids::ThreadId::parse("th_01HLIST").expect("id"),
        session_id: threadgate::ids::SessionId::parse("s0193abcdef01234").expect("id"),
        agent: "support".into(),
        state: SessionState::Running,
        container_id: Some("f00dfeedbeef1234".into()),
        branch: "threadgate/th_01HLIST".into(),
        worktree: None,
        customer_id: None,
        customer_email: None,
        created_at_ms: chrono::Utc::now().timestamp_millis(),
        updated_at_ms: 0,
        last_event_ms: 0,
        attempts: 0,
        last_error: None,
        stop_requested: false,
    };
    block_on(db.write(move |c| {
        let lease = threadgate::store::leases::acquire(c, &row.thread_id, "tg-cli", 1, 15_000)?
            .expect("a free lease");
        sessions::insert(c, &lease, &row)
    }))
    .expect("insert");
    let out = setup.run(&["sessions", "list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let socket = setup.data.join("sockets/s0193abcdef01234/api.sock");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("th_01HLIST"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("s0193abcdef01234"), "{line}");
    assert!(line.contains(&socket.display().to_string()), "{line}");
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|h| h.contains("session") && h.contains("socket"))
    );
}

/// Starts `threadgate serve` with stderr in a file, waits until the connectors are
/// logged (or the process ends), stops it, and returns the file's contents.
fn serve_log(setup: &Setup, format: Option<&str>) -> String {
    let log = setup.data.with_extension(format.unwrap_or("text"));
    let file = std::fs::File::create(&log).expect("log file");
    let mut command = setup.command(&["serve"]);
    command
        .env(
            "THREADGATE_PLAIN_SIGNING_SECRET",
            "whsec_cli_test_0123456789",
        )
        .env("THREADGATE_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    if let Some(format) = format {
        command.env("THREADGATE_LOG_FORMAT", format);
    }
    let mut child = command.spawn().expect("serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let done = logged.matches("connector configured").count() >= 3;
        if done || child.try_wait().expect("try_wait").is_some() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(&log).expect("read log")
}

fn repo_paths() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    format!(
        "policy_file = {:?}\nagents_dir = {:?}\nskills_dir = {:?}\n",
        root.join("policies/support.yaml").display().to_string(),
        root.join("agents").display().to_string(),
        root.join("skills").display().to_string(),
    )
}

#[test]
fn a_log_file_gets_no_colours_and_names_the_connectors_without_values() {
    let setup = Setup::new(&repo_paths());
    let key = "sk_test_never_in_logs_5e6f7a";
    let out = setup.run(&["secrets", "set", "stripe_api_key"], key);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let logged = serve_log(&setup, None);
    assert!(
        !logged.contains('\u{1b}'),
        "ANSI escapes in a file: {logged:?}"
    );
    for connector in ["stripe", "helpdesk", "github"] {
        assert!(
            logged
                .lines()
                .any(|l| l.contains("connector configured") && l.contains(connector)),
            "{connector} not logged: {logged}"
        );
    }
    assert!(
        logged.contains("plain_api_key"),
        "the missing secret is named: {logged}"
    );
    assert!(!logged.contains(key), "a value was logged");

    let json = serve_log(&setup, Some("json"));
    // Every log line is JSON; only the command's own last word (`error: ...`, when the
    // server cannot start here) is not a log line.
    let lines: Vec<serde_json::Value> = json
        .lines()
        .filter(|l| !l.starts_with("error: "))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["fields"]["connector"] == "stripe"),
        "{json}"
    );
    assert!(!json.contains('\u{1b}') && !json.contains(key));

    let out = setup
        .command(&["serve"])
        .env("THREADGATE_LOG_FORMAT", "yaml")
        .output()
        .expect("serve");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("THREADGATE_LOG_FORMAT"));
}

/// `threadgate migrate` applies the schema and exits: SQLite in the data directory by
/// default; `THREADGATE_DATABASE_URL` naming a database nothing answers for is an error
/// that names the address and never the password.
#[test]
fn migrate_applies_the_schema_and_names_an_unreachable_database_without_its_password() {
    let setup = Setup::new("");
    let out = setup.run(&["migrate"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("up to date"),
        "{}",
        text(&out.stdout)
    );
    assert!(setup.data.join("threadgate.db").exists());

    let out = setup
        .command(&["migrate"])
        .env(
            "THREADGATE_DATABASE_URL",
            "postgres://tg:fake_key_password@127.0.0.1:1/tg",
        )
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot reach the database at postgres://tg:***@127.0.0.1:1/tg"),
        "{stderr}"
    );
    assert!(!stderr.contains("fake_key_password"), "{stderr}");
}

/// On Postgres (`THREADGATE_TEST_DATABASE_URL`), `threadgate migrate` migrates a fresh
/// database and a second run finds nothing to do.
#[test]
fn migrate_on_postgres_is_idempotent() {
    let Some(db) = threadgate::store::testing::TestDb::postgres_from_env() else {
        eprintln!("migrate on postgres: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let setup = Setup::new("");
    for _ in 0..2 {
        let out = setup
            .command(&["migrate"])
            .env("THREADGATE_DATABASE_URL", db.url().expect("url"))
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("up to date"), "{stdout}");
        assert!(
            !stdout.contains(":threadgate@"),
            "the password is not printed: {stdout}"
        );
    }
}
