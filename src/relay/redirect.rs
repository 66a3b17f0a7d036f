//! Where a relay goes when it dialled an instance that does not run its session.
//!
//! Several replicas sit behind one Service; a relay's connection reaches any of them.
//! An instance asked for a session it does not serve looks up the session's lease owner
//! and, if the lease is live, another instance's and that instance advertised a relay
//! address in the registry (`store::instances`, heartbeat fresher than the lease
//! time), answers `GO <address>` (see `wire`): the relay dials that address instead
//! (still checking the certificate against the name it was given, at most
//! `client::MAX_REDIRECTS` times per connection). The address only ever comes from the
//! registry, never from the relay; an ended session, an expired or own lease, an owner
//! without an address, or a read that failed is answered `NO stopped`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::clock::Clock;
use crate::ids::SessionId;
use crate::store::Db;

/// What the relay listener needs to send a relay to its session's owner.
#[derive(Clone)]
pub struct Redirects {
    pub db: Db,
    /// This instance: never redirected to.
    pub instance_id: String,
    /// A registered instance whose heartbeat is older than this is not sent relays.
    pub lease_time: Duration,
    pub clock: Clock,
}

impl Redirects {
    /// The advertised relay address of the live instance `instance`, when that is
    /// another instance (a parked pod's relay waits for its adoption there).
    pub async fn instance_addr(&self, instance: &str) -> Option<SocketAddr> {
        if instance == self.instance_id {
            return None;
        }
        let owner = instance.to_owned();
        let lease_ms = i64::try_from(self.lease_time.as_millis()).unwrap_or(i64::MAX);
        let alive_after = self.clock.now_ms().saturating_sub(lease_ms);
        let read = self
            .db
            .read(move |conn| crate::store::instances::relay_addr(conn, &owner, alive_after))
            .await;
        match read {
            Ok(addr) => addr.and_then(|addr| addr.parse().ok()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up a parked pod's instance");
                None
            }
        }
    }

    /// The advertised relay address of `session`'s live lease owner, when that is
    /// another instance.
    pub async fn owner_of(&self, session: &SessionId) -> Option<SocketAddr> {
        let (session, me) = (session.clone(), self.instance_id.clone());
        let now = self.clock.now_ms();
        let lease_ms = i64::try_from(self.lease_time.as_millis()).unwrap_or(i64::MAX);
        let read = self
            .db
            .read(move |conn| {
                let Some(thread) = crate::session::store::live_thread_of(conn, &session)? else {
                    return Ok(None);
                };
                let Some((owner, _token, true)) = crate::store::leases::holder(conn, &thread, now)?
                else {
                    return Ok(None);
                };
                if owner == me {
                    return Ok(None);
                }
                let addr = crate::store::instances::relay_addr(
                    conn,
                    &owner,
                    now.saturating_sub(lease_ms),
                )?;
                Ok(addr.map(|addr| (owner, addr)))
            })
            .await;
        match read {
            Ok(Some((owner, addr))) => match addr.parse() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    tracing::warn!(%owner, "the instance registry holds a relay address that is none");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up a relayed session's owner");
                None
            }
        }
    }
}
