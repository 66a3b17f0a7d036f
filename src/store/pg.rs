//! The Postgres backend: a small bounded pool of `postgres` clients (the synchronous face
//! of tokio-postgres), used only on blocking threads; write transactions at SERIALIZABLE,
//! run again when they lose a race (40001, 40P01); single-statement writes in autocommit
//! (one round trip: no `BEGIN`/`COMMIT`); reads in a READ ONLY REPEATABLE READ
//! snapshot; migrations under an advisory lock.

use std::cell::RefCell;
use std::str::FromStr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use postgres::{Client, IsolationLevel};

use super::pg_background::{Background, run_after_commit};
use super::sql::{AfterStep, Conn, PgParts, Result, SqlError, StatementCache};
use super::{StoreError, lock};

/// How long a caller waits for a free connection before it is an error.
const POOL_WAIT: Duration = Duration::from_secs(30);
/// How many times a write transaction that lost a race is run in all.
const MAX_ATTEMPTS: u32 = 40;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The Postgres side of a `Db`.
pub(crate) struct PgStore {
    config: postgres::Config,
    /// The TLS the URL asks for (`pg_tls`).
    tls: super::pg_tls::Tls,
    /// Connections kept open at most (`[store] pool_size`).
    pool_size: usize,
    /// The URL with its password replaced, for messages.
    shown: String,
    pool: Mutex<PoolState>,
    freed: Condvar,
    /// Taken while a step runs after a commit on the writer's own connection
    /// ([`Conn::after_postgres_commit`]: today `audit::chain_waiting`'s): this process's
    /// writers run such steps one at a time, so only one connection per process waits
    /// on a lock the step takes in the database. The writers' audit chaining steps run
    /// on the background thread instead, one at a time by construction.
    after_commit_turn: Mutex<()>,
    /// Runs the steps queued to run after a commit in the background
    /// ([`Conn::after_postgres_commit_in_background`]), on a connection of its own.
    background: Background,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Pooled>,
    open: usize,
}

struct Pooled {
    client: Client,
    cache: RefCell<StatementCache>,
}

/// A connection taken from the pool, given back when dropped.
struct Lease<'p> {
    store: &'p PgStore,
    conn: Option<Pooled>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.store.pool);
        match self.conn.take() {
            Some(conn) if !conn.client.is_closed() => state.idle.push(conn),
            _ => state.open = state.open.saturating_sub(1),
        }
        drop(state);
        self.store.freed.notify_one();
    }
}

impl Drop for PgStore {
    /// Runs the background steps queued so far, then closes the pooled clients on a
    /// thread of their own: closing blocks, and the last handle may go on an async
    /// worker.
    fn drop(&mut self) {
        self.background.stop();
        let idle = std::mem::take(&mut lock(&self.pool).idle);
        if idle.is_empty() {
            return;
        }
        let closing = std::thread::spawn(move || drop(idle));
        if closing.join().is_err() {
            tracing::warn!("closing the database connections panicked");
        }
    }
}

