//! The secrets' generation a gated call read at its start, kept for the rest of the call.
//!
//! Every gated call reads the secrets' generation before its checks
//! (`gateway::fresh`). A live credential (`connectors::Credential`) also needs it before
//! each provider request, to know whether the stored key changed: read again, that was
//! one more statement, and on Postgres one more round trip, per request (one for a
//! read, two for a write). Inside a call ([`within`]) the credential takes the
//! generation the call read ([`observed`]) instead, so a key stored after the call
//! began is used by the next call at the latest (a key read on a cache miss is the one
//! stored then, labelled with the call's generation, which is never newer than it: the
//! next call that reads a later generation reads the key again). Outside a call (an
//! approved call run later, the model proxy, Stripe's events) nothing is kept and the
//! credential reads the generation itself.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static CALL_GENERATION: Cell<Option<u64>>;
}

/// Runs `call` with room for the generation it reads ([`observed`], then [`seen`]).
pub async fn within<F: Future>(call: F) -> F::Output {
    CALL_GENERATION.scope(Cell::new(None), call).await
}

/// The call running on this task read `generation` (a later read replaces an earlier
/// one); nothing outside [`within`].
pub fn observed(generation: u64) {
    let _ = CALL_GENERATION.try_with(|g| g.set(Some(generation)));
}

/// The generation the call running on this task read last (`None`: outside a call, or
/// nothing read yet).
pub fn seen() -> Option<u64> {
    CALL_GENERATION.try_with(Cell::get).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_generation_is_kept_within_its_call_alone() {
        observed(3);
        assert_eq!(seen(), None, "outside a call nothing is kept");
        let inside = within(async {
            assert_eq!(seen(), None, "nothing read yet");
            observed(4);
            observed(5);
            let nested = within(async { seen() }).await;
            (seen(), nested)
        })
        .await;
        assert_eq!(
            inside,
            (Some(5), None),
            "the last read, and none in a new call"
        );
        assert_eq!(seen(), None);
    }
}
