//! Unit tests of the Stripe answer mapping; the connector itself is tested against
//! localstripe in `tests/it/connectors_stripe.rs`.

use super::*;
use reqwest::header::{HeaderMap, HeaderValue};

const KEY: &str = "sk_test_unit_secret";

fn response(status: u16, body: &str, headers: &[(&'static str, &str)]) -> HttpResponse {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    HttpResponse {
        status: StatusCode::from_u16(status).unwrap(),
        headers: map,
        body: body.as_bytes().to_vec(),
    }
}

fn check(status: u16, body: &str, expected: Result<Value, ConnectorError>) {
    let key = Credential::new(KEY);
    assert_eq!(
        interpret(response(status, body, &[]), &key),
        expected,
        "{status} {body}"
    );
}

#[test]
fn success_is_the_json_body() {
    check(200, r#"{"id":"re_1"}"#, Ok(json!({"id": "re_1"})));
}

#[test]
fn stripe_errors_are_rejections_with_code_or_type() {
    check(
        400,
        r#"{"error":{"type":"invalid_request_error","code":"amount_too_large","message":"Too big","param":"amount"}}"#,
        Err(ConnectorError::Rejected {
            status: 400,
            code: Some("amount_too_large".into()),
            message: "Too big (param: amount)".into(),
        }),
    );
    check(
        400,
        r#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests"}}"#,
        Err(ConnectorError::Rejected {
            status: 400,
            code: Some("idempotency_error".into()),
            message: "Keys for idempotent requests".into(),
        }),
    );
    check(
        404,
        "not json",
        Err(ConnectorError::Rejected {
            status: 404,
            code: None,
            message: "stripe answered 404: not json".into(),
        }),
    );
}

#[test]
fn server_errors_and_bad_bodies_are_unknown() {
    let key = Credential::new(KEY);
    for (status, body) in [(500, "{}"), (503, "down"), (200, "<html>")] {
        let result = interpret(response(status, body, &[]), &key);
        assert!(
            matches!(result, Err(ConnectorError::Unknown { .. })),
            "{status}: {result:?}"
        );
    }
    let in_flight = r#"{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"busy"}}"#;
    assert!(matches!(
        interpret(response(409, in_flight, &[]), &key),
        Err(ConnectorError::Unknown { .. })
    ));
}

#[test]
fn rate_limit_honours_retry_after() {
    let key = Credential::new(KEY);
    let result = interpret(response(429, "{}", &[("retry-after", "4")]), &key);
    assert_eq!(
        result,
        Err(ConnectorError::RateLimited {
            retry_after: Duration::from_secs(4)
        })
    );
}

#[test]
fn the_key_never_reaches_an_error_message() {
    let key = Credential::new(KEY);
    let echo = format!(
        r#"{{"error":{{"type":"invalid_request_error","message":"Invalid API Key provided: {KEY}"}}}}"#
    );
    for status in [401, 500] {
        let error = interpret(response(status, &echo, &[]), &key).unwrap_err();
        assert!(!error.to_string().contains(KEY), "{error}");
        assert!(!format!("{error:?}").contains(KEY), "{error:?}");
    }
    let error = interpret(response(200, &format!("oops {KEY}"), &[]), &key).unwrap_err();
    assert!(!error.to_string().contains(KEY), "{error}");
}

#[test]
fn charge_facts_remaining() {
    let facts = ChargeFacts {
        customer: None,
        amount: 1000,
        amount_refunded: 300,
        currency: "usd".into(),
    };
    assert_eq!(facts.remaining(), 700);
}

#[test]
fn object_ids_from_strings_or_expanded_objects() {
    assert_eq!(object_id(&json!("cus_1")), Some("cus_1".into()));
    assert_eq!(object_id(&json!({"id": "cus_2"})), Some("cus_2".into()));
    assert_eq!(object_id(&Value::Null), None);
}

#[tokio::test]
async fn bad_arguments_are_refused_before_sending() {
    // Port 9 (discard) on loopback: nothing listens, but nothing must be sent anyway.
    let stripe = StripeConnector::new("http://127.0.0.1:9", Credential::new(KEY)).unwrap();
    let ctx = CallContext { execution_id: "e1" };
    let cases = [
        ("stripe.create_refund", json!({"amount": 5})),
        (
            "stripe.create_refund",
            json!({"charge": "ch_1", "amount": -5}),
        ),
        (
            "stripe.create_refund",
            json!({"charge": "ch_1", "reason": "because"}),
        ),
        ("stripe.create_refund", json!({"charge": "ch_1/../x"})),
        ("stripe.get_charge", json!({"charge": "ch_1", "extra": 1})),
        (
            "stripe.update_subscription",
            json!({"subscription": "sub_1"}),
        ),
        ("stripe.list_charges", json!({"limit": 5})),
        (
            "stripe.list_charges",
            json!({"customer": "cus_1", "limit": 1000}),
        ),
        ("stripe.nope", json!({})),
    ];
    for (tool, args) in cases {
        let result = stripe.call(tool, &args, &ctx).await;
        assert!(
            matches!(result, Err(ConnectorError::InvalidArgs { .. })),
            "{tool} {args}: {result:?}"
        );
    }
}
