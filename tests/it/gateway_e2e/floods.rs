//! Floods (issue 7 items 4, 6 and 8): idle, slow-header and slow-body connections on
//! the people's listener are closed; a session flooding its own socket exhausts only
//! itself; an events page is bounded by bytes; files and sockets are private.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};

use crate::support::plain::{email_received, plain_id};
use crate::support::world::World;

/// Waits until the server closes `stream` (EOF or reset); panics after `limit`.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(mut stream: S, limit: Duration) {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_header_connections_are_closed_and_webhooks_still_answer() {
    let mut world = World::new().await;
    world.settings.server.header_timeout = Duration::from_secs(1);
    world.settings.server.max_connections = 64;
    let app = world.start().await;

    let mut held = Vec::new();
    for i in 0..300 {
        let mut s = TcpStream::connect(app.addr).await.expect("connect");
        if i % 2 == 0 {
            // slowloris: a start line and one header, never the blank line
            s.write_all(b"POST /webhooks/plain HTTP/1.1\r\nHost: x\r\n")
                .await
                .expect("write");
        }
        held.push(s);
    }
    // Every one is closed by the server: over the cap at once, the rest at the header
    // timeout. On a server without timeouts these stay open forever.
    let waits = held
        .into_iter()
        .map(|s| tokio::spawn(closed_by_server(s, Duration::from_secs(20))));
    for w in waits {
        w.await.expect("task");
    }

    let health = app
        .http
        .get(format!("http://{}/healthz", app.addr))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let thread = plain_id("th");
    world
        .plain
        .add_thread(&thread, "c_flood", "flood@example.com");
    let status = app
        .send_webhook(&email_received(&thread, "c_flood", "flood@example.com"))
        .await;
    assert_eq!(status, 200, "a webhook is stored after the flood");
    app.stop().await;
}

/// One request on a fresh connection from `source`: the status, or `None` when the
/// server closed the connection without answering.
async fn status_from(source: &str, server: std::net::SocketAddr) -> Option<u16> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().expect("source"))
        .expect("bind the source address");
    let mut s = socket.connect(server).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("the server neither answered nor closed")
        .ok()?;
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_flooding_the_listener_cannot_lock_out_another() {
    let mut world = World::new().await;
    // Idle connections are kept long: only the caps decide who gets in.
    world.settings.server.header_timeout = Duration::from_secs(60);
    world.settings.server.max_connections = 64;
    world.settings.server.max_connections_per_address = 16;
    let app = world.start().await;

    // 127.0.0.1 opens 100 idle connections: more than the whole listener takes.
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(TcpStream::connect(app.addr).await.expect("connect"));
    }
    // Its 17th and later connections were closed at once (its share is 16)...
    let mut closed = 0;
    for s in held.split_off(16) {
        closed_by_server(s, Duration::from_secs(10)).await;
        closed += 1;
    }
    assert_eq!(closed, 84);
    assert_eq!(
        status_from("127.0.0.1", app.addr).await,
        None,
        "over its share"
    );
    // ...so another address is served at once. With only the global cap, the flood's
    // 64 idle connections would shut it out for the whole header timeout.
    assert_eq!(status_from("127.0.0.2", app.addr).await, Some(200));

    // Its share comes back as its connections close.
    drop(held);
    let mut served = None;
    for _ in 0..100 {
        served = status_from("127.0.0.1", app.addr).await;
        if served.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served, Some(200), "the address was not served again");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_is_cut_off() {
    let mut world = World::new().await;
    world.settings.server.body_timeout = Duration::from_secs(1);
    let app = world.start().await;
    let mut s = TcpStream::connect(app.addr).await.expect("connect");
    s.write_all(
        b"POST /webhooks/plain HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100000\r\n\r\n{\"id\":",
    )
    .await
    .expect("write");
    // The server answers (an error status) and closes, instead of waiting forever.
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw)).await;
    assert!(read.is_ok(), "the server waited forever for the body");
    let text = String::from_utf8_lossy(&raw);
    assert!(
        raw.is_empty() || !text.starts_with("HTTP/1.1 200"),
        "a cut-off body was accepted: {text}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_flooding_its_socket_exhausts_only_itself() {
    let mut world = World::new().await;
    world.settings.sessions.socket_max_connections = 16;
    let app = world.start().await;
    let a = world
        .open_session(&app, &plain_id("th"), "c_a", "a@example.com")
        .await;
    let b = world
        .open_session(&app, &plain_id("th"), "c_b", "b@example.com")
        .await;

    let mut flood = Vec::new();
    for _ in 0..1100 {
        flood.push(UnixStream::connect(&a.socket).await.expect("connect a"));
    }
    // The other session's socket and the people's listener still answer, mid-flood.
    let (status, body) = b.get("/v1/agent").await;
    assert_eq!(status, 200, "{body}");
    let health = app
        .http
        .get(format!("http://{}/healthz", app.addr))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    // The flooding session kept at most its cap: the rest are closed at once, while
    // those it holds stay open (their header timeout is 10 s; we look for 5 s).
    let reads = flood.into_iter().map(|mut s| {
        tokio::spawn(async move {
            let mut buf = [0u8; 1];
            let held = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .is_err();
            (held, s)
        })
    });
    let mut open = 0;
    let mut flood = Vec::new();
    for r in reads {
        let (held, s) = r.await.expect("task");
        open += usize::from(held);
        flood.push(s);
    }
    assert!(
        open <= 16,
        "{open} connections held on one session's socket"
    );
    assert!(open > 0, "the session's own connections were all closed");
    drop(flood);
    app.stop().await;
}

