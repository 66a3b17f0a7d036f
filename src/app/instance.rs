//! This process as one instance among several on a database: its data directory's
//! lock, its instance id (kept per data directory, never a shared row), its
//! registration in the instance registry and its heartbeat.

use std::time::Duration;

use anyhow::Context;

use crate::clock::Clock;
use crate::config::Settings;
use crate::store::Db;
use crate::store::instances::{self, Registration};
use crate::store::meta;
use crate::tasks::Tasks;

/// This process's instance id: `instance_id` when configured; else the id kept in the
/// data directory (`instance_id` file); else, at the first start of a data directory,
/// the id an earlier version kept in the database's `meta` (taken once, so its
/// containers are adopted; a second instance on the same database gets a fresh id), or
/// a fresh one; then kept in the data directory. Never a shared row: every instance on
/// one database would read the same one.
pub(super) async fn instance_id(db: &Db, settings: &Settings) -> anyhow::Result<String> {
    if let Some(id) = &settings.instance_id {
        return Ok(id.clone());
    }
    let path = settings.instance_id_path();
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            anyhow::ensure!(
                !id.is_empty()
                    && id.len() <= 64
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{}: not an instance id (ASCII letters, digits, `_` and `-`, at most 64); \
                 remove the file to generate a new one, or set instance_id",
                path.display()
            );
            return Ok(id.to_owned());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    // `build` runs inside the runtime: a blocking write would panic there.
    let earlier = db
        .write(|c| meta::take(c, meta::INSTANCE_ID))
        .await
        .context("cannot read the instance id an earlier version kept")?;
    let id = earlier
        .unwrap_or_else(|| format!("tg{}", &uuid::Uuid::new_v4().simple().to_string()[..10]));
    let partial = path.with_extension("partial");
    std::fs::write(&partial, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&partial, &path))
        .with_context(|| format!("cannot keep the instance id in {}", path.display()))?;
    Ok(id)
}

/// How long a start waits for the data directory's lock (a crashed process's descriptor
/// may take a moment to close) before refusing.
const DATA_DIR_LOCK_WAIT: Duration = Duration::from_secs(5);

/// This process's claim on its data directory: an exclusive lock on
/// `<data_dir>/instance.lock`, held while the application lives, whose text is the boot
/// nonce of the process holding it. A process that gets the lock knows the boot named
/// in the file is dead, so it may take that boot's instance id at once (a restart after
/// a crash need not wait out the lease time).
pub(super) struct DataDirLock {
    file: std::fs::File,
    /// The boot nonce the previous holder wrote, if any.
    previous: Option<String>,
}

impl DataDirLock {
    pub(super) async fn take(settings: &Settings) -> anyhow::Result<DataDirLock> {
        use std::io::Read as _;
        let path = settings.data_dir.join("instance.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let deadline = tokio::time::Instant::now() + DATA_DIR_LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                    "data_dir {} is in use by another running threadgate: every instance \
                     needs its own data_dir (several may share one database through \
                     database_file)",
                    settings.data_dir.display()
                ),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("cannot lock {}", path.display()));
                }
            }
        }
        let mut text = String::new();
        file.read_to_string(&mut text)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let previous = Some(text.trim().to_owned()).filter(|t| !t.is_empty());
        Ok(DataDirLock { file, previous })
    }

    /// Records `nonce` as the boot holding the lock.
    fn record(&mut self, nonce: &str) -> anyhow::Result<()> {
        use std::io::{Seek as _, Write as _};
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(nonce.as_bytes())?;
        self.file.sync_all()?;
        Ok(())
    }
}

/// Registers this boot of `instance_id` in the shared database, refusing the start while
/// another live process (a heartbeat fresher than the lease time) holds the same id;
/// the previous boot of this data directory (`lock`) counts as dead.
pub(super) async fn register(
    db: &Db,
    (instance_id, nonce): (&str, &str),
    lock: &mut DataDirLock,
    clock: &Clock,
    lease_time: Duration,
) -> anyhow::Result<()> {
    let now = clock.now_ms();
    let stale_before = now.saturating_sub(crate::clock::ms(lease_time));
    let (id, boot, previous) = (
        instance_id.to_owned(),
        nonce.to_owned(),
        lock.previous.clone(),
    );
    let registered = db
        .write(move |c| {
            instances::register(c, &id, (&boot, previous.as_deref()), now, stale_before)
        })
        .await
        .context("cannot register this instance in the database")?;
    if registered == Registration::Registered {
        lock.record(nonce)
            .context("cannot record this boot in the data directory's lock")?;
    }
    match registered {
        Registration::Registered => Ok(()),
        Registration::Taken { heartbeat_age_ms } => anyhow::bail!(
            "two instances with the same instance id: {instance_id:?} is held by another \
             running threadgate on this database (its heartbeat is {heartbeat_age_ms} ms old, \
             within sessions.lease_time = {}); they would adopt and reap each other's \
             containers. Give each instance its own instance_id (or its own data_dir, where a \
             generated id is kept); if the other instance has just stopped, start again after \
             the lease time",
            humantime::format_duration(lease_time)
        ),
    }
}

/// This boot's heartbeat in the instance registry: what renews it.
#[derive(Clone)]
pub(super) struct Heartbeat {
    db: Db,
    clock: Clock,
    id: String,
    nonce: String,
    every: Duration,
}

impl Heartbeat {
    /// The heartbeat of boot `nonce` of instance `id`, renewed every `every`.
    pub(super) fn new(
        db: &Db,
        clock: &Clock,
        (id, nonce): (String, String),
        every: Duration,
    ) -> Heartbeat {
        Heartbeat {
            db: db.clone(),
            clock: clock.clone(),
            id,
            nonce,
            every,
        }
    }

    /// Renews the heartbeat every `every` for as long as it is polled. A heartbeat the
    /// database refuses means another process took this instance id after this one's
    /// went stale: logged as an error, since the two now share containers.
    pub(super) async fn beat(self) -> std::convert::Infallible {
        let mut interval = tokio::time::interval(self.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let (i, n, now) = (self.id.clone(), self.nonce.clone(), self.clock.now_ms());
            match self
                .db
                .write(move |c| instances::heartbeat(c, &i, &n, now))
                .await
            {
                Ok(true) => {}
                Ok(false) => tracing::error!(
                    instance = %self.id,
                    "another process registered this instance id: two instances with the same instance id"
                ),
                Err(e) => tracing::error!(error = %e, "cannot renew this instance's heartbeat"),
            }
        }
    }
}

/// Renews this boot's heartbeat every third of the lease time until shutdown; the
/// drain at shutdown renews it again until the work in flight is done
/// ([`super::Application::run_until_within`]), so a call this instance is still sending
/// is never taken for a dead instance's by another instance's sweep.
pub(super) fn keep_heartbeat(tasks: &Tasks, heartbeat: &Heartbeat) {
    let heartbeat = heartbeat.clone();
    tasks.spawn_until_shutdown(async move {
        let _ = heartbeat.beat().await;
    });
}
