//! rmcp's client inside a real sandbox container: the agent file's `harness:` makes
//! `threadgate-agent-runner` open its bridge on the container's loopback and run
//! `examples/mcp_probe.rs` (committed to the repository the thread's branch starts
//! from), which talks MCP to `http://127.0.0.1:PORT/mcp` while a reviewer approves.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadgate::model::Provider;
use threadgate::sandbox::LABEL_INSTANCE;

use crate::support::agent::AgentWorld;
use crate::support::plain::{plain_id, repo_root};
use crate::support::world::{STRIPE_KEY, refunds};

/// How long the probe may take from the webhook to its last step.
const PROBE_WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_in_a_real_container_gets_the_gated_tools_through_the_bridge() {
    if crate::support::docker::skip() {
        return;
    }
    let mut w = AgentWorld::new(Provider::Scripted).await;
    let probe = built_probe(w.world.dir.path());
    let customer = w.customer(&[5000, 3000]).await;
    let other_thread = plain_id("th");
    w.world
        .plain
        .add_thread(&other_thread, &plain_id("c"), "bob@example.com");
    let plan = json!({"customer": customer.stripe_id, "charges": customer.charges,
        "other_thread": other_thread, "secret": STRIPE_KEY});
    commit_tools(&w.world.settings.repo.path, &probe, &plan);
    w.world.settings.agents_dir = agent_with_harness(w.world.dir.path());
    let app = w.start().await;
    let thread = w
        .open_thread(&app, &customer, "Hi, I'd like a refund please.")
        .await;

    let alice = app.add_reviewer("alice").await;
    let first = w.held_refund(&app).await;
    let (status, body) = app.decide(&first, &alice, "approve", "fine").await;
    assert_eq!(status, 200, "{body}");
    let second = w.held_refund(&app).await;
    assert_ne!(first, second);
    let (status, body) = app.decide(&second, &alice, "approve", "fine too").await;
    assert_eq!(status, 200, "{body}");
    let steps = probe_output(&w.instance).await;
    let step = |name: &str| -> Value {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .map(|s| s["body"].clone())
            .unwrap_or_else(|| panic!("no step {name}: {steps:?}"))
    };

    assert_eq!(step("env")["mcp_url"], "http://127.0.0.1:7345/mcp");
    assert_eq!(
        step("env")["model_base_url"],
        "http://127.0.0.1:7345/v1/model"
    );
    let model = step("model");
    assert_eq!(
        model["status"], 200,
        "the model proxy through the bridge: {model}"
    );
    assert_eq!(model["object"], "chat.completion", "{model}");
    let tools = step("tools");
    assert!(
        tools
            .as_array()
            .is_some_and(|t| t.contains(&json!("stripe.create_refund"))
                && t.last() == Some(&json!("threadgate_wait"))),
        "{tools}"
    );
    let read = step("read");
    assert_eq!(read["status"], "ok", "{read}");
    assert!(read.to_string().contains(&customer.charges[0]));
    assert_eq!(step("other_thread")["error"], "out_of_scope");
    assert_eq!(step("secret")["error"], "secret_in_arguments");
    assert!(!steps.iter().any(|s| s.to_string().contains(STRIPE_KEY)));
    let held = step("held");
    assert_eq!(held["status"], "pending_approval", "{held}");
    assert_eq!(held["execution_id"], json!(first));
    let waited = step("waited");
    assert_eq!(waited["status"], "ok", "{waited}");
    assert_eq!(waited["result"]["amount"], 1000);

    let asked = step("input_required");
    assert_eq!(asked["input_required"], true, "{asked}");
    assert_eq!(asked["meta"]["threadgate/execution_id"], json!(second));
    assert_eq!(asked["input_requests"]["approval"]["params"]["mode"], "url");
    assert_eq!(step("forged")["error"], "invalid_request_state");
    let redeemed = step("redeemed");
    assert_eq!(redeemed["status"], "ok", "{redeemed}");
    assert_eq!(redeemed["result"]["amount"], 500);
    assert_eq!(step("replayed")["error"], "invalid_request_state");

    let made = refunds(&w.world.stripe).await;
    let mut amounts: Vec<i64> = made.iter().filter_map(|r| r["amount"].as_i64()).collect();
    amounts.sort_unstable();
    assert_eq!(amounts, [500, 1000], "{made:?}");
    let plain = w.world.plain.thread(&other_thread);
    assert!(plain.replies().is_empty());
    let _ = thread;
    app.stop().await;
}

