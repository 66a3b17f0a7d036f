//! A minimal HTTP/1.1 client over a unix socket, as an agent in its sandbox talks to
//! `/run/threadgate/api.sock`: one request per connection (`Connection: close`), the
//! status line and the JSON body.

use std::io::Write as _;
use std::path::Path;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

/// One HTTP/1.1 request over a unix socket with `Connection: close`; answers the status
/// and the JSON body (or the body as a JSON string when it is not JSON).
pub async fn unix_request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let payload = body.map(|b| b.to_string());
    unix_request_raw(socket, method, path, payload.as_deref()).await
}

/// [`unix_request`], or `None` when the server cut the connection (refused, reset or
/// closed before a whole answer): what a request racing the socket's close may get.
pub async fn unix_request_or_cut(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Option<(u16, Value)> {
    let mut stream = UnixStream::connect(socket).await.ok()?;
    stream
        .write_all(&request_bytes(
            method,
            path,
            body.map(|b| b.to_string()).as_deref(),
        ))
        .await
        .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    raw.windows(4)
        .any(|w| w == b"\r\n\r\n")
        .then(|| parse_response(&raw))
}

/// [`unix_request`] with the body's exact bytes.
pub async fn unix_request_raw(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let mut stream = UnixStream::connect(socket)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    let request = request_bytes(method, path, body);
    stream.write_all(&request).await.expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read response");
    parse_response(&raw)
}

/// One request's bytes, `Connection: close`, with `body` as JSON when there is one.
fn request_bytes(method: &str, path: &str, body: Option<&str>) -> Vec<u8> {
    let payload = body.unwrap_or_default();
    let mut request = Vec::new();
    write!(
        request,
        "{method} {path} HTTP/1.1\r\nHost: threadgate\r\nConnection: close\r\n"
    )
    .expect("write");
    if body.is_some() {
        write!(
            request,
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            payload.len()
        )
        .expect("write");
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(payload.as_bytes());
    request
}

fn parse_response(raw: &[u8]) -> (u16, Value) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response has a head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut body = raw[split + 4..].to_vec();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, value)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or("0"), 16)
            .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}
