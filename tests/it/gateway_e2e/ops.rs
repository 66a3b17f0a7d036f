//! What an operator changes on a running server takes effect without a restart: a Stripe
//! key stored with `secrets set` is used by the next call, and a secret stored a moment
//! ago is already redacted from a provider's answer, in every encoding the scanner knows,
//! before the agent sees it.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use threadgate::app;
use threadgate::secrets::{SecretStore, SecretString};
use threadgate::store::Db;

use crate::support::plain::plain_id;
use crate::support::world::{STRIPE_KEY, World};

/// A second handle on the world's secret store, as `threadgate secrets set` opens it
/// from another process.
fn operator_store(world: &World) -> SecretStore {
    let db = Db::open(&world.settings.database_path()).expect("open the database");
    app::open_secrets(&db, &world.settings).expect("open the secrets")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_key_set_while_running_is_used_by_the_next_call() {
    let world = World::new().await;
    // localstripe refuses any key that does not start with `sk_`.
    let operator = operator_store(&world);
    operator
        .set(
            "stripe_api_key",
            SecretString::from("rk_revoked_key_4410aa9e"),
        )
        .await
        .expect("store the old key");
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[2500])
        .await;
    let call = || {
        ada.session
            .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
    };

    let (status, refused) = call().await;
    assert_ne!(status, 200, "the revoked key must not work: {refused}");
    assert!(
        refused.to_string().contains("401") || refused.to_string().contains("refused"),
        "{refused}"
    );

    operator
        .set("stripe_api_key", SecretString::from(STRIPE_KEY))
        .await
        .expect("store the new key");
    let (status, ran) = call().await;
    assert_eq!(status, 200, "the next call uses the new key: {ran}");
    assert_eq!(ran["result"]["id"], json!(ada.charges[0]), "{ran}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answer_echoing_a_secret_in_any_encoding_is_redacted() {
    let world = World::new().await;
    let app = world.start().await;
    // Stored while the server runs; the answer below comes right after.
    let value = "tok/+?&=\"\\é-9f3a1c~";
    operator_store(&world)
        .set("partner_token", SecretString::from(value))
        .await
        .expect("store the secret");

    let url: String = value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let json_escaped = serde_json::to_string(value).expect("json");
    let forms: Vec<(&str, String)> = vec![
        ("raw", value.to_owned()),
        ("b64", STANDARD.encode(format!("user:{value}"))),
        ("b64url", URL_SAFE_NO_PAD.encode(format!("xy{value}"))),
        ("hex", hex::encode(value)),
        ("hexupper", hex::encode_upper(value)),
        ("url", format!("https://partner.test/?t={url}")),
        ("json", json_escaped[1..json_escaped.len() - 1].to_owned()),
    ];
    let email = "eve@example.com";
    let mut form: Vec<(String, String)> = vec![("email".into(), email.into())];
    for (key, text) in &forms {
        form.push((format!("metadata[{key}]"), text.clone()));
    }
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let customer = world.stripe.post("customers", &pairs).await;
    let customer_id = customer["id"].as_str().expect("customer id").to_owned();
    for (key, text) in &forms {
        assert_eq!(
            customer["metadata"][key],
            json!(text),
            "localstripe keeps {key}"
        );
    }
    let session = world
        .open_session(&app, &plain_id("th"), &plain_id("c"), email)
        .await;

    let (status, answer) = session
        .call(
            "stripe.get_customer",
            json!({"customer": customer_id}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let metadata = &answer["result"]["metadata"];
    for (key, _) in &forms {
        let shown = metadata[key].as_str().unwrap_or_default();
        assert!(
            shown.contains("[secret:partner_token]"),
            "{key} was not redacted: {shown}"
        );
    }
    let answered = answer.to_string();
    let stored: Vec<Value> = app
        .executions()
        .await
        .into_iter()
        .filter_map(|e| e.result.and_then(|r| serde_json::from_str(&r).ok()))
        .collect();
    let stored = serde_json::to_string(&stored).expect("json");
    for (key, text) in &forms {
        assert!(!answered.contains(text.as_str()), "{key} reached the agent");
        assert!(!stored.contains(text.as_str()), "{key} was stored");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_the_audit_anchor_and_reports_deleted_rows() {
    let world = World::new().await;
    let anchor_file = world.settings.audit_anchor_path();
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[2500])
        .await;
    let (status, ran) = ada
        .session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 200, "{ran}");
    let rows = app.verify_audit().await as i64;
    assert!(rows >= 2, "{rows}");
    app.stop().await;

    // The next start checks the anchor and advances it to the current head.
    let app = world.start().await;
    crate::support::wait::eventually("the anchor file advances", || async {
        matches!(threadgate::audit::anchor::read_file(&anchor_file), Ok(Some(a)) if a.count == rows)
    })
    .await;
    app.stop().await;

    // Someone with the database file deletes the newest rows: the chain still verifies.
    let db = Db::open(&world.settings.database_path()).expect("open");
    db.write(|c| c.execute_batch("DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE id > 1;"))
        .await
        .expect("tamper");
    drop(db);
    let app = world.start().await;
    let path = anchor_file.display().to_string();
    crate::support::wait::eventually("the divergence is logged", || async {
        let logs = String::from_utf8_lossy(&crate::support::logs::captured_logs()).into_owned();
        logs.lines().any(|l| {
            l.contains("audit anchor check failed")
                && l.contains(&path)
                && l.contains(&format!("fewer than the anchor's {rows}"))
        })
    })
    .await;
    assert_eq!(
        app.verify_audit().await,
        1,
        "a shorter chain verifies alone"
    );
    let kept = threadgate::audit::anchor::read_file(&anchor_file).expect("read");
    assert_eq!(
        kept.map(|a| a.count),
        Some(rows),
        "the file keeps the last good head"
    );
    app.stop().await;
}
