//! A session's pace of tool calls (`[sessions] calls_per_second`, `calls_burst`): an
//! agent that loops on calls is refused `rate_limited` past its burst, nothing of the
//! refused calls recorded or sent, and is served again as its bucket refills; another
//! session is not held back.

use std::time::Duration;

use serde_json::json;

use crate::support::wait::eventually_within;
use crate::support::world::World;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_sessions_pace_are_refused_and_served_again_as_it_refills() {
    let mut world = World::new().await;
    world.settings.sessions.calls_per_second = 1;
    world.settings.sessions.calls_burst = 5;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let bo = world.customer_session(&app, "bo@example.com", &[700]).await;
    let read = |charge: &str| json!({"charge": charge});
    let before = app.executions_of("stripe.get_charge").await.len();

    // A loop of reads: the burst runs, then one a second at most.
    let mut answers = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..20 {
        answers.push(
            ada.session
                .call("stripe.get_charge", read(&ada.charges[0]), None)
                .await,
        );
    }
    let ran = answers.iter().filter(|(status, _)| *status == 200).count();
    let limited: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .collect();
    // The burst, and at most one more for each second the loop took.
    let refilled = usize::try_from(started.elapsed().as_secs()).expect("seconds") + 1;
    assert!(
        (5..=5 + refilled).contains(&ran),
        "{ran} ran: the burst of 5 and at most {refilled} refilled meanwhile"
    );
    assert_eq!(ran + limited.len(), 20, "{answers:?}");
    let (_, refusal) = limited[0];
    assert_eq!(refusal["error"], "rate_limited", "{refusal}");
    let message = refusal["message"].as_str().expect("a message");
    assert!(
        message.contains("calls_per_second (1)") && message.contains("calls_burst (5)"),
        "{message}"
    );
    // Nothing of a refused call was recorded.
    assert_eq!(
        app.executions_of("stripe.get_charge").await.len(),
        before + ran
    );

    // Another session has a bucket of its own.
    let (status, answer) = bo
        .session
        .call("stripe.get_charge", read(&bo.charges[0]), None)
        .await;
    assert_eq!(status, 200, "{answer}");

    // The bucket refills: the agent is served again.
    eventually_within(Duration::from_secs(10), "a call runs again", || async {
        ada.session
            .call("stripe.get_charge", read(&ada.charges[0]), None)
            .await
            .0
            == 200
    })
    .await;
    app.stop().await;
}
