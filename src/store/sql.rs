//! The connection every domain function takes: one synchronous API over SQLite (a
//! `rusqlite::Connection`) and Postgres (a `postgres::Transaction`), shaped like the
//! part of rusqlite the domain modules use, so their SQL is written once.
//!
//! SQL is written with `?N` placeholders; on Postgres they become `$N` (outside quoted
//! text) once per connection, with the prepared statement cached beside it. Values go in
//! through [`ToSql`] and come out through [`FromSql`], both of threadgate's own: one
//! value model (null, integer, real, text, bytes) that each backend binds and reads in
//! its own types. Where the dialects truly differ, a site asks [`Conn::dialect`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use postgres::types::Type;

pub use super::value::{Dialect, FromSql, OptionalExtension, Result, SqlError, ToSql, Value};

/// A statement's parameters: `params![..]`, an array of one type, or `()` for none.
pub trait Params {
    fn values(&self) -> Result<Vec<Value<'_>>>;
}

impl Params for () {
    fn values(&self) -> Result<Vec<Value<'_>>> {
        Ok(Vec::new())
    }
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<Value<'_>>> {
        self.iter().map(|p| p.to_value()).collect()
    }
}

impl Params for Vec<&dyn ToSql> {
    fn values(&self) -> Result<Vec<Value<'_>>> {
        self.iter().map(|p| p.to_value()).collect()
    }
}

impl<T: ToSql, const N: usize> Params for [T; N] {
    fn values(&self) -> Result<Vec<Value<'_>>> {
        self.iter().map(ToSql::to_value).collect()
    }
}

impl<T: ToSql, const N: usize> Params for &[T; N] {
    fn values(&self) -> Result<Vec<Value<'_>>> {
        self.iter().map(ToSql::to_value).collect()
    }
}

/// A statement's parameters of different types, as rusqlite's macro of the same name.
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::store::ToSql]
    };
    ($($param:expr),+ $(,)?) => {
        &[$(&$param as &dyn $crate::store::ToSql),+] as &[&dyn $crate::store::ToSql]
    };
}
pub(crate) use params;

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(i),
            Value::Real(f) => ValueRef::Real(f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// One row of a result.
#[derive(Clone, Copy)]
pub struct Row<'a>(RowInner<'a>);

#[derive(Clone, Copy)]
enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a postgres::Row),
}

/// A column's position (columns are read by index, as everywhere in threadgate).
pub trait RowIndex {
    fn index(self) -> usize;
}

impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

impl<'a> Row<'a> {
    /// A Postgres row.
    pub(crate) fn postgres(row: &'a postgres::Row) -> Row<'a> {
        Row(RowInner::Postgres(row))
    }

    /// Column `idx` as a `T`.
    pub fn get<I: RowIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let idx = idx.index();
        let decode = |message: String| SqlError::Decode { idx, message };
        match self.0 {
            RowInner::Sqlite(row) => {
                use rusqlite::types::ValueRef;
                let value = match row.get_ref(idx)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(i) => Value::Integer(i),
                    ValueRef::Real(f) => Value::Real(f),
                    ValueRef::Text(t) => Value::Text(
                        std::str::from_utf8(t).map_err(|e| decode(format!("not UTF-8: {e}")))?,
                    ),
                    ValueRef::Blob(b) => Value::Blob(b),
                };
                T::from_value(value).map_err(decode)
            }
            RowInner::Postgres(row) => {
                let value = crate::store::pg_value::column(row, idx).map_err(decode)?;
                T::from_value(value).map_err(decode)
            }
        }
    }
}

/// A transaction's connection, on either backend.
pub struct Conn<'a>(ConnInner<'a>);

