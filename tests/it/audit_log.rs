//! The audit log against a real database: the chain verifies, tampering is caught at the
//! row it touched, rows commit with the caller's state change, and secrets never land.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use threadgate::audit::{
    self, AuditError, AuditEvent, AuditFilter, AuditRecord, AuditRecordRow, format_table,
};
use threadgate::secrets::{Redactor, SecretString};
use threadgate::store::Db;

const STRIPE: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

fn open_temp() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("state.db")).expect("open");
    (dir, db)
}

fn redactor() -> Redactor {
    Redactor::new([("stripe_key".to_owned(), SecretString::from(STRIPE))]).expect("redactor")
}

fn record(event: AuditEvent, execution: &str, thread: &str) -> AuditRecord {
    AuditRecord {
        execution_id: Some(execution.to_owned()),
        thread_id: Some(thread.to_owned()),
        session_id: Some(format!("sess-{thread}")),
        agent: Some("billing".into()),
        tool: Some("stripe.create_refund".into()),
        args: Some(json!({"charge": "ch_1", "amount": 2500})),
        ..AuditRecord::new(event)
    }
}

/// Appends `records` in one write, as a caller would with its state change.
async fn append_all(db: &Db, records: Vec<AuditRecord>) -> Vec<i64> {
    db.write(move |c| {
        let r = Redactor::empty();
        records
            .iter()
            .map(|rec| audit::append(c, rec, &r))
            .collect()
    })
    .await
    .expect("append")
}

/// A typical life of two executions on two threads: 6 rows.
async fn seed(db: &Db) {
    let held = AuditRecord {
        decision: Some("hold".into()),
        rule: Some("stripe.create_refund".into()),
        policy_hash: Some("9f2c1e".into()),
        ..record(AuditEvent::Held, "ex-1", "th-1")
    };
    let approved = AuditRecord {
        reviewer: Some("alice".into()),
        ..record(AuditEvent::Approved, "ex-1", "th-1")
    };
    let ran = AuditRecord {
        outcome: Some("re_123 succeeded".into()),
        duration_ms: Some(182),
        ..record(AuditEvent::Ran, "ex-1", "th-1")
    };
    let blocked = AuditRecord {
        decision: Some("block".into()),
        rule: Some("*.delete_*".into()),
        tool: Some("stripe.delete_customer".into()),
        ..record(AuditEvent::Blocked, "ex-2", "th-2")
    };
    append_all(
        db,
        vec![
            record(AuditEvent::Requested, "ex-1", "th-1"),
            held,
            approved,
            ran,
            record(AuditEvent::Requested, "ex-2", "th-2"),
            blocked,
        ],
    )
    .await;
}

async fn verify(db: &Db) -> Result<usize, AuditError> {
    db.read(|c| Ok(audit::verify(c))).await.expect("read")
}

/// Runs `sql` with the append-only triggers dropped, as an attacker with the file would.
async fn tamper(db: &Db, sql: &'static str) {
    db.write(move |c| {
        c.execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")?;
        c.execute_batch(sql)
    })
    .await
    .expect("tamper");
}

#[tokio::test]
async fn an_untouched_chain_verifies() {
    let (_dir, db) = open_temp();
    assert_eq!(verify(&db).await.expect("empty log"), 0);
    seed(&db).await;
    assert_eq!(verify(&db).await.expect("verify"), 6);
    let rows = db
        .read(|c| audit::query(c, &AuditFilter::default()))
        .await
        .expect("query");
    assert_eq!(rows[0].prev_hash, vec![0u8; 32]);
    for pair in rows.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash);
        assert_eq!(pair[1].id, pair[0].id + 1);
    }
}

#[tokio::test]
async fn the_log_refuses_update_and_delete() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    for sql in [
        "UPDATE audit SET outcome = 'nothing happened' WHERE id = 4",
        "DELETE FROM audit WHERE id = 6",
    ] {
        let err = db
            .write(move |c| c.execute_batch(sql))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("append-only"), "{err}");
    }
    assert_eq!(verify(&db).await.expect("verify"), 6);
}

