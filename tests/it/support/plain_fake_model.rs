//! The Plain fake's in-memory model and its GraphQL resolvers (apollo-compiler's
//! execution engine walks the query; these resolvers answer one field at a time, so the
//! answer has exactly the shape the query asked for).

use std::cell::RefCell;
use std::collections::BTreeMap;

use apollo_compiler::ast::Type;
use apollo_compiler::resolvers::{FieldError, ObjectValue, ResolveInfo, ResolvedValue};
use apollo_compiler::response::JsonValue;
use apollo_compiler::schema::ExtendedType;
use serde_json::{Map, Value, json};

use super::plain_fake_trail as trail;
pub use super::plain_fake_trail::ThreadEventRecord;

/// A customer of the fake workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    pub id: String,
    pub email: String,
    pub full_name: String,
}

/// One entry on a thread's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A message from the customer.
    CustomerMessage { text: String },
    /// A reply sent with `replyToThread`.
    Reply {
        text: String,
        markdown: Option<String>,
    },
    /// An internal note made with `createNote`.
    Note {
        note_id: String,
        text: String,
        markdown: Option<String>,
    },
}

/// A thread of the fake workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub id: String,
    pub title: String,
    pub status: String,
    pub customer: Customer,
    pub label_type_ids: Vec<String>,
    pub assigned_user_id: Option<String>,
    pub escalations: u32,
    pub timeline: Vec<Entry>,
    /// Thread events made with `createThreadEvent`, oldest first.
    pub events: Vec<ThreadEventRecord>,
}

impl Thread {
    /// The notes on the thread, oldest first: `(note id, text)`.
    pub fn notes(&self) -> Vec<(String, String)> {
        self.timeline
            .iter()
            .filter_map(|entry| match entry {
                Entry::Note { note_id, text, .. } => Some((note_id.clone(), text.clone())),
                _ => None,
            })
            .collect()
    }

    /// The thread events on the thread, oldest first.
    pub fn events(&self) -> Vec<ThreadEventRecord> {
        self.events.clone()
    }

    /// The replies on the thread, oldest first: `(text, markdown)`.
    pub fn replies(&self) -> Vec<(String, Option<String>)> {
        self.timeline
            .iter()
            .filter_map(|entry| match entry {
                Entry::Reply { text, markdown } => Some((text.clone(), markdown.clone())),
                _ => None,
            })
            .collect()
    }
}

/// A `MutationError` the fake answers instead of running one mutation.
#[derive(Debug, Clone)]
pub struct MutationErrorSpec {
    pub message: String,
    pub error_type: String,
    pub code: String,
    pub fields: Vec<(String, String, String)>,
}

impl MutationErrorSpec {
    fn to_json(&self) -> Value {
        let fields: Vec<Value> = self
            .fields
            .iter()
            .map(|(field, message, kind)| json!({"field": field, "message": message, "type": kind}))
            .collect();
        json!({"message": self.message, "type": self.error_type, "code": self.code, "fields": fields})
    }
}

/// The fake workspace.
#[derive(Debug, Default)]
pub struct Model {
    pub threads: BTreeMap<String, Thread>,
    pub label_types: BTreeMap<String, String>,
    /// Every thread event's external id: Plain takes each once.
    pub event_external_ids: std::collections::BTreeSet<String>,
    /// One-shot mutation errors, by mutation field name.
    pub mutation_errors: BTreeMap<String, MutationErrorSpec>,
    next_id: u64,
}

impl Model {
    pub fn next_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}_{:06}", self.next_id)
    }
}

pub(crate) fn datetime() -> Value {
    json!({"iso8601": "2026-05-01T12:00:00.000Z", "unixTimestamp": "1777636800000"})
}