impl PgStore {
    /// Connects once to check the URL and the credentials, then applies pending
    /// migrations (under the advisory lock).
    pub(crate) fn connect(url: &str, pool_size: usize) -> Result<PgStore, StoreError> {
        let shown = redact(url);
        let (url, tls) = super::pg_tls::from_url(url, &shown)?;
        let mut config = postgres::Config::from_str(&url).map_err(|e| StoreError::BadUrl {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("threadgate");
        config.ssl_mode(tls.mode.ssl_mode());
        // The first connection and the migrations before anything else starts: a URL
        // that is refused, or a schema newer than this binary, starts no thread.
        let mut client = open_client(&config, &tls, &shown)?;
        super::migrations::apply_postgres(&mut client, &shown)?;
        let background = {
            let (config, tls, shown) = (config.clone(), tls.clone(), shown.clone());
            Background::start(Box::new(move || open_client(&config, &tls, &shown)))?
        };
        let store = PgStore {
            config,
            tls,
            pool_size: pool_size.max(1),
            shown,
            pool: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
            after_commit_turn: Mutex::new(()),
            background,
        };
        lock(&store.pool).idle.push(Pooled {
            client,
            cache: RefCell::default(),
        });
        lock(&store.pool).open = 1;
        Ok(store)
    }

    /// The URL without its password.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    fn open_client(&self) -> Result<Client, StoreError> {
        open_client(&self.config, &self.tls, &self.shown)
    }

    /// Runs the steps a write registered once it has committed: those for the
    /// background are queued for its thread; the others run here, on the writer's
    /// connection, one writer of this process at a time, before the write resolves.
    fn after_commit(
        &self,
        client: &mut Client,
        cache: &RefCell<StatementCache>,
        steps: Vec<AfterStep>,
    ) {
        if steps.is_empty() {
            return;
        }
        let mut turn = None;
        for step in steps {
            if step.in_background {
                self.background.queue(step.key, step.run);
            } else {
                turn.get_or_insert_with(|| lock(&self.after_commit_turn));
                run_after_commit(client, cache, step.key, step.run);
            }
        }
    }

    /// Resolves once every background step queued so far has run.
    pub(crate) async fn background_settled(&self) {
        self.background.settled().await;
    }

    /// Batches of background steps run so far.
    pub(crate) fn background_batches(&self) -> u64 {
        self.background.batches()
    }

    fn lease(&self) -> Result<Lease<'_>, StoreError> {
        let deadline = Instant::now() + POOL_WAIT;
        let mut state = lock(&self.pool);
        loop {
            if let Some(conn) = state.idle.pop() {
                return Ok(Lease {
                    store: self,
                    conn: Some(conn),
                });
            }
            if state.open < self.pool_size {
                state.open += 1;
                drop(state);
                return match self.open_client() {
                    Ok(client) => Ok(Lease {
                        store: self,
                        conn: Some(Pooled {
                            client,
                            cache: RefCell::default(),
                        }),
                    }),
                    Err(e) => {
                        lock(&self.pool).open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::PoolExhausted {
                    size: self.pool_size,
                });
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Runs `f` in a SERIALIZABLE transaction and commits it, running it again (up to
    /// [`MAX_ATTEMPTS`] in all, after a short random pause) when it loses a race.
    pub(crate) fn write<R>(&self, f: &dyn Fn(&Conn<'_>) -> Result<R>) -> Result<R, StoreError> {
        self.retrying(|| self.write_once(f, IsolationLevel::Serializable))
    }

    /// Runs `f` in a READ COMMITTED transaction and commits it: each statement sees
    /// what committed before it began, and nothing is checked at commit, so `f` must
    /// lock every row or name its decision rests on before it reads it (a row lock, or
    /// [`Conn::lock_name`]). Run again, as [`PgStore::write`], only on a deadlock.
    pub(crate) fn write_locking<R>(
        &self,
        f: &dyn Fn(&Conn<'_>) -> Result<R>,
    ) -> Result<R, StoreError> {
        self.retrying(|| self.write_once(f, IsolationLevel::ReadCommitted))
    }

    /// Runs `f`, which sends one statement, with no transaction around it: the
    /// statement is a transaction of its own (autocommit), committed by the server
    /// before it answers, so the write is one round trip (the statement is prepared once
    /// per connection). A second statement is refused before it is sent. Run again as
    /// [`PgStore::write`] when it loses a race (40001/40P01: nothing was written).
    /// Without `flush` the statement may turn `synchronous_commit` off for its own
    /// transaction ([`Conn::skips_flush`]).
    pub(crate) fn write_single<R>(
        &self,
        f: &dyn Fn(&Conn<'_>) -> Result<R>,
        flush: bool,
    ) -> Result<R, StoreError> {
        self.retrying(|| self.write_single_once(f, flush))
    }

    fn retrying<R>(&self, once: impl Fn() -> Result<R, Attempt>) -> Result<R, StoreError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let began = Instant::now();
            match once() {
                Ok(value) => {
                    crate::metrics::db_commit(1, began.elapsed(), true);
                    return Ok(value);
                }
                Err(Attempt::Lost) if attempt < MAX_ATTEMPTS => {
                    let ceiling = 1u64 << attempt.min(6);
                    std::thread::sleep(Duration::from_millis(rand::random_range(0..=ceiling)));
                }
                Err(Attempt::Lost) => {
                    crate::metrics::db_commit(1, began.elapsed(), false);
                    return Err(StoreError::Contention { attempts: attempt });
                }
                Err(Attempt::Failed(e)) => {
                    crate::metrics::db_commit(1, began.elapsed(), false);
                    return Err(e);
                }
            }
        }
    }

    fn write_single_once<R>(
        &self,
        f: &dyn Fn(&Conn<'_>) -> Result<R>,
        flush: bool,
    ) -> Result<R, Attempt> {
        let _attempt = tracing::trace_span!("pg.autocommit").entered();
        let mut lease = self.lease().map_err(Attempt::Failed)?;
        let Some(Pooled { client, cache }) = lease.conn.as_mut() else {
            return Err(Attempt::Failed(StoreError::WriterGone));
        };
        let conn = Conn::postgres_autocommit(client, cache, flush);
        let outcome = f(&conn);
        let lost = conn.lost_race();
        let after_commit = conn.take_after_commit();
        drop(conn);
        match outcome {
            _ if lost => Err(Attempt::Lost),
            Err(e) => Err(Attempt::from_sql(e)),
            // The client read the server's answer up to ReadyForQuery, which follows the
            // implicit transaction's commit: an error at commit would have been `Err`.
            Ok(value) => {
                super::counts::bump(super::counts::Event::commit(flush));
                self.after_commit(client, cache, after_commit);
                Ok(value)
            }
        }
    }

    fn write_once<R>(
        &self,
        f: &dyn Fn(&Conn<'_>) -> Result<R>,
        isolation: IsolationLevel,
    ) -> Result<R, Attempt> {
        let _attempt = tracing::trace_span!("pg.transaction").entered();
        let mut lease = self.lease().map_err(Attempt::Failed)?;
        let Some(Pooled { client, cache }) = lease.conn.as_mut() else {
            return Err(Attempt::Failed(StoreError::WriterGone));
        };
        super::counts::bump(super::counts::Event::RoundTrip);
        let tx = client
            .build_transaction()
            .isolation_level(isolation)
            .start()
            .map_err(|e| Attempt::from_sql(SqlError::Postgres(e)))?;
        let conn = Conn::postgres(tx, cache);
        if matches!(isolation, IsolationLevel::ReadCommitted) {
            conn.set_locking();
        }
        let outcome = f(&conn);
        let Some(PgParts {
            mut tx,
            lost,
            after_commit,
            unflushed_asked,
        }) = conn.into_postgres()
        else {
            return Err(Attempt::Failed(StoreError::WriterGone));
        };
        match outcome {
            _ if lost => Err(Attempt::Lost),
            Err(e) => Err(Attempt::from_sql(e)),
            Ok(value) => match tracing::trace_span!("pg.commit").in_scope(|| {
                if unflushed_asked {
                    // `Conn::commit_unflushed`, which no statement carried.
                    super::counts::bump_pg_statement();
                    tx.batch_execute("SET LOCAL synchronous_commit TO off")?;
                }
                super::counts::bump(super::counts::Event::RoundTrip);
                tx.commit()
            }) {
                Ok(()) => {
                    super::counts::bump(super::counts::Event::Commit);
                    self.after_commit(client, cache, after_commit);
                    Ok(value)
                }
                Err(e) => {
                    let e = SqlError::Postgres(e);
                    if e.is_retryable() {
                        Err(Attempt::Lost)
                    } else {
                        Err(Attempt::Failed(StoreError::Commit(e.to_string())))
                    }
                }
            },
        }
    }

    /// The rows of one statement, run outside a transaction (autocommit), through `f`.
    pub(crate) fn query_autocommit<T>(
        &self,
        sql: &str,
        params: &dyn super::Params,
        f: &dyn Fn(&super::Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let mut lease = self.lease()?;
        let Some(Pooled { client, cache }) = lease.conn.as_mut() else {
            return Err(StoreError::WriterGone);
        };
        let found = cache.borrow().get(sql);
        let statement = match found {
            Some(statement) => statement,
            None => {
                super::counts::bump(super::counts::Event::Prepare);
                let text = super::pg_value::placeholders(sql);
                let prepared = client.prepare(&text).map_err(SqlError::Postgres)?;
                cache.borrow_mut().insert(sql, prepared.clone());
                prepared
            }
        };
        let values = params.values()?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn postgres::types::ToSql + Sync))
            .collect();
        super::counts::bump(super::counts::Event::Read);
        super::counts::bump_pg_statement();
        let _trip = tracing::trace_span!("pg.statement").entered();
        let rows = client
            .query(&statement, &refs)
            .map_err(SqlError::Postgres)?;
        let out = rows
            .iter()
            .map(|r| f(&super::Row::postgres(r)))
            .collect::<Result<Vec<T>>>()?;
        Ok(out)
    }

    /// Runs `f` in a READ ONLY REPEATABLE READ transaction: one consistent snapshot.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&Conn<'_>) -> Result<R>) -> Result<R, StoreError> {
        let mut lease = self.lease()?;
        let Some(Pooled { client, cache }) = lease.conn.as_mut() else {
            return Err(StoreError::WriterGone);
        };
        super::counts::bump(super::counts::Event::Read);
        // BEGIN and COMMIT.
        super::counts::bump(super::counts::Event::RoundTrip);
        super::counts::bump(super::counts::Event::RoundTrip);
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(|e| StoreError::Sql(SqlError::Postgres(e)))?;
        let conn = Conn::postgres(tx, cache);
        let value = f(&conn)?;
        if let Some(PgParts { tx, .. }) = conn.into_postgres() {
            tx.commit()
                .map_err(|e| StoreError::Sql(SqlError::Postgres(e)))?;
        }
        Ok(value)
    }
}

/// How one run of a write transaction ended when it did not commit.
enum Attempt {
    /// It lost a race with another transaction: run it again.
    Lost,
    Failed(StoreError),
}

impl Attempt {
    fn from_sql(e: SqlError) -> Attempt {
        if e.is_retryable() {
            Attempt::Lost
        } else {
            Attempt::Failed(StoreError::Sql(e))
        }
    }
}

/// Opens one connection to the database `config` names, over `tls`; errors name what
/// is wrong with `shown` (the URL without its password).
fn open_client(
    config: &postgres::Config,
    tls: &super::pg_tls::Tls,
    shown: &str,
) -> Result<Client, StoreError> {
    config.connect(tls.connector()).map_err(|e| {
        tls.explain(shown, &e)
            .unwrap_or_else(|| connect_error(shown, config, &e))
    })
}

/// A connection error, named for what is wrong and never showing the password.
fn connect_error(shown: &str, config: &postgres::Config, e: &postgres::Error) -> StoreError {
    let url = shown.to_owned();
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        if code == "28P01" || code == "28000" {
            return StoreError::Credentials {
                url,
                user: config.get_user().unwrap_or_default().to_owned(),
            };
        }
        return StoreError::Connect {
            url,
            reason: format!("{} ({code})", db.message()),
        };
    }
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut reason = e.to_string();
    while let Some(s) = source {
        reason = format!("{reason}: {s}");
        source = s.source();
    }
    StoreError::Unreachable { url, reason }
}

/// `url` with any password replaced by `***`: the userinfo of a URL, a `password=` of
/// a key/value string or of a URL's query.
pub fn redact(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out
            .get(rest_start..)
            .and_then(|rest| rest.find(['/', '?']))
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out
            .get(rest_start..authority_end)
            .and_then(|a| a.rfind('@'))
        {
            let userinfo = rest_start..rest_start + at;
            if let Some(colon) = out.get(userinfo.clone()).and_then(|u| u.find(':')) {
                out.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    let lower = out.to_ascii_lowercase();
    if let Some(at) = lower.find("password=") {
        let start = at + "password=".len();
        let end = out
            .get(start..)
            .and_then(|rest| rest.find([' ', '&']))
            .map_or(out.len(), |i| start + i);
        out.replace_range(start..end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg_value::placeholders;

    #[test]
    fn placeholders_become_dollars_outside_quotes() {
        assert_eq!(
            placeholders("SELECT '?1', \"a?\" FROM t WHERE a = ?1 AND b = ?12 -- ?3\n AND c = ?"),
            "SELECT '?1', \"a?\" FROM t WHERE a = $1 AND b = $12 -- ?3\n AND c = $1"
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://tg:fake_key_secret@db.test:5432/tg"),
            "postgres://tg:***@db.test:5432/tg"
        );
        assert_eq!(redact("postgres://db.test/tg"), "postgres://db.test/tg");
        assert_eq!(
            redact("host=db user=tg password=fake_key_secret dbname=tg"),
            "host=db user=tg password=*** dbname=tg"
        );
        assert_eq!(
            redact("postgres://db.test/tg?user=a&password=fake_key_secret&x=1"),
            "postgres://db.test/tg?user=a&password=***&x=1"
        );
    }
}
