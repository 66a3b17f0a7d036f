//! The model calls each session has in flight. A session's calls run one at a time (so
//! concurrent calls cannot overspend its budget), and at most `max_queued_calls` wait
//! behind the one running: one more is refused before its body is read. A waiting call
//! holds only its raw body (at most `max_request_bytes`); it is parsed once its turn
//! comes, so what one session holds in memory is bounded however many calls it sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Every session's calls in flight.
pub struct Calls {
    max_queued: usize,
    table: Arc<Mutex<HashMap<String, Entry>>>,
}

/// One session's calls: the lock the running one holds, and how many are in flight.
struct Entry {
    serial: Arc<tokio::sync::Mutex<()>>,
    in_flight: usize,
}

/// A session that has as many calls in flight as it may: one running and
/// `max_queued_calls` waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub in_flight: usize,
    pub max_queued: usize,
}

/// A call's place in its session's queue, given back when dropped.
pub struct Place {
    table: Arc<Mutex<HashMap<String, Entry>>>,
    session: String,
    serial: Arc<tokio::sync::Mutex<()>>,
}

impl Calls {
    /// Sessions may have one call running and `max_queued` waiting.
    pub fn new(max_queued: usize) -> Calls {
        Calls {
            max_queued,
            table: Arc::default(),
        }
    }

    /// A place for one more call of `session`, or [`Full`].
    pub fn enter(&self, session: &str) -> Result<Place, Full> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let entry = table.entry(session.to_owned()).or_insert_with(|| Entry {
            serial: Arc::default(),
            in_flight: 0,
        });
        if entry.in_flight > self.max_queued {
            return Err(Full {
                in_flight: entry.in_flight,
                max_queued: self.max_queued,
            });
        }
        entry.in_flight += 1;
        Ok(Place {
            table: self.table.clone(),
            session: session.to_owned(),
            serial: entry.serial.clone(),
        })
    }
}

impl Place {
    /// Waits until no other call of the session runs; the call runs while the guard
    /// lives.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.serial.lock().await
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = table.get_mut(&self.session) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            if entry.in_flight == 0 {
                table.remove(&self.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Calls, Full};

    #[tokio::test]
    async fn one_runs_the_queue_is_bounded_and_places_are_given_back() {
        let calls = Calls::new(1);
        let running = calls.enter("s1").expect("first");
        let waiting = calls.enter("s1").expect("second waits");
        assert_eq!(
            calls.enter("s1").err(),
            Some(Full {
                in_flight: 2,
                max_queued: 1
            })
        );
        let _other = calls
            .enter("s2")
            .expect("another session has its own queue");
        let turn = running.turn().await;
        assert!(waiting.serial.try_lock().is_err(), "one call at a time");
        drop(turn);
        drop(running);
        let _again = calls.enter("s1").expect("a place given back");
        drop(waiting);
        drop(_again);
        assert!(!calls.table.lock().expect("table").contains_key("s1"));
    }
}
