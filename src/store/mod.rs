//! Durable state: one SQLite database in the data directory.
//!
//! Every write goes through a single writer thread that batches concurrent writes into
//! one transaction and one fsync (group commit): a caller's `write` future resolves only
//! after its transaction is on disk (`synchronous=FULL`, WAL). Reads use a small pool of
//! separate connections, which WAL lets run beside the writer. WAL checkpoints run on
//! their own thread (`checkpoint`), never inside a caller's commit.
//!
//! Domain modules own their SQL and run it through [`Db::write`] and [`Db::read`];
//! the schema lives in `migrations/`, applied in order at open. To move to Postgres for
//! several instances, this module and the domain queries are what changes; the
//! orchestrator only sees domain functions.

mod checkpoint;
pub mod instances;
pub mod leases;
pub mod meta;
mod migrations;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

pub use rusqlite;

/// The most writes folded into one transaction.
const MAX_BATCH: usize = 512;
/// Read connections kept open beside the writer.
const READERS: usize = 4;

/// Errors from the state store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database migration {name} failed: {source}")]
    Migration {
        name: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    /// The database's schema is of a later threadgate than this one.
    #[error(
        "the database's schema is version {found}, newer than this threadgate knows ({known}): \
         run the threadgate that wrote it, or restore a backup taken before the upgrade"
    )]
    SchemaNewer {
        /// The version found (`PRAGMA user_version`).
        found: i64,
        /// The newest version this binary has.
        known: usize,
    },
    #[error("cannot restrict the permissions of {path}: {source}")]
    Permissions {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("database commit failed: {0}")]
    Commit(String),
    #[error("the database writer has stopped")]
    WriterGone,
}

/// Makes the database file (created empty if missing) and any `-wal`/`-shm` beside it
/// readable by this user only: they hold customers' messages. SQLite creates its WAL
/// and shared-memory files with the database file's mode.
fn restrict_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

type Finish = Box<dyn FnOnce(Result<(), String>) + Send>;
type Job = Box<dyn FnOnce(&Connection) -> (bool, Finish) + Send>;

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    readers: Mutex<Vec<Connection>>,
    /// The writer thread, joined when the last handle goes.
    writer: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    /// Closes the writer's queue and waits for the writer thread: the writes queued
    /// before commit, then it stops its checkpoint thread and ends.
    fn drop(&mut self) {
        drop(lock(&self.jobs).take());
        let Some(writer) = lock(&self.writer).take() else {
            return;
        };
        // The last handle may go inside a job, on the writer thread itself.
        if writer.thread().id() != thread::current().id() && writer.join().is_err() {
            tracing::error!("the database writer thread panicked");
        }
    }
}