enum ConnInner<'a> {
    Sqlite(&'a rusqlite::Connection),
    Postgres(PgTx<'a>),
}

/// A Postgres transaction with its connection's statement cache.
pub(crate) struct PgTx<'a> {
    pub(crate) tx: RefCell<PgSession<'a>>,
    pub(crate) cache: &'a RefCell<StatementCache>,
    /// Set when a statement lost a race (40001/40P01): the whole transaction is run
    /// again, whatever the closure made of the error.
    pub(crate) retry: Cell<bool>,
    /// Statements sent so far (an autocommit connection sends at most one).
    pub(crate) sent: Cell<u32>,
    /// What runs once this transaction has committed, by key
    /// ([`Conn::after_postgres_commit`]).
    pub(crate) after_commit: RefCell<Vec<AfterStep>>,
    /// A READ COMMITTED transaction of [`crate::store::Db::write_locking`], where
    /// [`Conn::lock_name`] takes its lock.
    pub(crate) locking: Cell<bool>,
    /// The one statement of [`crate::store::Db::write_unflushed`]: it may commit
    /// without waiting for the WAL's flush ([`Conn::skips_flush`]).
    pub(crate) unflushed: bool,
    /// [`Conn::commit_unflushed`] was asked in this transaction and no statement has
    /// turned `synchronous_commit` off yet: the commit does it first.
    pub(crate) unflushed_asked: Cell<bool>,
}

