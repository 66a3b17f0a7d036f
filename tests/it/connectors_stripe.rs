//! The Stripe connector against localstripe (a real stateful Stripe fake).
//!
//! Needs `.venv-peers`: run `scripts/localstripe.sh setup` once.

use crate::support;

use std::collections::HashSet;

use serde_json::{Value, json};
use support::localstripe::{LocalStripe, TEST_KEY};
use threadgate::connectors::stripe::{ChargeFacts, EXECUTION_METADATA_KEY};
use threadgate::connectors::{CallContext, Connector, ConnectorError, Credential, StripeConnector};

fn connector(stripe: &LocalStripe) -> StripeConnector {
    StripeConnector::new(&stripe.base_url(), Credential::new(TEST_KEY)).unwrap()
}

fn ctx(execution_id: &str) -> CallContext<'_> {
    CallContext { execution_id }
}

async fn call(
    connector: &StripeConnector,
    tool: &str,
    args: Value,
) -> Result<Value, ConnectorError> {
    connector.call(tool, &args, &ctx("read")).await
}

#[tokio::test]
async fn reads_customers_and_charges() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let first = stripe.create_charge(&customer, 2400, "usd").await;
    let second = stripe.create_charge(&customer, 1100, "usd").await;
    let other = stripe.create_customer("bob@example.com").await;
    stripe.create_charge(&other, 999, "usd").await;
    let connector = connector(&stripe);

    let page = call(
        &connector,
        "stripe.list_charges",
        json!({"customer": customer}),
    )
    .await
    .unwrap();
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);
    assert_eq!(page["has_more"], false);
    assert_eq!(page["next_starting_after"], Value::Null);

    let charge = call(&connector, "get_charge", json!({"charge": first}))
        .await
        .unwrap();
    assert_eq!(charge["amount"], 2400);
    assert_eq!(charge["customer"], customer.as_str());
    let found = call(
        &connector,
        "stripe.get_customer",
        json!({"customer": customer}),
    )
    .await
    .unwrap();
    assert_eq!(found["email"], "ada@example.com");

    assert_eq!(
        connector.charge_facts(&first).await.unwrap(),
        ChargeFacts {
            customer: Some(customer.clone()),
            amount: 2400,
            amount_refunded: 0,
            currency: "usd".into(),
        }
    );
    assert_eq!(
        connector
            .customer_email(&customer)
            .await
            .unwrap()
            .as_deref(),
        Some("ada@example.com")
    );
}

/// A write's completion asks for a charge and its customer's email in one request
/// (`expand[]=customer`): the same facts as `charge_facts`, the email as Stripe has it
/// now (never remembered), and none for a charge without a customer.
#[tokio::test]
async fn a_charge_comes_with_its_customers_email_asked_now() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let charge = stripe.create_charge(&customer, 2400, "usd").await;
    let connector = connector(&stripe);
    let (facts, email) = connector.charge_facts_and_email(&charge).await.unwrap();
    assert_eq!(facts, connector.charge_facts(&charge).await.unwrap());
    assert_eq!(facts.customer.as_deref(), Some(customer.as_str()));
    assert_eq!(email.as_deref(), Some("ada@example.com"));

    stripe
        .post(
            &format!("customers/{customer}"),
            &[("email", "ada.new@example.com")],
        )
        .await;
    let (_, email) = connector.charge_facts_and_email(&charge).await.unwrap();
    assert_eq!(email.as_deref(), Some("ada.new@example.com"), "asked again");

    let error = connector
        .charge_facts_and_email("ch_missing")
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 404, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn unknown_objects_are_rejected_with_404() {
    let stripe = LocalStripe::start();
    let connector = connector(&stripe);
    let error = call(
        &connector,
        "stripe.get_charge",
        json!({"charge": "ch_missing"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 404, .. }),
        "{error:?}"
    );
    let error = connector.charge_facts("ch_missing").await.unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 404, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn refund_with_reason_is_persisted_and_tagged_with_the_execution() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let charge = stripe.create_charge(&customer, 2400, "usd").await;
    let connector = connector(&stripe);

    let args = json!({"charge": charge, "amount": 500, "reason": "duplicate",
                      "customer": customer, "currency": "usd"});
    let refund = connector
        .call("stripe.create_refund", &args, &ctx("exec-refund-1"))
        .await
        .unwrap();
    assert_eq!(refund["amount"], 500);
    assert_eq!(refund["reason"], "duplicate");

    let stored = stripe
        .get(&format!("refunds/{}", refund["id"].as_str().unwrap()))
        .await;
    assert_eq!(stored["reason"], "duplicate");
    assert_eq!(stored["charge"], charge.as_str());
    assert_eq!(stored["metadata"][EXECUTION_METADATA_KEY], "exec-refund-1");

    let facts = connector.charge_facts(&charge).await.unwrap();
    assert_eq!((facts.amount_refunded, facts.remaining()), (500, 1900));
}