impl Db {
    /// Opens (creating if needed) the database at `path`, applies pending migrations and
    /// starts the writer thread.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        restrict_files(path).map_err(|source| StoreError::Permissions {
            path: path.to_owned(),
            source,
        })?;
        let mut writer = Connection::open(path).map_err(open_err)?;
        configure(&writer).map_err(open_err)?;
        migrations::apply(&mut writer)?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            readers.push(open_reader(path).map_err(open_err)?);
        }
        writer
            .pragma_update(
                None,
                "wal_autocheckpoint",
                checkpoint::WRITER_BACKSTOP_PAGES,
            )
            .map_err(open_err)?;
        let checkpointer = checkpoint::Checkpointer::start(path).map_err(StoreError::Commit)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let writer = thread::Builder::new()
            .name("threadgate-db-writer".into())
            .spawn(move || writer_loop(writer, rx, checkpointer))
            .map_err(|e| StoreError::Commit(format!("cannot start the writer thread: {e}")))?;
        Ok(Db {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                jobs: Mutex::new(Some(tx)),
                readers: Mutex::new(readers),
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` inside a write transaction and resolves once that transaction is
    /// durably committed. `f` runs inside its own savepoint: if it returns an error,
    /// its changes are rolled back and the batch it shares goes on.
    pub async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let rx = self.submit(f)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` on a read connection (a consistent snapshot) on the blocking pool.
    pub async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let db = self.clone();
        crate::tasks::Tasks::spawn_blocking(move || db.read_inline(f))
            .await
            .map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` on a read connection on the calling thread, without the trip to the
    /// blocking pool that [`Db::read`] takes: only for a few indexed lookups on a hot
    /// path (the gate's read decision, the secrets' generation), where the trip costs
    /// more than the read.
    pub fn read_inline<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<R>,
    {
        let conn = self.take_reader()?;
        let result = f(&conn).map_err(StoreError::from);
        self.return_reader(conn);
        result
    }

    fn take_reader(&self) -> Result<Connection, StoreError> {
        let pooled = lock(&self.inner.readers).pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => open_reader(&self.inner.path).map_err(|source| StoreError::Open {
                path: self.inner.path.clone(),
                source,
            }),
        }
    }

    fn return_reader(&self, conn: Connection) {
        let mut readers = lock(&self.inner.readers);
        if readers.len() < READERS {
            readers.push(conn);
        }
    }

    fn submit<R, F>(&self, f: F) -> Result<oneshot::Receiver<Result<R, StoreError>>, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let outcome = f(conn);
            let ok = outcome.is_ok();
            let finish: Finish = Box::new(move |committed| {
                let result = match (outcome, committed) {
                    (Ok(value), Ok(())) => Ok(value),
                    (Ok(_), Err(message)) => Err(StoreError::Commit(message)),
                    (Err(e), _) => Err(StoreError::Sql(e)),
                };
                // The caller may have gone away; its result is then not needed.
                let _ = reply.send(result);
            });
            (ok, finish)
        });
        let jobs = lock(&self.inner.jobs);
        let sender = jobs.as_ref().ok_or(StoreError::WriterGone)?;
        sender.send(job).map_err(|_| StoreError::WriterGone)?;
        Ok(rx)
    }
}

/// Locks a mutex, recovering the data if a holder panicked: the pools hold no invariant
/// that a panic could break.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Statements each connection keeps parsed (the gate's hot path uses about a dozen).
const STATEMENT_CACHE: usize = 64;

/// [`Connection::execute`] through the connection's statement cache: a statement on the
/// call path is parsed once per connection, not at every call.
pub fn cached_execute<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// [`Connection::query_row`] through the connection's statement cache.
pub fn cached_query_row<T, P, F>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: F,
) -> rusqlite::Result<T>
where
    P: rusqlite::Params,
    F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
{
    conn.prepare_cached(sql)?.query_row(params, f)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

/// Takes every job waiting, runs them in one transaction, each in a savepoint, commits
/// once, then answers each caller. Checkpoints are left to `checkpointer`.
fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Job>,
    checkpointer: checkpoint::Checkpointer,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (began, jobs_in_batch) = (std::time::Instant::now(), batch.len());
        let mut finishers = Vec::with_capacity(batch.len());
        // INVARIANT: a job runs only inside its own savepoint of an open transaction, so
        // a failing job never leaves partial changes in the batch. A job that cannot be
        // run is dropped, which its caller sees as `WriterGone`.
        if cached_execute(&conn, "BEGIN IMMEDIATE", []).is_err() {
            continue;
        }
        for job in batch {
            if cached_execute(&conn, "SAVEPOINT job", []).is_err() {
                continue;
            }
            let (ok, finish) = job(&conn);
            let _ = if ok {
                cached_execute(&conn, "RELEASE job", []).map(drop)
            } else {
                conn.execute_batch("ROLLBACK TO job; RELEASE job")
            };
            finishers.push(finish);
        }
        let committed = cached_execute(&conn, "COMMIT", []).map(drop).map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            e.to_string()
        });
        crate::metrics::db_commit(jobs_in_batch, began.elapsed(), committed.is_ok());
        if committed.is_ok() {
            checkpointer.committed(jobs_in_batch);
        }
        for finish in finishers {
            finish(committed.clone());
        }
    }
}

/// Reads column `idx` as the name of a `T` (an enum stored by its name, parsed with its
/// `FromStr`). Unknown text is an error naming the type and the text, never a default
/// state.
pub fn named<T: std::str::FromStr>(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    text.parse().map_err(|_| {
        let name = std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("value");
        rusqlite::Error::FromSqlConversionFailure(
            idx,
            rusqlite::types::Type::Text,
            format!("unknown {name} {text:?} in the database").into(),
        )
    })
}

#[cfg(test)]
mod tests;
