//! The rounds an outbox's drain is made of (the note and thread-event outboxes drain
//! through [`in_rounds`]). A leaf of `notes`: the outboxes use it, and `pump` runs them.

use std::future::Future;

use crate::store::StoreError;

/// What one round of an outbox did: items that reached Plain, and items whose attempt
/// was recorded (sent, or put off until their next attempt).
pub(super) struct Round {
    pub(super) sent: usize,
    pub(super) settled: usize,
}

/// Drains an outbox round by round: `due` reads the next round (fair across threads),
/// `send` sends it. Ends when nothing is due, or when a round recorded nothing (the
/// database refuses writes: the next wake-up tries again rather than spinning here).
/// Returns how many items reached Plain; an error reading a round ends the drain with
/// it (what was sent before stays sent).
pub(super) async fn in_rounds<T, Due, DueFut, Send, SendFut>(
    mut due: Due,
    mut send: Send,
) -> Result<usize, StoreError>
where
    Due: FnMut() -> DueFut,
    DueFut: Future<Output = Result<Vec<T>, StoreError>>,
    Send: FnMut(Vec<T>) -> SendFut,
    SendFut: Future<Output = Round>,
{
    let mut sent = 0;
    loop {
        let round = due().await?;
        if round.is_empty() {
            return Ok(sent);
        }
        let done = send(round).await;
        sent += done.sent;
        if done.settled == 0 {
            return Ok(sent);
        }
    }
}
