//! The `instances` table: the registry of running threadgate processes sharing one
//! database. Its only owner.
//!
//! An instance registers at start under its instance id with a nonce of this boot and
//! renews its heartbeat while it lives. The id labels the containers it starts and owns
//! its session leases, so two live processes with one id would adopt and reap each
//! other's containers: registration is refused while another boot of the same id has a
//! heartbeat fresher than the lease time.

use crate::store::{Conn, OptionalExtension, params};

/// What [`register`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// This boot now holds the id.
    Registered,
    /// Another boot of the same id renewed its heartbeat `heartbeat_age_ms` ago, within
    /// the lease time: it is alive (or died less than a lease time ago).
    Taken { heartbeat_age_ms: i64 },
}

/// Registers `instance_id` for the boot `nonce` at `now_ms`: a new id, the same boot
/// again, the boot `previous` (one this process knows is dead: the last boot of its own
/// data directory, whose lock it now holds), or an id whose last heartbeat is at or
/// before `stale_before_ms` (its process is gone) is taken; any other is refused. One
/// conditional statement, so two processes starting at once with one id get one winner.
pub fn register(
    conn: &Conn<'_>,
    instance_id: &str,
    (nonce, previous): (&str, Option<&str>),
    now_ms: i64,
    stale_before_ms: i64,
) -> crate::store::Result<Registration> {
    let mut stmt = conn.prepare(
        "INSERT INTO instances (instance_id, boot_nonce, started_at_ms, heartbeat_at_ms) \
         VALUES (?1, ?2, ?3, ?3) \
         ON CONFLICT (instance_id) DO UPDATE SET boot_nonce = excluded.boot_nonce, \
         started_at_ms = excluded.started_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms \
         WHERE instances.boot_nonce = excluded.boot_nonce \
         OR instances.boot_nonce = ?5 \
         OR instances.heartbeat_at_ms <= ?4 \
         RETURNING instance_id",
    )?;
    let mut rows = stmt.query(params![
        instance_id,
        nonce,
        now_ms,
        stale_before_ms,
        previous
    ])?;
    if rows.next()?.is_some() {
        return Ok(Registration::Registered);
    }
    drop(rows);
    let heartbeat: Option<i64> = conn
        .query_row(
            "SELECT heartbeat_at_ms FROM instances WHERE instance_id = ?1",
            [instance_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Registration::Taken {
        heartbeat_age_ms: heartbeat.map_or(0, |at| now_ms.saturating_sub(at)),
    })
}

/// Renews this boot's heartbeat. `false`: the id is no longer this boot's (another
/// process took it after this one's heartbeat went stale).
pub fn heartbeat(
    conn: &Conn<'_>,
    instance_id: &str,
    nonce: &str,
    now_ms: i64,
) -> crate::store::Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE instances SET heartbeat_at_ms = ?3 \
             WHERE instance_id = ?1 AND boot_nonce = ?2",
        )?
        .execute(params![instance_id, nonce, now_ms])?;
    Ok(changed > 0)
}

/// Marks this boot stopped (a clean shutdown): its id may be registered again at once.
pub fn deregister(conn: &Conn<'_>, instance_id: &str, nonce: &str) -> crate::store::Result<()> {
    conn.execute(
        "UPDATE instances SET heartbeat_at_ms = 0 WHERE instance_id = ?1 AND boot_nonce = ?2",
        params![instance_id, nonce],
    )?;
    Ok(())
}

/// Records where this boot's relay listener is reached (`None`: it takes no redirects).
/// `false`: the id is no longer this boot's.
pub fn set_relay_addr(
    conn: &Conn<'_>,
    instance_id: &str,
    nonce: &str,
    relay_addr: Option<&str>,
) -> crate::store::Result<bool> {
    let changed = conn.execute(
        "UPDATE instances SET relay_addr = ?3 WHERE instance_id = ?1 AND boot_nonce = ?2",
        params![instance_id, nonce, relay_addr],
    )?;
    Ok(changed > 0)
}

/// The relay address `instance_id` advertised, if it has one and its heartbeat is later
/// than `alive_after_ms` (a stopped or dead instance is sent no relay).
pub fn relay_addr(
    conn: &Conn<'_>,
    instance_id: &str,
    alive_after_ms: i64,
) -> crate::store::Result<Option<String>> {
    let addr: Option<Option<String>> = conn
        .query_row(
            "SELECT relay_addr FROM instances WHERE instance_id = ?1 AND heartbeat_at_ms > ?2",
            params![instance_id, alive_after_ms],
            |r| r.get(0),
        )
        .optional()?;
    Ok(addr.flatten())
}

