//! Databases for tests: a fresh SQLite file, or a fresh Postgres database on the server
//! `THREADGATE_TEST_DATABASE_URL` names (created with a random name, dropped after).

use std::path::PathBuf;

use super::{Db, StoreError};

/// The variable naming the Postgres server tests may create databases on.
pub const TEST_DATABASE_URL: &str = "THREADGATE_TEST_DATABASE_URL";

/// The Postgres server for tests, if one is set.
pub fn test_database_url() -> Option<String> {
    std::env::var(TEST_DATABASE_URL)
        .ok()
        .filter(|u| !u.is_empty())
}

/// A database made for one test; a Postgres one is dropped with it.
pub struct TestDb {
    url: Option<String>,
    admin_url: Option<String>,
    name: String,
    path: Option<PathBuf>,
}

impl TestDb {
    /// A SQLite database at `path` (the caller's temporary directory holds it).
    pub fn sqlite(path: PathBuf) -> TestDb {
        TestDb {
            url: None,
            admin_url: None,
            name: String::new(),
            path: Some(path),
        }
    }

    /// A fresh, empty Postgres database on the server at `admin_url` (a URL whose
    /// database the test user may connect to and whose user may create databases).
    pub fn postgres(admin_url: &str) -> Result<TestDb, String> {
        let name = format!("tg_test_{}", uuid::Uuid::new_v4().simple());
        let admin = admin_url.to_owned();
        let statement = format!("CREATE DATABASE {name}");
        run_admin(&admin, &statement)?;
        let url = with_database(admin_url, &name)?;
        Ok(TestDb {
            url: Some(url),
            admin_url: Some(admin),
            name,
            path: None,
        })
    }

    /// Postgres when `THREADGATE_TEST_DATABASE_URL` is set, else `None`.
    pub fn postgres_from_env() -> Option<TestDb> {
        let url = test_database_url()?;
        match TestDb::postgres(&url) {
            Ok(db) => Some(db),
            Err(e) => panic!("cannot create a test database: {e}"),
        }
    }

    /// The connection URL of a Postgres test database.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// Opens a new handle on the database (on Postgres, a new pool: another instance).
    pub fn open(&self) -> Result<Db, StoreError> {
        match (&self.url, &self.path) {
            (Some(url), _) => Db::connect(url),
            (None, Some(path)) => Db::open(path),
            (None, None) => Err(StoreError::Commit("no temporary directory".into())),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(admin) = &self.admin_url {
            let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            if let Err(e) = run_admin(admin, &statement) {
                eprintln!("cannot drop test database {}: {e}", self.name);
            }
        }
    }
}

/// Runs one statement on the admin URL's database, on a thread of its own (the sync
/// client must not run on an async worker).
fn run_admin(admin_url: &str, statement: &str) -> Result<(), String> {
    let admin_url = admin_url.to_owned();
    let statement = statement.to_owned();
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&admin_url, postgres::NoTls)
            .map_err(|e| format!("{}: {e}", super::pg::redact(&admin_url)))?;
        client.batch_execute(&statement).map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the admin thread panicked".to_owned())?
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> Result<String, String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base
        .find("://")
        .ok_or("the test database url is not a URL")?
        + 3;
    let path_start = base
        .get(scheme_end..)
        .and_then(|rest| rest.find('/'))
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", base.get(..path_start).unwrap_or(base));
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// The backends a store test runs on: SQLite (a file in `dir`) always, Postgres when
/// `THREADGATE_TEST_DATABASE_URL` is set (otherwise it says so on stderr).
pub fn each_backend(dir: &std::path::Path) -> Vec<TestDb> {
    let mut all = vec![TestDb::sqlite(dir.join("state.db"))];
    match TestDb::postgres_from_env() {
        Some(pg) => all.push(pg),
        None => eprintln!("{TEST_DATABASE_URL} is not set: Postgres skipped"),
    }
    all
}