/// What a Postgres [`Conn`]'s statements run in.
pub(crate) enum PgSession<'a> {
    /// An open transaction, committed (or rolled back) by its owner.
    Transaction(postgres::Transaction<'a>),
    /// No transaction: the one statement allowed is a transaction of its own, committed
    /// by the server before it answers (`Db::write_single`).
    Autocommit(&'a mut postgres::Client),
}

impl PgSession<'_> {
    fn query(
        &mut self,
        statement: &postgres::Statement,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> std::result::Result<Vec<postgres::Row>, postgres::Error> {
        match self {
            PgSession::Transaction(tx) => tx.query(statement, params),
            PgSession::Autocommit(client) => client.query(statement, params),
        }
    }

    fn execute(
        &mut self,
        statement: &postgres::Statement,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> std::result::Result<u64, postgres::Error> {
        match self {
            PgSession::Transaction(tx) => tx.execute(statement, params),
            PgSession::Autocommit(client) => client.execute(statement, params),
        }
    }

    fn batch_execute(&mut self, sql: &str) -> std::result::Result<(), postgres::Error> {
        match self {
            PgSession::Transaction(tx) => tx.batch_execute(sql),
            PgSession::Autocommit(client) => client.batch_execute(sql),
        }
    }

    fn prepare(&mut self, sql: &str) -> std::result::Result<postgres::Statement, postgres::Error> {
        match self {
            PgSession::Transaction(tx) => tx.prepare(sql),
            PgSession::Autocommit(client) => client.prepare(sql),
        }
    }
}

/// A step run once a Postgres write transaction has committed, in a READ COMMITTED
/// transaction of its own ([`Conn::after_postgres_commit`],
/// [`Conn::after_postgres_commit_in_background`]).
pub(crate) type AfterCommit = Box<dyn FnOnce(&Conn<'_>) -> Result<()> + Send>;

/// A step registered on a Postgres write, with where it runs once the write commits.
pub(crate) struct AfterStep {
    pub(crate) key: &'static str,
    pub(crate) run: AfterCommit,
    /// On the store's background thread, after the write resolves (else on the
    /// writer's connection, before it resolves).
    pub(crate) in_background: bool,
}

/// A Postgres [`Conn`] taken apart once its closure is done.
pub(crate) struct PgParts<'a> {
    pub(crate) tx: postgres::Transaction<'a>,
    /// A statement lost a race: run the transaction again.
    pub(crate) lost: bool,
    pub(crate) after_commit: Vec<AfterStep>,
    /// [`Conn::commit_unflushed`] was asked and no statement carried it: the commit
    /// turns `synchronous_commit` off first.
    pub(crate) unflushed_asked: bool,
}

/// Statements prepared on one Postgres connection, by their `?N` text.
#[derive(Default)]
pub(crate) struct StatementCache(HashMap<String, postgres::Statement>);

impl StatementCache {
    /// The statement prepared for `sql`, if it is.
    pub(crate) fn get(&self, sql: &str) -> Option<postgres::Statement> {
        self.0.get(sql).cloned()
    }

    /// Keeps `statement` prepared for `sql` (past [`PG_STATEMENT_CACHE`] the cache starts
    /// again).
    pub(crate) fn insert(&mut self, sql: &str, statement: postgres::Statement) {
        if self.0.len() >= PG_STATEMENT_CACHE {
            self.0.clear();
        }
        self.0.insert(sql.to_owned(), statement);
    }
}

/// Statements kept prepared per Postgres connection; past it the cache starts again.
const PG_STATEMENT_CACHE: usize = 512;

impl<'a> Conn<'a> {
    /// A SQLite connection (a transaction is open on it or it is a reader).
    pub fn sqlite(conn: &'a rusqlite::Connection) -> Conn<'a> {
        Conn(ConnInner::Sqlite(conn))
    }

    pub(crate) fn postgres(
        tx: postgres::Transaction<'a>,
        cache: &'a RefCell<StatementCache>,
    ) -> Conn<'a> {
        Conn::postgres_in(PgSession::Transaction(tx), cache, false)
    }

    /// A Postgres connection with no transaction open, on which one statement may run,
    /// as a transaction of its own (autocommit): a second statement is refused before
    /// it is sent, so the one write is all or nothing.
    pub(crate) fn postgres_autocommit(
        client: &'a mut postgres::Client,
        cache: &'a RefCell<StatementCache>,
        flush: bool,
    ) -> Conn<'a> {
        Conn::postgres_in(PgSession::Autocommit(client), cache, !flush)
    }

    fn postgres_in(
        session: PgSession<'a>,
        cache: &'a RefCell<StatementCache>,
        unflushed: bool,
    ) -> Conn<'a> {
        Conn(ConnInner::Postgres(PgTx {
            tx: RefCell::new(session),
            cache,
            retry: Cell::new(false),
            sent: Cell::new(0),
            after_commit: RefCell::default(),
            locking: Cell::new(false),
            unflushed,
            unflushed_asked: Cell::new(false),
        }))
    }

    /// Marks a Postgres transaction as READ COMMITTED under its own locks
    /// ([`crate::store::Db::write_locking`]): [`Conn::lock_name`] takes its lock there.
    pub(crate) fn set_locking(&self) {
        if let ConnInner::Postgres(pg) = &self.0 {
            pg.locking.set(true);
        }
    }

    /// The Postgres transaction back, to commit it, whether it lost a race, and the
    /// steps to run once it has committed (`None` on SQLite or an autocommit
    /// connection).
    pub(crate) fn into_postgres(self) -> Option<PgParts<'a>> {
        match self.0 {
            ConnInner::Postgres(pg) => match pg.tx.into_inner() {
                PgSession::Transaction(tx) => Some(PgParts {
                    tx,
                    lost: pg.retry.get(),
                    after_commit: pg.after_commit.into_inner(),
                    unflushed_asked: pg.unflushed_asked.get(),
                }),
                PgSession::Autocommit(_) => None,
            },
            ConnInner::Sqlite(_) => None,
        }
    }

    /// Whether a statement lost a race with another writer (always `false` on SQLite).
    pub(crate) fn lost_race(&self) -> bool {
        match &self.0 {
            ConnInner::Postgres(pg) => pg.retry.get(),
            ConnInner::Sqlite(_) => false,
        }
    }

    /// The steps registered with [`Conn::after_postgres_commit`] on an autocommit
    /// connection, to run once its one statement has committed.
    pub(crate) fn take_after_commit(&self) -> Vec<AfterStep> {
        match &self.0 {
            ConnInner::Postgres(pg) => pg.after_commit.take(),
            ConnInner::Sqlite(_) => Vec::new(),
        }
    }

    /// On Postgres, runs `step` once this write transaction has committed, in a READ
    /// COMMITTED transaction of its own on the same connection, before the write
    /// resolves: each of its statements sees every transaction committed before it
    /// began (a lock it takes first is followed by a fresh view, which a SERIALIZABLE
    /// snapshot taken earlier cannot give). A later step with the same `key` replaces
    /// an earlier one (it must do what both would). A step that fails is logged, never
    /// the write's error: the write has committed. Not run when the transaction does
    /// not commit; nothing on SQLite (its single writer never needs one), where
    /// `step` is dropped.
    pub(crate) fn after_postgres_commit(
        &self,
        key: &'static str,
        step: impl FnOnce(&Conn<'_>) -> Result<()> + Send + 'static,
    ) {
        self.register_after_commit(key, Box::new(step), false);
    }

    /// As [`Conn::after_postgres_commit`], but the step runs on the store's background
    /// thread (its own connection), after the write has resolved: the caller never
    /// waits for it. Steps queued while one runs are run together after it, a later
    /// step of a `key` replacing the earlier ones (it must do what they would), so under
    /// load one step does the work of many writes. [`crate::store::Db::background_settled`]
    /// waits for the steps queued so far. A step lost (a crash, a failure: logged) must
    /// leave its work to a later one.
    pub(crate) fn after_postgres_commit_in_background(
        &self,
        key: &'static str,
        step: impl FnOnce(&Conn<'_>) -> Result<()> + Send + 'static,
    ) {
        self.register_after_commit(key, Box::new(step), true);
    }

    fn register_after_commit(&self, key: &'static str, run: AfterCommit, in_background: bool) {
        if let ConnInner::Postgres(pg) = &self.0 {
            let mut steps = pg.after_commit.borrow_mut();
            steps.retain(|s| s.key != key);
            steps.push(AfterStep {
                key,
                run,
                in_background,
            });
        }
    }

    /// Marks the transaction as having lost a race with another writer (a row it could
    /// not see under its snapshot refused it): on Postgres it is then run again whatever
    /// the closure makes of the error. Nothing on SQLite, whose writer is alone.
    pub fn retry_later(&self) {
        if let ConnInner::Postgres(pg) = &self.0 {
            pg.retry.set(true);
        }
    }

    /// On Postgres, lets this transaction's commit return before its WAL reaches disk
    /// (`synchronous_commit` off for this transaction alone): its rows are visible at
    /// commit and durable once any later synchronous commit, or the WAL writer, flushes
    /// past it (the WAL is one sequence). Only for a write whose loss in a database
    /// crash breaks nothing anyone was told: the gate's decision to run a read, which
    /// the read's outcome, committed synchronously before the agent is answered,
    /// flushes. Nothing on SQLite, whose group commit is synced as one.
    ///
    /// Sends nothing itself: the next statement that can carry the setting does
    /// ([`Conn::skips_flush`], [`Conn::flush_skip_carried`]: `audit::append_after`'s),
    /// and a transaction none carried sends it before its `COMMIT`.
    pub fn commit_unflushed(&self) -> Result<()> {
        if let ConnInner::Postgres(pg) = &self.0 {
            pg.unflushed_asked.set(true);
        }
        Ok(())
    }

    /// Whether a statement sent now on Postgres should turn `synchronous_commit` off
    /// for its transaction (`set_config('synchronous_commit', 'off', true)` evaluated
    /// inside the statement: the commit reads the setting): the one statement of a
    /// [`crate::store::Db::write_unflushed`], or any in a transaction that asked
    /// [`Conn::commit_unflushed`] and none has carried yet. A statement that does not
    /// commits synchronously, which is always safe. `false` on SQLite, whose writer
    /// skips the fsync for the whole group commit instead.
    pub fn skips_flush(&self) -> bool {
        matches!(&self.0, ConnInner::Postgres(pg) if pg.unflushed || pg.unflushed_asked.get())
    }

    /// A statement sent since [`Conn::skips_flush`] said so turned `synchronous_commit`
    /// off (it evaluated the setting): the commit need not send it again.
    pub fn flush_skip_carried(&self) {
        if let ConnInner::Postgres(pg) = &self.0 {
            pg.unflushed_asked.set(false);
        }
    }

    /// In a [`crate::store::Db::write_locking`] transaction on Postgres, takes the
    /// transaction's lock on `name` (an advisory lock on its 64-bit hash, held until
    /// commit or rollback), waiting while another transaction holds it: two such
    /// writers that lock one name before they read what it guards see each other's
    /// writes. Sent as a statement of its own, so the next statement (READ COMMITTED)
    /// sees everything the holder it waited for committed. Nothing elsewhere: a read
    /// snapshot or a SERIALIZABLE transaction fixed its view before the lock, so the
    /// lock would guard nothing there and only make it wait (SERIALIZABLE's own checks
    /// guard those), nor on SQLite, whose writer is alone.
    pub fn lock_name(&self, name: &str) -> Result<()> {
        if let ConnInner::Postgres(pg) = &self.0
            && pg.locking.get()
        {
            self.prepare_cached("SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))")?
                .query_row([name], |_| Ok(()))?;
        }
        Ok(())
    }

    /// The SQL dialect of the connection.
    pub fn dialect(&self) -> Dialect {
        match self.0 {
            ConnInner::Sqlite(_) => Dialect::Sqlite,
            ConnInner::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection under this one, for SQLite's own statements (PRAGMA).
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match self.0 {
            ConnInner::Sqlite(c) => Some(c),
            ConnInner::Postgres(_) => None,
        }
    }

    /// Runs one statement, returning how many rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare(sql)?.execute(params)
    }

    /// Runs several statements without parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            ConnInner::Postgres(pg) => {
                pg.sending()?;
                let _trip = tracing::trace_span!("pg.statement").entered();
                super::counts::bump_pg_statement();
                let result = pg.tx.borrow_mut().batch_execute(sql);
                pg.check(result)
            }
        }
    }

    /// The first row of a query through `f`; no row is [`SqlError::NoRows`].
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        self.prepare(sql)?.query_row(params, f)
    }

    /// A statement to run (on SQLite parsed now; on Postgres prepared once per
    /// connection and cached).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(Statement(StmtInner::Sqlite(SqliteStmt::Plain(
                c.prepare(sql)?,
            )))),
            ConnInner::Postgres(pg) => Ok(Statement(StmtInner::Postgres {
                pg,
                statement: pg.statement(sql)?,
            })),
        }
    }

    /// [`Conn::prepare`] through SQLite's statement cache (Postgres caches every
    /// statement).
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(Statement(StmtInner::Sqlite(SqliteStmt::Cached(
                c.prepare_cached(sql)?,
            )))),
            ConnInner::Postgres(_) => self.prepare(sql),
        }
    }
}