fn entry_json(thread: &Thread, index: usize, entry: &Entry) -> Value {
    let (kind, actor, body) = match entry {
        Entry::CustomerMessage { text } => (
            "CHAT",
            json!({"__typename": "CustomerActor", "customerId": thread.customer.id}),
            json!({"__typename": "ChatEntry", "chatId": format!("chat_{index}"), "text": text,
                   "attachments": []}),
        ),
        Entry::Reply { text, .. } => (
            "CHAT",
            json!({"__typename": "MachineUserActor", "machineUserId": "mu_threadgate"}),
            json!({"__typename": "ChatEntry", "chatId": format!("chat_{index}"), "text": text,
                   "attachments": []}),
        ),
        Entry::Note {
            note_id,
            text,
            markdown,
        } => (
            "NOTE",
            json!({"__typename": "MachineUserActor", "machineUserId": "mu_threadgate"}),
            json!({"__typename": "NoteEntry", "noteId": note_id, "text": text,
                   "markdown": markdown, "attachments": [], "isEdited": false}),
        ),
    };
    json!({
        "__kind": kind,
        "id": format!("te_{}_{index:04}", thread.id),
        "customerId": thread.customer.id,
        "threadId": thread.id,
        "timestamp": datetime(),
        "actor": actor,
        "entry": body,
    })
}

fn label_json(model: &Model, label_type_id: &str) -> Value {
    json!({
        "id": format!("l_{label_type_id}"),
        "labelType": {"id": label_type_id, "name": model.label_types.get(label_type_id)},
        "createdAt": datetime(),
        "updatedAt": datetime(),
    })
}

/// The thread as GraphQL data; `__timeline` holds every timeline node for
/// `Thread.timelineEntries` to page through.
pub fn thread_json(model: &Model, thread: &Thread) -> Value {
    let labels: Vec<Value> = thread
        .label_type_ids
        .iter()
        .map(|id| label_json(model, id))
        .collect();
    let assigned = thread.assigned_user_id.as_ref().map(|id| {
        json!({"__typename": "User", "id": id, "fullName": "Engineer On Call",
               "publicName": "Engineer", "email": "oncall@example.com"})
    });
    let timeline: Vec<Value> = thread
        .timeline
        .iter()
        .enumerate()
        .map(|(index, entry)| entry_json(thread, index, entry))
        .collect();
    json!({
        "id": thread.id,
        "ref": format!("T-{}", thread.id.len()),
        "title": thread.title,
        "description": null,
        "previewText": null,
        "priority": 2,
        "status": thread.status,
        "createdAt": datetime(),
        "updatedAt": datetime(),
        "statusChangedAt": datetime(),
        "customer": {
            "id": thread.customer.id,
            "fullName": thread.customer.full_name,
            "email": {"email": thread.customer.email, "isVerified": true},
            "isAnonymous": false,
        },
        "labels": labels,
        "assignedTo": assigned,
        "__timeline": timeline,
    })
}

/// `Thread.timelineEntries(filters, first, after, last, before)` over the stored nodes.
fn timeline_connection(thread: &Map<String, Value>, args: &Value) -> Value {
    let wanted: Option<Vec<&str>> = args["filters"]["entryTypes"]
        .as_array()
        .map(|types| types.iter().filter_map(Value::as_str).collect());
    let nodes: Vec<&Value> = thread["__timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|node| {
            wanted
                .as_ref()
                .is_none_or(|types| types.contains(&node["__kind"].as_str().unwrap_or("")))
        })
        .collect();
    let position = |cursor: &Value| {
        cursor
            .as_str()
            .and_then(|cursor| nodes.iter().position(|node| node["id"] == cursor))
    };
    let mut start = position(&args["after"]).map_or(0, |index| index + 1);
    let mut end = position(&args["before"]).unwrap_or(nodes.len());
    if let Some(first) = args["first"].as_u64() {
        end = end.min(start.saturating_add(usize::try_from(first).unwrap_or(usize::MAX)));
    }
    if let Some(last) = args["last"].as_u64() {
        start = start.max(end.saturating_sub(usize::try_from(last).unwrap_or(usize::MAX)));
    }
    let page = &nodes[start.min(end)..end];
    let edges: Vec<Value> = page
        .iter()
        .map(|node| json!({"cursor": node["id"], "node": node}))
        .collect();
    json!({
        "edges": edges,
        "pageInfo": {
            "hasNextPage": end < nodes.len(),
            "hasPreviousPage": start > 0,
            "startCursor": page.first().map(|node| node["id"].clone()),
            "endCursor": page.last().map(|node| node["id"].clone()),
        },
    })
}

/// Any object of the schema, answered from JSON.
pub struct JsonObject {
    type_name: String,
    value: Map<String, Value>,
}

