//! The Stripe connector: the `stripe.*` tools over Stripe's REST API.
//!
//! Requests are form-encoded with `Authorization: Bearer <key>`; answers are JSON.
//! Every `POST` and `DELETE` carries `Idempotency-Key: threadgate-<execution id>`, so an
//! execution sent twice runs once. Errors (`{"error":{type,code,message,param}}`) become
//! [`ConnectorError::Rejected`]; 429 becomes [`ConnectorError::RateLimited`]; 5xx and
//! transport failures after sending become [`ConnectorError::Unknown`].
//!
//! The gateway also needs facts before it decides (whose charge is this, how much is
//! left on it): [`StripeConnector::charge_facts`], [`StripeConnector::customer_email`]
//! and [`StripeConnector::subscription_customer`].

pub mod changes;
pub mod events;
mod form;
mod known_emails;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use reqwest::{Client, StatusCode, Url};
use serde_json::{Map, Value, json};

use super::args::Args;
use super::http::{self, HttpResponse};
use super::rate_limit::retry_after_from_headers;
use super::{CallContext, ConfigError, Connector, ConnectorError, Credential, action_name};

/// The tools this connector runs, as the policy catalog names them.
pub const TOOLS: &[&str] = &[
    "stripe.list_invoices",
    "stripe.list_charges",
    "stripe.get_charge",
    "stripe.get_customer",
    "stripe.create_refund",
    "stripe.update_subscription",
    "stripe.cancel_subscription",
    "stripe.delete_customer",
];

/// Refund reasons Stripe accepts.
pub const REFUND_REASONS: &[&str] = &["duplicate", "fraudulent", "requested_by_customer"];

/// The metadata key under which a write records the execution that made it.
pub const EXECUTION_METADATA_KEY: &str = "threadgate_execution_id";

/// Stripe's largest page.
const MAX_PAGE_SIZE: u64 = 100;
/// How many pages [`StripeConnector::list_all`] follows before giving up.
const MAX_PAGES: usize = 1000;
/// Stripe's largest amount in the smallest currency unit (eight digits).
const MAX_AMOUNT: u64 = 99_999_999;
/// Charge owners remembered by [`StripeConnector::charge_customer`] before the memory is
/// cleared and starts again.
const MAX_KNOWN_OWNERS: usize = 10_000;

/// What the gateway needs to know about a charge before deciding a refund on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeFacts {
    /// The customer the charge belongs to, if any.
    pub customer: Option<String>,
    /// The charged amount, in the currency's smallest unit.
    pub amount: u64,
    /// How much of it has been refunded already.
    pub amount_refunded: u64,
    /// The three-letter currency code, lowercase.
    pub currency: String,
}

impl ChargeFacts {
    /// What is left to refund.
    pub fn remaining(&self) -> u64 {
        self.amount.saturating_sub(self.amount_refunded)
    }
}

/// The Stripe connector. Cheap to clone.
#[derive(Clone)]
pub struct StripeConnector {
    client: Client,
    base: Url,
    key: Credential,
    /// Charge id to its customer, for charges that have one: Stripe never changes a
    /// charge's customer once set, so the answer stays true.
    owners: Arc<Mutex<HashMap<String, String>>>,
    /// Customer emails for the read path, remembered only while Stripe's events keep
    /// them true (see [`known_emails`]).
    emails: Arc<known_emails::KnownEmails>,
}

impl std::fmt::Debug for StripeConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeConnector")
            .field("base", &self.base.as_str())
            .field("key", &self.key)
            .finish()
    }
}

struct SubscriptionItem {
    id: String,
    quantity: u64,
}

enum Request {
    Get(Vec<(String, String)>),
    Post(Vec<(String, String)>),
    Delete,
}

impl StripeConnector {
    /// A connector for the Stripe API at `base_url` (e.g. `https://api.stripe.com` or a
    /// localstripe address), authenticating with `api_key`.
    pub fn new(base_url: &str, api_key: Credential) -> Result<Self, ConfigError> {
        Self::with_timeout(base_url, api_key, http::DEFAULT_TIMEOUT)
    }