/// What a statement runs on Postgres (a trait so a statement's borrow of the
/// transaction need not name the transaction's own lifetime).
trait PgRun {
    fn query(
        &self,
        statement: &postgres::Statement,
        values: &[Value<'_>],
    ) -> Result<Vec<postgres::Row>>;
    fn execute(&self, statement: &postgres::Statement, values: &[Value<'_>]) -> Result<usize>;
}

impl PgRun for PgTx<'_> {
    fn query(
        &self,
        statement: &postgres::Statement,
        values: &[Value<'_>],
    ) -> Result<Vec<postgres::Row>> {
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn postgres::types::ToSql + Sync))
            .collect();
        self.sending()?;
        let _trip = tracing::trace_span!("pg.statement").entered();
        super::counts::bump_pg_statement();
        let result = self.tx.borrow_mut().query(statement, &refs);
        self.check(result)
    }

    fn execute(&self, statement: &postgres::Statement, values: &[Value<'_>]) -> Result<usize> {
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn postgres::types::ToSql + Sync))
            .collect();
        self.sending()?;
        let _trip = tracing::trace_span!("pg.statement").entered();
        super::counts::bump_pg_statement();
        let result = self.tx.borrow_mut().execute(statement, &refs);
        let changed = self.check(result)?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }
}

