//! With `--features otlp`, threadgate's spans reach an OpenTelemetry collector over
//! OTLP/HTTP with their ids. The collector here is a plain HTTP listener that keeps
//! what is posted to `/v1/traces` (protobuf; the test looks for the span's name and
//! field values in it). Without the feature this file compiles to nothing, and
//! `init_serving` refusing an endpoint is tested instead.

#[cfg(not(feature = "otlp"))]
#[test]
fn an_endpoint_without_the_feature_is_refused() {
    let error = threadgate::telemetry::init_serving(Some("http://127.0.0.1:4318"))
        .err()
        .expect("refused");
    assert!(error.contains("--features otlp"), "{error}");
}

#[cfg(feature = "otlp")]
#[test]
fn spans_reach_the_collector_with_their_ids() {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    // The collector: answers every request 200 and sends its raw bytes back here.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let (posted, received) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 16 * 1024];
            // Read the headers, then as many body bytes as Content-Length says.
            let body_len = loop {
                let n = stream.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break None;
                }
                request.extend_from_slice(&buf[..n]);
                if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    break Some(end + 4 + len);
                }
            };
            let Some(total) = body_len else { continue };
            while request.len() < total {
                let n = stream.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
            let _ = posted.send(request);
        }
    });

    let guard = threadgate::telemetry::init_serving(Some(&endpoint)).expect("export set up");
    {
        let span = tracing::info_span!(
            target: "threadgate::gateway",
            "execute",
            execution_id = "ex_otlp_0123456789",
            thread_id = "th_OTLP01"
        );
        let _entered = span.enter();
        tracing::info!(target: "threadgate::gateway", "provider answered");
    }
    // A span outside threadgate is not exported.
    drop(tracing::info_span!(target: "hyper", "not_ours_span").entered());
    drop(guard); // flushes the batch

    let request = received
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the collector received a post");
    let text = String::from_utf8_lossy(&request);
    assert!(text.starts_with("POST /v1/traces "), "{text}");
    for needle in ["execute", "ex_otlp_0123456789", "th_OTLP01", "threadgate"] {
        assert!(text.contains(needle), "{needle} missing from the export");
    }
    assert!(!text.contains("not_ours_span"));
}
