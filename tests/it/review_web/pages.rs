//! What the review pages show: the queue's fields (summary in words, customer, agent,
//! rule, time left, the thread's Plain link), the approval page's other calls on the
//! thread, and the history's reviewer, message and outcome, and the thread's trail.

use std::time::Duration;

use serde_json::json;

use super::web::{Web, add_reviewer};
use crate::support::app::TestApp;
use crate::support::world::{World, refunds};

/// Plain's link to a thread, as configured for the test world.
const THREAD_URL: &str = "https://plain.test/workspace/w_1/thread/{thread_id}";

/// The rule text the pages show for a held call: `because (line N)`.
async fn rule_of(app: &TestApp, id: &str) -> String {
    let id = id.to_owned();
    app.db
        .read(move |c| {
            c.query_row(
                "SELECT because, rule_line FROM executions WHERE id = ?1",
                [id],
                |r| {
                    let because: String = r.get(0)?;
                    let line: Option<i64> = r.get(1)?;
                    Ok(match line {
                        Some(line) => format!("{because} (line {line})"),
                        None => because,
                    })
                },
            )
        })
        .await
        .expect("rule")
}

/// `text` as the templates escape it.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// Decides `id` as `web` with a message.
async fn decide(web: &Web, id: &str, decision: &str) -> u16 {
    let path = format!("/approvals/{id}/decide");
    let fields = [
        ("csrf", web.csrf.as_str()),
        ("decision", decision),
        ("message", "Checked with finance."),
    ];
    web.post(&path, &fields).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_the_approval_and_the_history_show_their_fields() {
    let mut world = World::new().await;
    world.settings.plain.thread_url = Some(THREAD_URL.to_owned());
    // The hour the clock moves below must not make the session idle: its socket would
    // close (and reopen on the decision) while the test still talks to it.
    world.settings.sessions.idle_timeout = Duration::from_secs(24 * 3600);
    let (app, clock) = world.start_with_clock().await;
    add_reviewer(&app, "alice").await;
    add_reviewer(&app, "bob").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000, 3000])
        .await;
    let note = json!({"text": "Looked at the two charges of this month."});
    let (status, body) = ada.session.call("helpdesk.add_note", note, None).await;
    assert_eq!(status, 200, "{body}");
    let first = ada.session.hold_refund(&ada.charges[0], 1000).await;
    let second = ada.session.hold_refund(&ada.charges[1], 250).await;
    // An hour later on threadgate's clock (the policy's ttl is 4h).
    clock.advance(Duration::from_secs(3600));

    let alice = Web::sign_in(&app, "alice").await;
    let (status, queue) = alice.get("/approvals").await;
    assert_eq!(status, 200);
    let thread = &ada.session.thread_id;
    let link = THREAD_URL.replace("{thread_id}", thread);
    let summary = format!(
        "Refund 10.00 USD on {} (requested_by_customer)",
        ada.charges[0]
    );
    let rule = rule_of(&app, &first).await;
    for shown in [
        summary.clone(),
        "<dt>Customer</dt><dd>ada@example.com</dd>".to_owned(),
        "<dt>Agent</dt><dd>support</dd>".to_owned(),
        format!("<dt>Held by</dt><dd>{}</dd>", escaped(&rule)),
        "2 h 59 min left".to_owned(),
        "<dt>Waiting</dt><dd>1 h 0 min</dd>".to_owned(),
        format!("href=\"{}\"", escaped(&link)),
    ] {
        assert!(queue.contains(&shown), "the queue shows {shown}: {queue}");
    }
    assert!(
        !queue.contains("{&#34;") && !queue.contains("{\""),
        "no raw JSON in the summary: {queue}"
    );

    let (_, page) = alice.get(&format!("/approvals/{first}")).await;
    assert!(
        page.contains(&format!("href=\"{}\"", escaped(&link))),
        "{page}"
    );
    let others = &page[page.find("Other calls on this thread").expect("others")..];
    assert!(
        others.contains(&format!("href=\"/approvals/{second}\""))
            && others.contains("helpdesk.add_note")
            && others.contains("Looked at the two charges of this month."),
        "the other calls of the thread: {others}"
    );
    assert!(
        !others.contains(&format!("/approvals/{first}\"")),
        "{others}"
    );

    // alice denies one with a message; bob approves the other, which runs.
    assert_eq!(decide(&alice, &second, "deny").await, 200);
    let bob = Web::sign_in(&app, "bob").await;
    assert_eq!(decide(&bob, &first, "approve").await, 200);
    let done = ada.session.wait(&first, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    let made = refunds(&world.stripe).await;
    let refund_id = made[0]["id"].as_str().expect("refund id");

    let (_, history) = alice.get("/approvals/history").await;
    let card = |id: &str| -> String {
        let at = history
            .find(&format!("href=\"/approvals/{id}\""))
            .unwrap_or_else(|| panic!("{id} in the history: {history}"));
        let end = history[at..]
            .find("</li>")
            .map_or(history.len(), |e| at + e);
        history[at..end].to_owned()
    };
    let denied = card(&second);
    assert!(
        denied.contains("<dt>Decided by</dt><dd>alice</dd>")
            && denied.contains("Checked with finance.")
            && denied.contains("<dt>Outcome</dt><dd class=\"outcome\">denied</dd>"),
        "{denied}"
    );
    let approved = card(&first);
    assert!(
        approved.contains("<dt>Decided by</dt><dd>bob</dd>") && approved.contains(refund_id),
        "the history shows who approved and what ran: {approved}"
    );

    let (_, trail) = alice.get(&format!("/threads/{thread}")).await;
    for event in ["requested", "held", "denied", "approved", "ran"] {
        assert!(trail.contains(&format!(">{event}<")), "{event}: {trail}");
    }
    assert!(
        trail.contains(">alice<") && trail.contains(">bob<"),
        "{trail}"
    );
    app.stop().await;
}