    /// As [`StripeConnector::new`], with a bound on each request's total time.
    pub fn with_timeout(
        base_url: &str,
        api_key: Credential,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::build_client(timeout)?,
            base: http::parse_base_url(base_url)?,
            key: api_key,
            owners: Arc::default(),
            emails: Arc::default(),
        })
    }

    /// Remembers customer emails for [`StripeConnector::known_customer_email`] for up to
    /// `max_age`. Only for a deployment whose Stripe webhook endpoint forgets a customer
    /// when its email changes ([`events`]).
    pub fn with_email_memory(mut self, max_age: Duration) -> Self {
        self.emails = Arc::new(known_emails::KnownEmails::new(Some(max_age)));
        self
    }

    /// Forgets what is remembered of `customer` (Stripe said it changed).
    pub fn forget_customer(&self, customer: &str) {
        self.emails.forget(customer);
    }

    /// Whether customer emails are remembered ([`StripeConnector::with_email_memory`]).
    pub fn remembers_emails(&self) -> bool {
        self.emails.remembers()
    }

    /// Forgets the customers other instances were told changed ([`changes`]), given the
    /// database's customer-change `mark` (read with the call's first look-up, so a read
    /// never costs a round trip for it): nothing to do while the mark stands still; when
    /// it moved, the changes since are read (one read) and their customers forgotten. The
    /// first look forgets everything remembered, as does a read that fails or a mark
    /// that could not be read (`None`).
    pub async fn catch_up(&self, db: &crate::store::Db, mark: Option<u64>) {
        if !self.emails.remembers() {
            return;
        }
        let Some(mark) = mark else {
            self.emails.forget_all();
            return;
        };
        let seen = self.emails.changes_seen();
        match seen {
            Some(seen) if seen >= mark => return,
            Some(seen) => match db.read_inline(move |c| changes::since(c, seen)) {
                Ok(customers) => {
                    for customer in &customers {
                        self.emails.forget(customer);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the stripe customer changes; forgetting every email");
                    self.emails.forget_all();
                }
            },
            None => self.emails.forget_all(),
        }
        self.emails.caught_up(mark);
    }

    /// The customer a charge belongs to, if any. A charge's customer cannot change once
    /// set (Stripe only lets one be added to a charge without one), so a known owner is
    /// answered from memory without a request; a charge without one is asked again.
    pub async fn charge_customer(&self, charge_id: &str) -> Result<Option<String>, ConnectorError> {
        let known = self
            .owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(charge_id)
            .cloned();
        if let Some(customer) = known {
            return Ok(Some(customer));
        }
        let customer = self.charge_facts(charge_id).await?.customer;
        if let Some(customer) = &customer {
            let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
            if owners.len() >= MAX_KNOWN_OWNERS {
                owners.clear();
            }
            owners.insert(charge_id.to_owned(), customer.clone());
        }
        Ok(customer)
    }

    /// The customer, amounts and currency of a charge.
    pub async fn charge_facts(&self, charge_id: &str) -> Result<ChargeFacts, ConnectorError> {
        let charge_id = checked_id("charge", charge_id)?;
        let charge = self
            .request(
                &["v1", "charges", charge_id],
                Request::Get(Vec::new()),
                None,
            )
            .await?;
        facts_of(charge_id, &charge)
    }

    /// [`StripeConnector::charge_facts`] and the email of the charge's customer, asked
    /// of Stripe in one request (`expand[]=customer`): what a write's completion needs,
    /// never answered from memory. The email is `None` when the charge has no customer
    /// or its customer has no email or was deleted. A provider that answers the
    /// customer unexpanded (its id) is asked for the customer's email in a second
    /// request.
    pub async fn charge_facts_and_email(
        &self,
        charge_id: &str,
    ) -> Result<(ChargeFacts, Option<String>), ConnectorError> {
        let charge_id = checked_id("charge", charge_id)?;
        let charge = self
            .request(
                &["v1", "charges", charge_id],
                Request::Get(vec![("expand[]".into(), "customer".into())]),
                None,
            )
            .await?;
        let facts = facts_of(charge_id, &charge)?;
        let email = match (charge.get("customer"), &facts.customer) {
            (Some(customer @ Value::Object(_)), Some(_)) => email_of(customer),
            (_, Some(id)) => self.customer_email(id).await?,
            (_, None) => None,
        };
        Ok((facts, email))
    }

    /// The email of a customer; `None` when it has none or has been deleted.
    pub async fn customer_email(
        &self,
        customer_id: &str,
    ) -> Result<Option<String>, ConnectorError> {
        let customer_id = checked_id("customer", customer_id)?;
        let customer = self
            .request(
                &["v1", "customers", customer_id],
                Request::Get(Vec::new()),
                None,
            )
            .await?;
        Ok(email_of(&customer))
    }

    /// As [`StripeConnector::customer_email`], answered from memory when the email was
    /// asked recently and Stripe has not said since that the customer changed (with
    /// [`StripeConnector::with_email_memory`]; without it, always asked). For the read
    /// path's scope check; writes ask Stripe every time.
    pub async fn known_customer_email(
        &self,
        customer_id: &str,
    ) -> Result<Option<String>, ConnectorError> {
        if let Some(email) = self.emails.get(customer_id) {
            return Ok(Some(email));
        }
        let asked_at = self.emails.generation();
        let email = self.customer_email(customer_id).await?;
        if let Some(email) = &email {
            self.emails.remember(customer_id, email, asked_at);
        }
        Ok(email)
    }

    /// The customer a subscription belongs to.
    pub async fn subscription_customer(
        &self,
        subscription_id: &str,
    ) -> Result<Option<String>, ConnectorError> {
        let subscription_id = checked_id("subscription", subscription_id)?;
        let subscription = self
            .request(
                &["v1", "subscriptions", subscription_id],
                Request::Get(Vec::new()),
                None,
            )
            .await?;
        Ok(object_id(
            subscription.get("customer").unwrap_or(&Value::Null),
        ))
    }

    /// Runs a list tool (`stripe.list_invoices` or `stripe.list_charges`) page after
    /// page, following `has_more` with `starting_after`, and returns every object.
    pub async fn list_all(&self, tool: &str, args: &Value) -> Result<Vec<Value>, ConnectorError> {
        let action = action_name(self.name(), tool);
        if !matches!(action, "list_invoices" | "list_charges") {
            return Err(ConnectorError::invalid(format!(
                "stripe.{action}: not a list tool"
            )));
        }
        let mut page_args = args.as_object().cloned().unwrap_or_default();
        page_args
            .entry("limit")
            .or_insert_with(|| json!(MAX_PAGE_SIZE));
        let mut items = Vec::new();
        for _ in 0..MAX_PAGES {
            let page = self.list(action, &Value::Object(page_args.clone())).await?;
            let data = page
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let next = data
                .last()
                .and_then(|last| last["id"].as_str())
                .map(str::to_owned);
            items.extend(data);
            match (page.get("has_more").and_then(Value::as_bool), next) {
                (Some(true), Some(next)) => {
                    page_args.insert("starting_after".into(), Value::String(next));
                }
                _ => return Ok(items),
            }
        }
        Err(ConnectorError::invalid(format!(
            "stripe.{action}: more than {MAX_PAGES} pages; narrow the query"
        )))
    }

    async fn list(&self, action: &str, args: &Value) -> Result<Value, ConnectorError> {
        let tool = format!("stripe.{action}");
        let args = Args::new(&tool, args, &["customer", "limit", "starting_after"])?;
        let mut query = vec![("customer".to_owned(), args.id("customer")?.to_owned())];
        if let Some(limit) = args.opt_int("limit", 1, MAX_PAGE_SIZE)? {
            query.push(("limit".into(), limit.to_string()));
        }
        if let Some(after) = args.opt_id("starting_after")? {
            query.push(("starting_after".into(), after.to_owned()));
        }
        let resource = if action == "list_invoices" {
            "invoices"
        } else {
            "charges"
        };
        let mut page = self
            .request(&["v1", resource], Request::Get(query), None)
            .await?;
        let next = page
            .get("data")
            .and_then(Value::as_array)
            .and_then(|data| data.last())
            .and_then(|last| last["id"].as_str())
            .filter(|_| page.get("has_more").and_then(Value::as_bool) == Some(true))
            .map(|id| Value::String(id.to_owned()))
            .unwrap_or(Value::Null);
        if let Value::Object(map) = &mut page {
            map.insert("next_starting_after".into(), next);
        }
        Ok(page)
    }

    async fn get(&self, tool: &str, args: &Value, key: &str) -> Result<Value, ConnectorError> {
        // `get_charge` also carries the `customer` the gateway checked it belongs to.
        let allowed: &[&str] = if key == "charge" {
            &["charge", "customer"]
        } else {
            &[key]
        };
        let args = Args::new(tool, args, allowed)?;
        let resource = if key == "charge" {
            "charges"
        } else {
            "customers"
        };
        if key == "charge" {
            args.opt_id("customer")?;
        }
        let id = args.id(key)?;
        self.request(&["v1", resource, id], Request::Get(Vec::new()), None)
            .await
    }

    async fn create_refund(
        &self,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "stripe.create_refund",
            args,
            &["charge", "amount", "reason", "customer", "currency"],
        )?;
        let mut params = Map::new();
        params.insert("charge".into(), json!(args.id("charge")?));
        if let Some(amount) = args.opt_int("amount", 1, MAX_AMOUNT)? {
            params.insert("amount".into(), json!(amount));
        }
        if let Some(reason) = args.opt_str("reason")? {
            if !REFUND_REASONS.contains(&reason) {
                return Err(args.reject("reason", &format!("one of {}", REFUND_REASONS.join(", "))));
            }
            params.insert("reason".into(), json!(reason));
        }
        // `customer` and `currency` are context the gateway filled in for the policy;
        // Stripe takes them from the charge.
        args.opt_id("customer")?;
        args.opt_str("currency")?;
        params.insert(
            "metadata".into(),
            json!({ EXECUTION_METADATA_KEY: ctx.execution_id }),
        );
        let form = form::encode(&Value::Object(params));
        self.request(&["v1", "refunds"], Request::Post(form), Some(ctx))
            .await
    }

    async fn update_subscription(
        &self,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "stripe.update_subscription",
            args,
            &[
                "subscription",
                "plan",
                "quantity",
                "cancel_at_period_end",
                "customer",
            ],
        )?;
        let subscription = args.id("subscription")?;
        args.opt_id("customer")?;
        let plan = args.opt_id("plan")?;
        let quantity = args.opt_int("quantity", 1, u64::from(u32::MAX))?;
        let mut params = Map::new();
        if plan.is_some() || quantity.is_some() {
            let item = self.single_item(subscription).await?;
            params.insert(
                "items".into(),
                json!([{
                    "id": item.id,
                    "plan": plan,
                    "quantity": quantity.unwrap_or(item.quantity),
                }]),
            );
        }
        if let Some(cancel) = args.opt_bool("cancel_at_period_end")? {
            params.insert("cancel_at_period_end".into(), json!(cancel));
        }
        if params.is_empty() {
            return Err(args.reject(
                "plan",
                "given (or `quantity` or `cancel_at_period_end`): nothing to update",
            ));
        }
        params.insert(
            "metadata".into(),
            json!({ EXECUTION_METADATA_KEY: ctx.execution_id }),
        );
        let form = form::encode(&Value::Object(params));
        self.request(
            &["v1", "subscriptions", subscription],
            Request::Post(form),
            Some(ctx),
        )
        .await
    }

    /// The one item of a single-item subscription: plan and quantity changes are made
    /// on it (`items[0][id]`), keeping its quantity unless a new one is given.
    async fn single_item(&self, subscription: &str) -> Result<SubscriptionItem, ConnectorError> {
        let current = self
            .request(
                &["v1", "subscriptions", subscription],
                Request::Get(Vec::new()),
                None,
            )
            .await?;
        let items = current
            .pointer("/items/data")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let [item] = items.as_slice() else {
            return Err(ConnectorError::invalid(format!(
                "stripe.update_subscription: subscription `{subscription}` has {} items; \
                 only single-item subscriptions can change plan or quantity",
                items.len()
            )));
        };
        let id = item["id"]
            .as_str()
            .filter(|id| super::args::is_plain_id(id));
        match (id, item["quantity"].as_u64()) {
            (Some(id), Some(quantity)) => Ok(SubscriptionItem {
                id: id.to_owned(),
                quantity,
            }),
            _ => Err(ConnectorError::unknown(format!(
                "stripe answered subscription `{subscription}` without an item id and quantity"
            ))),
        }
    }

    async fn delete(
        &self,
        tool: &str,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        let (key, resource, allowed): (&str, &str, &[&str]) = if tool == "stripe.delete_customer" {
            ("customer", "customers", &["customer"])
        } else {
            (
                "subscription",
                "subscriptions",
                &["subscription", "customer"],
            )
        };
        let args = Args::new(tool, args, allowed)?;
        let id = args.id(key)?;
        if key == "subscription" {
            args.opt_id("customer")?;
        }
        self.request(&["v1", resource, id], Request::Delete, Some(ctx))
            .await
    }

    /// Sends one request and interprets Stripe's answer. `ctx` is given for writes and
    /// supplies the idempotency key.
    async fn request(
        &self,
        segments: &[&str],
        request: Request,
        ctx: Option<&CallContext<'_>>,
    ) -> Result<Value, ConnectorError> {
        let mut url = http::endpoint(&self.base, segments);
        let builder = match request {
            Request::Get(query) => {
                if !query.is_empty() {
                    url.query_pairs_mut().extend_pairs(query);
                }
                self.client.get(url)
            }
            Request::Post(form) => self.client.post(url).form(&form),
            Request::Delete => self.client.delete(url),
        };
        let mut builder = builder;
        if let Some(ctx) = ctx {
            builder = builder.header("Idempotency-Key", ctx.idempotency_key());
        }
        let response = http::send(builder, &self.key).await?;
        interpret(response, &self.key)
    }
}

