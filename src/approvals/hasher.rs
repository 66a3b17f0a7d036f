//! Bounded argon2id: at most a few password hashes are computed at once, and only a
//! bounded number of callers may wait for a turn.
//!
//! argon2id costs ~19 MiB and tens of milliseconds per hash by design. Unbounded, a
//! flood of sign-in attempts becomes a memory flood (issue 7 item 5: 400 parallel
//! requests reached 7.7 GB). Here at most `permits` hashes run at any moment, so their
//! memory is at most `permits` x 19 MiB; a caller beyond `max_waiting` queued ones is
//! told [`HashError::Busy`] at once instead of queueing. Counters make the bound
//! observable to tests and operators.
//!
//! The memory itself is allocated once per turn and reused ([`memory`]): freed after
//! each hash, it stayed with the allocator and a sign-in flood grew the process by
//! hundreds of MiB per burst (issue 17 item 4).

mod memory;

use crate::secrets::ExposeSecret as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use memory::BlockPool;
pub use memory::MAX_M_COST_KIB;

use crate::secrets::SecretString;

/// Hashes computed at once by the server's pool.
pub const GLOBAL_PERMITS: usize = 2;
/// Callers that may wait for a turn on the server's pool.
pub const GLOBAL_MAX_WAITING: usize = 32;

/// Why a hash was not computed.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// Too many callers already wait; try again later.
    #[error("too many password checks at once; try again in a moment")]
    Busy,
    /// argon2 failed (a broken stored hash or parameters), or the task was lost.
    #[error("cannot hash the password: {0}")]
    Failed(String),
}

/// A bounded pool for argon2id hashing and verification.
#[derive(Debug)]
pub struct Hasher {
    turns: Semaphore,
    permits: usize,
    max_waiting: usize,
    waiting: AtomicUsize,
    running: AtomicUsize,
    peak: AtomicUsize,
    started: AtomicUsize,
    /// The hashing memory: at most one buffer per turn, kept between hashes.
    memory: Arc<BlockPool>,
}

