//! WAL checkpoints off the writer thread.
//!
//! SQLite's default copies the write-ahead log back into the database file inside the
//! commit that crosses 1,000 pages, on the committing connection: the writer thread then
//! stalls for a checkpoint (a few MiB written and an fsync of the database file) while
//! every caller waits. Here the writer's own threshold is only a backstop
//! ([`WRITER_BACKSTOP_PAGES`]); a separate thread with its own connection runs passive
//! checkpoints, which never block the writer, after every [`JOBS_PER_CHECKPOINT`]
//! committed writes, and at least once a second while anything is left. Durability is
//! unchanged: a write is on disk (in the log, `synchronous=FULL`) when its commit
//! returns, but for `Db::write_unflushed`'s (written to the log, synced by the next
//! synchronous commit or by this thread's checkpoint, which syncs the log first); the
//! checkpoint only moves it into the database file later.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread;
use std::time::Duration;

use rusqlite::Connection;

/// Committed writes after which the checkpointer is woken.
pub(super) const JOBS_PER_CHECKPOINT: u64 = 256;
/// The writer connection's own automatic checkpoint threshold, in pages (64 MiB of 4 KiB
/// pages): reached only if the checkpointer falls far behind, and bounds the log then.
pub(super) const WRITER_BACKSTOP_PAGES: i64 = 16_384;
/// How long the checkpointer waits before checkpointing a few leftover writes.
const IDLE: Duration = Duration::from_secs(1);

/// The writer's handle on the checkpoint thread; dropping it stops the thread and
/// waits for it.
pub(super) struct Checkpointer {
    poke: SyncSender<()>,
    pending: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel wakes the thread, which then ends.
        drop(std::mem::replace(&mut self.poke, sync_channel(0).0));
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the database checkpoint thread panicked");
        }
    }
}

impl Checkpointer {
    /// Opens a connection to `path` and starts the checkpoint thread.
    pub(super) fn start(path: &Path) -> Result<Checkpointer, String> {
        let conn = Connection::open(path).map_err(|e| e.to_string())?;
        conn.busy_timeout(Duration::from_secs(10))
            .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
            .map_err(|e| e.to_string())?;
        let (poke, woken) = sync_channel(1);
        let pending = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&pending);
        let thread = thread::Builder::new()
            .name("threadgate-db-checkpoint".into())
            .spawn(move || run(&conn, &woken, &counted))
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        Ok(Checkpointer {
            poke,
            pending,
            thread: Some(thread),
        })
    }

    /// Tells the checkpointer that `jobs` more writes were committed.
    pub(super) fn committed(&self, jobs: usize) {
        let jobs = u64::try_from(jobs).unwrap_or(u64::MAX);
        let before = self.pending.fetch_add(jobs, Ordering::Relaxed);
        if before.saturating_add(jobs) >= JOBS_PER_CHECKPOINT {
            // A full channel means a wake-up is already due.
            if let Err(TrySendError::Disconnected(())) = self.poke.try_send(()) {
                tracing::warn!("the database checkpoint thread has stopped");
            }
        }
    }
}

fn run(conn: &Connection, woken: &Receiver<()>, pending: &AtomicU64) {
    loop {
        match woken.recv_timeout(IDLE) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if pending.swap(0, Ordering::Relaxed) == 0 {
            continue;
        }
        // A busy or failed passive checkpoint leaves the log as it is; the next one
        // (or the writer's backstop) copies it.
        let checkpointed = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(0)
        });
        if let Err(e) = checkpointed {
            tracing::debug!(error = %e, "passive WAL checkpoint failed");
        }
    }
}