#[tokio::test]
async fn the_same_execution_refunds_once() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let charge = stripe.create_charge(&customer, 2400, "usd").await;
    let connector = connector(&stripe);
    let args = json!({"charge": charge, "amount": 700});

    let first = connector
        .call("stripe.create_refund", &args, &ctx("exec-7"))
        .await
        .unwrap();
    let again = connector
        .call("create_refund", &args, &ctx("exec-7"))
        .await
        .unwrap();
    assert_eq!(first["id"], again["id"]);

    let refunds = stripe.get(&format!("refunds?charge={charge}")).await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        connector
            .charge_facts(&charge)
            .await
            .unwrap()
            .amount_refunded,
        700
    );

    let changed = json!({"charge": charge, "amount": 800});
    let error = connector
        .call("stripe.create_refund", &changed, &ctx("exec-7"))
        .await
        .unwrap_err();
    match error {
        ConnectorError::Rejected { status, code, .. } => {
            assert_eq!((status, code.as_deref()), (400, Some("idempotency_error")));
        }
        other => panic!("expected an idempotency error, got {other:?}"),
    }

    let other_execution = connector
        .call("stripe.create_refund", &args, &ctx("exec-8"))
        .await
        .unwrap();
    assert_ne!(other_execution["id"], first["id"]);
    assert_eq!(
        connector
            .charge_facts(&charge)
            .await
            .unwrap()
            .amount_refunded,
        1400
    );
}

#[tokio::test]
async fn over_refunds_are_rejected_and_change_nothing() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let charge = stripe.create_charge(&customer, 1000, "usd").await;
    let connector = connector(&stripe);

    let too_much = json!({"charge": charge, "amount": 1001});
    let error = connector
        .call("stripe.create_refund", &too_much, &ctx("e1"))
        .await
        .unwrap_err();
    match &error {
        ConnectorError::Rejected {
            status: 400,
            code,
            message,
        } => {
            assert_eq!(code.as_deref(), Some("amount_too_large"));
            assert!(message.contains("param: amount"), "{message}");
        }
        other => panic!("expected amount_too_large, got {other:?}"),
    }
    assert!(error.is_definite());
    assert_eq!(
        connector
            .charge_facts(&charge)
            .await
            .unwrap()
            .amount_refunded,
        0
    );

    let full = json!({"charge": charge});
    connector
        .call("stripe.create_refund", &full, &ctx("e2"))
        .await
        .unwrap();
    let error = connector
        .call(
            "stripe.create_refund",
            &json!({"charge": charge, "amount": 1}),
            &ctx("e3"),
        )
        .await;
    assert!(
        matches!(error, Err(ConnectorError::Rejected { status: 400, .. })),
        "{error:?}"
    );
}

#[tokio::test]
async fn lists_paginate_with_starting_after() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    let mut created = Vec::new();
    for amount in 101..=107 {
        created.push(stripe.create_charge(&customer, amount, "usd").await);
    }
    let connector = connector(&stripe);

    let first = call(
        &connector,
        "stripe.list_charges",
        json!({"customer": customer, "limit": 3}),
    )
    .await
    .unwrap();
    assert_eq!(first["has_more"], true);
    assert_eq!(first["data"].as_array().unwrap().len(), 3);
    assert_eq!(first["next_starting_after"], created[2].as_str());
    let second = call(
        &connector,
        "stripe.list_charges",
        json!({"customer": customer, "limit": 3, "starting_after": first["next_starting_after"]}),
    )
    .await
    .unwrap();
    assert_eq!(second["data"][0]["id"], created[3].as_str());

    let all = connector
        .list_all(
            "stripe.list_charges",
            &json!({"customer": customer, "limit": 3}),
        )
        .await
        .unwrap();
    let ids: Vec<String> = all
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, created);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 7);
}

