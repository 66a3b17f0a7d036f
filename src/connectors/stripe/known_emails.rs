//! Customer emails remembered for the read path's scope check.
//!
//! A read's scope check asks "does Stripe customer X have the thread's email?". The
//! answer can change (a customer's email is editable), so it is remembered only while
//! Stripe tells threadgate when it changes: with the Stripe webhook endpoint configured
//! (`[stripe] webhook_secret`), a verified `customer.updated` or `customer.deleted` event
//! forgets that customer at once, and every entry is dropped after a maximum age in case
//! an event is lost. Without the endpoint nothing is remembered and every read asks.
//!
//! INVARIANT: an answer fetched before a customer was forgotten is never stored after
//! it: a lookup takes the current generation before it asks Stripe, and its answer is
//! remembered only if no customer was forgotten meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many customers are remembered before the memory is cleared and starts again.
const MAX_KNOWN: usize = 10_000;

/// Remembered customer emails (see the module docs). Shared by clones of a connector.
#[derive(Debug, Default)]
pub(super) struct KnownEmails {
    /// How long an answer stays good; `None`: nothing is remembered.
    max_age: Option<Duration>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    emails: HashMap<String, (String, Instant)>,
    /// Moves each time a customer is forgotten.
    generation: u64,
    /// The database's customer-change mark this memory has caught up with (`None`:
    /// never looked; see [`super::changes`]).
    changes_seen: Option<u64>,
}

impl KnownEmails {
    /// A memory whose answers stay good for `max_age` (`None`: remembers nothing).
    pub(super) fn new(max_age: Option<Duration>) -> KnownEmails {
        KnownEmails {
            max_age,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The remembered email of `customer`, if one is remembered and not too old.
    pub(super) fn get(&self, customer: &str) -> Option<String> {
        let max_age = self.max_age?;
        let state = self.state();
        let (email, at) = state.emails.get(customer)?;
        (at.elapsed() < max_age).then(|| email.clone())
    }

    /// The generation to hand to [`KnownEmails::remember`], taken before asking Stripe.
    pub(super) fn generation(&self) -> u64 {
        self.state().generation
    }

    /// Remembers `customer`'s `email`, asked when the generation was `asked_at`, unless
    /// a customer was forgotten since.
    pub(super) fn remember(&self, customer: &str, email: &str, asked_at: u64) {
        if self.max_age.is_none() {
            return;
        }
        let mut state = self.state();
        if state.generation != asked_at {
            return;
        }
        if state.emails.len() >= MAX_KNOWN {
            state.emails.clear();
        }
        state
            .emails
            .insert(customer.to_owned(), (email.to_owned(), Instant::now()));
    }

    /// Forgets `customer` (its email changed or it was deleted), and makes every lookup
    /// in flight forget what it is about to learn.
    pub(super) fn forget(&self, customer: &str) {
        let mut state = self.state();
        state.generation += 1;
        state.emails.remove(customer);
    }

    /// Forgets every customer (the changes since the last look could not be read, or
    /// this memory never looked).
    pub(super) fn forget_all(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.emails.clear();
    }

    /// Whether anything is remembered at all (a max age is set).
    pub(super) fn remembers(&self) -> bool {
        self.max_age.is_some()
    }

    /// The customer-change mark caught up with, if any.
    pub(super) fn changes_seen(&self) -> Option<u64> {
        self.state().changes_seen
    }

    /// Records that the changes up to `mark` are forgotten (the mark never goes back).
    pub(super) fn caught_up(&self, mark: u64) {
        let mut state = self.state();
        state.changes_seen = Some(state.changes_seen.map_or(mark, |seen| seen.max(mark)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_max_age_nothing_is_remembered() {
        let known = KnownEmails::new(None);
        let at = known.generation();
        known.remember("cus_1", "a@example.com", at);
        assert_eq!(known.get("cus_1"), None);
    }

    #[test]
    fn an_answer_is_remembered_until_its_customer_is_forgotten() {
        let known = KnownEmails::new(Some(Duration::from_secs(60)));
        let at = known.generation();
        known.remember("cus_1", "a@example.com", at);
        known.remember("cus_2", "b@example.com", at);
        assert_eq!(known.get("cus_1").as_deref(), Some("a@example.com"));
        known.forget("cus_1");
        assert_eq!(known.get("cus_1"), None);
        assert_eq!(known.get("cus_2").as_deref(), Some("b@example.com"));
    }

    #[test]
    fn an_answer_asked_before_a_forget_is_not_stored() {
        let known = KnownEmails::new(Some(Duration::from_secs(60)));
        let asked = known.generation();
        // The email changes while the lookup is in flight.
        known.forget("cus_1");
        known.remember("cus_1", "old@example.com", asked);
        assert_eq!(known.get("cus_1"), None);
    }

    #[test]
    fn an_answer_older_than_the_max_age_is_not_used() {
        let known = KnownEmails::new(Some(Duration::ZERO));
        let at = known.generation();
        known.remember("cus_1", "a@example.com", at);
        assert_eq!(known.get("cus_1"), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let known = KnownEmails::new(Some(Duration::from_secs(60)));
        let at = known.generation();
        for i in 0..(MAX_KNOWN + 5) {
            known.remember(&format!("cus_{i}"), "a@example.com", at);
        }
        assert!(known.state().emails.len() <= MAX_KNOWN);
        assert_eq!(
            known.get(&format!("cus_{}", MAX_KNOWN + 4)).as_deref(),
            Some("a@example.com")
        );
    }
}