#[tokio::test]
async fn a_changed_row_is_detected_at_that_row() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    tamper(&db, "UPDATE audit SET reviewer = 'mallory' WHERE id = 3").await;
    match verify(&db).await {
        Err(AuditError::Broken { id, reason }) => {
            assert_eq!(id, 3);
            assert_eq!(reason, "its contents do not match its hash");
        }
        other => panic!("expected a break at row 3, got {other:?}"),
    }
}

#[tokio::test]
async fn a_changed_row_with_a_recomputed_hash_breaks_the_next_link() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    // Replace row 2's hash by row 5's: row 2 no longer matches, and neither does row 3's
    // link; the first failure reported is row 2.
    tamper(
        &db,
        "UPDATE audit SET hash = (SELECT hash FROM audit WHERE id = 5) WHERE id = 2",
    )
    .await;
    assert!(matches!(
        verify(&db).await,
        Err(AuditError::Broken { id: 2, .. })
    ));
}

#[tokio::test]
async fn a_removed_row_is_detected_where_the_gap_is() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    tamper(&db, "DELETE FROM audit WHERE id = 4").await;
    match verify(&db).await {
        Err(AuditError::Broken { id, reason }) => {
            assert_eq!(id, 5);
            assert_eq!(reason, "expected row 4 before it");
        }
        other => panic!("expected a break at row 5, got {other:?}"),
    }
}

#[tokio::test]
async fn a_relinked_row_is_detected_by_its_prev_hash() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    tamper(
        &db,
        "UPDATE audit SET prev_hash = zeroblob(32) WHERE id = 4",
    )
    .await;
    match verify(&db).await {
        Err(AuditError::Broken { id, reason }) => {
            assert_eq!(id, 4);
            assert_eq!(
                reason,
                "its prev_hash does not match the previous row's hash"
            );
        }
        other => panic!("expected a break at row 4, got {other:?}"),
    }
}

#[tokio::test]
async fn a_secret_in_any_field_is_stored_redacted() {
    let (_dir, db) = open_temp();
    let b64 = STANDARD.encode(format!("user:{STRIPE}"));
    let leaky = AuditRecord {
        execution_id: Some(format!("ex-{STRIPE}")),
        session_id: Some(STRIPE.into()),
        thread_id: Some(STRIPE.into()),
        agent: Some(STRIPE.into()),
        tool: Some(STRIPE.into()),
        args: Some(json!({
            "headers": {"authorization": format!("Basic {b64}")},
            STRIPE: [STRIPE, format!("key%3D{}", STRIPE.replace('_', "%5F"))],
        })),
        decision: Some(STRIPE.into()),
        rule: Some(STRIPE.into()),
        policy_hash: Some(STRIPE.into()),
        reviewer: Some(STRIPE.into()),
        outcome: Some(format!("provider said: invalid key {STRIPE}")),
        ..AuditRecord::new(AuditEvent::Failed)
    };
    db.write(move |c| audit::append(c, &leaky, &redactor()))
        .await
        .expect("append");
    let rows = db
        .read(|c| audit::query(c, &AuditFilter::default()))
        .await
        .expect("query");
    let row = &rows[0];
    let shown = format!("{row:?}");
    assert!(!shown.contains(STRIPE), "{shown}");
    assert!(!shown.contains(&b64[8..30]), "{shown}");
    assert_eq!(row.tool.as_deref(), Some("[secret:stripe_key]"));
    assert_eq!(
        row.outcome.as_deref(),
        Some("provider said: invalid key [secret:stripe_key]")
    );
    let args: serde_json::Value =
        serde_json::from_str(row.args_redacted.as_deref().expect("args")).expect("json");
    assert_eq!(
        args,
        json!({
            "headers": {"authorization": "Basic [secret:stripe_key]"},
            "[secret:stripe_key]": ["[secret:stripe_key]", "key%3D[secret:stripe_key]"],
        })
    );
    assert_eq!(verify(&db).await.expect("verify"), 1);
    let disk =
        std::fs::read(db.path().expect("a SQLite file").with_extension("db-wal")).expect("wal");
    assert!(!disk.windows(STRIPE.len()).any(|w| w == STRIPE.as_bytes()));
}

