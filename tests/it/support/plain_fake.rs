//! A fake Plain GraphQL endpoint for integration tests.
//!
//! Every request to `POST /graphql/v1` is parsed and validated against Plain's real
//! schema (`shared/plain/schema.graphql`) with apollo-compiler, and its variables are
//! coerced against the operation's input types: a wrong field, argument or input key
//! fails the request with a GraphQL error and is recorded in
//! [`PlainFake::invalid_requests`]. Valid operations run against a small in-memory
//! workspace (threads with a customer, notes, replies, status, labels, assignee) and are
//! answered in exactly the shape the query asked for.
//!
//! The fake can be told to fail the next requests with a 500, a 429 carrying
//! `x-ratelimit-reset`, or an error echoing the `Authorization` header, and to answer
//! one mutation with a `MutationError`. It records thread events (`createThreadEvent`)
//! and refuses a second one with an external id it already has, as Plain does.
//!
//! Part of the shared harness (`tests/support`).

use std::cell::RefCell;
use std::collections::VecDeque;

use std::sync::{Arc, Mutex, OnceLock};

use apollo_compiler::executable::{OperationType, Selection};
use apollo_compiler::request::coerce_variable_values;
use apollo_compiler::resolvers::Execution;
use apollo_compiler::response::JsonMap;
use apollo_compiler::validation::Valid;
use apollo_compiler::{ExecutableDocument, Schema};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::plain::shared_dir;
use super::plain_fake_model as model;

pub use model::{Customer, Entry, MutationErrorSpec, Thread, ThreadEventRecord};

/// The API key the fake accepts.
pub const API_KEY: &str = "plainApiKey_test_threadgate_7a3b9e";

/// One operation the fake accepted and ran.
#[derive(Debug, Clone)]
pub struct Operation {
    /// The operation name, e.g. `ThreadgateCreateNote`.
    pub name: Option<String>,
    /// Whether it was a mutation.
    pub is_mutation: bool,
    /// The root fields it selected, e.g. `["createNote"]`.
    pub root_fields: Vec<String>,
    /// Its variables as sent.
    pub variables: Value,
}

/// How the fake fails a request instead of answering it.
#[derive(Debug, Clone)]
pub enum Failure {
    /// HTTP 500.
    ServerError,
    /// HTTP 429 with this `x-ratelimit-reset` value.
    RateLimited { reset: String },
    /// HTTP 400 whose error message repeats the request's `Authorization` header.
    EchoAuthorization,
}

#[derive(Default)]
struct FakeState {
    model: Mutex<model::Model>,
    operations: Mutex<Vec<Operation>>,
    invalid: Mutex<Vec<String>>,
    failures: Mutex<VecDeque<Failure>>,
    requests: Mutex<u32>,
}

/// A running fake, stopped when dropped.
pub struct PlainFake {
    base_url: String,
    state: Arc<FakeState>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PlainFake {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl PlainFake {
    /// Starts the fake on a free loopback port.
    pub async fn start() -> Self {
        schema();
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .route("/graphql/v1", post(graphql))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("plain fake serves");
        });
        Self {
            base_url,
            state,
            server,
        }
    }

    /// The base URL to give the connector (requests go to `<base>/graphql/v1`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Adds a thread whose customer has written one message.
    pub fn add_thread(&self, thread_id: &str, customer_id: &str, email: &str) {
        let thread = Thread {
            id: thread_id.to_owned(),
            title: format!("Help with {thread_id}"),
            status: "TODO".into(),
            customer: Customer {
                id: customer_id.to_owned(),
                email: email.to_owned(),
                full_name: "Ada Lovelace".into(),
            },
            label_type_ids: Vec::new(),
            assigned_user_id: None,
            escalations: 0,
            timeline: vec![Entry::CustomerMessage {
                text: "I was charged twice for my order.".into(),
            }],
            events: Vec::new(),
        };
        self.model().threads.insert(thread_id.to_owned(), thread);
    }

    /// Adds a label type the workspace knows.
    pub fn add_label_type(&self, label_type_id: &str, name: &str) {
        self.model()
            .label_types
            .insert(label_type_id.to_owned(), name.to_owned());
    }

    /// Adds a note directly (as if posted earlier) and returns its id.
    pub fn add_note(&self, thread_id: &str, text: &str) -> String {
        let mut model = self.model();
        let note_id = model.next_id("note");
        let thread = model.threads.get_mut(thread_id).expect("thread exists");
        thread.timeline.push(Entry::Note {
            note_id: note_id.clone(),
            text: text.to_owned(),
            markdown: None,
        });
        note_id
    }

    /// A snapshot of a thread.
    pub fn thread(&self, thread_id: &str) -> Thread {
        self.model()
            .threads
            .get(thread_id)
            .cloned()
            .expect("thread exists")
    }

    /// The operations accepted so far, in order.
    pub fn operations(&self) -> Vec<Operation> {
        self.state.operations.lock().expect("lock").clone()
    }

    /// How many HTTP requests reached the fake, failed ones included.
    pub fn request_count(&self) -> u32 {
        *self.state.requests.lock().expect("lock")
    }

    /// Requests that failed schema validation, variable coercion or execution.
    pub fn invalid_requests(&self) -> Vec<String> {
        self.state.invalid.lock().expect("lock").clone()
    }