#[async_trait]
impl Connector for StripeConnector {
    fn name(&self) -> &'static str {
        "stripe"
    }

    async fn call(
        &self,
        tool: &str,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        match action_name(self.name(), tool) {
            action @ ("list_invoices" | "list_charges") => self.list(action, args).await,
            "get_charge" => self.get("stripe.get_charge", args, "charge").await,
            "get_customer" => self.get("stripe.get_customer", args, "customer").await,
            "create_refund" => self.create_refund(args, ctx).await,
            "update_subscription" => self.update_subscription(args, ctx).await,
            "cancel_subscription" => self.delete("stripe.cancel_subscription", args, ctx).await,
            "delete_customer" => self.delete("stripe.delete_customer", args, ctx).await,
            other => Err(ConnectorError::invalid(format!(
                "unknown tool stripe.{other}"
            ))),
        }
    }

    fn supports_idempotency(&self) -> bool {
        true
    }
}

/// Maps Stripe's answer to a value or a [`ConnectorError`], scrubbing `key` from text.
fn interpret(response: HttpResponse, key: &Credential) -> Result<Value, ConnectorError> {
    let status = response.status;
    let code = status.as_u16();
    if status.is_success() {
        return serde_json::from_slice(&response.body).map_err(|_| ConnectorError::Unknown {
            message: key.redact(&format!(
                "stripe answered {code} with a body that is not json: {}",
                http::body_excerpt(&response.body)
            )),
        });
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(ConnectorError::RateLimited {
            retry_after: retry_after_from_headers(&response.headers, Utc::now()),
        });
    }
    let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    let error = body.get("error").unwrap_or(&Value::Null);
    let field = |name: &str| error[name].as_str().map(str::to_owned);
    let mut message = field("message").unwrap_or_else(|| {
        format!(
            "stripe answered {code}: {}",
            http::body_excerpt(&response.body)
        )
    });
    if let Some(param) = field("param") {
        message.push_str(&format!(" (param: {param})"));
    }
    let message = key.redact(&message);
    let error_code = field("code").or_else(|| field("type"));
    if status.is_server_error() {
        return Err(ConnectorError::Unknown { message });
    }
    // A 409 on an idempotent request means another request with the same key is still
    // in flight: its outcome, which is this execution's outcome, is not known yet.
    if status == StatusCode::CONFLICT
        && error_code
            .as_deref()
            .is_some_and(|c| c.contains("idempotency"))
    {
        return Err(ConnectorError::Unknown { message });
    }
    Err(ConnectorError::Rejected {
        status: code,
        code: error_code,
        message,
    })
}

