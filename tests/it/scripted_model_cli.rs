//! `threadgate scripted-model --listen ADDR` serves the scripted model (labelled as not a
//! real model) in both wire formats, as `scripts/demo.sh` runs it.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::json;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_cli_serves_both_formats_labelled_as_scripted() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let _server = Killed(
        Command::new(env!("CARGO_BIN_EXE_threadgate"))
            .args(["scripted-model", "--listen", &format!("127.0.0.1:{port}")])
            .spawn()
            .expect("spawn"),
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the server did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let said = json!([{"role": "user", "content": "cus_Q I was charged twice"}]);
    let openai: serde_json::Value = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "scripted-model", "messages": said}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(openai["model"], "scripted-model (not a real model)");
    let message = &openai["choices"][0]["message"];
    assert!(
        message["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("[scripted model, not a real model]")
    );
    assert_eq!(
        message["tool_calls"][0]["function"]["name"],
        "stripe__list_charges"
    );
    let anthropic: serde_json::Value = http
        .post(format!("{base}/v1/messages"))
        .json(&json!({"model": "scripted-model", "max_tokens": 100, "messages": said}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(anthropic["model"], "scripted-model (not a real model)");
    assert_eq!(anthropic["stop_reason"], "tool_use");
    assert_eq!(
        anthropic["content"][1]["input"],
        json!({"customer": "cus_Q"})
    );
}
