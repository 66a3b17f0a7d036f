//! Reads are scoped to the thread's customer, and GitHub to the configured repositories
//! (issue 7, items 2 and 3): from one thread, another customer's customer object,
//! charges, invoices or charge are refused with `out_of_scope` and never returned; a
//! GitHub call on a repository outside the config is refused before the policy, and a
//! GitHub write on a configured one waits for a person.

use serde_json::{Value, json};

use crate::support::world::{GITHUB_REPO, World};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_customers_objects_are_never_read() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 3000])
        .await;
    let bob = world.stripe.create_customer("bob@example.com").await;
    let bobs_charge = world.stripe.create_charge(&bob, 4000, "usd").await;
    let session = &ada.session;

    // The attack: read Bob's email and charges from Ada's thread.
    for (tool, args) in [
        ("stripe.get_customer", json!({"customer": bob})),
        ("stripe.list_charges", json!({"customer": bob})),
        ("stripe.list_invoices", json!({"customer": bob})),
        ("stripe.get_charge", json!({"charge": bobs_charge})),
    ] {
        let (status, body) = session.call(tool, args.clone(), None).await;
        assert_eq!(status, 403, "{tool} {args}: {body}");
        assert_eq!(body["error"], "out_of_scope", "{body}");
        let text = body.to_string();
        assert!(!text.contains("bob@example.com"), "{text}");
        assert!(
            !text.contains(&bobs_charge) || tool == "stripe.get_charge",
            "{text}"
        );
    }

    // Ada's own objects are read as before, and a list holds only her rows.
    let (status, body) = session
        .call("stripe.get_customer", json!({"customer": ada.id}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["email"], "ada@example.com");
    let (status, body) = session
        .call("stripe.list_charges", json!({"customer": ada.id}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let rows = body["result"]["data"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{body}");
    assert!(rows.iter().all(|r| r["customer"] == ada.id.as_str()));
    let (status, body) = session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 5000);

    // A thread whose customer has no Stripe customer of that email reads nothing: the
    // owner cannot be shown, so it fails closed.
    let stranger = world
        .customer_session(&app, "nobody@example.com", &[])
        .await;
    let (status, body) = stranger
        .session
        .call("stripe.get_customer", json!({"customer": ada.id}), None)
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "out_of_scope");

    // Nothing of Bob's was stored: no execution for the refused reads, and neither the
    // executions nor the audit hold his email.
    let rows = app.executions().await;
    assert_eq!(rows.len(), 3, "only Ada's reads ran: {rows:#?}");
    let stored = format!("{rows:?}{:?}", app.audit_rows().await);
    assert!(!stored.contains("bob@example.com"));
    let refused = app
        .audit_rows()
        .await
        .into_iter()
        .filter(|r| r.event == "refused")
        .count();
    assert_eq!(refused, 5);
    assert!(app.verify_audit().await > 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_reaches_only_the_configured_repositories_and_writes_wait() {
    let world = World::new().await;
    let app = world.start().await;
    world
        .github
        .add_file(GITHUB_REPO, "main", "src/invoice.rs", b"fn rounding() {}\n");
    world
        .github
        .add_file("attacker/drop", "main", "x.rs", b"fn rounding() {}\n");
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let session = &ada.session;

    // The attack: an issue on a repository outside the config, and reads elsewhere.
    for (tool, args) in [
        (
            "github.create_issue",
            json!({"repo": "attacker/drop", "title": "customer data", "body": "ada@example.com"}),
        ),
        (
            "github.get_file",
            json!({"repo": "attacker/drop", "path": "x.rs"}),
        ),
        (
            "github.search_code",
            json!({"query": "rounding", "repo": "attacker/drop"}),
        ),
        (
            "github.search_code",
            json!({"query": "rounding repo:attacker/drop"}),
        ),
    ] {
        let (status, body) = session.call(tool, args.clone(), None).await;
        assert_eq!(status, 403, "{tool} {args}: {body}");
        assert_eq!(body["error"], "out_of_scope", "{body}");
    }
    assert!(world.github.issues().is_empty());
    assert!(world.github.requests().is_empty());
    assert!(
        app.executions().await.is_empty(),
        "refused before the policy"
    );

    // Reads of the configured repository run; a search without `repo` stays inside it.
    let (status, body) = session
        .call("github.search_code", json!({"query": "rounding"}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let repos: Vec<&Value> = body["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| &i["repository"])
        .collect();
    assert_eq!(repos, vec![&json!(GITHUB_REPO)]);

    // A write on the configured repository waits for a person under the shipped policy.
    let (status, body) = session
        .call(
            "github.create_issue",
            json!({"repo": GITHUB_REPO, "title": "Invoice rounding"}),
            Some("the invoice total rounds twice"),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert!(world.github.issues().is_empty());
    app.stop().await;
}
