//! The harness choice and the bridge.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixListener};

use crate::bridge;
use crate::harness::Harness;

/// The harness of an agent answer given as JSON.
fn harness_of(agent: serde_json::Value) -> Option<Harness> {
    let agent: threadgate_api::AgentView = serde_json::from_value(agent).expect("an agent");
    Harness::of(&agent)
}

#[test]
fn the_agent_file_chooses_the_harness_and_its_urls() {
    assert_eq!(
        harness_of(json!({"name": "support", "harness": null})),
        None
    );
    assert_eq!(harness_of(json!({"name": "support"})), None);
    assert_eq!(
        harness_of(json!({"name": "support", "harness": {"command": [], "port": 7345}})),
        None
    );
    let h = harness_of(json!({"name": "support", "harness": {
        "command": ["/opt/agent", "--mcp", "{mcp_url}", "--llm={model_base_url}"], "port": 7345}}))
    .expect("a harness");
    assert_eq!(h.mcp_url(), "http://127.0.0.1:7345/mcp");
    assert_eq!(
        h.argv(),
        [
            "/opt/agent",
            "--mcp",
            "http://127.0.0.1:7345/mcp",
            "--llm=http://127.0.0.1:7345/v1/model"
        ]
    );
}

#[tokio::test]
async fn the_bridge_pipes_loopback_connections_to_the_socket_and_caps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("api.sock");
    let upstream = UnixListener::bind(&socket).expect("bind socket");
    // The socket's side: answer each connection's bytes reversed.
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = upstream.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 5];
                if c.read_exact(&mut buf).await.is_ok() {
                    buf.reverse();
                    let _ = c.write_all(&buf).await;
                    // Hold the connection until the client's side ends.
                    let mut rest = Vec::new();
                    let _ = c.read_to_end(&mut rest).await;
                }
            });
        }
    });
    let listener = bridge::bind(0).await.expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    assert!(addr.ip().is_loopback());
    tokio::spawn(bridge::serve(listener, socket));

    let mut held = Vec::new();
    for _ in 0..bridge::MAX_CONNECTIONS {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"hello").await.expect("write");
        let mut back = [0u8; 5];
        c.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"olleh");
        held.push(c);
    }
    // One over the cap is closed without reaching the socket.
    let mut extra = TcpStream::connect(addr).await.expect("connect");
    let _ = extra.write_all(b"hello").await;
    let mut back = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut back))
        .await
        .expect("closed, not left hanging");
    assert!(read.is_err() || back.is_empty(), "{back:?}");
    // A freed slot serves again.
    drop(held.pop());
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let _ = c.write_all(b"again").await;
            let mut back = [0u8; 5];
            if c.read_exact(&mut back).await.is_ok() {
                return back;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a slot frees");
    assert_eq!(&served, b"niaga");
}
