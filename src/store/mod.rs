//! Durable state: one SQLite database in the data directory, or one Postgres database
//! shared by several instances (`[store] url`).
//!
//! Every write goes through a single writer thread that batches concurrent writes into
//! one transaction and one fsync (group commit): a caller's `write` future resolves only
//! after its transaction is on disk (`synchronous=FULL`, WAL). Reads use a small pool of
//! separate connections, which WAL lets run beside the writer. WAL checkpoints run on
//! their own thread (`checkpoint`), never inside a caller's commit.
//!
//! On Postgres (`pg`) a write is one SERIALIZABLE transaction of its own, run again
//! when it loses a race with another instance, and a read is a READ ONLY REPEATABLE READ
//! snapshot; both on the blocking pool, over a small bounded pool of connections. A
//! write of one statement ([`Db::write_single`], the webhook intake's insert) sends no
//! `BEGIN`/`COMMIT`: the statement is its own transaction, one round trip.
//!
//! Domain modules own their SQL and run it through [`Db::write`] and [`Db::read`] on a
//! [`Conn`] (`sql`), the one API over both backends; the schema lives in `migrations/`
//! (and `migrations/postgres/`), applied in order at open.

mod checkpoint;
pub mod counts;
pub mod instances;
pub mod leases;
pub mod meta;
mod migrations;
mod pg;
mod pg_background;
mod pg_tls;
mod pg_value;
mod sql;
pub mod testing;
mod value;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

pub use pg::redact;
pub use rusqlite;
pub(crate) use sql::params;
pub use sql::{
    Conn, Dialect, FromSql, OptionalExtension, Params, Result, Row, RowIndex, Rows, SqlError,
    Statement, ToSql, Value,
};

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
        source: SqlError,
    },
    /// `[store] url` is not a connection string.
    #[error("invalid database url {url}: {reason}")]
    BadUrl { url: String, reason: String },
    /// TLS to the database failed as the URL's `sslmode`/`sslrootcert` asked (a
    /// certificate refused, a server without TLS).
    #[error("cannot connect to the database at {url} over TLS: {reason}")]
    TlsRefused { url: String, reason: String },
    /// Nothing answered at the database's address.
    #[error("cannot reach the database at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server refused the user name or password.
    #[error(
        "the database at {url} refused the credentials of user {user:?} (wrong user name or password)"
    )]
    Credentials { url: String, user: String },
    /// The server answered but cannot be used (no such database, no permission, …).
    #[error("cannot use the database at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("no database connection came free in time (all {size} in use)")]
    PoolExhausted { size: usize },
    /// A write kept losing races with other instances' writes.
    #[error("a database write lost {attempts} races with other writes in a row")]
    Contention { attempts: u32 },
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
    Sql(#[from] SqlError),
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
/// A write queued for the SQLite writer: its work, and whether its commit must wait for
/// the log's fsync (every write but [`Db::write_unflushed`]'s).
struct Job {
    run: JobWork,
    flush: bool,
}

/// A job's work on the writer's connection: whether it succeeded, and what to tell its
/// caller once the batch has committed (or not).
type JobWork = Box<dyn FnOnce(&Connection) -> (bool, Finish) + Send>;

/// Postgres connections one instance's callers keep open at most, unless `[store]
/// pool_size` says otherwise (the store's background thread has one more of its own).
pub const DEFAULT_POOL_SIZE: usize = 16;

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    inner: Arc<Backend>,
}

/// How a write runs on Postgres.
#[derive(Clone, Copy)]
enum Mode {
    /// A SERIALIZABLE transaction: `BEGIN`, the statements, `COMMIT`.
    Transaction,
    /// One statement, a transaction of its own.
    Single,
    /// A READ COMMITTED transaction whose closure locks what it reads.
    Locking,
    /// One statement, a transaction of its own whose commit does not wait for the
    /// log's flush.
    Unflushed,
}

