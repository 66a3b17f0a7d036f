//! Two gateway instances on one database, each with its relay listener: a relay that
//! reaches the instance not running its session is sent to the session's owner (the
//! address it advertised in the instance registry) and served there; once the session
//! has stopped it is refused, not sent anywhere; and a relay sent on and on gives up
//! after a bounded number of redirects.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use threadgate::app::Overrides;
use threadgate::ids::{SessionId, ThreadId};
use threadgate::sandbox::FakeRuntime;
use threadgate::secrets::ExposeSecret as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::support::app::{TestApp, spawn_app};
use crate::support::relay::{RelaySetup, RunningRelay, TlsFiles, greet, greet_at};
use crate::support::world::World;

fn greeting(credential: &str) -> String {
    format!("TGR1 stream {credential}\n")
}

/// A second instance beside `world`'s: its own data directory, the same database file
/// and master key, its relay listener on 127.0.0.1 (advertised as bound).
async fn second_instance(world: &World) -> TestApp {
    let mut settings = world.settings.clone();
    settings.data_dir = world.dir.path().join("data-b");
    settings.database_file = world.settings.database_path();
    std::fs::create_dir_all(&settings.data_dir).expect("data dir");
    let overrides = Overrides {
        sandbox: Some(Arc::new(FakeRuntime::new())),
        clock: None,
    };
    spawn_app(settings, overrides).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_reaches_another_instance_is_sent_to_its_sessions_owner() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let owner = world.start().await;
    let other = second_instance(&world).await;
    assert_ne!(owner.relay_addr, other.relay_addr);
    let ada = world
        .customer_session(&owner, "ada@example.com", &[5000])
        .await;
    let id = SessionId::parse(ada.session.id.as_str()).expect("session id");
    let credential = owner.relay_credentials.mint(&id);
    let owner_addr = owner.relay_addr.expect("relay listener");

    // The other instance answers with the owner's advertised address; the owner serves.
    let (answer, _) = greet(&other, &tls.ca_file, &greeting(credential.expose_secret())).await;
    assert_eq!(answer, format!("GO {owner_addr}\n"));
    let (answer, _) = greet(&owner, &tls.ca_file, &greeting(credential.expose_secret())).await;
    assert_eq!(answer, "OK\n");

    // A relay given the other instance's address carries the agent's calls to the owner.
    let relay = RunningRelay::presenting(
        &other,
        world.dir.path(),
        "ada",
        &tls.ca_file,
        credential.clone(),
    )
    .await;
    let pod = relay.session(&ada.session);
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, direct) = ada.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, direct);
    let (status, body) = pod
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await;
    assert_eq!(status, 200, "{body}");
    relay.stop().await;

    // A credential that does not verify is refused before any owner is looked up.
    let (answer, _) = greet(&other, &tls.ca_file, &greeting("tgr1.x.1.n.m")).await;
    assert_eq!(answer, "NO invalid\n");

    // Once the session has stopped, neither instance sends the relay anywhere.
    let thread = ThreadId::parse(ada.session.thread_id.as_str()).expect("thread");
    owner.supervisor.stop(&thread).await.expect("stop");
    owner.session_stops(&ada.session.thread_id).await;
    for (which, app) in [("other", &other), ("owner", &owner)] {
        let (answer, _) = greet(app, &tls.ca_file, &greeting(credential.expose_secret())).await;
        assert_eq!(answer, "NO stopped\n", "{which}");
    }
    other.stop().await;
    owner.stop().await;
}

/// A session's owner whose relay listener is on an IPv6 address, advertised bare (as
/// the downward API gives a pod's IP): the registry holds it with brackets and the
/// listener's port, the other instance redirects to that literal, and a relay follows
/// it, checking the certificate against the name it dials (`localhost`), not the
/// address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_is_sent_to_an_owner_advertised_by_a_bare_ipv6_address() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let ipv4 = world.settings.clone();
    world.settings.relay.listen = Some("[::1]:0".parse().expect("addr"));
    world.settings.relay.advertise = Some("::1".parse().expect("advertise"));
    let owner = world.start().await;
    let owner_addr = owner.relay_addr.expect("relay listener");
    assert!(owner_addr.is_ipv6(), "{owner_addr}");
    let other = {
        let mut settings = ipv4;
        settings.data_dir = world.dir.path().join("data-b");
        settings.database_file = world.settings.database_path();
        std::fs::create_dir_all(&settings.data_dir).expect("data dir");
        let overrides = Overrides {
            sandbox: Some(Arc::new(FakeRuntime::new())),
            clock: None,
        };
        spawn_app(settings, overrides).await
    };
    let ada = world
        .customer_session(&owner, "ada@example.com", &[5000])
        .await;
    let id = SessionId::parse(ada.session.id.as_str()).expect("session id");
    let credential = owner.relay_credentials.mint(&id);

    let (answer, _) = greet(&other, &tls.ca_file, &greeting(credential.expose_secret())).await;
    assert_eq!(answer, format!("GO [::1]:{}\n", owner_addr.port()));
    let relay = RunningRelay::presenting(
        &other,
        world.dir.path(),
        "ada",
        &tls.ca_file,
        credential.clone(),
    )
    .await;
    let pod = relay.session(&ada.session);
    let (_, relayed) = pod.get("/v1/events?after=0").await;
    let (_, direct) = ada.session.get("/v1/events?after=0").await;
    assert_eq!(relayed, direct);
    relay.stop().await;
    other.stop().await;
    owner.stop().await;
}

/// A gateway that sends every relay back to itself: the relay stops following after
/// `MAX_REDIRECTS` and answers its agent with a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_follows_a_bounded_number_of_redirects() {
    let dir = tempfile::tempdir().expect("dir");
    let tls = TlsFiles::make(dir.path(), "loop");
    let config =
        threadgate::relay::tls::server_config(("cert", &tls.cert_file), ("key", &tls.key_file))
            .expect("tls");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let greeted = Arc::new(AtomicUsize::new(0));
    let counted = greeted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut stream = BufReader::new(tls);
                let mut line = String::new();
                if stream.read_line(&mut line).await.is_ok() && line.starts_with("TGR1 ") {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(format!("GO {addr}\n").as_bytes()).await;
                    let _ = stream.flush().await;
                }
            });
        }
    });
    let (answer, _) = greet_at(addr, &tls.ca_file, "TGR1 stream tgr1.x.1.n.m\n").await;
    assert_eq!(answer, format!("GO {addr}\n"));

    let relay = RunningRelay::start_at(
        addr,
        dir.path(),
        "looping",
        RelaySetup {
            ca_file: &tls.ca_file,
            credential: threadgate::secrets::SecretString::from("tgr1.x.1.n.m".to_owned()),
            secrets_dir: None,
            max_connections: 4,
            workspace: None,
        },
    )
    .await;
    let session = crate::support::world::Session {
        id: "looping".into(),
        thread_id: "looping".into(),
        socket: relay.socket.clone(),
    };
    let (status, body) = session.get("/v1/agent").await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("more than 3 times")),
        "{body}"
    );
    assert!(
        greeted.load(Ordering::SeqCst) >= 4,
        "a dial and three redirects"
    );
    relay.stop().await;
}
