//! The ten-call queue of `policies/support.calls.yaml` through the live gateway: six
//! run, three wait for a person (each with its internal note on the thread), one is
//! blocked, and the stores say exactly that.

use std::collections::HashMap;

use serde_json::{Value, json};
use threadgate::notes::held::reference;

use crate::support::plain::plain_id;
use crate::support::wait::eventually;
use crate::support::world::{PUBLIC_URL, World, refunds};

/// The calls of a calls file, with the file's placeholder ids replaced by real ones.
pub(super) fn load_calls(file: &str, ids: &HashMap<&str, String>) -> Vec<(String, Value)> {
    let text =
        std::fs::read_to_string(crate::support::plain::repo_root().join(file)).expect("calls");
    let doc: Value = serde_norway::from_str(&text).expect("calls yaml");
    doc["calls"]
        .as_array()
        .expect("calls list")
        .iter()
        .map(|call| {
            let mut args = call["args"].clone();
            if let Value::Object(map) = &mut args {
                for value in map.values_mut() {
                    if let Some(real) = value.as_str().and_then(|s| ids.get(s)) {
                        *value = Value::String(real.clone());
                    }
                }
            }
            (call["tool"].as_str().expect("tool").to_owned(), args)
        })
        .collect()
}

/// The decision column of an expected file (indented lines detail the row above).
pub(super) fn load_expected(file: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(crate::support::plain::repo_root().join(file)).expect("expected");
    text.lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split_whitespace().nth(1).expect("decision").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ten_call_queue_runs_six_holds_three_and_blocks_one() {
    let world = World::new().await;
    let app = world.start().await;
    let email = "ada@example.com";
    let customer = world.stripe.create_customer(email).await;
    // The invoice was submitted twice: two $49 charges, the second refunded.
    world.stripe.create_charge(&customer, 4900, "usd").await;
    let duplicate = world.stripe.create_charge(&customer, 4900, "usd").await;
    let first = world.stripe.create_charge(&customer, 2000, "usd").await;
    world.stripe.create_plan("pro", 4900).await;
    world.stripe.create_plan("starter", 1900).await;
    let subscription = world.stripe.create_subscription(&customer, "pro").await;
    world.github.add_file(
        "acme/billing",
        "main",
        "src/invoice.rs",
        b"// the invoice total rounding happens here\n",
    );
    let thread = plain_id("th");
    let session = world
        .open_session(&app, &thread, &plain_id("c"), email)
        .await;

    let ids = HashMap::from([
        ("cus_4821", customer.clone()),
        ("ch_2", duplicate.clone()),
        ("ch_1", first.clone()),
        ("sub_1", subscription.clone()),
    ]);
    let calls = load_calls("policies/support.calls.yaml", &ids);
    let expected = load_expected("policies/support.expected.txt");
    assert_eq!(calls.len(), 10);
    assert_eq!(expected.len(), 10);

    let mut ran = Vec::new();
    let mut held = Vec::new();
    let mut blocked = Vec::new();
    for (i, ((tool, args), want)) in calls.iter().zip(&expected).enumerate() {
        let diagnosis = format!("diagnosis {i}: the customer's invoice was submitted twice");
        let (status, body) = session.call(tool, args.clone(), Some(&diagnosis)).await;
        let id = body["execution_id"].as_str().unwrap_or_default().to_owned();
        match want.as_str() {
            "run" => {
                assert_eq!(status, 200, "{tool} should run: {body}");
                assert_eq!(body["status"], "ok");
                ran.push((id, tool.clone()));
            }
            "hold" => {
                assert_eq!(status, 202, "{tool} should be held: {body}");
                assert_eq!(body["status"], "pending_approval");
                assert_eq!(
                    body["approval_url"],
                    format!("{PUBLIC_URL}/approvals/{id}").as_str()
                );
                let summary = body["approval_summary"].as_str().expect("summary");
                // A phrase in words (or the tool and its arguments), then the rule.
                assert!(summary.contains("; held: "), "{summary}");
                let expires = body["expires_at"].as_str().expect("expires_at");
                let expires = chrono::DateTime::parse_from_rfc3339(expires).expect("rfc3339");
                let ttl = expires.timestamp_millis() - chrono::Utc::now().timestamp_millis();
                assert!(
                    (3 * 3600 * 1000..=4 * 3600 * 1000).contains(&ttl),
                    "ttl 4h: {ttl}"
                );
                held.push((id, tool.clone(), diagnosis));
            }
            "block" => {
                assert_eq!(status, 403, "{tool} should be blocked: {body}");
                assert_eq!(body["status"], "blocked");
                assert!(
                    body["rule"].as_str().expect("rule").contains("*.delete_*"),
                    "{body}"
                );
                blocked.push((id, tool.clone()));
            }
            other => panic!("unexpected decision {other}"),
        }
    }
    assert_eq!((ran.len(), held.len(), blocked.len()), (6, 3, 1));

    // The executions table says exactly that.
    let rows = app.executions().await;
    assert_eq!(rows.len(), 10, "{rows:#?}");
    let status_of: HashMap<&str, (&str, &str)> = rows
        .iter()
        .map(|r| (r.id.as_str(), (r.status.as_str(), r.verdict.as_str())))
        .collect();
    for (id, tool) in &ran {
        assert_eq!(status_of[id.as_str()], ("succeeded", "run"), "{tool}");
    }
    for (id, tool, _) in &held {
        assert_eq!(status_of[id.as_str()], ("held", "hold"), "{tool}");
    }
    for (id, tool) in &blocked {
        assert_eq!(status_of[id.as_str()], ("blocked", "block"), "{tool}");
    }
    assert!(rows.iter().all(|r| r.session_id == session.id));

    // localstripe: the duplicate refund and no other; the subscription and the customer
    // are untouched.
    let made = refunds(&world.stripe).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["charge"], duplicate.as_str());
    assert_eq!(made[0]["amount"], 4900);
    let refund_exec = &ran
        .iter()
        .find(|(_, t)| t == "stripe.create_refund")
        .expect("the duplicate refund ran")
        .0;
    assert_eq!(
        made[0]["metadata"]["threadgate_execution_id"],
        refund_exec.as_str()
    );
    let sub = world
        .stripe
        .get(&format!("subscriptions/{subscription}"))
        .await;
    assert_eq!(sub["items"]["data"][0]["plan"]["id"], "pro");
    let still = world.stripe.get(&format!("customers/{customer}")).await;
    assert_ne!(still["deleted"], true);

    // Plain: the reply that ran, the note that ran, and one internal note per held call
    // with the diagnosis, the rule, the approval link and the execution marker.
    eventually("three held-call notes", || async {
        let notes = world.plain.thread(&thread).notes();
        notes
            .iter()
            .filter(|(_, text)| text.contains("threadgate-execution: "))
            .count()
            >= 3
    })
    .await;
    let t = world.plain.thread(&thread);
    assert_eq!(t.replies().len(), 1);
    assert!(t.replies()[0].0.contains("refunding it now"));
    let notes = t.notes();
    for (id, tool, diagnosis) in &held {
        let row = app.execution(id).await;
        let matching: Vec<&String> = notes
            .iter()
            .map(|(_, text)| text)
            .filter(|text| text.contains(&reference(id)))
            .collect();
        assert_eq!(matching.len(), 1, "one note for {tool}: {notes:#?}");
        let text = matching[0];
        assert!(text.contains(diagnosis.as_str()), "{text}");
        assert!(text.contains(&row.because), "{text}");
        assert!(text.contains(tool.as_str()), "{text}");
        assert!(
            text.contains(&format!("{PUBLIC_URL}/approvals/{id}")),
            "{text}"
        );
    }
    let create_notes = world
        .plain
        .operations()
        .iter()
        .filter(|op| op.root_fields == ["createNote"])
        .count();
    assert_eq!(
        create_notes, 4,
        "three held-call notes and the agent's note"
    );
    assert!(world.plain.invalid_requests().is_empty());

    // The catalog does not offer what the policy always blocks.
    let (status, tools) = session.get("/v1/tools").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"stripe.create_refund"));
    assert!(!names.contains(&"stripe.delete_customer"), "{names:?}");
    // Each tool says what it does; a refund's reason lists the values Stripe accepts.
    let listed = tools["tools"].as_array().expect("tools");
    assert!(
        listed.iter().all(|t| t["description"].as_str().is_some()),
        "{tools}"
    );
    let refund = listed
        .iter()
        .find(|t| t["name"] == "stripe.create_refund")
        .expect("refund");
    let reason = refund["args"]
        .as_array()
        .expect("args")
        .iter()
        .find(|a| a["name"] == "reason")
        .expect("reason");
    assert_eq!(
        reason["enum"],
        json!(["duplicate", "fraudulent", "requested_by_customer"])
    );

    assert!(app.verify_audit().await >= 20);
    app.stop().await;
}