enum Backend {
    Sqlite(Inner),
    Postgres(Box<pg::PgStore>),
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
    /// Opens (creating if needed) the SQLite database at `path`, applies pending
    /// migrations and starts the writer thread.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        Ok(Db {
            inner: Arc::new(Backend::Sqlite(Inner::open(path)?)),
        })
    }

    /// Connects to the Postgres database at `url`, checks it and applies pending
    /// migrations (under an advisory lock). Errors name what is wrong and never the
    /// password.
    pub fn connect(url: &str) -> Result<Db, StoreError> {
        Db::connect_pooled(url, DEFAULT_POOL_SIZE)
    }

    /// As [`Db::connect`], keeping at most `pool_size` connections open (`[store]
    /// pool_size`).
    pub fn connect_pooled(url: &str, pool_size: usize) -> Result<Db, StoreError> {
        let store = off_runtime(|| pg::PgStore::connect(url, pool_size))?;
        Ok(Db {
            inner: Arc::new(Backend::Postgres(Box::new(store))),
        })
    }

    /// Postgres at `url` when one is given, else SQLite at `path`.
    pub fn open_configured(
        url: Option<&str>,
        pool_size: usize,
        path: &Path,
    ) -> Result<Db, StoreError> {
        match url {
            Some(url) => Db::connect_pooled(url, pool_size),
            None => Db::open(path),
        }
    }

    /// The SQLite database file (`None` on Postgres).
    pub fn path(&self) -> Option<&Path> {
        match &*self.inner {
            Backend::Sqlite(inner) => Some(&inner.path),
            Backend::Postgres(_) => None,
        }
    }

    /// Where the data is, for messages: the file, or the URL without its password.
    pub fn location(&self) -> String {
        match &*self.inner {
            Backend::Sqlite(inner) => inner.path.display().to_string(),
            Backend::Postgres(pg) => pg.shown().to_owned(),
        }
    }

    /// The SQL dialect of the backend.
    pub fn dialect(&self) -> Dialect {
        match &*self.inner {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Resolves once every step this handle's writes queued to run in the background
    /// after their commit has run (on Postgres, the audit chain's steps: the rows of the
    /// writes resolved so far are then chained, `audit::append_all`); at once on SQLite,
    /// which queues none.
    pub async fn background_settled(&self) {
        if let Backend::Postgres(pg) = &*self.inner {
            pg.background_settled().await;
        }
    }

    /// Batches of background steps this handle has run (0 on SQLite): under load one
    /// runs the steps of many writes.
    pub fn background_batches(&self) -> u64 {
        match &*self.inner {
            Backend::Postgres(pg) => pg.background_batches(),
            Backend::Sqlite(_) => 0,
        }
    }

    /// Runs `f` inside a write transaction and resolves once that transaction is
    /// durably committed. On SQLite `f` runs inside its own savepoint of a group
    /// commit: if it returns an error, its changes are rolled back and the batch it
    /// shares goes on. On Postgres it is a SERIALIZABLE transaction of its own, and `f`
    /// runs again when the transaction loses a race with another writer: `f` must be
    /// safe to run more than once (it is `Fn`).
    pub async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        self.write_now(f, Mode::Transaction).await
    }

    /// A write of one statement, resolved once it is durably committed, with the same
    /// guarantees as [`Db::write`] in fewer round trips. On SQLite it is exactly
    /// [`Db::write`] (a savepoint of a group commit). On Postgres no `BEGIN`/`COMMIT`
    /// is sent: the statement is a transaction of its own (autocommit, the server's
    /// default isolation), committed before the server answers, so the write costs one
    /// round trip (its statement is prepared once per connection). `f` must send one
    /// statement: a second is refused before it is sent ([`SqlError::SecondStatement`]),
    /// so the write is still all or nothing. Meant for an insert-or-nothing (`INSERT …
    /// ON CONFLICT DO NOTHING`) or a conditional `UPDATE`, which need no snapshot of
    /// their own: the uniqueness check and the `WHERE` on the changed row see the latest
    /// committed rows (a condition on another table's row reads the statement's snapshot
    /// unless it locks that row: `leases::fence_clause_shared`).
    /// Run again on 40001/40P01 as [`Db::write`].
    pub async fn write_single<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        self.write_now(f, Mode::Single).await
    }

    /// A write whose closure takes a lock on every row or name its decision rests on
    /// before it reads it: [`leases::fence_exclusive`] for a thread's own rows,
    /// [`Conn::lock_name`] for a name shared across threads (a limit's key). On SQLite
    /// it is exactly [`Db::write`] (the single writer serialises everything). On
    /// Postgres it is a READ COMMITTED transaction, which a concurrent writer never makes
    /// fail at commit: where SERIALIZABLE would roll back (and run again) every
    /// transaction whose reads touched an index page another one wrote, two such writes
    /// wait for each other only when they take the same lock. Meant for the gate's hot
    /// path; what it reads without a lock must be safe to read stale (a compare-and-set
    /// `UPDATE … WHERE status = …` re-checks its row; an insert's unique key is checked
    /// against the latest rows). Run again on 40P01 (deadlock) as [`Db::write`].
    pub async fn write_locking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        self.write_now(f, Mode::Locking).await
    }

    /// A write of one statement (as [`Db::write_single`]) whose commit does not wait
    /// for the log to reach the disk: its rows are visible once it resolves, and they
    /// survive this process dying (the log is written, not synced); only a crash of the
    /// machine (SQLite) or of the database server (Postgres) can lose them, until the
    /// next synchronous commit or checkpoint syncs the log past them (it is one
    /// sequence). On SQLite its savepoint joins a group commit that skips its fsync when
    /// no write in it needs one (`synchronous=NORMAL` for that commit); on Postgres the
    /// statement turns `synchronous_commit` off for its own transaction when it can
    /// ([`Conn::skips_flush`], `audit::append_after`), else it commits as
    /// [`Db::write_single`]. Only for a write whose loss in such a crash breaks nothing
    /// anyone was told: a call's outcome whose decision is already durable and which
    /// recovery may send again, a read's or a write's with an idempotency key.
    pub async fn write_unflushed<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        self.write_now(f, Mode::Unflushed).await
    }

    /// Makes every write committed so far durable, [`Db::write_unflushed`]'s included.
    /// On SQLite one synchronous commit of a small write (the time, under `meta`'s
    /// [`meta::LOG_SYNCED_AT`]): its fsync syncs the log past every frame before it. On
    /// Postgres nothing: `audit::anchor::head`, the one caller, waits for the WAL's flush
    /// past what its snapshot sees.
    pub async fn sync_log(&self) -> Result<(), StoreError> {
        if let Backend::Postgres(_) = &*self.inner {
            return Ok(());
        }
        let now = crate::clock::Clock::system().now_ms().to_string();
        self.write(move |c| meta::set(c, meta::LOG_SYNCED_AT, &now))
            .await
    }

    /// Every write's way in, timed by the `db.write` span (`benches/gateway_call.rs`;
    /// trace level, off in production).
    async fn write_now<R, F>(&self, f: F, mode: Mode) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        use tracing::Instrument as _;
        self.write_in(f, mode)
            .instrument(tracing::trace_span!("db.write"))
            .await
    }

    async fn write_in<R, F>(&self, f: F, mode: Mode) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        // The caller's counter (when counting) follows the work to the writer's reply
        // or the blocking pool's thread.
        let counter = counts::current();
        match &*self.inner {
            Backend::Sqlite(inner) => {
                let flush = !matches!(mode, Mode::Unflushed);
                let rx = inner.submit(f, flush)?;
                let written = rx.await.map_err(|_| StoreError::WriterGone)?;
                if let (Some(counter), Ok(_)) = (&counter, &written) {
                    counts::bump_on(counter, counts::Event::commit(flush));
                }
                written
            }
            Backend::Postgres(_) => {
                let db = self.clone();
                crate::tasks::Tasks::spawn_blocking(move || {
                    counts::on_thread(counter, || match (&*db.inner, mode) {
                        (Backend::Postgres(pg), Mode::Transaction) => pg.write(&f),
                        (Backend::Postgres(pg), Mode::Single) => pg.write_single(&f, true),
                        (Backend::Postgres(pg), Mode::Unflushed) => pg.write_single(&f, false),
                        (Backend::Postgres(pg), Mode::Locking) => pg.write_locking(&f),
                        (Backend::Sqlite(_), _) => Err(StoreError::WriterGone),
                    })
                })
                .await
                .map_err(|_| StoreError::WriterGone)?
            }
        }
    }

    /// Runs `f` on a read connection (a consistent snapshot) on the blocking pool.
    pub async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        let db = self.clone();
        let counter = counts::current();
        crate::tasks::Tasks::spawn_blocking(move || {
            counts::on_thread(counter, || db.read_blocking(f))
        })
        .await
        .map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` on a read connection without the trip to the blocking pool that
    /// [`Db::read`] takes: only for a few indexed lookups on a hot path (the gate's read
    /// decision, the secrets' generation), where the trip costs more than the read. On
    /// SQLite it runs on the calling thread; on Postgres, whose client must not block an
    /// async worker, it runs in `block_in_place` (or on a thread of its own when the
    /// runtime has a single thread).
    pub fn read_inline<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send,
        F: FnOnce(&Conn<'_>) -> sql::Result<R> + Send,
    {
        match &*self.inner {
            Backend::Sqlite(inner) => inner.read(f),
            Backend::Postgres(pg) => {
                let counter = counts::current();
                off_runtime(|| counts::on_thread(counter, || pg.read(f)))
            }
        }
    }

    /// The rows of one read-only statement through `f`, with no transaction around it (a
    /// single statement is its own consistent snapshot), on the calling thread as
    /// [`Db::read_inline`]. On Postgres that is one round trip where a read transaction
    /// takes three (`BEGIN`, the statement, `COMMIT`): for the one look-up every gated
    /// call makes first (`gateway::fresh`).
    pub fn query_inline<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<Vec<T>, StoreError>
    where
        T: Send,
        P: Params + Send,
        F: Fn(&Row<'_>) -> sql::Result<T> + Send,
    {
        match &*self.inner {
            Backend::Sqlite(inner) => {
                inner.read(|c| c.prepare_cached(sql)?.query_map(params, f)?.collect())
            }
            Backend::Postgres(pg) => {
                let counter = counts::current();
                off_runtime(move || {
                    counts::on_thread(counter, || pg.query_autocommit(sql, &params, &f))
                })
            }
        }
    }

    /// Runs `f` on a read connection on this thread, which must not be an async worker.
    fn read_blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Conn<'_>) -> sql::Result<R>,
    {
        match &*self.inner {
            Backend::Sqlite(inner) => inner.read(f),
            Backend::Postgres(pg) => pg.read(f),
        }
    }
}

/// Runs blocking work from wherever the caller is: in `block_in_place` on a
/// multi-threaded runtime's worker, on a scoped thread of its own on a single-threaded
/// runtime (whose only worker it then holds for the work's time), else right here.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| match s.spawn(f).join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
        Err(_) => f(),
    }
}

impl Inner {
    fn open(path: &Path) -> Result<Inner, StoreError> {
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
        Ok(Inner {
            path: path.to_owned(),
            jobs: Mutex::new(Some(tx)),
            readers: Mutex::new(readers),
            writer: Mutex::new(Some(writer)),
        })
    }

    fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Conn<'_>) -> sql::Result<R>,
    {
        let conn = self.take_reader()?;
        counts::bump(counts::Event::Read);
        let result = f(&Conn::sqlite(&conn)).map_err(StoreError::from);
        self.return_reader(conn);
        result
    }

    fn take_reader(&self) -> Result<Connection, StoreError> {
        let pooled = lock(&self.readers).pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => open_reader(&self.path).map_err(|source| StoreError::Open {
                path: self.path.clone(),
                source,
            }),
        }
    }

    fn return_reader(&self, conn: Connection) {
        let mut readers = lock(&self.readers);
        if readers.len() < READERS {
            readers.push(conn);
        }
    }

    fn submit<R, F>(
        &self,
        f: F,
        flush: bool,
    ) -> Result<oneshot::Receiver<Result<R, StoreError>>, StoreError>
    where
        R: Send + 'static,
        F: Fn(&Conn<'_>) -> sql::Result<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        // The caller's counter (when counting) counts the job's statements.
        let counter = counts::current();
        let run = Box::new(move |conn: &Connection| {
            let outcome = counts::on_thread(counter, || f(&Conn::sqlite(conn)));
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
        let job = Job { run, flush };
        let jobs = lock(&self.jobs);
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

/// [`Conn::execute`] through the connection's statement cache: a statement on the
/// call path is parsed once per connection, not at every call.
pub fn cached_execute<P: Params>(conn: &Conn<'_>, sql: &str, params: P) -> sql::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// [`Conn::query_row`] through the connection's statement cache.
pub fn cached_query_row<T, P, F>(conn: &Conn<'_>, sql: &str, params: P, f: F) -> sql::Result<T>
where
    P: Params,
    F: FnOnce(&Row<'_>) -> sql::Result<T>,
{
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// A statement of the SQLite writer itself, through its statement cache.
fn writer_execute(conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute([])
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    stable_plans(conn)?;
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
    stable_plans(&conn)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

/// Turns on SQLite's query planner stability guarantee: a statement's plan never
/// depends on the values bound to it. Without it SQLite marks a parameter compared by
/// equality in a statement with an `ORDER BY` (the session's earlier calls, the outbox,
/// the events feed...) as one whose value may change the plan, and a statement with
/// such a parameter expires when the parameter is bound again. The statement cache
/// clears a statement's bindings as it takes it back, so such a statement was parsed
/// and planned again at every use (about 0.1 ms of the writer's time per gated write
/// for `earlier_calls` alone). What the guarantee gives up: `ANALYZE` statistics (none
/// are kept), the `LIKE` optimization for a bound pattern (the default `LIKE` ignores
/// case and never used a `BINARY` index anyway), a bound `LIMIT` in the cost estimate,
/// and matching a bound value against the literal in a partial index's `WHERE`. The
/// last is a rule for new queries: a partial index is used only when the query's own
/// terms imply its `WHERE` whatever the values (`thread_pos > ?` implies `thread_pos IS
/// NOT NULL`; `class <> ?1` would not imply `class <> 'x'`).
fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map(drop)
}