    /// Fails the next `count` requests with `failure`.
    pub fn fail_next(&self, count: usize, failure: Failure) {
        let mut failures = self.state.failures.lock().expect("lock");
        failures.extend(std::iter::repeat_n(failure, count));
    }

    /// Forgets the failures [`PlainFake::fail_next`] queued and not yet used.
    pub fn clear_failures(&self) {
        self.state.failures.lock().expect("lock").clear();
    }

    /// The thread ids of the notes created so far (`createNote`), in the order Plain
    /// received them.
    pub fn note_order(&self) -> Vec<String> {
        self.operations()
            .iter()
            .filter(|op| op.root_fields == ["createNote"])
            .filter_map(|op| {
                op.variables["input"]["threadId"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Answers the next `mutation` (e.g. `"createNote"`) with this `MutationError`.
    pub fn mutation_error_on(&self, mutation: &str, error: MutationErrorSpec) {
        self.model()
            .mutation_errors
            .insert(mutation.to_owned(), error);
    }

    fn model(&self) -> std::sync::MutexGuard<'_, model::Model> {
        self.state.model.lock().expect("lock")
    }
}

/// Plain's schema, parsed and validated once.
pub fn schema() -> &'static Valid<Schema> {
    static SCHEMA: OnceLock<Valid<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = shared_dir().join("plain/schema.graphql");
        let sdl = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
        Schema::parse_and_validate(sdl, &path).expect("plain schema is valid")
    })
}

/// Validates a document against Plain's schema; the error lists every problem.
pub fn validate(document: &str) -> Result<Valid<ExecutableDocument>, String> {
    ExecutableDocument::parse_and_validate(schema(), document, "request.graphql")
        .map_err(|with_errors| with_errors.errors.to_string())
}

fn graphql_error(status: StatusCode, message: &str, code: &str) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": code}}]});
    (status, Json(body)).into_response()
}

async fn graphql(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    *state.requests.lock().expect("lock") += 1;
    let authorization = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let failure = state.failures.lock().expect("lock").pop_front();
    match failure {
        Some(Failure::ServerError) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response();
        }
        Some(Failure::RateLimited { reset }) => {
            let mut response = graphql_error(
                StatusCode::TOO_MANY_REQUESTS,
                "Too Many Requests - Rate limit exceeded",
                "RATE_LIMITED",
            );
            let reset = reset.parse().expect("header value");
            response.headers_mut().insert("x-ratelimit-reset", reset);
            return response;
        }
        Some(Failure::EchoAuthorization) => {
            let message = format!("token not accepted: {authorization}");
            return graphql_error(StatusCode::BAD_REQUEST, &message, "BAD_REQUEST");
        }
        None => {}
    }
    if authorization != format!("Bearer {API_KEY}") {
        return graphql_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "UNAUTHENTICATED",
        );
    }
    match run(&state, &body) {
        Ok(answer) => Json(answer).into_response(),
        Err(problem) => {
            state.invalid.lock().expect("lock").push(problem.clone());
            graphql_error(
                StatusCode::BAD_REQUEST,
                &problem,
                "GRAPHQL_VALIDATION_FAILED",
            )
        }
    }
}

/// Validates and runs one GraphQL request body; `Err` describes why it is invalid.
fn run(state: &FakeState, body: &str) -> Result<Value, String> {
    let request: Value =
        serde_json::from_str(body).map_err(|error| format!("body is not json: {error}"))?;
    let query = request["query"].as_str().ok_or("request has no query")?;
    let document = validate(query)?;
    let operation = document
        .operations
        .get(request["operationName"].as_str())
        .map_err(|error| error.message().to_string())?;
    let variables = match &request["variables"] {
        Value::Null => JsonMap::new(),
        other => serde_json::from_value::<JsonMap>(other.clone()).map_err(|e| e.to_string())?,
    };
    let coerced = coerce_variable_values(schema(), operation, &variables)
        .map_err(|error| format!("variables: {}", error.message()))?;
    let is_mutation = operation.operation_type == OperationType::Mutation;
    let root_fields = operation
        .selection_set
        .selections
        .iter()
        .filter_map(|selection| match selection {
            Selection::Field(field) => Some(field.name.to_string()),
            _ => None,
        })
        .collect();
    state.operations.lock().expect("lock").push(Operation {
        name: operation.name.as_ref().map(|name| name.to_string()),
        is_mutation,
        root_fields,
        variables: request["variables"].clone(),
    });
    let execution = Execution::new(schema(), &document)
        .operation(operation)
        .coerced_variable_values(&coerced);
    let mut model = state.model.lock().expect("lock");
    let response = if is_mutation {
        let root = model::MutationRoot {
            model: RefCell::new(&mut *model),
        };
        execution.execute_sync(&root)
    } else {
        execution.execute_sync(&model::QueryRoot { model: &model })
    }
    .map_err(|error| error.message().to_string())?;
    if !response.errors.is_empty() {
        let messages: Vec<String> = response.errors.iter().map(|e| e.message.clone()).collect();
        return Err(format!("execution: {}", messages.join("; ")));
    }
    serde_json::to_value(&response).map_err(|error| error.to_string())
}
