use super::*;

fn open_temp() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("state.db")).expect("open");
    (dir, db)
}

#[tokio::test]
async fn writes_are_visible_to_readers_after_commit() {
    let (_dir, db) = open_temp();
    db.write(|c| c.execute("INSERT INTO meta (key, value) VALUES ('a', '1')", ()))
        .await
        .expect("write");
    let value: String = db
        .read(|c| c.query_row("SELECT value FROM meta WHERE key = 'a'", (), |r| r.get(0)))
        .await
        .expect("read");
    assert_eq!(value, "1");
}

#[tokio::test]
async fn a_failing_write_rolls_back_alone_in_a_concurrent_batch() {
    let (_dir, db) = open_temp();
    db.write(|c| c.execute("INSERT INTO meta (key, value) VALUES ('taken', '1')", ()))
        .await
        .expect("seed");
    let mut handles = Vec::new();
    for i in 0..200 {
        let db = db.clone();
        handles.push(tokio::spawn(async move {
            db.write(move |c| {
                c.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, 'x')",
                    [format!("k{i}")],
                )?;
                if i % 10 == 0 {
                    // A duplicate key: this job's insert above must be rolled back too.
                    c.execute("INSERT INTO meta (key, value) VALUES ('taken', 'dup')", ())?;
                }
                Ok(())
            })
            .await
        }));
    }
    let mut failed = 0;
    for h in handles {
        if h.await.expect("join").is_err() {
            failed += 1;
        }
    }
    assert_eq!(failed, 20);
    let count: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM meta", (), |r| r.get(0)))
        .await
        .expect("count");
    assert_eq!(count, 181, "180 successful jobs plus the seed row");
}

#[tokio::test]
async fn reopening_keeps_data_and_does_not_rerun_migrations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let db = Db::open(&path).expect("open");
        db.write(|c| c.execute("INSERT INTO meta (key, value) VALUES ('a', '1')", ()))
            .await
            .expect("write");
    }
    let db = Db::open(&path).expect("reopen");
    let value: String = db
        .read(|c| c.query_row("SELECT value FROM meta WHERE key = 'a'", (), |r| r.get(0)))
        .await
        .expect("read");
    assert_eq!(value, "1");
}