impl JsonObject {
    pub fn new(type_name: &str, value: Value) -> Self {
        let value = match value {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Self {
            type_name: type_name.to_owned(),
            value,
        }
    }
}

fn to_json_value(value: Value) -> JsonValue {
    serde_json::from_value(value).expect("json converts")
}

fn arguments(info: &ResolveInfo<'_>) -> Value {
    serde_json::to_value(info.arguments()).expect("arguments are json")
}

/// Wraps `value` for the schema type `ty`: objects become [`JsonObject`]s (abstract
/// types take their concrete type from `__typename`), lists recurse, the rest are leaves.
pub fn resolved<'a>(info: &ResolveInfo<'a>, ty: &Type, value: Value) -> ResolvedValue<'a> {
    if value.is_null() {
        return ResolvedValue::null();
    }
    if ty.is_list() {
        let item_type = ty.item_type().clone();
        let items: Vec<ResolvedValue<'a>> = match value {
            Value::Array(items) => items
                .into_iter()
                .map(|item| resolved(info, &item_type, item))
                .collect(),
            _ => Vec::new(),
        };
        return ResolvedValue::list(items);
    }
    let name = ty.inner_named_type();
    match info.schema().types.get(name) {
        Some(ExtendedType::Object(_)) => ResolvedValue::object(JsonObject::new(name, value)),
        Some(ExtendedType::Interface(_) | ExtendedType::Union(_)) => {
            let concrete = value["__typename"].as_str().unwrap_or("Unknown").to_owned();
            ResolvedValue::object(JsonObject::new(&concrete, value))
        }
        _ => ResolvedValue::leaf(to_json_value(value)),
    }
}

impl ObjectValue for JsonObject {
    fn type_name(&self) -> &str {
        &self.type_name
    }

    fn resolve_field<'a>(
        &'a self,
        info: &'a ResolveInfo<'a>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        let field = info.field_name();
        let value = if self.type_name == "Thread" && field == "timelineEntries" {
            timeline_connection(&self.value, &arguments(info))
        } else {
            self.value.get(field).cloned().unwrap_or(Value::Null)
        };
        Ok(resolved(info, &info.field_definition().ty, value))
    }
}

/// The `Query` root.
pub struct QueryRoot<'m> {
    pub model: &'m Model,
}

impl ObjectValue for QueryRoot<'_> {
    fn type_name(&self) -> &str {
        "Query"
    }

    fn resolve_field<'a>(
        &'a self,
        info: &'a ResolveInfo<'a>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        match info.field_name() {
            "thread" => {
                let id = arguments(info)["threadId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let thread = self
                    .model
                    .threads
                    .get(&id)
                    .map(|t| thread_json(self.model, t));
                Ok(resolved(
                    info,
                    &info.field_definition().ty,
                    thread.unwrap_or(Value::Null),
                ))
            }
            "labelType" => {
                let id = arguments(info)["labelTypeId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let label_type = self.model.label_types.get(&id).map(|name| {
                    json!({"id": id, "name": name, "isArchived": false, "position": "a",
                           "isExcludedFromAi": false, "type": "DEFAULT",
                           "createdAt": datetime(), "updatedAt": datetime()})
                });
                Ok(resolved(
                    info,
                    &info.field_definition().ty,
                    label_type.unwrap_or(Value::Null),
                ))
            }
            other => Err(FieldError {
                message: format!("the plain fake does not implement Query.{other}"),
            }),
        }
    }
}

/// The `Mutation` root: each field changes the model, unless a one-shot
/// [`MutationErrorSpec`] is registered for it.
pub struct MutationRoot<'m> {
    pub model: RefCell<&'m mut Model>,
}

impl ObjectValue for MutationRoot<'_> {
    fn type_name(&self) -> &str {
        "Mutation"
    }

    fn resolve_field<'a>(
        &'a self,
        info: &'a ResolveInfo<'a>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        let field = info.field_name();
        let input = arguments(info)["input"].clone();
        let mut model = self.model.borrow_mut();
        let mut output = match model.mutation_errors.remove(field) {
            Some(spec) => json!({"error": spec.to_json()}),
            None => apply(&mut model, field, &input)?,
        };
        if !output["error"].is_null() {
            fill_required_lists(info, &mut output);
        }
        Ok(resolved(info, &info.field_definition().ty, output))
    }
}

