//! The supervisor's channel, made before the supervisor: every part that needs a
//! [`SupervisorHandle`] gets one at construction, and the actor starts last.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::handle::Msg;
use super::{Supervisor, SupervisorHandle, SupervisorParts};
use crate::clock::Clock;
use crate::ids::ThreadId;

/// The supervisor's mailbox before its task runs: created first, so the gate, the
/// sandbox API and the model proxy get a [`SupervisorHandle`] at construction, and the
/// supervisor (which needs them, through the session sockets) starts last. Messages
/// sent meanwhile wait in the channel.
pub struct SupervisorInbox {
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    activity: Arc<Mutex<HashMap<ThreadId, i64>>>,
    feed: broadcast::Sender<ThreadId>,
}

impl Supervisor {
    /// The supervisor's channel: a handle to give out now, and the inbox
    /// [`Supervisor::start`] serves later.
    pub fn channel(clock: Clock) -> (SupervisorHandle, SupervisorInbox) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (feed, _) = broadcast::channel(1024);
        let activity = Arc::new(Mutex::new(HashMap::new()));
        let handle = SupervisorHandle {
            tx: tx.clone(),
            activity: activity.clone(),
            feed: feed.clone(),
            clock,
        };
        let inbox = SupervisorInbox {
            tx,
            rx,
            activity,
            feed,
        };
        (handle, inbox)
    }

    /// Starts the supervisor on `inbox`: it reconciles containers with the database,
    /// applies every stored event not applied yet, then serves messages until every
    /// handle is dropped.
    pub fn start(parts: SupervisorParts, inbox: SupervisorInbox) -> JoinHandle<()> {
        let sup = Supervisor {
            parts: Arc::new(parts),
            tx: inbox.tx,
            rx: inbox.rx,
            activity: inbox.activity,
            feed: inbox.feed,
            busy: HashMap::new(),
            slots: HashSet::new(),
            quiet_waiters: Vec::new(),
            last_reconcile_ms: 0,
            checkpoints: Default::default(),
            syncs: Default::default(),
            leases: Arc::new(Mutex::new(HashMap::new())),
            reaping: Arc::default(),
            tick_queued: Arc::default(),
        };
        let tasks = sup.parts.tasks.clone();
        tasks.spawn(sup.run())
    }

    /// [`Supervisor::channel`] then [`Supervisor::start`], for parts that need no handle.
    pub fn spawn(parts: SupervisorParts) -> (SupervisorHandle, JoinHandle<()>) {
        let (handle, inbox) = Supervisor::channel(parts.clock.clone());
        (handle, Supervisor::start(parts, inbox))
    }
}
