//! The session's granted secrets reach the pod as read-only files the relay writes
//! before it opens the agent's socket; no value is logged, and the agent's own
//! connections cannot ask the gateway for them.

use std::os::unix::fs::PermissionsExt as _;

use threadgate::ids::SessionId;
use threadgate::secrets::ExposeSecret as _;
use threadgate::store::Db;

use crate::support::logs::captured_text;
use crate::support::plain::repo_root;
use crate::support::relay::{RelaySetup, RunningRelay};
use crate::support::world::World;

const SECRET_NAME: &str = "sandbox_token";
const SECRET_VALUE: &str = "fake_key_relay_sandbox_7c41e09b2d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_writes_the_sessions_secrets_and_logs_none() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    // The support agent, asking for one secret (granted to it).
    let agents = world.dir.path().join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    let text = std::fs::read_to_string(repo_root().join("agents/support.md")).expect("agent");
    let asking = text.replacen("secrets: []", &format!("secrets: [{SECRET_NAME}]"), 1);
    assert_ne!(asking, text, "the shipped agent's secrets line changed");
    std::fs::write(agents.join("support.md"), asking).expect("write agent");
    world.settings.agents_dir = agents;
    world.store_secret(SECRET_NAME, SECRET_VALUE).await;
    let db = Db::open(&world.settings.database_path()).expect("db");
    threadgate::app::open_secrets(&db, &world.settings)
        .expect("secrets")
        .grant(SECRET_NAME, "support")
        .await
        .expect("grant");
    drop(db);

    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let credential = app
        .relay_credentials
        .mint(&SessionId::parse(ada.session.id.as_str()).expect("id"));
    let secrets_dir = world.dir.path().join("pod-secrets");
    let relay = RunningRelay::start(
        &app,
        world.dir.path(),
        "ada",
        RelaySetup {
            ca_file: &tls.ca_file,
            credential: credential.clone(),
            secrets_dir: Some(secrets_dir.clone()),
            max_connections: 32,
            workspace: None,
        },
    )
    .await;
    // The socket opens only once the files are in place.
    let file = secrets_dir.join(SECRET_NAME);
    assert_eq!(
        std::fs::read_to_string(&file).expect("secret file"),
        SECRET_VALUE
    );
    let mode = std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o400, "read-only, the owner's only");
    assert_eq!(
        std::fs::read_dir(&secrets_dir).expect("dir").count(),
        1,
        "only the granted secret"
    );

    // The agent's connections are the session's router: no relay route there.
    let pod = relay.session(&ada.session);
    let (status, body) = pod.get("/relay/v1/secrets").await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.to_string().contains(SECRET_VALUE));

    let logs = captured_text();
    assert!(
        logs.contains("secrets handed to the session's relay"),
        "the fetch is logged"
    );
    assert!(!logs.contains(SECRET_VALUE), "a secret value was logged");
    assert!(
        !logs.contains(credential.expose_secret()),
        "a credential was logged"
    );
    relay.stop().await;
    app.stop().await;
}
