//! The bridge from the container's loopback to the session socket: a harness that
//! speaks HTTP over TCP reaches threadgate's MCP endpoint (and the model proxy) at
//! `http://127.0.0.1:PORT/...`. Each accepted connection is piped, byte for byte, to a
//! new connection on the socket; nothing else listens. The socket serves this
//! session only, so the bridge adds no reach the container lacked.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;

/// Connections the bridge carries at once; further ones are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// Binds `127.0.0.1:port` (the container's own loopback, never another address).
pub(crate) async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).await
}

/// Serves `listener` until the process ends, piping each connection to `socket`.
pub(crate) async fn serve(listener: TcpListener, socket: PathBuf) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("threadgate-agent-runner: bridge accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if !peer.ip().is_loopback() {
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: dropping the stream closes it.
            continue;
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = pipe(conn, &socket).await {
                eprintln!("threadgate-agent-runner: bridge connection: {e}");
            }
        });
    }
}

async fn pipe(mut conn: TcpStream, socket: &std::path::Path) -> std::io::Result<()> {
    let mut upstream = UnixStream::connect(socket).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}