impl PgTx<'_> {
    /// Counts a statement about to be sent; on an autocommit connection a second one is
    /// refused before it is sent (the first is already committed on its own).
    fn sending(&self) -> Result<()> {
        let sent = self.sent.get();
        if sent > 0 && matches!(*self.tx.borrow(), PgSession::Autocommit(_)) {
            return Err(SqlError::SecondStatement);
        }
        self.sent.set(sent.saturating_add(1));
        Ok(())
    }

    /// Notes a lost race before handing the error on.
    fn check<T>(&self, result: std::result::Result<T, postgres::Error>) -> Result<T> {
        result.map_err(|e| {
            let e = SqlError::Postgres(e);
            if e.is_retryable() {
                self.retry.set(true);
            }
            e
        })
    }

    fn statement(&self, sql: &str) -> Result<postgres::Statement> {
        if let Some(found) = self.cache.borrow().0.get(sql) {
            return Ok(found.clone());
        }
        let text = crate::store::pg_value::placeholders(sql);
        let _trip = tracing::trace_span!("pg.prepare").entered();
        super::counts::bump(super::counts::Event::Prepare);
        let prepared = self.tx.borrow_mut().prepare(&text);
        let prepared = self.check(prepared)?;
        let mut cache = self.cache.borrow_mut();
        if cache.0.len() >= PG_STATEMENT_CACHE {
            cache.0.clear();
        }
        cache.0.insert(sql.to_owned(), prepared.clone());
        Ok(prepared)
    }
}