/// Decrements a counter when dropped (a cancelled request still gives its place back).
struct Count<'a>(&'a AtomicUsize);

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Hasher {
    /// A pool running at most `permits` hashes, with at most `max_waiting` callers queued.
    pub fn new(permits: usize, max_waiting: usize) -> Hasher {
        let permits = permits.max(1);
        Hasher {
            turns: Semaphore::new(permits),
            permits,
            max_waiting,
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            memory: BlockPool::new(),
        }
    }

    /// A process-wide pool ([`GLOBAL_PERMITS`], [`GLOBAL_MAX_WAITING`]) for callers
    /// without one of their own (the server gives each [`crate::approvals::Approvals`]
    /// its own).
    pub fn global() -> &'static Hasher {
        static GLOBAL: OnceLock<Hasher> = OnceLock::new();
        GLOBAL.get_or_init(|| Hasher::new(GLOBAL_PERMITS, GLOBAL_MAX_WAITING))
    }

    /// The most hashes that may run at once.
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// The most hashes that ever ran at the same moment.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// How many hashes were started in total.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// How many hashing buffers the pool keeps (never more than its permits).
    pub fn buffers(&self) -> usize {
        self.memory.kept()
    }

    /// A standard argon2id PHC hash of `password` (argon2's default parameters).
    pub async fn hash(&self, password: SecretString) -> Result<String, HashError> {
        let memory = self.memory.clone();
        self.run(move || {
            memory
                .hash(password.expose_secret().as_bytes())
                .map_err(|e| HashError::Failed(e.to_string()))
        })
        .await
    }

    /// Whether `password` matches the argon2 PHC hash `phc`. A stored string that is
    /// not a usable argon2 hash is an error, not a mismatch.
    pub async fn verify(&self, password: SecretString, phc: String) -> Result<bool, HashError> {
        let memory = self.memory.clone();
        self.run(move || {
            memory
                .verify(password.expose_secret().as_bytes(), &phc)
                .map_err(|e| HashError::Failed(e.to_string()))
        })
        .await
    }

    /// Runs `work` on the blocking pool once a turn is free.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, HashError> + Send + 'static,
    ) -> Result<T, HashError> {
        let queued = self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Count(&self.waiting);
        if queued >= self.max_waiting + self.permits {
            return Err(HashError::Busy);
        }
        let _turn = self
            .turns
            .acquire()
            .await
            .map_err(|_| HashError::Failed("the hashing pool is closed".into()))?;
        drop(waiting);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        let _running = Count(&self.running);
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        // The turn is held until the blocking task has finished, even when the caller
        // is cancelled meanwhile: awaiting the handle keeps `_turn` alive until then.
        let handle = crate::tasks::Tasks::spawn_blocking(work);
        handle
            .await
            .map_err(|_| HashError::Failed("the hashing task did not finish".into()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_flood_of_verifications_never_runs_more_hashes_than_permits() {
        let hasher = std::sync::Arc::new(Hasher::new(2, 1000));
        let phc = hasher
            .hash(SecretString::from("correct horse battery"))
            .await
            .expect("hash");
        let mut tasks = Vec::new();
        for i in 0..60 {
            let (h, phc) = (hasher.clone(), phc.clone());
            tasks.push(tokio::spawn(async move {
                h.verify(SecretString::from(format!("guess {i}")), phc)
                    .await
            }));
        }
        for t in tasks {
            assert!(!t.await.expect("task").expect("verified"));
        }
        assert_eq!(hasher.started(), 61);
        assert!(hasher.peak() <= 2, "peak {}", hasher.peak());
        assert!(hasher.peak() >= 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn callers_beyond_the_queue_are_told_busy_without_hashing() {
        let hasher = std::sync::Arc::new(Hasher::new(1, 3));
        let phc = hasher.hash(SecretString::from("pw")).await.expect("hash");
        let mut tasks = Vec::new();
        for _ in 0..400 {
            let (h, phc) = (hasher.clone(), phc.clone());
            tasks.push(tokio::spawn(async move {
                h.verify(SecretString::from("wrong"), phc).await
            }));
        }
        let mut busy = 0;
        for t in tasks {
            if matches!(t.await.expect("task"), Err(HashError::Busy)) {
                busy += 1;
            }
        }
        // One runs and three wait at most at any moment: most of the 400 are turned away.
        assert!(busy > 0, "nobody was turned away");
        assert_eq!(hasher.started() - 1, 400 - busy);
        assert_eq!(hasher.peak(), 1);
    }

    /// The pool's hashes are argon2's standard PHC strings: the argon2 crate's own
    /// verifier accepts them, and the pool accepts the crate's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hashes_are_standard_argon2id_phc_strings_both_ways() {
        use argon2::password_hash::PasswordVerifier as _;
        use argon2::{Argon2, PasswordHasher as _};

        let hasher = Hasher::new(2, 8);
        let phc = hasher
            .hash(SecretString::from("correct horse battery"))
            .await
            .expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        let parsed = argon2::PasswordHash::new(&phc).expect("a PHC string");
        assert!(
            Argon2::default()
                .verify_password(b"correct horse battery", &parsed)
                .is_ok()
        );
        assert!(
            Argon2::default()
                .verify_password(b"correct horse batter", &parsed)
                .is_err()
        );

        let theirs = Argon2::default()
            .hash_password(b"made by the crate")
            .expect("hash")
            .to_string();
        let yes = hasher.verify(SecretString::from("made by the crate"), theirs.clone());
        assert!(yes.await.expect("verify"));
        let no = hasher.verify(SecretString::from("made by the crat"), theirs);
        assert!(!no.await.expect("verify"));
    }

    /// Other parameters than the default (an older hash) are read from the string.
    #[tokio::test]
    async fn a_hash_with_other_parameters_is_checked_with_them() {
        use argon2::{Algorithm, Argon2, Params, PasswordHasher as _, Version};

        let params = Params::new(4096, 3, 1, Some(16)).expect("params");
        let theirs = Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password(b"older password")
            .expect("hash")
            .to_string();
        let hasher = Hasher::new(1, 4);
        let yes = hasher.verify(SecretString::from("older password"), theirs.clone());
        assert!(yes.await.expect("verify"));
        let no = hasher.verify(SecretString::from("older passwort"), theirs);
        assert!(!no.await.expect("verify"));
    }

    #[tokio::test]
    async fn a_stored_string_that_is_no_argon2_hash_is_an_error_not_a_mismatch() {
        let hasher = Hasher::new(1, 4);
        for stored in [
            "",
            "sha256:abcd",
            "$argon2id$v=19$m=999999999,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
        ] {
            let checked = hasher.verify(SecretString::from("pw"), stored.into()).await;
            assert!(
                matches!(checked, Err(HashError::Failed(_))),
                "{stored}: {checked:?}"
            );
        }
    }

    /// Issue 17 item 4: every hash allocated its ~19 MiB afresh and the allocator kept
    /// what was freed. Now the memory is one buffer per turn, reused: a flood of 60
    /// checks on a pool of 2 turns leaves at most 2 buffers, whatever the threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_flood_reuses_at_most_one_buffer_per_turn() {
        let hasher = std::sync::Arc::new(Hasher::new(2, 1000));
        let phc = hasher
            .hash(SecretString::from("pw for the flood"))
            .await
            .expect("hash");
        assert_eq!(hasher.buffers(), 1);
        let mut tasks = Vec::new();
        for i in 0..60 {
            let (h, phc) = (hasher.clone(), phc.clone());
            tasks.push(tokio::spawn(async move {
                h.verify(SecretString::from(format!("guess {i}")), phc)
                    .await
            }));
        }
        for t in tasks {
            assert!(!t.await.expect("task").expect("verified"));
        }
        assert!(
            (1..=2).contains(&hasher.buffers()),
            "{} buffers",
            hasher.buffers()
        );
    }
}