#[tokio::test]
async fn an_audit_row_commits_or_rolls_back_with_the_callers_change() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    let failed = db
        .write(|c| {
            c.execute("INSERT INTO meta (key, value) VALUES ('paused', '1')", ())?;
            audit::append(
                c,
                &record(AuditEvent::Ran, "ex-9", "th-9"),
                &Redactor::empty(),
            )?;
            // The state change fails after its audit row: both must go.
            c.execute("INSERT INTO meta (key, value) VALUES ('paused', '2')", ())
        })
        .await;
    assert!(failed.is_err());
    let (meta, audit_rows): (i64, i64) = db
        .read(|c| {
            Ok((
                c.query_row("SELECT count(*) FROM meta", (), |r| r.get(0))?,
                c.query_row("SELECT count(*) FROM audit", (), |r| r.get(0))?,
            ))
        })
        .await
        .expect("count");
    assert_eq!((meta, audit_rows), (0, 6));
    // The chain continues from the last committed row.
    append_all(&db, vec![record(AuditEvent::Ran, "ex-9", "th-9")]).await;
    assert_eq!(verify(&db).await.expect("verify"), 7);
}

/// Several rows appended at once (one read of the head) chain exactly as rows appended
/// one by one: same ids, same links, same hashes; and the chain goes on after them.
#[tokio::test]
async fn rows_appended_together_chain_as_rows_appended_one_by_one() {
    let steps = |n: &str| {
        vec![
            record(AuditEvent::Requested, n, "th-1"),
            record(AuditEvent::Decided, n, "th-1"),
            AuditRecord {
                outcome: Some("ok".into()),
                duration_ms: Some(3),
                ..record(AuditEvent::Ran, n, "th-1")
            },
        ]
    };
    let (_one_dir, one_by_one) = open_temp();
    let (_all_dir, together) = open_temp();
    for (n, records) in [("ex-1", steps("ex-1")), ("ex-2", steps("ex-2"))] {
        append_all(&one_by_one, records.clone()).await;
        let last = together
            .write(move |c| audit::append_all(c, &records, &Redactor::empty()))
            .await
            .expect("append together");
        assert_eq!(last, if n == "ex-1" { 3 } else { 6 });
    }
    let none = together
        .write(|c| audit::append_all(c, &[], &Redactor::empty()))
        .await
        .expect("append nothing");
    assert_eq!(none, 0, "nothing appended, no row");
    let rows = |db: &Db| {
        let db = db.clone();
        async move {
            db.read(|c| audit::query(c, &AuditFilter::default()))
                .await
                .expect("query")
                .into_iter()
                .map(|r| (r.id, r.event.as_str().to_owned(), r.prev_hash, r.hash))
                .collect::<Vec<_>>()
        }
    };
    let (a, b) = (rows(&one_by_one).await, rows(&together).await);
    assert_eq!(a.len(), 6);
    assert_eq!(
        a.iter()
            .map(|r| (r.0, r.1.clone(), r.2.clone()))
            .collect::<Vec<_>>(),
        b.iter()
            .map(|r| (r.0, r.1.clone(), r.2.clone()))
            .collect::<Vec<_>>(),
        "ids, events and links"
    );
    assert_eq!(verify(&together).await.expect("verify"), 6);
    append_all(&together, vec![record(AuditEvent::Ran, "ex-3", "th-3")]).await;
    assert_eq!(verify(&together).await.expect("verify"), 7);
}

#[tokio::test]
async fn concurrent_appends_in_group_commits_keep_one_chain() {
    let (_dir, db) = open_temp();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let rec = record(AuditEvent::Requested, &format!("ex-{i}"), "th-1");
            db.write(move |c| audit::append(c, &rec, &Redactor::empty()))
                .await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("join").expect("append"));
    }
    ids.sort();
    assert_eq!(ids, (1..=64).collect::<Vec<i64>>());
    assert_eq!(verify(&db).await.expect("verify"), 64);
}