/// Every registered instance with its last heartbeat (`threadgate` operators' view and
/// tests).
pub fn list(conn: &Conn<'_>) -> crate::store::Result<Vec<(String, i64)>> {
    let mut stmt =
        conn.prepare("SELECT instance_id, heartbeat_at_ms FROM instances ORDER BY instance_id")?;
    let rows = stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        (dir, db)
    }

    #[tokio::test]
    async fn a_live_instance_id_is_refused_to_another_boot_and_a_stale_one_is_taken() {
        let (_dir, db) = db();
        let lease = 15_000;
        let first = db
            .write(move |c| register(c, "tg-a", ("boot1", None), 1_000, 1_000 - lease))
            .await
            .unwrap();
        assert_eq!(first, Registration::Registered);
        // The same boot registering again (a retried start) is itself.
        let again = db
            .write(move |c| register(c, "tg-a", ("boot1", None), 2_000, 2_000 - lease))
            .await
            .unwrap();
        assert_eq!(again, Registration::Registered);
        // Another boot within the lease time of the last heartbeat: refused.
        let second = db
            .write(move |c| register(c, "tg-a", ("boot2", None), 5_000, 5_000 - lease))
            .await
            .unwrap();
        assert_eq!(
            second,
            Registration::Taken {
                heartbeat_age_ms: 3_000
            }
        );
        // Another id is free.
        let other = db
            .write(move |c| register(c, "tg-b", ("boot9", None), 5_000, 5_000 - lease))
            .await
            .unwrap();
        assert_eq!(other, Registration::Registered);
        // The first boot's heartbeat keeps it alive.
        assert!(
            db.write(move |c| heartbeat(c, "tg-a", "boot1", 16_000))
                .await
                .unwrap()
        );
        let refused = db
            .write(move |c| register(c, "tg-a", ("boot2", None), 20_000, 20_000 - lease))
            .await
            .unwrap();
        assert!(matches!(refused, Registration::Taken { .. }), "{refused:?}");
        // Past the lease time without a heartbeat the first boot is taken for dead.
        let taken = db
            .write(move |c| register(c, "tg-a", ("boot2", None), 31_000, 31_000 - lease))
            .await
            .unwrap();
        assert_eq!(taken, Registration::Registered);
        // The old boot's heartbeat is refused: the id is no longer its own.
        assert!(
            !db.write(move |c| heartbeat(c, "tg-a", "boot1", 31_500))
                .await
                .unwrap()
        );
        // A clean stop frees the id at once.
        db.write(move |c| deregister(c, "tg-a", "boot2"))
            .await
            .unwrap();
        let next = db
            .write(move |c| register(c, "tg-a", ("boot3", None), 32_000, 32_000 - lease))
            .await
            .unwrap();
        assert_eq!(next, Registration::Registered);
        // boot3 crashes (no clean stop, heartbeat fresh). A boot that knows boot3 is dead
        // (the next start on its data directory) takes the id at once; any other waits.
        let stranger = db
            .write(move |c| register(c, "tg-a", ("boot4", Some("boot1")), 33_000, 33_000 - lease))
            .await
            .unwrap();
        assert!(
            matches!(stranger, Registration::Taken { .. }),
            "{stranger:?}"
        );
        let successor = db
            .write(move |c| register(c, "tg-a", ("boot4", Some("boot3")), 33_000, 33_000 - lease))
            .await
            .unwrap();
        assert_eq!(successor, Registration::Registered);
    }

    /// A relay address is this boot's to set, and is given out only while its
    /// heartbeat is fresh.
    #[tokio::test]
    async fn a_relay_address_is_read_only_while_its_instance_lives() {
        let (_dir, db) = db();
        db.write(|c| register(c, "tg-a", ("boot1", None), 1_000, 0))
            .await
            .unwrap();
        assert!(
            db.write(|c| set_relay_addr(c, "tg-a", "boot1", Some("10.0.0.5:8443")))
                .await
                .unwrap()
        );
        assert!(
            !db.write(|c| set_relay_addr(c, "tg-a", "boot0", Some("10.6.6.6:1")))
                .await
                .unwrap(),
            "another boot's nonce sets nothing"
        );
        let read = |after: i64| db.read(move |c| relay_addr(c, "tg-a", after));
        assert_eq!(read(999).await.unwrap().as_deref(), Some("10.0.0.5:8443"));
        assert_eq!(read(1_000).await.unwrap(), None, "heartbeat too old");
        assert_eq!(
            db.read(|c| relay_addr(c, "tg-b", 0)).await.unwrap(),
            None,
            "no such instance"
        );
        db.write(|c| set_relay_addr(c, "tg-a", "boot1", None))
            .await
            .unwrap();
        assert_eq!(read(0).await.unwrap(), None, "cleared");
    }
}