#[tokio::test]
async fn the_database_runs_with_full_sync_and_wal() {
    let (_dir, db) = open_temp();
    let mode: String = db
        .read(|c| c.query_row("PRAGMA journal_mode", (), |r| r.get(0)))
        .await
        .expect("pragma");
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_meta_value_is_set_once_and_read_back() {
    let (_dir, db) = open_temp();
    let first = db
        .write(|c| meta::get_or_insert(c, meta::INSTANCE_ID, "tg-first"))
        .await
        .expect("first");
    let second = db
        .write(|c| meta::get_or_insert(c, meta::INSTANCE_ID, "tg-second"))
        .await
        .expect("second");
    assert_eq!((first.as_str(), second.as_str()), ("tg-first", "tg-first"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_checkpointed_off_the_writer() {
    let (dir, db) = open_temp();
    let file = dir.path().join("state.db");
    let size = || std::fs::metadata(&file).expect("database file").len();
    let before = size();
    // Enough writes to wake the checkpointer; far below the writer's own threshold, so
    // only the checkpoint thread can have copied them into the database file.
    let blob = "x".repeat(4000);
    let mut handles = Vec::new();
    for i in 0..checkpoint::JOBS_PER_CHECKPOINT + 44 {
        let (db, blob) = (db.clone(), blob.clone());
        handles.push(tokio::spawn(async move {
            db.write(move |c| {
                c.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                    [format!("k{i}"), blob.clone()],
                )
            })
            .await
        }));
    }
    for handle in handles {
        handle.await.expect("task").expect("write");
    }
    const _: () = assert!(300 * 4000 < checkpoint::WRITER_BACKSTOP_PAGES * 4096);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while size() < before + 300 * 4000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the database file did not grow: {} bytes, {before} before",
            size()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let count: i64 = db
        .read(|c| {
            c.query_row("SELECT count(*) FROM meta WHERE key LIKE 'k%'", (), |r| {
                r.get(0)
            })
        })
        .await
        .expect("count");
    assert_eq!(count, 300);
}

#[test]
fn a_schema_newer_than_the_binary_is_refused_by_name_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    drop(Db::open(&path).expect("open"));
    let newer = {
        let conn = Connection::open(&path).expect("raw");
        let known: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("version");
        conn.pragma_update(None, "user_version", known + 1)
            .expect("bump");
        known + 1
    };
    let Err(err) = Db::open(&path) else {
        panic!("a newer schema must not open");
    };
    let text = err.to_string();
    assert!(
        matches!(err, StoreError::SchemaNewer { found, .. } if found == newer),
        "{text}"
    );
    assert!(text.contains(&format!("version {newer}")), "{text}");
    let conn = Connection::open(&path).expect("raw");
    let after: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(after, newer, "nothing was applied or rewritten");
    conn.pragma_update(None, "user_version", -1)
        .expect("negative");
    drop(conn);
    assert!(matches!(
        Db::open(&path).map(drop),
        Err(StoreError::SchemaNewer { found: -1, .. })
    ));
}

/// The basics on every backend (Postgres when `THREADGATE_TEST_DATABASE_URL` is set):
/// a committed write is read back, a failing write leaves nothing, the meta counter
/// counts, and values of every kind the domain stores come back as they went in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_backend_keeps_the_store_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in testing::each_backend(dir.path()) {
        let db = backend.open().expect("open");
        db.write(|c| meta::set(c, "a", "1")).await.expect("write");
        let failed = db
            .write(|c| {
                meta::set(c, "b", "1")?;
                c.execute("INSERT INTO meta (key, value) VALUES ('a', 'dup')", ())
            })
            .await;
        assert!(failed.is_err(), "{:?}", db.dialect());
        let b = db.read(|c| meta::get(c, "b")).await.expect("read");
        assert_eq!(
            b,
            None,
            "the failed write left nothing ({:?})",
            db.dialect()
        );
        for _ in 0..3 {
            db.write(|c| meta::increment(c, "n"))
                .await
                .expect("increment");
        }
        let n = db.read(|c| meta::get(c, "n")).await.expect("read");
        assert_eq!(n.as_deref(), Some("3"), "{:?}", db.dialect());
        let first = db
            .write(|c| meta::get_or_insert(c, meta::INSTANCE_ID, "tg-first"))
            .await
            .expect("first");
        let second = db
            .write(|c| meta::get_or_insert(c, meta::INSTANCE_ID, "tg-second"))
            .await
            .expect("second");
        assert_eq!((first.as_str(), second.as_str()), ("tg-first", "tg-first"));
        let inline = db.read_inline(|c| meta::get(c, "a")).expect("read inline");
        assert_eq!(inline.as_deref(), Some("1"));
        let (count, missing, sum): (i64, Option<String>, i64) = db
            .read(|c| {
                c.query_row(
                    "SELECT count(*), (SELECT value FROM meta WHERE key = ?1), \
                     coalesce(sum(CAST(value AS BIGINT)), 0) FROM meta WHERE key IN ('a', 'n')",
                    ["absent"],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
            })
            .await
            .expect("aggregate");
        assert_eq!((count, missing, sum), (2, None, 4), "{:?}", db.dialect());
    }
}

/// `PRAGMA synchronous` as a job sees it on the writer: 2 (FULL, the commit syncs the
/// log) or 1 (NORMAL, it does not).
fn synchronous(c: &Conn<'_>) -> sql::Result<i64> {
    c.query_row("PRAGMA synchronous", (), |r| r.get(0))
}

/// An unflushed write alone commits without the log's fsync; one that shares its group
/// commit with a write that needs the fsync gets it (FULL), and a write after it syncs
/// again. Each write is visible once it resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unflushed_write_skips_the_fsync_only_in_a_batch_of_its_own() {
    let (_dir, db) = open_temp();
    let insert = |key: &'static str| {
        move |c: &Conn<'_>| {
            c.execute("INSERT INTO meta (key, value) VALUES (?1, 'x')", [key])?;
            synchronous(c)
        }
    };
    assert_eq!(db.write(insert("a")).await.expect("write"), 2);
    assert_eq!(db.write_unflushed(insert("b")).await.expect("write"), 1);
    assert_eq!(db.write(insert("c")).await.expect("write"), 2);

    // The writer is held inside a first job while an unflushed and a flushed write
    // queue up behind it; released, it takes the two as one batch, synced.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let db2 = db.clone();
    let holding = tokio::spawn(async move {
        db2.write(move |c| {
            entered_tx.send(()).ok();
            lock(&release_rx).recv().ok();
            synchronous(c)
        })
        .await
    });
    tokio::task::spawn_blocking(move || entered_rx.recv())
        .await
        .expect("join")
        .expect("the writer runs the first job");
    // A SQLite write is queued at its first poll.
    let mut unflushed = Box::pin(db.write_unflushed(insert("d")));
    let mut flushed = Box::pin(db.write(insert("e")));
    assert!(futures::poll!(&mut unflushed).is_pending());
    assert!(futures::poll!(&mut flushed).is_pending());
    release_tx.send(()).expect("release");
    assert_eq!(holding.await.expect("join").expect("write"), 2);
    assert_eq!(
        unflushed.await.expect("write"),
        2,
        "in a batch with a flushed write"
    );
    assert_eq!(flushed.await.expect("write"), 2);
    assert_eq!(db.write_unflushed(insert("f")).await.expect("write"), 1);

    let keys: Vec<String> = db
        .read(|c| {
            let mut stmt = c.prepare("SELECT key FROM meta WHERE value = 'x' ORDER BY key")?;
            let rows = stmt.query_map((), |r| r.get(0))?;
            rows.collect()
        })
        .await
        .expect("read");
    assert_eq!(keys, ["a", "b", "c", "d", "e", "f"]);
}

/// The statement cache holds: a statement that compares bound values by equality and
/// sorts (the shape of the session's earlier calls, the outbox, the events feed) is
/// prepared once on the writer and on a reader, whatever values are bound. Without the
/// query planner stability guarantee SQLite prepared it again at every new value.
#[test]
fn a_cached_statement_is_not_prepared_again_for_new_values() {
    use rusqlite::{OptionalExtension as _, StatementStatus};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let mut writer = Connection::open(&path).expect("open");
    configure(&writer).expect("configure");
    migrations::apply(&mut writer).expect("migrate");
    let reader = open_reader(&path).expect("a reader");
    let sql = "SELECT id FROM executions WHERE session_id = ?1 AND binding_hash = ?2 \
               AND status = 'succeeded' ORDER BY created_at_ms LIMIT 1";
    for (name, conn) in [("writer", &writer), ("reader", &reader)] {
        for i in 0..5 {
            let mut stmt = conn.prepare_cached(sql).expect("prepare");
            let found = stmt
                .query_row(
                    rusqlite::params![format!("sess_{i}"), format!("hash_{i}")],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .expect("query");
            assert_eq!(found, None);
            assert_eq!(
                stmt.get_status(StatementStatus::RePrepare),
                0,
                "{name}: prepared again for the values of round {i}"
            );
        }
    }
}
