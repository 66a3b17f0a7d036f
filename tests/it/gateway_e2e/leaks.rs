//! Secrets never leak: after a session that runs, holds, approves, is refused for a
//! secret in its arguments, and meets a Plain that echoes the credential back in its
//! errors, every secret value used is searched for in the captured logs, the database
//! files, everything the Plain fake received, and every answer the agent got: zero
//! hits, in raw, base64, hex and URL-encoded form.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::logs::captured_logs;
use crate::support::plain_fake::Failure;
use crate::support::world::{SIGNING_SECRET, World, stored_secrets};

/// The forms a value is searched in.
fn forms(value: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut out = vec![
        value.to_owned(),
        b64.encode(value),
        url.encode(value),
        hex::encode(value),
        hex::encode_upper(value),
        value
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect(),
    ];
    out.dedup();
    out
}

fn hits(haystack: &[u8], needles: &[(String, String)]) -> Vec<String> {
    needles
        .iter()
        .filter(|(_, needle)| {
            haystack
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        })
        .map(|(name, _)| name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_value_reaches_logs_database_notes_or_the_agent() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 3000])
        .await;
    let session = &ada.session;
    let mut answers: Vec<Value> = Vec::new();

    // Calls that run.
    answers.push(
        session
            .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
            .await
            .1,
    );
    answers.push(
        session
            .call(
                "helpdesk.add_note",
                json!({"text": "Looking into the duplicate charge."}),
                None,
            )
            .await
            .1,
    );
    // Plain echoes the Authorization header (the API key) in its error.
    world.plain.fail_next(1, Failure::EchoAuthorization);
    let (status, failed) = session
        .call(
            "helpdesk.reply_to_thread",
            json!({"text": "We are on it."}),
            None,
        )
        .await;
    assert_eq!(status, 502, "{failed}");
    answers.push(failed);
    // A stored secret in the arguments.
    let (status, refused) = session
        .call(
            "helpdesk.reply_to_thread",
            json!({"text": format!("token {}", crate::support::github_stub::TOKEN)}),
            None,
        )
        .await;
    assert_eq!(status, 403);
    answers.push(refused);

    // A held refund whose note first meets a Plain that echoes the key, then goes
    // through on a retry; then approved by a reviewer.
    world.plain.fail_next(2, Failure::EchoAuthorization);
    let (status, held) = session
        .call(
            "stripe.create_refund",
            json!({"charge": ada.charges[1], "reason": "requested_by_customer"}),
            Some("the customer asked for a refund within the trial"),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["execution_id"].as_str().expect("id").to_owned();
    answers.push(held);
    let thread = session.thread_id.clone();
    world
        .note_containing(&thread, &id, "the held-call note after retries")
        .await;
    let token = app.add_reviewer("alice").await;
    let (status, decided) = app.decide(&id, &token, "approve", "fine").await;
    assert_eq!(status, 200, "{decided}");
    answers.push(decided);
    answers.push(session.wait(&id, 30).await);
    assert_eq!(answers.last().expect("wait")["status"], "ok");

    // What to look for.
    let mut secrets: Vec<(String, String)> = stored_secrets()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    secrets.push(("plain signing secret".into(), SIGNING_SECRET.into()));
    secrets.push(("reviewer token".into(), token.clone()));
    secrets.push((
        "master key".into(),
        world.master_key_text().trim().to_owned(),
    ));
    let needles: Vec<(String, String)> = secrets
        .iter()
        .flat_map(|(name, value)| forms(value).into_iter().map(move |f| (name.clone(), f)))
        .collect();

    app.stop().await;

    // The logs (the whole process's: every test of this binary so far).
    let logs = captured_logs();
    assert!(!logs.is_empty(), "logs were captured");
    assert!(
        String::from_utf8_lossy(&logs).contains("cannot post the note yet"),
        "the echoed failure was logged (redacted)"
    );
    assert_eq!(hits(&logs, &needles), Vec::<String>::new(), "in the logs");

    // The database files.
    let db_path = world.settings.database_path();
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", db_path.display());
        if let Ok(bytes) = std::fs::read(&path) {
            assert_eq!(hits(&bytes, &needles), Vec::<String>::new(), "in {path}");
        }
    }

    // Everything the Plain fake received: notes, replies, and all variables sent.
    let mut plain_text = String::new();
    for (_, text) in world.plain.thread(&thread).notes() {
        plain_text.push_str(&text);
    }
    for (text, markdown) in world.plain.thread(&thread).replies() {
        plain_text.push_str(&text);
        plain_text.push_str(&markdown.unwrap_or_default());
    }
    for op in world.plain.operations() {
        plain_text.push_str(&op.variables.to_string());
    }
    assert!(plain_text.contains("the customer asked for a refund"));
    assert_eq!(
        hits(plain_text.as_bytes(), &needles),
        Vec::<String>::new(),
        "in what Plain received"
    );

    // Everything the agent and the reviewer were answered.
    let answered = serde_json::to_vec(&answers).expect("json");
    assert_eq!(
        hits(&answered, &needles),
        Vec::<String>::new(),
        "in the answers: {answers:#?}"
    );
}
