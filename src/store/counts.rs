//! What one piece of work costs the database and the providers, counted exactly: the
//! durable commits it waited for, the read transactions, the statements, the Postgres
//! round trips and the provider requests. Counting is off unless the work runs inside
//! [`counted`] (a task-local), so production pays one task-local look-up per event.
//!
//! The counts follow the work wherever the store runs it: [`crate::store::Db`] carries
//! them from the calling task to the SQLite writer's reply, to the blocking pool's thread
//! and into `block_in_place`. A test wraps a gated call in [`counted`] and asserts the
//! counts, so a change that adds a commit or a round trip fails without any timing
//! (`tests/it/call_counts.rs`).

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a piece of work cost (see the module docs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Durable commits waited for (`Db::write`s that committed): on SQLite each is one
    /// group commit (one fsync of the WAL), on Postgres one WAL flush.
    pub commits: u64,
    /// Writes that did not ask to wait for the log's flush
    /// ([`crate::store::Db::write_unflushed`]; on SQLite one that shares its group commit
    /// with a write that asked is synced with it all the same).
    pub unflushed_commits: u64,
    /// Read transactions (`Db::read`, `Db::read_inline`) and single-statement reads
    /// (`Db::query_inline`).
    pub reads: u64,
    /// Statements run (queries and changes), on either backend.
    pub statements: u64,
    /// Round trips to Postgres: statements, `BEGIN` and `COMMIT` (0 on SQLite).
    pub round_trips: u64,
    /// Statements prepared on a Postgres connection, each one more round trip (once
    /// per connection and statement: how many a call meets depends on which pooled
    /// connection it gets).
    pub prepares: u64,
    /// Requests sent to a provider (Stripe, Plain, GitHub) by a connector.
    pub provider_requests: u64,
}

/// The live counters of one [`counted`] scope.
#[derive(Debug, Default)]
pub struct Counter {
    commits: AtomicU64,
    unflushed_commits: AtomicU64,
    reads: AtomicU64,
    statements: AtomicU64,
    round_trips: AtomicU64,
    prepares: AtomicU64,
    provider_requests: AtomicU64,
}

impl Counter {
    fn snapshot(&self) -> Counts {
        Counts {
            commits: self.commits.load(Ordering::Relaxed),
            unflushed_commits: self.unflushed_commits.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            statements: self.statements.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
            prepares: self.prepares.load(Ordering::Relaxed),
            provider_requests: self.provider_requests.load(Ordering::Relaxed),
        }
    }
}

/// What is counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Commit,
    UnflushedCommit,
    Read,
    /// A statement; on Postgres also a round trip.
    Statement,
    /// A Postgres round trip that is no statement (`BEGIN`, `COMMIT`).
    RoundTrip,
    /// A statement prepared on a Postgres connection.
    Prepare,
    ProviderRequest,
}

impl Event {
    /// A commit that waited for the log's flush, or one that did not.
    pub(crate) fn commit(flushed: bool) -> Event {
        if flushed {
            Event::Commit
        } else {
            Event::UnflushedCommit
        }
    }
}

tokio::task_local! {
    static TASK: Arc<Counter>;
}

thread_local! {
    /// Set on a thread running a counted task's database work (blocking pool).
    static THREAD: RefCell<Option<Arc<Counter>>> = const { RefCell::new(None) };
}

/// Runs `work` counting what it costs; answers its output and the counts.
pub async fn counted<F: Future>(work: F) -> (F::Output, Counts) {
    let counter = Arc::new(Counter::default());
    let out = TASK.scope(counter.clone(), work).await;
    (out, counter.snapshot())
}

/// `work`, counted with the current task's counter when there is one: work a counted
/// task hands to a task of its own (a read's outcome written after its answer) is
/// counted with it. A test that asserts the counts waits for that work inside
/// [`counted`].
pub(crate) fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let counter = current();
    async move {
        match counter {
            Some(counter) => TASK.scope(counter, work).await,
            None => work.await,
        }
    }
}

/// The counter of the current task or thread, if counting.
pub(crate) fn current() -> Option<Arc<Counter>> {
    THREAD
        .with(|t| t.borrow().clone())
        .or_else(|| TASK.try_with(Clone::clone).ok())
}

/// Runs `f` on this thread with `counter` as its counter (the blocking pool's side of a
/// counted task).
pub(crate) fn on_thread<T>(counter: Option<Arc<Counter>>, f: impl FnOnce() -> T) -> T {
    if counter.is_none() {
        return f();
    }
    let before = THREAD.with(|t| t.replace(counter));
    let out = f();
    THREAD.with(|t| *t.borrow_mut() = before);
    out
}

/// Counts `event` for the current task or thread, if counting.
pub(crate) fn bump(event: Event) {
    if let Some(counter) = current() {
        bump_on(&counter, event);
    }
}

/// Counts a Postgres statement: a statement and a round trip.
pub(crate) fn bump_pg_statement() {
    if let Some(counter) = current() {
        bump_on(&counter, Event::Statement);
        bump_on(&counter, Event::RoundTrip);
    }
}

/// Counts `event` on `counter`.
pub(crate) fn bump_on(counter: &Counter, event: Event) {
    let add = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    match event {
        Event::Commit => add(&counter.commits),
        Event::UnflushedCommit => add(&counter.unflushed_commits),
        Event::Read => add(&counter.reads),
        Event::Statement => add(&counter.statements),
        Event::RoundTrip => add(&counter.round_trips),
        Event::Prepare => add(&counter.prepares),
        Event::ProviderRequest => add(&counter.provider_requests),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn nothing_is_counted_outside_a_scope_and_everything_inside() {
        bump(Event::Commit);
        let ((), counts) = counted(async {
            bump(Event::Commit);
            bump(Event::Statement);
            let counter = current();
            std::thread::spawn(move || on_thread(counter, || bump(Event::RoundTrip)))
                .join()
                .expect("thread");
        })
        .await;
        assert_eq!(
            counts,
            Counts {
                commits: 1,
                statements: 1,
                round_trips: 1,
                ..Counts::default()
            }
        );
    }
}