#[tokio::test]
async fn subscriptions_update_and_cancel() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("ada@example.com").await;
    stripe.create_plan("gold", 2000).await;
    stripe.create_plan("silver", 1000).await;
    let subscription = stripe.create_subscription(&customer, "gold").await;
    let connector = connector(&stripe);

    assert_eq!(
        connector
            .subscription_customer(&subscription)
            .await
            .unwrap()
            .as_deref(),
        Some(customer.as_str())
    );
    let invoices = call(
        &connector,
        "stripe.list_invoices",
        json!({"customer": customer}),
    )
    .await
    .unwrap();
    assert!(
        !invoices["data"].as_array().unwrap().is_empty(),
        "{invoices}"
    );

    let quantity = json!({"subscription": subscription, "quantity": 3, "customer": customer});
    let updated = connector
        .call("stripe.update_subscription", &quantity, &ctx("s1"))
        .await
        .unwrap();
    assert_eq!(updated["items"]["data"][0]["quantity"], 3);
    assert_eq!(updated["items"]["data"][0]["plan"]["id"], "gold");

    let downgrade =
        json!({"subscription": subscription, "plan": "silver", "cancel_at_period_end": true});
    let updated = connector
        .call("stripe.update_subscription", &downgrade, &ctx("s2"))
        .await
        .unwrap();
    assert_eq!(updated["items"]["data"][0]["plan"]["id"], "silver");
    assert_eq!(updated["items"]["data"][0]["quantity"], 3, "quantity kept");
    assert_eq!(updated["cancel_at_period_end"], true);
    // localstripe drops subscription metadata (refund metadata is checked above).

    let cancel = json!({"subscription": subscription, "customer": customer});
    let canceled = connector
        .call("stripe.cancel_subscription", &cancel, &ctx("s3"))
        .await
        .unwrap();
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(
        stripe.get(&format!("subscriptions/{subscription}")).await["status"],
        "canceled"
    );
}

#[tokio::test]
async fn delete_customer_removes_it() {
    let stripe = LocalStripe::start();
    let customer = stripe.create_customer("gone@example.com").await;
    let connector = connector(&stripe);
    let deleted = connector
        .call(
            "stripe.delete_customer",
            &json!({"customer": customer}),
            &ctx("d1"),
        )
        .await
        .unwrap();
    assert_eq!(deleted["deleted"], true);
    let error = call(
        &connector,
        "stripe.get_customer",
        json!({"customer": customer}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 404, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_unreachable_provider_is_unreachable_for_reads_and_writes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let connector = StripeConnector::new(
        &format!("http://127.0.0.1:{port}"),
        Credential::new(TEST_KEY),
    )
    .unwrap();
    let read = call(&connector, "stripe.get_charge", json!({"charge": "ch_1"}))
        .await
        .unwrap_err();
    assert!(
        matches!(read, ConnectorError::Unreachable { .. }),
        "{read:?}"
    );
    let write = connector
        .call(
            "stripe.create_refund",
            &json!({"charge": "ch_1"}),
            &ctx("u1"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(write, ConnectorError::Unreachable { .. }),
        "{write:?}"
    );
    assert!(write.is_definite());
    assert!(!write.to_string().contains(TEST_KEY));
}

#[tokio::test]
async fn the_key_never_appears_in_errors_or_debug_output() {
    let stripe = LocalStripe::start();
    // localstripe refuses keys that do not start with `sk_`.
    let secret = "rk_live_do_not_print_me_8c1d";
    let connector = StripeConnector::new(&stripe.base_url(), Credential::new(secret)).unwrap();
    let error = call(
        &connector,
        "stripe.get_customer",
        json!({"customer": "cus_1"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 401, .. }),
        "{error:?}"
    );
    let dead = StripeConnector::new("http://127.0.0.1:9", Credential::new(secret)).unwrap();
    let unreachable = call(&dead, "stripe.get_charge", json!({"charge": "ch_1"}))
        .await
        .unwrap_err();
    for text in [
        error.to_string(),
        format!("{error:?}"),
        unreachable.to_string(),
        format!("{unreachable:?}"),
        format!("{connector:?}"),
    ] {
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains("do_not_print"), "{text}");
    }
}

/// Two localstripes at once keep their state apart: each writes its own state file
/// (localstripe alone writes every instance's store to one shared /tmp file).
#[tokio::test]
async fn each_localstripe_keeps_its_own_state_file() {
    let (one, two) = tokio::join!(
        tokio::task::spawn_blocking(LocalStripe::start),
        tokio::task::spawn_blocking(LocalStripe::start)
    );
    let (one, two) = (one.expect("first"), two.expect("second"));
    assert_ne!(one.state_file(), two.state_file());
    one.create_customer("only-in-one@example.com").await;
    two.create_customer("only-in-two@example.com").await;
    let contains =
        |bytes: &[u8], text: &str| bytes.windows(text.len()).any(|w| w == text.as_bytes());
    let first = std::fs::read(one.state_file()).expect("the first state file");
    let second = std::fs::read(two.state_file()).expect("the second state file");
    assert!(contains(&first, "only-in-one@example.com"));
    assert!(!contains(&first, "only-in-two@example.com"));
    assert!(contains(&second, "only-in-two@example.com"));
    assert!(!contains(&second, "only-in-one@example.com"));
    let listed = two.get("customers").await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1), "{listed}");
}