/// A signed `thread.email_received` for `thread` whose text is `size` bytes.
fn big_email(thread: &str, size: usize) -> Vec<u8> {
    let body = email_received(thread, "c_big", "big@example.com");
    let mut event: Value = serde_json::from_slice(&body).expect("json");
    event["payload"]["email"]["textContent"] = json!("x".repeat(size));
    serde_json::to_vec(&event).expect("serialize")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_page_is_bounded_by_bytes_and_a_big_event_still_gets_through() {
    let mut world = World::new().await;
    world.settings.plain.max_body_bytes = 3 << 20;
    let app = world.start().await;
    let thread = plain_id("th");
    let session = world
        .open_session(&app, &thread, "c_big", "big@example.com")
        .await;
    for _ in 0..5 {
        let body = big_email(&thread, 390_000);
        assert_eq!(app.send_webhook(&body).await, 200);
    }
    // One event bigger than a page's byte budget.
    let body = big_email(&thread, 2_000_000);
    assert_eq!(app.send_webhook(&body).await, 200);

    let mut after = 0;
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let (status, page) = session
            .get(&format!("/v1/events?after={after}&limit=1000"))
            .await;
        assert_eq!(status, 200, "{page}");
        let events = page["events"].as_array().expect("events").clone();
        if events.is_empty() {
            break;
        }
        pages += 1;
        let bytes: usize = events.iter().map(|e| e["event"].to_string().len()).sum();
        assert!(
            events.len() == 1 || bytes <= threadgate::gateway::sandbox_api::MAX_PAGE_BYTES,
            "a page of {} events holds {bytes} bytes",
            events.len()
        );
        for e in &events {
            seen.push(e["position"].as_i64().expect("position"));
        }
        after = page["next"].as_i64().expect("next");
    }
    // Seven events (the opening one, five of 390 KB, one of 2 MB), each exactly once,
    // in order, over several pages (one page on a server without a byte budget).
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert!(pages >= 4, "{pages} pages");
    app.stop().await;
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_database_keys_and_sockets_are_private() {
    let world = World::new().await;
    // A database left world-readable by an older version is tightened at start.
    let db = world.settings.database_path();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let app = world.start().await;
    let session = world
        .open_session(&app, &plain_id("th"), "c_p", "p@example.com")
        .await;
    let data = &world.settings.data_dir;
    assert_eq!(mode(data), 0o700, "data dir");
    assert_eq!(mode(&db), 0o600, "database");
    for suffix in ["-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = Path::new(&name);
        if path.exists() {
            assert_eq!(mode(path), 0o600, "{}", path.display());
        }
    }
    assert_eq!(mode(&world.settings.master_key_file), 0o600, "master key");
    let socket_dir = session.socket.parent().expect("socket dir");
    assert_eq!(mode(socket_dir), 0o700, "socket dir");
    assert_eq!(mode(&session.socket), 0o600, "socket");
    app.stop().await;
}
