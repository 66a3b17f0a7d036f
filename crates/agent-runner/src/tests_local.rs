//! The runner's own tools: the gateway listing as function tools, and the local
//! workspace tools (confinement, caps).

use serde_json::{Value, json};

use crate::local;
use crate::tests::listing;
use crate::tools::GatewayTools;

#[test]
fn gateway_tools_become_function_tools_with_schemas_and_a_diagnosis() {
    let tools = GatewayTools::from_listing(&listing());
    let refund = tools
        .definitions()
        .iter()
        .find(|d| d["function"]["name"] == "stripe__create_refund")
        .unwrap();
    let params = &refund["function"]["parameters"];
    assert_eq!(params["properties"]["amount"]["type"], "integer");
    assert_eq!(params["required"], json!(["charge"]));
    assert_eq!(params["properties"]["diagnosis"]["type"], "string");
    let reason = &params["properties"]["reason"];
    assert_eq!(
        (reason["enum"].clone(), reason["description"].as_str()),
        (json!(["duplicate", "fraudulent"]), Some("Why."))
    );
    assert!(
        refund["function"]["description"]
            .as_str()
            .unwrap()
            .starts_with("Refunds a charge. Gateway tool"),
        "{refund}"
    );
    let issue = tools
        .definitions()
        .iter()
        .find(|d| d["function"]["name"] == "github__create_issue")
        .unwrap();
    assert_eq!(
        issue["function"]["parameters"]["properties"]["labels"]["items"]["type"],
        "string"
    );
    assert_eq!(
        tools.resolve("stripe__create_refund"),
        Some("stripe.create_refund")
    );
    assert_eq!(
        tools.resolve("stripe.create_refund"),
        Some("stripe.create_refund")
    );
    assert_eq!(tools.resolve("stripe__delete_customer"), None);
    for d in tools.definitions() {
        let name = d["function"]["name"].as_str().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name}"
        );
    }
}

#[tokio::test]
async fn local_tools_stay_inside_the_workspace() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    std::fs::write(root.join("lib.rs"), "fn charge_twice() {}\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s3cr3t").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
    let run = |name: &'static str, args: Value| {
        let root = root.to_path_buf();
        async move { local::run(&root, name, &args).await.unwrap() }
    };
    assert!(
        run("workspace__read_file", json!({"path": "../etc/passwd"}))
            .await
            .is_err()
    );
    assert!(
        run("workspace__read_file", json!({"path": "/etc/passwd"}))
            .await
            .is_err()
    );
    assert!(
        run("workspace__read_file", json!({"path": "escape/secret"}))
            .await
            .is_err()
    );
    assert!(
        run(
            "workspace__write_file",
            json!({"path": "escape/new", "content": "x"})
        )
        .await
        .is_err()
    );
    assert!(!outside.path().join("new").exists());
    assert!(
        run("workspace__list_files", json!({"path": "escape"}))
            .await
            .is_err()
    );
    let read = run("workspace__read_file", json!({"path": "lib.rs"}))
        .await
        .unwrap();
    assert_eq!(read["content"], "fn charge_twice() {}\n");
    run(
        "workspace__write_file",
        json!({"path": "notes/finding.md", "content": "dup"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("notes/finding.md")).unwrap(),
        "dup"
    );
    let listed = run("workspace__list_files", json!({})).await.unwrap();
    assert!(
        listed["entries"]
            .as_array()
            .unwrap()
            .contains(&json!("notes/finding.md"))
    );
}

#[tokio::test]
async fn search_and_commands_are_capped() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    std::fs::write(root.join("billing.rs"), "fn refund() {}\nfn charge() {}\n").unwrap();
    let found = local::run(
        root,
        "workspace__search_code",
        &json!({"pattern": "fn ref"}),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        found["matches"]
            .as_str()
            .unwrap()
            .contains("billing.rs:1:fn refund() {}"),
        "{found}"
    );
    let started = std::time::Instant::now();
    let slow = local::run(
        root,
        "workspace__run_command",
        &json!({"command": "sleep 30 & sleep 30", "timeout_secs": 1}),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(slow["timed_out"], true);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let loud = local::run(
        root,
        "workspace__run_command",
        &json!({"command": "head -c 1000000 /dev/zero | tr '\\0' a"}),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(loud["truncated"], true);
    assert_eq!(loud["stdout"].as_str().unwrap().len(), 16 * 1024);
    assert_eq!(loud["exit_code"], 0);
}
