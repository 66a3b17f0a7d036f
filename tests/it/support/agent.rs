//! The world of the agent end-to-end tests: the gateway harness's peers (localstripe,
//! the Plain fake, the GitHub stub) and a real threadgate running real Docker sessions
//! from the sandbox image, its model proxy pointed at a fresh scripted model server.
//! Dropping the world force-removes its containers. Shared with `examples/demo.rs`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadgate::app::Overrides;
use threadgate::model::Provider;
use threadgate::model::scripted::ScriptedModel;

use super::app::TestApp;
use super::docker;
use super::plain::{self, plain_id};
use super::world::World;

/// The model key threadgate holds for the Anthropic run.
const MODEL_KEY: &str = "sk-ant-agent-e2e-6c1d0b9e3f2a";

/// How long a scenario may take to reach what it waits for (a container starts, the
/// runner asks the model several times).
pub const WAIT: Duration = Duration::from_secs(60);

/// One test's world.
pub struct AgentWorld {
    pub world: World,
    pub model: ScriptedModel,
    pub instance: String,
}

/// A localstripe customer with charges, and the Plain customer of the thread.
pub struct Customer {
    pub stripe_id: String,
    pub plain_id: String,
    pub email: String,
    pub charges: Vec<String>,
}

impl Drop for AgentWorld {
    fn drop(&mut self) {
        docker::remove_instance_containers(&self.instance);
        // A world that turned warm starts on leaves its slots' mounts: never remove
        // through one.
        docker::unmount_under(&self.world.settings.sandbox.secrets_root);
        let _ = std::fs::remove_dir_all(&self.world.settings.sandbox.secrets_root);
    }
}

impl AgentWorld {
    /// A world under the repository's policy, agents and skills, its model on `provider`.
    pub async fn new(provider: Provider) -> AgentWorld {
        let mut world = World::new().await;
        let instance = format!("ag{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let s = &mut world.settings;
        s.instance_id = Some(instance.clone());
        s.sandbox.image = docker::image();
        s.sandbox.secrets_root = format!("/dev/shm/threadgate-{instance}").into();
        s.model.retries = 1;
        let model = world.use_scripted_model(provider, MODEL_KEY).await;
        AgentWorld {
            world,
            model,
            instance,
        }
    }

    /// Uses a copy of `agents/support.md` with these limits.
    pub fn with_limits(mut self, max_tokens: u64, max_turns: u64) -> AgentWorld {
        self.world.limit_agent(max_tokens, max_turns);
        self
    }

    /// Serves threadgate with the real Docker runtime.
    pub async fn start(&self) -> TestApp {
        self.world
            .start_with(Overrides {
                sandbox: None,
                clock: None,
            })
            .await
    }

    /// A localstripe customer with one USD charge per amount.
    pub async fn customer(&self, amounts: &[u64]) -> Customer {
        let email = format!("{}@customers.test", plain_id("u").to_lowercase());
        let stripe_id = self.world.stripe.create_customer(&email).await;
        let mut charges = Vec::new();
        for amount in amounts {
            charges.push(
                self.world
                    .stripe
                    .create_charge(&stripe_id, *amount, "usd")
                    .await,
            );
        }
        Customer {
            stripe_id,
            plain_id: plain_id("c"),
            email,
            charges,
        }
    }

    /// A new thread of `customer` whose first email says `text` (with the customer's
    /// Stripe id, as a signature would carry it), delivered as a signed webhook.
    pub async fn open_thread(&self, app: &TestApp, customer: &Customer, text: &str) -> String {
        let thread = plain_id("th");
        self.world
            .plain
            .add_thread(&thread, &customer.plain_id, &customer.email);
        let body = plain::email_received(&thread, &customer.plain_id, &customer.email);
        let mut event: Value = serde_json::from_slice(&body).expect("json");
        event["payload"]["email"]["textContent"] =
            json!(format!("{text}\n\n-- account {}", customer.stripe_id));
        let body = serde_json::to_vec(&event).expect("json");
        assert_eq!(
            app.send_webhook(&body).await,
            200,
            "the signed webhook is accepted"
        );
        thread
    }

    /// A further email of `customer` on `thread`, as a signed webhook.
    pub async fn message(&self, app: &TestApp, thread: &str, customer: &Customer, text: &str) {
        let body = plain::email_received(thread, &customer.plain_id, &customer.email);
        let mut event: Value = serde_json::from_slice(&body).expect("json");
        event["payload"]["email"]["textContent"] = json!(text);
        let body = serde_json::to_vec(&event).expect("json");
        assert_eq!(app.send_webhook(&body).await, 200);
    }

    /// Waits for a held `stripe.create_refund` and answers its execution id.
    pub async fn held_refund(&self, app: &TestApp) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let held = app
                .executions()
                .await
                .into_iter()
                .find(|e| e.tool == "stripe.create_refund" && e.status == "held");
            if let Some(e) = held {
                return e.id;
            }
            assert!(
                Instant::now() < deadline,
                "no held refund: {:?}",
                app.executions()
                    .await
                    .iter()
                    .map(|e| (&e.tool, &e.status))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Delivers the thread's move to DONE (Plain's example, re-aimed at `thread`).
    pub async fn mark_done(&self, app: &TestApp, thread: &str) {
        let body = plain::email_received(thread, "c_x", "x@x.test");
        let created: Value = serde_json::from_slice(&body).expect("json");
        let example = plain::shared_dir().join("plain/examples/thread-status-transitioned.json");
        let mut event: Value =
            serde_json::from_str(&std::fs::read_to_string(example).expect("example"))
                .expect("json");
        let later = chrono::Utc::now() + chrono::Duration::seconds(1);
        let at = later.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        event["id"] = json!(format!("pEv_{}", uuid::Uuid::new_v4().simple()));
        event["timestamp"] = json!(at);
        event["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] =
            created["webhookMetadata"]["webhookDeliveryAttemptTimestamp"].clone();
        event["payload"]["thread"]["id"] = json!(thread);
        assert_eq!(event["payload"]["thread"]["status"], "DONE");
        let body = serde_json::to_vec(&event).expect("json");
        assert_eq!(app.send_webhook(&body).await, 200);
    }

    /// `path` on the thread's branch, once the branch has it.
    pub async fn branch_file(&self, thread: &str, path: &str) -> String {
        let branch = format!("refs/heads/threadgate/{thread}");
        let deadline = Instant::now() + WAIT;
        loop {
            let repo = git2::Repository::open(&self.world.settings.repo.path).expect("repo");
            let text = repo
                .find_reference(&branch)
                .and_then(|r| r.peel_to_tree())
                .and_then(|t| t.get_path(std::path::Path::new(path)))
                .and_then(|e| e.to_object(&repo))
                .ok()
                .and_then(|o| {
                    o.as_blob()
                        .map(|b| String::from_utf8_lossy(b.content()).into_owned())
                });
            if let Some(text) = text {
                return text;
            }
            assert!(Instant::now() < deadline, "{branch} never held {path}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many containers of this world run.
    pub async fn running_containers(&self) -> usize {
        docker::running_count(&self.instance)
    }
}
