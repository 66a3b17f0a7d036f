//! Keeping a [`Redactor`] in step with the store: rebuilt when the store's generation
//! counter (bumped by every `set` and `delete`, from any process) has moved.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::{Redactor, SecretStore};

/// Rebuilds a shared redactor from `store` when the store changed since the last build.
#[derive(Debug)]
pub struct RedactorSource {
    store: SecretStore,
    /// The generation the redactor in the slot was built at, plus one (0: never built
    /// by this source).
    built_at: AtomicU64,
}

impl RedactorSource {
    /// A source over `store` whose slot was filled at `generation`, if known.
    pub fn new(store: SecretStore, generation: Option<u64>) -> RedactorSource {
        RedactorSource {
            store,
            built_at: AtomicU64::new(generation.map_or(0, |g| g.saturating_add(1))),
        }
    }

    /// Reads the generation (one small query) and, when it moved, rebuilds the redactor
    /// in `slot`. On a read failure the slot keeps its redactor and the failure is
    /// logged: the next call tries again.
    pub async fn refresh(&self, slot: &RwLock<Arc<Redactor>>) {
        let generation = match self.store.generation().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the secrets' generation");
                return;
            }
        };
        self.refresh_at(generation, slot).await;
    }

    /// As [`RedactorSource::refresh`] with the store's `generation` already read (by the
    /// gate's first look-up of a call, with other marks in the same statement).
    pub async fn refresh_at(&self, generation: u64, slot: &RwLock<Arc<Redactor>>) {
        let mark = generation.saturating_add(1);
        if self.built_at.load(Ordering::Acquire) == mark {
            return;
        }
        let built = match self.store.all_values().await {
            Ok(values) => Redactor::new(values),
            Err(e) => Err(e),
        };
        match built {
            Ok(redactor) => {
                *slot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(redactor);
                self.built_at.store(mark, Ordering::Release);
            }
            Err(e) => tracing::warn!(error = %e, "cannot rebuild the secret redactor"),
        }
    }
}
