//! A session is scoped to its thread and its customer: another thread's id is refused,
//! another customer's charge is held whatever the policy says, a smaller retry of a
//! held refund is held too, and a stored secret in the arguments is refused and
//! audited by name only. None of it runs anything.

use base64::Engine as _;
use serde_json::json;

use crate::support::plain::plain_id;
use crate::support::plain_fake;
use crate::support::world::{STRIPE_KEY, World, refunds};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_leave_its_thread_or_its_customer() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 3000])
        .await;
    let bob = world.stripe.create_customer("bob@example.com").await;
    let bobs_charge = world.stripe.create_charge(&bob, 4000, "usd").await;
    // Bob was charged twice, so the policy alone would run a duplicate refund.
    world.stripe.create_charge(&bob, 4000, "usd").await;
    let other_thread = plain_id("th");
    world
        .plain
        .add_thread(&other_thread, &plain_id("c"), "bob@example.com");
    let session = &ada.session;

    // Another thread's id.
    for tool in ["helpdesk.reply_to_thread", "helpdesk.add_note"] {
        let (status, body) = session
            .call(
                tool,
                json!({"thread_id": other_thread, "text": "Your refund is on its way."}),
                None,
            )
            .await;
        assert_eq!(status, 403, "{tool}: {body}");
        assert_eq!(body["error"], "out_of_scope");
    }
    let (status, body) = session
        .call(
            "helpdesk.get_thread",
            json!({"thread_id": other_thread}),
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(world.plain.thread(&other_thread).replies().is_empty());
    assert!(world.plain.thread(&other_thread).notes().is_empty());

    // A stored secret in the arguments (raw) or in the diagnosis (base64).
    let (status, body) = session
        .call(
            "helpdesk.reply_to_thread",
            json!({"text": format!("use this key: {STRIPE_KEY}")}),
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "secret_in_arguments");
    let message = body["message"].as_str().expect("message");
    assert!(message.contains("stripe_api_key"), "{message}");
    assert!(!message.contains(STRIPE_KEY));
    let encoded = base64::engine::general_purpose::STANDARD.encode(plain_fake::API_KEY);
    let (status, body) = session
        .call(
            "stripe.get_charge",
            json!({"charge": ada.charges[0]}),
            Some(&format!("the token is {encoded}")),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("plain_api_key"),
        "{body}"
    );
    // URL-encoded, inside a larger base64 blob, and behind JSON unicode escapes.
    let url_encoded = STRIPE_KEY.replace('_', "%5F");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!(
        "Authorization: Bearer {}",
        crate::support::github_stub::TOKEN
    ));
    for text in [format!("key={url_encoded}"), format!("header {basic}")] {
        let (status, body) = session
            .call("helpdesk.add_note", json!({"text": text}), None)
            .await;
        assert_eq!(status, 403, "{text}: {body}");
        assert_eq!(body["error"], "secret_in_arguments");
    }
    let escaped: String = STRIPE_KEY
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let raw = format!(r#"{{"tool": "helpdesk.add_note", "args": {{"text": "{escaped}"}}}}"#);
    let (status, body) = crate::support::unix_http::unix_request_raw(
        &session.socket,
        "POST",
        "/v1/calls",
        Some(&raw),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "secret_in_arguments");
    assert!(world.plain.thread(&session.thread_id).replies().is_empty());
    assert!(world.plain.thread(&session.thread_id).notes().is_empty());

    // Another customer's charge: the policy would run a duplicate refund, but the charge
    // is not this thread's customer's. The gateway completed the full remaining amount.
    let (status, body) = session
        .call(
            "stripe.create_refund",
            json!({"charge": bobs_charge, "reason": "duplicate"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let summary = body["approval_summary"].as_str().expect("summary");
    assert!(
        summary.contains(&format!("belongs to customer {bob}"))
            && summary.contains("not to this thread's customer"),
        "{summary}"
    );
    let foreign = app
        .execution(body["execution_id"].as_str().expect("id"))
        .await;
    assert_eq!(foreign.args["amount"], 4000);
    assert_eq!(foreign.args["customer"], bob.as_str());
    assert_eq!(foreign.args["currency"], "usd");
    assert_eq!(foreign.status, "held");

    // A smaller retry of a held refund, in a session of its own so the hold above
    // plays no part: the first waits for a person, the retry (which the policy alone
    // would run: carol was charged twice) is held too.
    let carol = world
        .customer_session(&app, "carol@example.com", &[5000, 5000])
        .await;
    let (status, first) = carol
        .session
        .call(
            "stripe.create_refund",
            json!({"charge": carol.charges[0], "amount": 2000, "reason": "requested_by_customer"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{first}");
    let first_id = first["execution_id"].as_str().expect("id").to_owned();
    let (status, retry) = carol
        .session
        .call(
            "stripe.create_refund",
            json!({"charge": carol.charges[0], "amount": 1900, "reason": "duplicate"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{retry}");
    assert_ne!(retry["execution_id"], first_id.as_str());
    let summary = retry["approval_summary"].as_str().expect("summary");
    assert!(
        summary.contains(&format!("({first_id}) is waiting for a person")),
        "{summary}"
    );
    // One session cannot read another's executions.
    let (status, _) = carol
        .session
        .get(&format!("/v1/executions/{}", foreign.id))
        .await;
    assert_eq!(status, 404);

    // Calls of the wrong shape are refused before anything is decided.
    let (status, body) = session
        .call(
            "stripe.create_refund",
            json!({"charge": ada.charges[0], "amont": 100}),
            None,
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = session
        .call("stripe.create_payout", json!({"amount": 100}), None)
        .await;
    assert_eq!(status, 404);

    // Nothing ran.
    assert!(refunds(&world.stripe).await.is_empty());
    let rows = app.executions().await;
    assert!(
        rows.iter().all(|r| r.status == "held"),
        "only the held refunds were recorded: {rows:#?}"
    );
    assert_eq!(rows.len(), 3);

    // The refusals are audited; the secrets by name only, without the arguments.
    let audit = app.audit_rows().await;
    let refused: Vec<_> = audit.iter().filter(|r| r.event == "refused").collect();
    assert_eq!(refused.len(), 8, "{refused:#?}");
    let secret_rows: Vec<_> = refused
        .iter()
        .filter(|r| r.rule.as_deref().unwrap_or_default().contains("secret"))
        .collect();
    assert_eq!(secret_rows.len(), 5, "{secret_rows:#?}");
    assert!(secret_rows.iter().all(|r| r.args.is_none()));
    assert!(
        secret_rows
            .iter()
            .any(|r| r.rule.as_deref() == Some("secret stripe_api_key in arguments"))
    );
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}