#[tokio::test]
async fn query_filters_by_thread_execution_event_and_decision() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    let ids = |rows: Vec<AuditRecordRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let run = |filter: AuditFilter| {
        let db = db.clone();
        async move {
            db.read(move |c| audit::query(c, &filter))
                .await
                .expect("query")
        }
    };
    let by_thread = AuditFilter {
        thread_id: Some("th-2".into()),
        ..AuditFilter::default()
    };
    assert_eq!(ids(run(by_thread).await), [5, 6]);
    let by_execution = AuditFilter {
        execution_id: Some("ex-1".into()),
        ..AuditFilter::default()
    };
    assert_eq!(ids(run(by_execution).await), [1, 2, 3, 4]);
    let by_event = AuditFilter {
        event: Some(AuditEvent::Requested),
        ..AuditFilter::default()
    };
    assert_eq!(ids(run(by_event).await), [1, 5]);
    let by_decision = AuditFilter {
        decision: Some("block".into()),
        ..AuditFilter::default()
    };
    assert_eq!(ids(run(by_decision).await), [6]);
    let newest = AuditFilter {
        thread_id: Some("th-1".into()),
        limit: Some(2),
        ..AuditFilter::default()
    };
    assert_eq!(ids(run(newest).await), [3, 4]);
    let nothing = AuditFilter {
        thread_id: Some("th-1".into()),
        decision: Some("block".into()),
        ..AuditFilter::default()
    };
    assert!(run(nothing).await.is_empty());
}

#[tokio::test]
async fn the_table_shows_filled_columns_aligned_and_escapes_control_characters() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    let sneaky = AuditRecord {
        outcome: Some("ok\n\u{1b}[2Jcleared".into()),
        ..record(AuditEvent::Failed, "ex-3", "th-3")
    };
    append_all(&db, vec![sneaky]).await;
    let rows = db
        .read(|c| audit::query(c, &AuditFilter::default()))
        .await
        .expect("query");
    let table = format_table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 8, "{table}");
    assert!(lines[0].starts_with("id  time (utc)"), "{table}");
    for header in [
        "event",
        "execution",
        "thread",
        "reviewer",
        "outcome",
        "args",
    ] {
        assert!(lines[0].contains(header), "{header} in {table}");
    }
    let event_col = lines[0].find("event").expect("event column");
    assert_eq!(&lines[2][event_col..event_col + 4], "held");
    assert_eq!(&lines[6][event_col..event_col + 7], "blocked");
    assert!(lines[4].contains("re_123 succeeded"));
    assert!(lines[7].contains(r"ok\n\u{1b}[2Jcleared"), "{table}");
    assert!(!table.contains('\u{1b}'));
    assert_eq!(format_table(&[]), "no audit records\n");

    // Columns empty in every row are left out.
    let only_requested = db
        .read(|c| {
            audit::query(
                c,
                &AuditFilter {
                    event: Some(AuditEvent::Requested),
                    ..AuditFilter::default()
                },
            )
        })
        .await
        .expect("query");
    let narrow = format_table(&only_requested);
    assert!(!narrow.contains("reviewer"), "{narrow}");
    assert!(!narrow.contains("decision"), "{narrow}");
}

#[test]
fn event_names_round_trip() {
    for event in AuditEvent::ALL {
        assert_eq!(event.as_str().parse::<AuditEvent>().ok(), Some(event));
    }
    assert!("exploded".parse::<AuditEvent>().is_err());
}

async fn head(db: &Db) -> audit::Anchor {
    db.read(|c| Ok(audit::anchor::head(c)))
        .await
        .expect("read")
        .expect("head")
}

async fn extends(db: &Db, anchor: &audit::Anchor) -> Result<(), audit::AnchorError> {
    let anchor = anchor.clone();
    db.read(move |c| Ok(audit::anchor::extends(c, &anchor)))
        .await
        .expect("read")
}