/// The id of a field that is either an id string or an expanded object.
/// A charge's facts from Stripe's answer for it.
fn facts_of(charge_id: &str, charge: &Value) -> Result<ChargeFacts, ConnectorError> {
    let amount = |key: &str| {
        charge.get(key).and_then(Value::as_u64).ok_or_else(|| {
            ConnectorError::unknown(format!("stripe charge {charge_id} has no `{key}`"))
        })
    };
    Ok(ChargeFacts {
        customer: object_id(charge.get("customer").unwrap_or(&Value::Null)),
        amount: amount("amount")?,
        amount_refunded: amount("amount_refunded")?,
        currency: charge
            .get("currency")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    })
}

/// A customer object's email; `None` when it has none or has been deleted.
fn email_of(customer: &Value) -> Option<String> {
    if customer.get("deleted").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    customer
        .get("email")
        .and_then(Value::as_str)
        .filter(|email| !email.is_empty())
        .map(str::to_owned)
}

fn object_id(value: &Value) -> Option<String> {
    match value {
        Value::String(id) => Some(id.clone()),
        Value::Object(map) => map.get("id").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

fn checked_id<'a>(what: &str, id: &'a str) -> Result<&'a str, ConnectorError> {
    if super::args::is_plain_id(id) {
        Ok(id)
    } else {
        Err(ConnectorError::invalid(format!(
            "stripe {what} id must be made of letters, digits, `_` and `-`"
        )))
    }
}