/// The queue comes a page at a time (25 held calls), filtered by thread, tool and age,
/// oldest or newest first, with the filters kept in the page links; a filter the page
/// cannot read is a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_pages_and_filters_held_calls() {
    let mut world = World::new().await;
    // More held calls in one session than the default cap on pending holds.
    world.settings.sessions.max_pending_holds = 30;
    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[100_000])
        .await;
    let bob = world
        .customer_session(&app, "bob@example.com", &[100_000])
        .await;
    let mut ada_holds = Vec::new();
    for i in 0..22 {
        ada_holds.push(ada.session.hold_refund(&ada.charges[0], 1_000 + i).await);
    }
    let mut bob_holds = Vec::new();
    for i in 0..6 {
        bob_holds.push(bob.session.hold_refund(&bob.charges[0], 2_000 + i).await);
    }
    let web = Web::sign_in(&app, "alice").await;
    let ids_on = |page: &str| -> Vec<String> {
        page.match_indices("href=\"/approvals/ex_")
            .map(|(at, _)| page[at + 17..].split('"').next().unwrap_or("").to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };

    let (status, first) = web.get("/approvals").await;
    assert_eq!(status, 200);
    assert!(first.contains("Page 1 of 2"), "{first}");
    assert!(first.contains("<span class=\"count\">28</span>"), "{first}");
    assert_eq!(ids_on(&first).len(), 25);
    assert!(first.contains("href=\"/approvals?page=2\""), "{first}");
    assert!(
        first.find(&ada_holds[0]) < first.find(&ada_holds[1]),
        "oldest first"
    );
    let (_, second) = web.get("/approvals?page=2").await;
    assert_eq!(ids_on(&second).len(), 3);
    assert!(second.contains("Page 2 of 2"), "{second}");

    let thread = &bob.session.thread_id;
    let (_, bobs) = web
        .get(&format!("/approvals?thread={thread}&order=newest"))
        .await;
    let shown = ids_on(&bobs);
    let mut expected = bob_holds.clone();
    expected.sort();
    assert_eq!(shown, expected, "only bob's thread");
    assert!(
        bobs.find(&bob_holds[5]) < bobs.find(&bob_holds[0]),
        "newest first"
    );
    let (_, none) = web.get("/approvals?tool=github.create_issue").await;
    assert!(
        ids_on(&none).is_empty() && none.contains("under these filters"),
        "{none}"
    );
    let (_, young) = web.get("/approvals?age=2h").await;
    assert!(ids_on(&young).is_empty(), "nothing has waited two hours");

    for (query, field) in [
        ("order=sideways", "order"),
        ("page=0", "page"),
        ("age=soon", "age"),
        ("thread=%3Cscript%3E", "thread"),
    ] {
        let (status, body) = web.get(&format!("/approvals?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(&format!("{field} must")), "{query}: {body}");
    }
    app.stop().await;
}
