//! The supervisor actor: the one place a session's state changes.
//!
//! The actor itself is here: its state, the messages it serves, and the decisions it
//! takes one at a time. Around it: `parts` (what it drives), `handle` (its mailbox),
//! `events` (applying a thread's events in one transaction), `lifecycle` (starting
//! and stopping containers, off the actor), `checkpoint` (committing and pushing a
//! running session's worktree, off the actor, as an operation in flight) and
//! `ownership` (the session leases).
//!
//! Several instances may share one database: a thread's session is acted on only by
//! the instance holding its lease, and every write the actor makes for a thread
//! carries the lease's fencing token, so the database refuses a stale owner's write.

mod checkpoint;
mod checkpoint_answer;
mod events;
mod handle;
mod inbox;
mod lifecycle;
mod ownership;
mod parts;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};

pub use self::checkpoint::{Checkpoint, CheckpointError, MIN_AGENT_GAP_MS, PushState};
use self::events::{Want, apply_events};
pub use self::handle::SupervisorHandle;
use self::handle::{Msg, Outcome, lock};
pub use self::inbox::SupervisorInbox;
use self::lifecycle::{scope_of, start_session, stop_session};
pub use self::parts::SupervisorParts;
use crate::ids::ThreadId;
use crate::session::SessionError;
use crate::session::store::{self, SessionRow, SessionState};
use crate::store::leases::Lease;
use crate::webhook::store as event_store;
use crate::workspace::volume;

/// How often the supervisor looks for idle sessions, stop requests and free slots.
const TICK: Duration = Duration::from_millis(500);
/// How long one tick may spend applying stored events (see `apply_all_pending`).
const TICK_APPLY_BUDGET: Duration = Duration::from_secs(1);
/// How soon a reconciliation whose database read failed is tried again.
const RECONCILE_RETRY_MS: i64 = 5_000;

/// The actor's state.
pub struct Supervisor {
    parts: Arc<SupervisorParts>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    activity: Arc<Mutex<HashMap<ThreadId, i64>>>,
    feed: broadcast::Sender<ThreadId>,
    /// Threads with an operation in flight, and whether events came meanwhile.
    busy: HashMap<ThreadId, bool>,
    /// Threads holding a container slot (starting or running).
    slots: HashSet<ThreadId>,
    quiet_waiters: Vec<oneshot::Sender<()>>,
    last_reconcile_ms: i64,
    checkpoints: checkpoint::Checkpoints,
    /// Each thread's worktree lock and its syncs (`sync.rs`).
    syncs: sync::Syncs,
    /// The session leases this instance holds, shared with their renewal task.
    leases: ownership::Held,
    /// Whether a pass of the secrets reaper is running (at most one at a time).
    reaping: Arc<std::sync::atomic::AtomicBool>,
    /// Whether a tick waits in the mailbox (the ticker sends no second one).
    tick_queued: Arc<std::sync::atomic::AtomicBool>,
}

impl Supervisor {
    async fn run(mut self) {
        self.reclaim().await;
        ownership::spawn_renewal(
            &self.parts.tasks,
            (self.parts.db.clone(), self.parts.clock.clone()),
            self.leases.clone(),
            self.tx.clone(),
            (
                self.parts.settings.renew_every(),
                self.parts.settings.lease_time,
            ),
        );
        let lease_time = self.parts.settings.lease_time;
        ownership::spawn_lapse_watch(
            self.parts.clone(),
            self.leases.clone(),
            self.tx.clone(),
            (
                ownership::lapse_watch_every(lease_time),
                ownership::lapse_margin(lease_time),
            ),
        );
        self.reconcile().await;
        if let Some(pool) = &self.parts.pool {
            let tasks = self.parts.tasks.clone();
            self.parts
                .tasks
                .spawn_until_shutdown(pool.clone().run(tasks));
        }
        self.apply_all_pending(Duration::MAX).await;
        let (ticker_tx, tick_queued) = (self.tx.clone(), self.tick_queued.clone());
        // Ends at the shutdown signal, or when the actor has stopped. One tick waits in
        // the mailbox at most: a tick that ran long is not followed by all those missed.
        self.parts.tasks.spawn_until_shutdown(async move {
            let mut interval = tokio::time::interval(TICK);
            loop {
                interval.tick().await;
                if tick_queued.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                if ticker_tx.send(Msg::Tick).is_err() {
                    break;
                }
            }
        });
        while let Some(msg) = self.rx.recv().await {
            if matches!(msg, Msg::Shutdown) {
                break;
            }
            self.handle(msg).await;
            if self.busy.is_empty() && self.rx.is_empty() {
                for waiter in self.quiet_waiters.drain(..) {
                    let _ = waiter.send(());
                }
            }
        }
    }

