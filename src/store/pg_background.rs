//! The Postgres store's background thread: runs the steps writers queue to run after
//! their commit ([`Conn::after_postgres_commit_in_background`]) on a connection of its
//! own, so no caller waits for them.
//!
//! INVARIANT: a step is queued only after its write committed, and steps run in the
//! order queued; the steps queued while one batch runs are run together in the next, a
//! later step of a key replacing the earlier ones (each must do the work of those
//! before it, as the audit chain's step chains every row waiting). `settled` resolves
//! once every step queued before it was called has run or was given up (a step that
//! fails, or cannot get a connection, is logged and leaves its work to a later one).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::thread;

use postgres::{Client, IsolationLevel};

use super::sql::{AfterCommit, Conn, PgParts, SqlError, StatementCache};
use super::{StoreError, lock};

/// How a new connection is opened (the store's URL, TLS and timeouts).
pub(crate) type Connect = Box<dyn Fn() -> Result<Client, StoreError> + Send>;

/// One queued step and its place in the queue.
struct Job {
    seq: u64,
    key: &'static str,
    run: AfterCommit,
}

pub(crate) struct Background {
    /// The queue's sender and the number of the last job sent, under one lock so the
    /// numbers follow the order of the queue.
    queue: Mutex<(Option<mpsc::Sender<Job>>, u64)>,
    /// The number of the last job run (or given up).
    done: tokio::sync::watch::Receiver<u64>,
    /// The thread, joined when the store goes (it runs what was queued, then ends).
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    /// Steps run (batches), for tests and figures.
    batches: std::sync::Arc<AtomicU64>,
}

impl Background {
    /// Starts the thread; it connects when the first step comes.
    pub(crate) fn start(connect: Connect) -> Result<Background, StoreError> {
        let (sender, jobs) = mpsc::channel::<Job>();
        let (done_tx, done) = tokio::sync::watch::channel(0u64);
        let batches = std::sync::Arc::new(AtomicU64::new(0));
        let counted = batches.clone();
        let thread = thread::Builder::new()
            .name("threadgate-pg-after-commit".into())
            .spawn(move || run(&connect, &jobs, &done_tx, &counted))
            .map_err(|e| StoreError::Commit(format!("cannot start the background thread: {e}")))?;
        Ok(Background {
            queue: Mutex::new((Some(sender), 0)),
            done,
            thread: Mutex::new(Some(thread)),
            batches,
        })
    }

    /// Queues `run` (a write has committed).
    pub(crate) fn queue(&self, key: &'static str, run: AfterCommit) {
        let mut queue = lock(&self.queue);
        let seq = queue.1 + 1;
        let Some(sender) = queue.0.as_ref() else {
            return;
        };
        if sender.send(Job { seq, key, run }).is_ok() {
            queue.1 = seq;
        } else {
            tracing::warn!(
                step = key,
                "the background thread is gone; a later step does this one's work"
            );
        }
    }

    /// Resolves once every step queued before this call has run (or was given up).
    pub(crate) async fn settled(&self) {
        let target = lock(&self.queue).1;
        let mut done = self.done.clone();
        // An error means the thread ended: nothing more will run.
        let _ = done.wait_for(|d| *d >= target).await;
    }

    /// Batches of steps run so far.
    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Closes the queue and waits for the thread to run what was queued.
    pub(crate) fn stop(&self) {
        drop(lock(&self.queue).0.take());
        if let Some(thread) = lock(&self.thread).take()
            && thread.join().is_err()
        {
            tracing::error!("the database's background thread panicked");
        }
    }
}

/// The thread: waits for a job, takes every job queued then, keeps the last of each
/// key, runs them in order, and says how far it got.
fn run(
    connect: &Connect,
    jobs: &mpsc::Receiver<Job>,
    done: &tokio::sync::watch::Sender<u64>,
    batches: &AtomicU64,
) {
    let mut client: Option<Client> = None;
    let cache = RefCell::new(StatementCache::default());
    while let Ok(first) = jobs.recv() {
        let mut last = first.seq;
        let mut steps: Vec<(&'static str, AfterCommit)> = vec![(first.key, first.run)];
        while let Ok(job) = jobs.try_recv() {
            last = job.seq;
            steps.retain(|(k, _)| *k != job.key);
            steps.push((job.key, job.run));
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            *cache.borrow_mut() = StatementCache::default();
            client = match connect() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "the background thread cannot connect; a later step does this work");
                    None
                }
            };
        }
        if let Some(client) = client.as_mut() {
            for (key, step) in steps {
                run_after_commit(client, &cache, key, step);
            }
            batches.fetch_add(1, Ordering::Relaxed);
        }
        done.send_replace(last);
    }
}

/// Runs a step registered with [`Conn::after_postgres_commit`] in a READ COMMITTED
/// transaction of its own on `client`, and commits it. A failure is logged: the write
/// before it has committed, and what the step leaves undone is left for a later one
/// (the audit chain's step chains every row waiting).
pub(super) fn run_after_commit(
    client: &mut Client,
    cache: &RefCell<StatementCache>,
    key: &'static str,
    step: AfterCommit,
) {
    let _span = tracing::trace_span!("pg.after_commit", key).entered();
    super::counts::bump(super::counts::Event::RoundTrip);
    let tx = match client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
    {
        Ok(tx) => tx,
        Err(e) => {
            tracing::warn!(step = key, error = %e, "cannot begin a step after a commit");
            return;
        }
    };
    let conn = Conn::postgres(tx, cache);
    let done = step(&conn);
    let Some(PgParts { tx, .. }) = conn.into_postgres() else {
        return;
    };
    let done = done.and_then(|()| {
        super::counts::bump(super::counts::Event::RoundTrip);
        tx.commit().map_err(SqlError::Postgres)
    });
    if done.is_ok() {
        super::counts::bump(super::counts::Event::Commit);
    }
    if let Err(e) = done {
        tracing::warn!(step = key, error = %e, "a step after a commit failed; a later one does its work");
    }
}