#[tokio::test]
async fn deleting_the_newest_rows_verifies_but_breaks_the_anchor() {
    let (dir, db) = open_temp();
    let empty = head(&db).await;
    assert_eq!(empty.count, 0);
    seed(&db).await;
    let anchor = head(&db).await;
    assert_eq!(anchor.count, 6);
    let printed = anchor.to_string();
    assert_eq!(printed.parse::<audit::Anchor>().expect("parse"), anchor);
    extends(&db, &empty)
        .await
        .expect("a longer chain extends the empty anchor");
    extends(&db, &anchor)
        .await
        .expect("the chain extends its own head");

    // The anchor file: checked and advanced, then kept when the chain diverges.
    let file = dir.path().join("audit.anchor");
    let advanced = db
        .read({
            let file = file.clone();
            move |c| Ok(audit::anchor::check_and_advance(c, &file))
        })
        .await
        .expect("read")
        .expect("first check");
    assert_eq!(advanced, anchor);
    append_all(&db, vec![record(AuditEvent::Requested, "ex-3", "th-3")]).await;
    extends(&db, &anchor)
        .await
        .expect("a grown chain extends it");

    tamper(&db, "DELETE FROM audit WHERE id >= 6").await;
    assert_eq!(
        verify(&db).await.expect("a shorter chain still verifies"),
        5
    );
    let error = extends(&db, &anchor)
        .await
        .expect_err("the anchor catches it");
    let text = error.to_string();
    assert!(
        text.contains("fewer than the anchor's 6") && text.contains(&printed),
        "{text}"
    );
    let from_file = db
        .read({
            let file = file.clone();
            move |c| Ok(audit::anchor::check_and_advance(c, &file))
        })
        .await
        .expect("read");
    assert!(matches!(
        from_file,
        Err(audit::AnchorError::Diverged { .. })
    ));
    let kept = audit::anchor::read_file(&file).expect("read file");
    assert_eq!(kept, Some(anchor), "a diverged chain leaves the file alone");
}

#[tokio::test]
async fn a_rewritten_tail_with_recomputed_hashes_breaks_the_anchor() {
    let (_dir, db) = open_temp();
    seed(&db).await;
    let anchor = head(&db).await;
    // Delete the last two rows and append two others: a valid chain of the same length.
    tamper(&db, "DELETE FROM audit WHERE id >= 5").await;
    append_all(
        &db,
        vec![
            record(AuditEvent::Requested, "ex-9", "th-9"),
            record(AuditEvent::Denied, "ex-9", "th-9"),
        ],
    )
    .await;
    assert_eq!(verify(&db).await.expect("valid chain"), 6);
    let text = extends(&db, &anchor).await.expect_err("caught").to_string();
    assert!(text.contains("row 6 has another hash"), "{text}");
}

#[test]
fn malformed_anchors_are_refused_by_their_text() {
    for bad in [
        "",
        "abc:1",
        &format!("{}:x", "0".repeat(64)),
        &format!("{}:-1", "0".repeat(64)),
    ] {
        let error = bad.parse::<audit::Anchor>().expect_err(bad);
        assert!(error.to_string().contains("HASH:COUNT"), "{error}");
    }
}

/// When `Db::sync_log` last synced SQLite's log.
async fn synced_at(db: &Db) -> Option<String> {
    db.read(|c| threadgate::store::meta::get(c, threadgate::store::meta::LOG_SYNCED_AT))
        .await
        .expect("read meta")
}

/// On SQLite a read's outcome, with its audit row, commits without its fsync
/// (`Db::write_unflushed`): the server's anchor round and `audit --verify` read the head,
/// then sync the log past it with a synchronous commit (`Db::sync_log`), and only then
/// write the file, so the file never names a row a crash of the machine could take back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_is_written_only_once_the_log_is_synced_past_its_head() {
    let (dir, db) = open_temp();
    seed(&db).await;
    db.write_unflushed(|c| {
        audit::append(
            c,
            &record(AuditEvent::Ran, "ex-9", "th-9"),
            &Redactor::empty(),
        )
    })
    .await
    .expect("an unflushed append");
    assert_eq!(synced_at(&db).await, None);

    let file = dir.path().join("audit.anchor");
    let head = db
        .read({
            let file = file.clone();
            move |c| Ok(audit::anchor::checked_head(c, &file))
        })
        .await
        .expect("read")
        .expect("the head");
    assert_eq!(head.count, 7, "the unflushed row is the head");
    assert_eq!(audit::anchor::read_file(&file).expect("read file"), None);
    let advanced = audit::anchor::advance(&db, &file, head.clone())
        .await
        .expect("advance");
    assert_eq!(advanced, head);
    assert!(
        synced_at(&db).await.is_some(),
        "a synchronous commit came before the file"
    );
    assert_eq!(
        audit::anchor::read_file(&file).expect("read file"),
        Some(head)
    );
}