    fn now(&self) -> i64 {
        self.parts.clock.now_ms()
    }

    async fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Thread(thread) => self.apply_thread(&thread).await,
            Msg::Resume(thread) => self.resume(&thread).await,
            Msg::Done { thread, outcome } => self.finish(&thread, outcome).await,
            Msg::Stop { thread, reply } => {
                let result = self.stop_thread(&thread).await;
                let _ = reply.send(result);
            }
            Msg::StopSoon { thread, why } => {
                if let Err(e) = self.stop_thread(&thread).await {
                    tracing::warn!(thread = %thread, why, error = %e, "cannot stop the session");
                }
            }
            Msg::Checkpoint { thread, reply } => self.checkpoint_asked(&thread, reply).await,
            Msg::WhenQuiet(reply) => self.quiet_waiters.push(reply),
            Msg::Tick => {
                self.tick_queued
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                self.tick().await;
            }
            Msg::LeaseLost(lease) => self.renewal_refused(&lease),
            Msg::LeaseLapsing(lease) => self.lease_lapsed(&lease),
            Msg::Reconcile => self.reconcile().await,
            Msg::Shutdown => {}
        }
    }

    /// Applies the pending events of every thread this instance owns or no one owns
    /// (an event stored by any instance is applied by the thread's owner), oldest first,
    /// until `budget` has passed: the rest wait for the next tick, so that a backlog
    /// (a burst, a dead instance's stored events) never holds the tick's other duties,
    /// takeovers among them, for longer than that.
    async fn apply_all_pending(&mut self, budget: Duration) {
        let began = std::time::Instant::now();
        let (me, now) = (self.parts.instance_id.clone(), self.now());
        let threads = self
            .parts
            .db
            .read(move |c| event_store::threads_with_pending_events(c, &me, now))
            .await;
        match threads {
            Ok(threads) => {
                for thread in threads {
                    if began.elapsed() >= budget {
                        break;
                    }
                    self.apply_thread(&thread).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot read pending events"),
        }
    }

    /// Applies a thread's unapplied events in the order they happened, then does what
    /// the result asks: start or resume its session, or end it.
    #[tracing::instrument(name = "supervisor", skip_all, fields(thread_id = %thread))]
    async fn apply_thread(&mut self, thread: &ThreadId) {
        if let Some(dirty) = self.busy.get_mut(thread) {
            *dirty = true;
            return;
        }
        if self.lease_for(thread).await.is_none() {
            // Another instance owns the thread: its tick applies the stored events.
            tracing::debug!(thread = %thread, "the thread's lease is held elsewhere");
            return;
        }
        let now = self.now();
        let default_agent = self.parts.default_agent.clone();
        let branch = self.parts.workspaces.branch_name(thread);
        let applied = self
            .fenced(thread, "apply events", move |conn, lease| {
                apply_events(conn, lease, &default_agent, &branch, now)
            })
            .await;
        let Some(want) = applied else {
            self.release_if_unused(thread).await;
            return;
        };
        match want {
            Want::Nothing => {}
            Want::Fed => {
                self.touch(thread);
                let _ = self.feed.send(thread.to_owned());
            }
            Want::Live => {
                self.touch(thread);
                let _ = self.feed.send(thread.to_owned());
                self.ensure_live(thread).await;
            }
            Want::End => {
                if let Err(e) = self.stop_thread(thread).await {
                    tracing::error!(thread = %thread, error = %e, "cannot end session");
                }
            }
        }
        self.release_if_unused(thread).await;
    }

    async fn resume(&mut self, thread: &ThreadId) {
        if let Some(dirty) = self.busy.get_mut(thread) {
            *dirty = true;
            return;
        }
        if let Some(row) = self.session(thread).await
            && row.state == SessionState::Idle
        {
            self.touch(thread);
            self.try_start(row).await;
        }
    }

    fn touch(&self, thread: &ThreadId) {
        lock(&self.activity).insert(thread.to_owned(), self.now());
    }

    /// Starts or resumes the thread's container unless it has one.
    async fn ensure_live(&mut self, thread: &ThreadId) {
        let row = match self.session(thread).await {
            Some(row) => row,
            None => return,
        };
        match row.state {
            SessionState::Running | SessionState::Starting if self.slots.contains(thread) => {}
            _ => self.try_start(row).await,
        }
    }

    async fn session(&self, thread: &ThreadId) -> Option<SessionRow> {
        let thread = thread.to_owned();
        match self.parts.db.read(move |c| store::get(c, &thread)).await {
            Ok(row) => row,
            Err(e) => {
                tracing::error!(error = %e, "cannot read session");
                None
            }
        }
    }

    /// Records the session's state under its lease; `false` when it was not recorded
    /// (refused by the lease, which drops the session here, or a failed write).
    async fn set_state(
        &mut self,
        thread: &ThreadId,
        state: SessionState,
        container: Option<String>,
    ) -> bool {
        let now = self.now();
        self.fenced(thread, "record session state", move |c, lease| {
            store::set_state(c, lease, state, container.as_deref(), now)
        })
        .await
        .is_some()
    }

    /// Whether the data disk is below its reserve: new sessions then wait, so the
    /// database (webhooks, decisions) keeps room to write.
    fn disk_low(&self) -> bool {
        let reserve = self.parts.settings.disk_reserve_bytes;
        let data_dir = self
            .parts
            .sockets_dir
            .parent()
            .unwrap_or(&self.parts.sockets_dir);
        let low = reserve > 0 && volume::free_bytes(data_dir).is_ok_and(|free| free < reserve);
        if low {
            tracing::warn!(
                reserve,
                "data disk below its free-space reserve; new sessions wait"
            );
        }
        low
    }

    /// Ends the running sessions whose workspace filesystem is full. Runs at every tick:
    /// with the limit off (`workspace_bytes = 0`) no workspace is a filesystem of its
    /// own and nothing is read; otherwise the running sessions are read once, not one
    /// read per slot (a hundred sessions on Postgres made that two hundred round trips a
    /// second on the actor, ahead of takeovers and new threads).
    async fn stop_full_workspaces(&mut self) {
        if self.parts.settings.workspace_bytes == 0 || self.slots.is_empty() {
            return;
        }
        let running = match self
            .parts
            .db
            .read(|c| store::in_states(c, &[SessionState::Running]))
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the running sessions; workspaces checked next tick");
                return;
            }
        };
        let full: Vec<SessionRow> = running
            .into_iter()
            .filter(|row| {
                self.slots.contains(&row.thread_id) && !self.busy.contains_key(&row.thread_id)
            })
            .filter(|row| {
                row.worktree
                    .as_deref()
                    .is_some_and(|w| volume::is_full(std::path::Path::new(w)))
            })
            .collect();
        let reason = super::StopReason::WorkspaceFull {
            limit_bytes: self.parts.settings.workspace_bytes,
        };
        for row in full {
            let thread = row.thread_id.clone();
            tracing::warn!(thread = %thread, "workspace full; stopping the session");
            self.note_stop(&row, &reason).await;
            if let Err(e) = self.stop_thread(&thread).await {
                tracing::warn!(thread = %thread, error = %e, "cannot stop a session with a full workspace");
            }
        }
    }

    /// Queues the note saying why the supervisor stops `row`'s session. A note that
    /// cannot be queued is logged; the stop goes ahead (a full disk must not keep a
    /// session running).
    async fn note_stop(&self, row: &SessionRow, reason: &super::StopReason) {
        let (Some(notes), Some(lease)) = (&self.parts.notes, self.held(&row.thread_id)) else {
            return;
        };
        if let Err(e) = notes.stopped(&scope_of(row, lease), reason).await {
            let thread = &row.thread_id;
            tracing::warn!(thread = %thread, error = %e, "cannot queue the note for a stopped session");
        }
    }

    /// Whether sessions are paused. A failed read counts as paused: nothing starts on
    /// an answer the database did not give.
    async fn paused(&self) -> bool {
        match self.parts.db.read(store::paused).await {
            Ok(paused) => paused,
            Err(e) => {
                tracing::error!(error = %e, "cannot read whether sessions are paused; starting none");
                true
            }
        }
    }

    /// Starts the session's container if this instance holds (or gets) the thread's
    /// lease, a slot is free and sessions are not paused; otherwise leaves it queued
    /// (durably) for a slot, here or on another instance.
    async fn try_start(&mut self, row: SessionRow) {
        let thread = row.thread_id.clone();
        if self.busy.contains_key(&thread) {
            return;
        }
        let fresh = self.held(&thread).is_none();
        let Some(lease) = self.lease_for(&thread).await else {
            return;
        };
        // A lease just acquired: the row was read before it, and another owner may have
        // moved the session on meanwhile.
        let row = if fresh {
            match self.session(&thread).await {
                Some(now) if now.state == row.state => now,
                _ => {
                    self.release_if_unused(&thread).await;
                    return;
                }
            }
        } else {
            row
        };
        if self.slots.len() >= self.parts.settings.max_live
            || self.paused().await
            || self.disk_low()
        {
            if row.state != SessionState::Queued {
                self.set_state(&thread, SessionState::Queued, None).await;
            }
            self.release_if_unused(&thread).await;
            return;
        }
        self.slots.insert(thread.clone());
        self.busy.insert(thread.clone(), false);
        if !self.set_state(&thread, SessionState::Starting, None).await {
            self.busy.remove(&thread);
            self.slots.remove(&thread);
            self.release_if_unused(&thread).await;
            return;
        }
        let parts = self.parts.clone();
        let tx = self.tx.clone();
        let span = tracing::info_span!("session_start", thread_id = %row.thread_id, session_id = %row.session_id);
        let start = async move {
            let began = std::time::Instant::now();
            let outcome = match start_session(&parts, &row, lease).await {
                Ok((container_id, worktree)) => Outcome::Started {
                    container_id,
                    worktree,
                },
                Err(e) => Outcome::StartFailed(format!("{e:#}")),
            };
            let ok = matches!(outcome, Outcome::Started { .. });
            crate::metrics::session_start(ok, began.elapsed());
            let took_ms = crate::clock::ms_u64(began.elapsed());
            tracing::info!(ok, took_ms, "session start finished");
            let _ = tx.send(Msg::Done {
                thread: row.thread_id,
                outcome,
            });
        };
        self.parts
            .tasks
            .spawn(tracing::Instrument::instrument(start, span));
    }

    /// Stops the thread's container (if any), commits its worktree and ends the session.
    async fn stop_thread(&mut self, thread: &ThreadId) -> Result<(), SessionError> {
        let row = self
            .session(thread)
            .await
            .ok_or_else(|| SessionError::UnknownThread(thread.to_string()))?;
        if row.state == SessionState::Ended {
            return Ok(());
        }
        if self.busy.contains_key(thread) || self.lease_for(thread).await.is_none() {
            // With an operation in flight, or owned by another instance: the flag asks
            // the owner's tick to end it.
            // Ended by the tick once the current operation reports back; the flag is
            // what remembers it (a re-applied thread has no event left saying so).
            let t = thread.to_owned();
            self.parts
                .db
                .write(move |c| store::request_stop(c, &t))
                .await?;
            return Ok(());
        }
        self.spawn_stop(row, true);
        Ok(())
    }

    fn spawn_stop(&mut self, mut row: SessionRow, end: bool) {
        let lease = self.held(&row.thread_id);
        if !self.slots.contains(&row.thread_id) {
            // Not a container this instance runs (a session taken over from an owner
            // that died): nothing of it is here to stop.
            row.container_id = None;
        }
        self.busy.insert(row.thread_id.clone(), false);
        let parts = self.parts.clone();
        let tx = self.tx.clone();
        let worktree = self.syncs.lock_of(&row.thread_id);
        let span = tracing::info_span!("session_stop", thread_id = %row.thread_id, session_id = %row.session_id, end);
        let stop = async move {
            // A sync in flight ends first: it never writes the worktree the stop commits.
            let _worktree = sync::hold(worktree).await;
            let began = std::time::Instant::now();
            let outcome = match stop_session(&parts, &row, end, lease).await {
                Ok(()) => Outcome::Stopped { ended: end },
                Err(e) => Outcome::StopFailed(format!("{e:#}")),
            };
            let ok = matches!(outcome, Outcome::Stopped { .. });
            let took_ms = crate::clock::ms_u64(began.elapsed());
            tracing::info!(ok, took_ms, "session stop finished");
            let _ = tx.send(Msg::Done {
                thread: row.thread_id,
                outcome,
            });
        };
        self.parts
            .tasks
            .spawn(tracing::Instrument::instrument(stop, span));
    }

    async fn finish(&mut self, thread: &ThreadId, outcome: Outcome) {
        let dirty = self.busy.remove(thread).unwrap_or(false);
        match outcome {
            Outcome::Started {
                container_id,
                worktree,
            } => {
                let recorded = self
                    .fenced(thread, "record the session's worktree", move |c, lease| {
                        store::set_worktree(c, lease, &worktree)
                    })
                    .await
                    .is_some()
                    && self
                        .set_state(thread, SessionState::Running, Some(container_id))
                        .await;
                if self.held(thread).is_none() {
                    // The lease went elsewhere while the container started: it is the
                    // new owner's session now; this container goes (unless a refused
                    // write above already sent it).
                    if !self.busy.contains_key(thread) {
                        self.spawn_drop(thread);
                    }
                    return;
                }
                if recorded {
                    self.touch(thread);
                    tracing::info!(thread = %thread, "session running");
                }
            }
            Outcome::StartFailed(error) => {
                self.slots.remove(thread);
                tracing::error!(thread = %thread, error = %error, "session failed to start; will retry");
                let now = self.now();
                if self.held(thread).is_some() {
                    self.fenced(thread, "record the failed start", move |c, lease| {
                        store::record_failure(c, lease, &error, now)
                    })
                    .await;
                }
                self.release_if_unused(thread).await;
            }
            Outcome::Stopped { ended } => {
                self.slots.remove(thread);
                let state = if ended {
                    SessionState::Ended
                } else {
                    SessionState::Idle
                };
                if self.held(thread).is_some() && self.set_state(thread, state, None).await {
                    tracing::info!(thread = %thread, state = state.as_str(), "session stopped");
                }
                self.release_if_unused(thread).await;
                self.start_queued().await;
            }
            Outcome::StopFailed(error) => {
                tracing::error!(thread = %thread, error = %error, "stopping session failed; will retry");
            }
            Outcome::Checkpointed { push } => self.checkpointed(thread, push),
            Outcome::Dropped => {
                self.slots.remove(thread);
                self.release_if_unused(thread).await;
                tracing::info!(thread = %thread, "session dropped here; its new owner runs it");
                return;
            }
        }
        if dirty {
            self.apply_thread(thread).await;
        }
    }

    /// Starts queued sessions while slots are free (oldest first), skipping those
    /// still backing off after a failed start.
    async fn start_queued(&mut self) {
        if self.slots.len() >= self.parts.settings.max_live
            || self.paused().await
            || self.disk_low()
        {
            return;
        }
        let queued = match self
            .parts
            .db
            .read(|c| store::in_states(c, &[SessionState::Queued]))
            .await
        {
            Ok(queued) => queued,
            Err(e) => {
                // Nothing starts on an unknown queue; the next tick reads it again.
                tracing::error!(error = %e, "cannot read queued sessions; retried next tick");
                return;
            }
        };
        let now = self.now();
        for row in queued {
            if self.slots.len() >= self.parts.settings.max_live {
                break;
            }
            let retry_at = crate::retry::SESSION_START.next_at_ms(row.updated_at_ms, row.attempts);
            if row.attempts > 0 && retry_at > now {
                continue;
            }
            self.try_start(row).await;
        }
    }

    async fn tick(&mut self) {
        let now = self.now();
        // Operators' stop requests.
        let (me, at) = (self.parts.instance_id.clone(), now);
        let stops = match self
            .parts
            .db
            .read(move |c| store::stop_requests_for(c, &me, at))
            .await
        {
            Ok(stops) => stops,
            Err(e) => {
                // The requests stay stored; the next tick reads them again.
                tracing::error!(error = %e, "cannot read stop requests; retried next tick");
                Vec::new()
            }
        };
        for thread in stops {
            if !self.busy.contains_key(&thread)
                && let Err(e) = self.stop_thread(&thread).await
            {
                tracing::warn!(thread = %thread, error = %e, "cannot stop session");
            }
        }
        // Quiet sessions give up their container.
        let idle_ms = crate::clock::ms(self.parts.settings.idle_timeout);
        let quiet: Vec<ThreadId> = {
            let activity = lock(&self.activity);
            self.slots
                .iter()
                .filter(|t| !self.busy.contains_key(*t))
                .filter(|t| activity.get(*t).is_some_and(|at| now - at >= idle_ms))
                .cloned()
                .collect()
        };
        for thread in quiet {
            if let Some(row) = self.session(&thread).await
                && row.state == SessionState::Running
            {
                tracing::info!(thread = %thread, "session idle; stopping its container");
                self.spawn_stop(row, false);
            }
        }
        self.stop_full_workspaces().await;
        self.checkpoints_due().await;
        self.syncs_due().await;
        // A dead owner's live sessions first: its customers have no agent meanwhile.
        self.take_over_unowned().await;
        // Events stored by any instance for threads this one owns (or no one owns).
        self.apply_all_pending(TICK_APPLY_BUDGET).await;
        self.start_queued().await;
        if now - self.last_reconcile_ms >= self.parts.settings.reconcile_every_ms() {
            self.reconcile().await;
        }
    }

    /// Makes containers match the database: adopts the containers of live sessions
    /// whose lease this instance holds (or gets), removes every other container
    /// labelled with this instance (by lease, not by label alone: a thread whose lease
    /// another instance holds is that instance's), resumes the live sessions it owns
    /// whose container vanished, and releases the leases of threads it has nothing of.
    ///
    /// Both inputs must be known: a failed read of either skips the whole pass (nothing
    /// stopped, removed or resumed) and it is tried again after [`RECONCILE_RETRY_MS`].
    async fn reconcile(&mut self) {
        let now = self.now();
        self.last_reconcile_ms = now;
        let retry_at = now
            .saturating_sub(self.parts.settings.reconcile_every_ms())
            .saturating_add(RECONCILE_RETRY_MS);
        let containers = match self.parts.sandbox.list().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot list containers; reconcile skipped");
                self.last_reconcile_ms = retry_at;
                return;
            }
        };
        // INVARIANT: an empty list here means no session is live, never that the read
        // failed: every container not in it is stopped below.
        let live = match self
            .parts
            .db
            .read(|c| store::in_states(c, &[SessionState::Starting, SessionState::Running]))
            .await
        {
            Ok(live) => live,
            Err(e) => {
                tracing::error!(error = %e, "cannot read live sessions; reconcile skipped");
                self.last_reconcile_ms = retry_at;
                return;
            }
        };
        let by_session: HashMap<&str, &SessionRow> =
            live.iter().map(|r| (r.session_id.as_str(), r)).collect();
        let mut adopted: HashSet<ThreadId> = HashSet::new();
        let mut strays = Vec::new();
        for c in &containers {
            if self.busy.contains_key(c.thread_id.as_str()) {
                continue;
            }
            let owner = by_session.get(c.session_id.as_str());
            let ours = owner.is_some_and(|r| {
                r.state == SessionState::Running
                    && r.container_id.as_deref() == Some(c.container_id.as_str())
            });
            let leased = match owner {
                Some(row) if ours && c.running => self.lease_for(&row.thread_id).await,
                _ => None,
            };
            if let Some(lease) = leased
                && let Some(row) = owner
            {
                // The session's own row names the thread (its container's label says
                // the same: both were written from it).
                adopted.insert(row.thread_id.clone());
                if self.slots.insert(row.thread_id.clone()) {
                    crate::metrics::reconcile("adopted", 1);
                    self.reopen_api(row, lease).await;
                    self.touch(&row.thread_id);
                }
                continue;
            }
            tracing::warn!(container = %c.container_id, thread = %c.thread_id, "removing a container without a live session");
            strays.push(c.container_id.as_str());
        }
        // Each stop waits out the container's grace period: stop them all at once, so
        // that N strays hold the actor for one grace period rather than N.
        crate::metrics::reconcile("reaped", strays.len());
        let sandbox = &self.parts.sandbox;
        let stops = strays
            .iter()
            .map(|id| async move { (id, sandbox.stop(id).await) });
        for (container, result) in futures::future::join_all(stops).await {
            if let Err(e) = result {
                tracing::error!(container = %container, error = %e, "cannot remove container");
            }
        }
        self.spawn_secrets_reaper();
        for row in live {
            if adopted.contains(&row.thread_id)
                || self.busy.contains_key(&row.thread_id)
                || self.held(&row.thread_id).is_none()
            {
                // Another instance's (or no one's: the tick takes those over).
                continue;
            }
            if row.stop_requested {
                // Ending, not resuming: the tick stops it and commits its work.
                continue;
            }
            tracing::warn!(thread = %row.thread_id, "session lost its container; resuming");
            crate::metrics::reconcile("resumed", 1);
            self.slots.remove(&row.thread_id);
            self.parts.api.close(&row.session_id).await;
            self.try_start(row).await;
        }
        self.release_unused().await;
    }

    /// Secret files of sessions whose container is gone (a crash mid-start, a container
    /// removed behind threadgate's back) must not stay on the host: reaped off the actor,
    /// one pass at a time. The reaper waits until no container start is in flight (the
    /// runtime's start gate); on the actor, a burst of slow starts held the supervisor
    /// that long (15 s and more on a loaded machine), and with it every takeover and new
    /// thread.
    fn spawn_secrets_reaper(&self) {
        if self.reaping.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (sandbox, reaping) = (self.parts.sandbox.clone(), self.reaping.clone());
        let reap = async move {
            match sandbox.reap_orphan_secrets().await {
                Ok(0) => {}
                Ok(removed) => {
                    crate::metrics::reconcile("secrets_reaped", removed);
                    tracing::warn!(removed, "removed secrets directories without a container")
                }
                Err(e) => tracing::error!(error = %e, "cannot reap secrets directories"),
            }
            reaping.store(false, std::sync::atomic::Ordering::SeqCst);
        };
        self.parts.tasks.spawn(tracing::Instrument::instrument(
            reap,
            tracing::info_span!("secrets_reaper"),
        ));
    }

    async fn reopen_api(&self, row: &SessionRow, lease: Lease) {
        let dir = self.parts.sockets_dir.join(&row.session_id);
        if let Err(e) = self.parts.api.open(scope_of(row, lease), dir).await {
            tracing::error!(thread = %row.thread_id, error = %e, "cannot reopen the session's socket");
        }
    }
}