/// `examples/mcp_probe.rs`, stripped into `dir`. `scripts/test.sh` builds it with
/// `cargo build --example mcp_probe` before `cargo test` (which builds examples as test
/// harnesses, under hashed names, not the program); under nextest, which releases
/// cargo's build lock while tests run, it is built here, so it is never stale.
fn built_probe(dir: &Path) -> PathBuf {
    if std::env::var_os("NEXTEST").is_some() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--example", "mcp_probe"])
            .current_dir(repo_root())
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build --example mcp_probe");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let built = target.join("debug/examples/mcp_probe");
    assert!(
        built.exists(),
        "{} is missing: run `cargo build --example mcp_probe` (scripts/test.sh does)",
        built.display()
    );
    let stripped = dir.join("mcp-probe");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&built)
        .status()
        .expect("run strip");
    assert!(status.success(), "strip the probe");
    stripped
}

/// Commits `tools/mcp-probe` (executable) and `tools/probe.json` on `main`.
fn commit_tools(repo: &Path, probe: &Path, plan: &Value) {
    let repo = git2::Repository::open(repo).expect("repo");
    let head = repo
        .find_reference("refs/heads/main")
        .and_then(|r| r.peel_to_commit())
        .expect("main");
    let probe_blob = repo
        .blob(&std::fs::read(probe).expect("read probe"))
        .expect("blob");
    let plan_blob = repo.blob(plan.to_string().as_bytes()).expect("blob");
    let mut tools = repo.treebuilder(None).expect("treebuilder");
    tools
        .insert("mcp-probe", probe_blob, 0o100755)
        .expect("insert");
    tools
        .insert("probe.json", plan_blob, 0o100644)
        .expect("insert");
    let tools = tools.write().expect("tools tree");
    let base = head.tree().expect("tree");
    let mut root = repo.treebuilder(Some(&base)).expect("treebuilder");
    root.insert("tools", tools, 0o040000).expect("insert");
    let tree = repo.find_tree(root.write().expect("root")).expect("tree");
    let sig = git2::Signature::now("test", "test@example.com").expect("sig");
    repo.commit(
        Some("refs/heads/main"),
        &sig,
        &sig,
        "the team's MCP harness",
        &tree,
        &[&head],
    )
    .expect("commit");
}

/// A copy of `agents/support.md` whose `harness:` is the probe.
fn agent_with_harness(dir: &Path) -> PathBuf {
    let agents = dir.join("agents-mcp");
    std::fs::create_dir_all(&agents).expect("agents dir");
    let text = std::fs::read_to_string(repo_root().join("agents/support.md")).expect("support.md");
    let harness = "harness:\n  command: [\"/workspace/tools/mcp-probe\", \"/workspace/tools/probe.json\"]\nlimits:\n";
    assert!(text.contains("\nlimits:\n"));
    std::fs::write(
        agents.join("support.md"),
        text.replacen("\nlimits:\n", &format!("\n{harness}"), 1),
    )
    .expect("write agent");
    agents
}

/// The probe's `PROBE {...}` lines from its container's log, once it printed `DONE`.
async fn probe_output(instance: &str) -> Vec<Value> {
    let deadline = Instant::now() + PROBE_WAIT;
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    loop {
        let (_, ids, _) = crate::support::docker::docker(&["ps", "-aq", "--filter", &filter]);
        let mut logs = String::new();
        for id in ids.split_whitespace() {
            let (_, out, err) = crate::support::docker::docker(&["logs", id]);
            logs.push_str(&out);
            logs.push_str(&err);
        }
        if logs.contains("PROBE DONE") {
            return logs
                .lines()
                .filter_map(|l| l.strip_prefix("PROBE "))
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "the probe did not finish; logs:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