/// A failed mutation still answers its non-null list fields (e.g. `AddLabelsOutput.labels`)
/// with an empty list, as Plain does.
fn fill_required_lists(info: &ResolveInfo<'_>, output: &mut Value) {
    let output_type = info.field_definition().ty.inner_named_type();
    let Some(object) = info.schema().get_object(output_type) else {
        return;
    };
    for (name, definition) in &object.fields {
        if definition.ty.is_non_null()
            && definition.ty.is_list()
            && output.get(name.as_str()).is_none()
        {
            output[name.as_str()] = json!([]);
        }
    }
}

pub(crate) fn validation_error(field: &str, message: &str) -> Value {
    json!({"error": {"message": message, "type": "VALIDATION", "code": "input_validation",
                     "fields": [{"field": field, "message": message, "type": "VALIDATION"}]}})
}

fn apply(model: &mut Model, field: &str, input: &Value) -> Result<Value, FieldError> {
    if field == "removeLabels" {
        return Ok(trail::remove_labels(model, input));
    }
    let thread_id = input["threadId"].as_str().unwrap_or_default().to_owned();
    if !model.threads.contains_key(&thread_id) {
        return Ok(validation_error("threadId", "thread not found"));
    }
    let text = |key: &str| input[key].as_str().map(str::to_owned);
    let output = match field {
        "replyToThread" => {
            let thread = model.threads.get_mut(&thread_id).expect("checked");
            thread.timeline.push(Entry::Reply {
                text: text("textContent").unwrap_or_default(),
                markdown: text("markdownContent"),
            });
            json!({"error": null})
        }
        "createNote" => {
            if input["customerId"].as_str() != Some(model.threads[&thread_id].customer.id.as_str())
            {
                return Ok(validation_error(
                    "customerId",
                    "customer does not match the thread",
                ));
            }
            let note_id = model.next_id("note");
            let note = Entry::Note {
                note_id: note_id.clone(),
                text: text("text").unwrap_or_default(),
                markdown: text("markdown"),
            };
            model
                .threads
                .get_mut(&thread_id)
                .expect("checked")
                .timeline
                .push(note);
            json!({"note": {"id": note_id, "text": text("text"), "markdown": text("markdown"),
                            "isEdited": false, "isDeleted": false, "attachments": [],
                            "createdAt": datetime(), "updatedAt": datetime()},
                   "error": null})
        }
        "addLabels" => {
            let ids: Vec<String> = input["labelTypeIds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|id| id.as_str().map(str::to_owned))
                .collect();
            if let Some(unknown) = ids.iter().find(|id| !model.label_types.contains_key(*id)) {
                return Ok(validation_error(
                    "labelTypeIds",
                    &format!("unknown label type {unknown}"),
                ));
            }
            let thread = model.threads.get_mut(&thread_id).expect("checked");
            for id in &ids {
                if !thread.label_type_ids.contains(id) {
                    thread.label_type_ids.push(id.clone());
                }
            }
            let labels: Vec<Value> = ids.iter().map(|id| label_json(model, id)).collect();
            json!({"labels": labels, "thread": thread_json(model, &model.threads[&thread_id]), "error": null})
        }
        "createThreadEvent" => return Ok(trail::create_thread_event(model, &thread_id, input)),
        "assignThread" => {
            let thread = model.threads.get_mut(&thread_id).expect("checked");
            thread.assigned_user_id = text("userId").or_else(|| text("machineUserId"));
            json!({"thread": thread_json(model, &model.threads[&thread_id]), "error": null})
        }
        "escalateThread" => {
            model
                .threads
                .get_mut(&thread_id)
                .expect("checked")
                .escalations += 1;
            json!({"thread": thread_json(model, &model.threads[&thread_id]), "error": null})
        }
        "markThreadAsDone" => {
            model.threads.get_mut(&thread_id).expect("checked").status = "DONE".into();
            json!({"thread": thread_json(model, &model.threads[&thread_id]), "error": null})
        }
        other => {
            return Err(FieldError {
                message: format!("the plain fake does not implement Mutation.{other}"),
            });
        }
    };
    Ok(output)
}