/// A prepared statement.
pub struct Statement<'c>(StmtInner<'c>);

enum StmtInner<'c> {
    Sqlite(SqliteStmt<'c>),
    Postgres {
        pg: &'c (dyn PgRun + 'c),
        statement: postgres::Statement,
    },
}

enum SqliteStmt<'c> {
    Plain(rusqlite::Statement<'c>),
    Cached(rusqlite::CachedStatement<'c>),
}

impl<'c> SqliteStmt<'c> {
    fn get(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            SqliteStmt::Plain(s) => s,
            SqliteStmt::Cached(s) => s,
        }
    }
}

/// Rows of a query, read one at a time.
pub struct Rows<'s>(RowsInner<'s>);

enum RowsInner<'s> {
    Sqlite(rusqlite::Rows<'s>),
    Postgres(std::vec::IntoIter<postgres::Row>, Option<postgres::Row>),
}

impl Rows<'_> {
    /// The next row, or `None` after the last.
    #[expect(
        clippy::should_implement_trait,
        reason = "a row borrows the rows it came from: a lending iterator, as rusqlite's"
    )]
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match &mut self.0 {
            RowsInner::Sqlite(rows) => Ok(rows.next()?.map(|r| Row(RowInner::Sqlite(r)))),
            RowsInner::Postgres(rest, current) => {
                *current = rest.next();
                Ok(current.as_ref().map(|r| Row(RowInner::Postgres(r))))
            }
        }
    }
}

impl Statement<'_> {
    /// Runs the statement, returning how many rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let values = params.values()?;
        match &mut self.0 {
            StmtInner::Sqlite(s) => {
                super::counts::bump(super::counts::Event::Statement);
                Ok(s.get().execute(rusqlite::params_from_iter(values.iter()))?)
            }
            StmtInner::Postgres { pg, statement } => pg.execute(statement, &values),
        }
    }

    /// The rows of the query, to read one at a time.
    pub fn query<P: Params>(&mut self, params: P) -> Result<Rows<'_>> {
        let values = params.values()?;
        match &mut self.0 {
            StmtInner::Sqlite(s) => {
                super::counts::bump(super::counts::Event::Statement);
                Ok(Rows(RowsInner::Sqlite(
                    s.get().query(rusqlite::params_from_iter(values.iter()))?,
                )))
            }
            StmtInner::Postgres { pg, statement } => {
                let rows = pg.query(statement, &values)?;
                Ok(Rows(RowsInner::Postgres(rows.into_iter(), None)))
            }
        }
    }

    /// Every row of the query through `f`.
    pub fn query_map<T, P, F>(
        &mut self,
        params: P,
        mut f: F,
    ) -> Result<std::vec::IntoIter<Result<T>>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        let mut rows = self.query(params)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(f(&row));
        }
        Ok(out.into_iter())
    }

    /// The first row through `f`; no row is [`SqlError::NoRows`].
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(row) => f(&row),
            None => Err(SqlError::NoRows),
        }
    }

    /// Whether the query has a row.
    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        Ok(self.query(params)?.next()?.is_some())
    }
}

/// Binds a value in the type the server inferred for its placeholder: the same
/// integer goes to a `BIGINT`, an `INTEGER` or a `BOOLEAN`, text to `TEXT` or `JSONB`.
impl postgres::types::ToSql for Value<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        crate::store::pg_value::bind(self, ty, out)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}
