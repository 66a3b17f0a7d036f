//! What the model proxy adds to a model call: the same OpenAI chat-completions request
//! through a session's socket (parse, budget read, secret scan, the turn's durable
//! row, the upstream call, the tokens and the audit row) against straight to the
//! scripted upstream with reqwest, in the same run. Criterion reports the median of
//! each; compare the two.
//!
//! `cargo bench --bench model_proxy`. Needs `.venv-peers` (`scripts/localstripe.sh
//! setup`): the harness starts the gateway's peers too.

#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]
#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]

#[path = "../tests/it/support/mod.rs"]
pub mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use threadgate::model::Provider;
use threadgate::model::scripted::ScriptedModel;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (world, app, session, model) = rt.block_on(async {
        let mut world = support::world::World::new().await;
        let model = ScriptedModel::start("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("scripted model");
        world.settings.model.provider = Provider::Scripted;
        world.settings.model.base_url = model.openai_base();
        let agents = world.dir.path().join("agents");
        std::fs::create_dir_all(&agents).expect("agents dir");
        let text = std::fs::read_to_string(support::plain::repo_root().join("agents/support.md"))
            .expect("support.md")
            .replace("max_tokens: 200000", "max_tokens: 1000000000000")
            .replace("max_turns: 40", "max_turns: 1000000000");
        std::fs::write(agents.join("support.md"), text).expect("write");
        world.settings.agents_dir = agents;
        let app = world.start().await;
        let session = world
            .customer_session(&app, "bench@example.com", &[900])
            .await
            .session;
        (world, app, session, model)
    });
    let messages = json!([
        {"role": "system", "content": "You are the support agent."},
        {"role": "user", "content": "I was charged twice for my order."},
    ]);
    let tools = json!([{"type": "function", "function": {"name": "stripe.list_charges",
        "description": "list", "parameters": {"type": "object", "properties": {"customer": {"type": "string"}}}}}]);
    let through = json!({"messages": messages, "tools": tools});
    let direct = json!({"model": "scripted-model", "messages": messages, "tools": tools});
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", model.openai_base());

    let mut group = c.benchmark_group("model_call");
    group.sample_size(100);
    group.bench_function("through_proxy_socket", |b| {
        b.iter(|| {
            rt.block_on(async {
                let (status, body) = support::unix_http::unix_request(
                    &session.socket,
                    "POST",
                    "/v1/model/chat/completions",
                    Some(&through),
                )
                .await;
                assert_eq!(status, 200, "{body}");
            })
        })
    });
    group.bench_function("direct_to_scripted_upstream", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = http.post(&url).json(&direct).send().await.expect("send");
                assert!(r.status().is_success());
                r.bytes().await.expect("body");
            })
        })
    });
    group.finish();
    rt.block_on(app.stop());
    drop(world);
}

criterion_group!(benches, bench);
criterion_main!(benches);