/// Takes every job waiting, runs them in one transaction, each in a savepoint, commits
/// once, then answers each caller. Checkpoints are left to `checkpointer`.
fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Job>,
    checkpointer: checkpoint::Checkpointer,
) {
    // The connection's `synchronous` setting: FULL (each commit syncs the log) unless
    // the last batch needed no sync. SQLite refuses to change it inside a transaction.
    let mut syncing = true;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (began, jobs_in_batch) = (std::time::Instant::now(), batch.len());
        // INVARIANT: a batch with one job that needs its fsync commits with FULL; only a
        // batch of unflushed writes alone skips it (NORMAL: the log is written, not
        // synced; the next FULL commit or checkpoint syncs it).
        let flush = batch.iter().any(|job| job.flush);
        if flush != syncing {
            let level = if flush { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", level) {
                Ok(()) => syncing = flush,
                // Still syncing: the batch commits as a synchronous one.
                Err(_) if !flush => {}
                // Still not syncing: the batch is dropped (its callers see `WriterGone`).
                Err(_) => continue,
            }
        }
        let mut finishers = Vec::with_capacity(batch.len());
        // INVARIANT: a job runs only inside its own savepoint of an open transaction, so
        // a failing job never leaves partial changes in the batch. A job that cannot be
        // run is dropped, which its caller sees as `WriterGone`.
        if writer_execute(&conn, "BEGIN IMMEDIATE").is_err() {
            continue;
        }
        for job in batch {
            if writer_execute(&conn, "SAVEPOINT job").is_err() {
                continue;
            }
            let (ok, finish) = (job.run)(&conn);
            let _ = if ok {
                writer_execute(&conn, "RELEASE job").map(drop)
            } else {
                conn.execute_batch("ROLLBACK TO job; RELEASE job")
            };
            finishers.push(finish);
        }
        let commit = tracing::trace_span!("sqlite.commit").entered();
        let committed = writer_execute(&conn, "COMMIT").map(drop).map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            e.to_string()
        });
        drop(commit);
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
pub fn named<T: std::str::FromStr>(row: &Row<'_>, idx: usize) -> sql::Result<T> {
    let text: String = row.get(idx)?;
    text.parse().map_err(|_| {
        let name = std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("value");
        SqlError::Decode {
            idx,
            message: format!("unknown {name} {text:?} in the database"),
        }
    })
}

#[cfg(test)]
mod tests;
