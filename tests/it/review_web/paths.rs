//! The host's paths stay on the host: a policy file at a distinctive absolute path is
//! shown by its name and line only, in the agent's 202, the held call's note, the
//! review pages and the unauthenticated `/readyz`.

use serde_json::Value;

use super::web::{Web, add_reviewer};
use crate::support::world::World;

/// The directory's own name: nothing outside the host should ever say it.
const PRIVATE_DIR: &str = "ops-private-7c1d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_part_of_the_policy_files_directory_is_shown_anywhere() {
    let mut world = World::new().await;
    let dir = world
        .dir
        .path()
        .canonicalize()
        .expect("tempdir")
        .join(PRIVATE_DIR)
        .join("policies");
    std::fs::create_dir_all(&dir).expect("policy dir");
    let policy = dir.join("refunds-policy.yaml");
    std::fs::copy(&world.settings.policy_file, &policy).expect("copy the policy");
    world.settings.policy_file = policy;
    // Every part of the directory that names something of this host.
    let dir_text = dir.display().to_string();
    let tempdir_name = world
        .dir
        .path()
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let leaks = |what: &str, shown: &str| {
        for part in [dir_text.as_str(), PRIVATE_DIR, tempdir_name.as_str()] {
            assert!(!shown.contains(part), "{what} shows {part:?}: {shown}");
        }
    };

    let app = world.start().await;
    add_reviewer(&app, "alice").await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let args = serde_json::json!({"charge": ada.charges[0], "amount": 700,
        "reason": "requested_by_customer"});
    let (status, held) = ada
        .session
        .call("stripe.create_refund", args, Some("a double charge"))
        .await;
    assert_eq!(status, 202, "{held}");
    leaks("the 202", &held.to_string());
    let summary = held["approval_summary"].as_str().unwrap_or_default();
    assert!(summary.contains("(refunds-policy.yaml:"), "{held}");
    let id = held["execution_id"].as_str().expect("id");

    let note = world
        .note_containing(&ada.session.thread_id, id, "the held call's note")
        .await;
    leaks("the note", &note);
    assert!(note.contains("refunds-policy.yaml:"), "{note}");
    let queued = app.notes(&ada.session.thread_id).await;
    leaks("the queued notes", &queued.join("\n"));

    let alice = Web::sign_in(&app, "alice").await;
    for page in ["/approvals".to_owned(), format!("/approvals/{id}")] {
        let (status, html) = alice.get(&page).await;
        assert_eq!(status, 200, "{page}");
        leaks(&page, &html);
    }
    let (status, execution) = ada.session.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(status, 200, "{execution}");
    leaks("the agent's view of the execution", &execution.to_string());

    let readyz: Value = app
        .http
        .get(format!("http://{}/readyz", app.addr))
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("JSON");
    leaks("/readyz", &readyz.to_string());
    assert_eq!(readyz["checks"]["policy"]["file"], "refunds-policy.yaml");
    app.stop().await;
}
