//! argon2id computed in memory that is kept and reused: one buffer of [`Block`]s per
//! turn of the [`super::Hasher`], allocated once and handed from hash to hash.
//!
//! argon2's own `hash_password` allocates its ~19 MiB afresh for every hash. Freed, that
//! memory stayed with the allocator: 300 sign-ins at once took the server from 27 MiB
//! to 825 MiB and repeated bursts to 1.3 GiB (issue 17 item 4). Here the memory of at
//! most `permits` hashes exists at all, for the life of the pool. The PHC strings made
//! and checked are argon2's standard ones (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`).

use std::sync::{Arc, Mutex};

use argon2::password_hash::phc::{Output, ParamsString, PasswordHash, Salt};
use argon2::{Algorithm, Argon2, Block, Params, RECOMMENDED_SALT_LEN, Version};
use rand::Rng as _;
use zeroize::Zeroize as _;

/// The largest memory a stored hash may ask for, in KiB (64 MiB): more than the
/// default's 19 MiB, far less than what would let a stored string exhaust the host.
pub const MAX_M_COST_KIB: u32 = 64 * 1024;

/// Why a hash could not be computed or a stored one read.
#[derive(Debug, thiserror::Error)]
pub(super) enum MemoryHashError {
    /// The stored string is not an argon2 PHC hash this pool can check.
    #[error("the stored hash is not a usable argon2 PHC string: {0}")]
    Stored(String),
    /// argon2 itself failed.
    #[error("argon2 failed: {0}")]
    Argon2(String),
}

/// Buffers of blocks, at most one per turn of the pool that owns it.
#[derive(Debug, Default)]
pub(super) struct BlockPool {
    free: Mutex<Vec<Vec<Block>>>,
}

impl BlockPool {
    /// An empty pool (buffers are allocated on first use, then kept).
    pub(super) fn new() -> Arc<BlockPool> {
        Arc::new(BlockPool::default())
    }

    /// How many buffers are kept (for tests: never more than the turns).
    pub(super) fn kept(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A buffer, kept from an earlier hash when one is free. The caller holds one of
    /// the pool's turns, so at most that many buffers ever exist.
    fn take(self: &Arc<Self>) -> Lease {
        let blocks = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default();
        Lease {
            pool: self.clone(),
            blocks,
        }
    }

    /// A standard argon2id PHC hash of `password` (argon2's default parameters, a fresh
    /// random salt).
    pub(super) fn hash(self: &Arc<Self>, password: &[u8]) -> Result<String, MemoryHashError> {
        let argon2 = Argon2::default();
        let mut salt = [0u8; RECOMMENDED_SALT_LEN];
        rand::rng().fill_bytes(&mut salt);
        let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
        self.take().compute(&argon2, password, &salt, &mut out)?;
        let phc = PasswordHash {
            algorithm: Algorithm::Argon2id.ident(),
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(argon2.params()).map_err(argon2_error)?,
            salt: Some(Salt::new(&salt).map_err(argon2_error)?),
            hash: Some(Output::new(&out).map_err(argon2_error)?),
        };
        Ok(phc.to_string())
    }

    /// Whether `password` matches the PHC string `phc`, computed with the parameters,
    /// salt and output length it names and compared in constant time.
    pub(super) fn verify(
        self: &Arc<Self>,
        password: &[u8],
        phc: &str,
    ) -> Result<bool, MemoryHashError> {
        let stored = PasswordHash::new(phc).map_err(stored_error)?;
        let algorithm = Algorithm::try_from(stored.algorithm.as_str()).map_err(stored_error)?;
        let version = stored
            .version
            .map(Version::try_from)
            .transpose()
            .map_err(stored_error)?
            .unwrap_or_default();
        let params = Params::try_from(&stored).map_err(stored_error)?;
        if params.m_cost() > MAX_M_COST_KIB {
            return Err(MemoryHashError::Stored(format!(
                "it asks for {} KiB, more than the {MAX_M_COST_KIB} KiB allowed",
                params.m_cost()
            )));
        }
        let (Some(salt), Some(expected)) = (&stored.salt, &stored.hash) else {
            return Err(MemoryHashError::Stored("no salt or no hash".into()));
        };
        let mut out = vec![0u8; expected.len()];
        let argon2 = Argon2::new(algorithm, version, params);
        self.take().compute(&argon2, password, salt, &mut out)?;
        let computed = Output::new(&out).map_err(argon2_error)?;
        // `Output`'s equality is argon2's constant-time comparison.
        Ok(computed == *expected)
    }
}

/// A buffer taken from the pool, given back when dropped (also when a hash fails).
struct Lease {
    pool: Arc<BlockPool>,
    blocks: Vec<Block>,
}

impl Lease {
    /// Runs `argon2` in this buffer, grown first when its parameters need more blocks.
    fn compute(
        &mut self,
        argon2: &Argon2<'_>,
        password: &[u8],
        salt: &[u8],
        out: &mut [u8],
    ) -> Result<(), MemoryHashError> {
        let needed = argon2.params().block_count();
        if self.blocks.len() < needed {
            self.blocks.resize(needed, Block::new());
        }
        #[expect(
            clippy::indexing_slicing,
            reason = "INVARIANT: the blocks were just grown to at least `needed`"
        )]
        let memory = &mut self.blocks[..needed];
        let computed = argon2
            .hash_password_into_with_memory(password, salt, out, &mut *memory)
            .map_err(argon2_error);
        // The blocks are derived from the password: wipe them before they wait for the
        // next hash.
        for block in memory.iter_mut() {
            block.as_mut().zeroize();
        }
        computed
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.blocks);
        self.pool
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(blocks);
    }
}

fn argon2_error(e: impl std::fmt::Display) -> MemoryHashError {
    MemoryHashError::Argon2(e.to_string())
}

fn stored_error(e: impl std::fmt::Display) -> MemoryHashError {
    MemoryHashError::Stored(e.to_string())
}
