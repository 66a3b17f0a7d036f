//! The GitHub connector against a local stub of GitHub's REST API.

use crate::support;

use serde_json::{Value, json};
use support::github_stub::{Failure, GithubStub, TOKEN};
use threadgate::connectors::{CallContext, Connector, ConnectorError, Credential, GithubConnector};

const REPO: &str = "acme/shop";
const CHECKOUT: &str = "fn retry_payment() {\n    // retries without an idempotency key\n}\n";

async fn stub_with_files() -> GithubStub {
    let stub = GithubStub::start().await;
    stub.add_file(REPO, "main", "src/checkout.rs", CHECKOUT.as_bytes());
    stub.add_file(REPO, "main", "src/cart.rs", b"fn total() {}\n");
    stub.add_file(REPO, "v1", "src/checkout.rs", b"fn old_checkout() {}\n");
    stub.add_file(REPO, "main", "assets/logo.bin", &[0xff, 0x00, 0xfe]);
    stub.add_file("acme/other", "main", "lib.rs", b"fn retry_payment() {}\n");
    stub
}

fn connector(stub: &GithubStub) -> GithubConnector {
    GithubConnector::new(stub.base_url(), Credential::new(TOKEN))
        .unwrap()
        .with_repos(&[REPO.to_owned()])
}

async fn call(
    connector: &GithubConnector,
    tool: &str,
    args: Value,
) -> Result<Value, ConnectorError> {
    connector
        .call(
            tool,
            &args,
            &CallContext {
                execution_id: "exec-gh",
            },
        )
        .await
}

#[tokio::test]
async fn search_code_scopes_to_the_repo() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let found = call(
        &connector,
        "github.search_code",
        json!({"query": "retry_payment", "repo": REPO}),
    )
    .await
    .unwrap();
    assert_eq!(found["total_count"], 1);
    assert_eq!(found["items"][0]["path"], "src/checkout.rs");
    assert_eq!(found["items"][0]["repository"], REPO);
    let request = &stub.requests()[0];
    assert_eq!(request.query["q"], format!("retry_payment repo:{REPO}"));
    assert_eq!(
        request.accept.as_deref(),
        Some("application/vnd.github+json")
    );
    assert_eq!(request.api_version.as_deref(), Some("2022-11-28"));

    // Without `repo`, the search covers the configured repositories only (acme/other
    // also has a match).
    let unscoped = call(&connector, "search_code", json!({"query": "retry_payment"}))
        .await
        .unwrap();
    assert_eq!(unscoped["total_count"], 1);
}

#[tokio::test]
async fn get_file_decodes_content_at_a_ref() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let file = call(
        &connector,
        "github.get_file",
        json!({"repo": REPO, "path": "src/checkout.rs"}),
    )
    .await
    .unwrap();
    assert_eq!(file["content"], CHECKOUT);
    assert_eq!(file["type"], "file");

    let old = call(
        &connector,
        "github.get_file",
        json!({"repo": REPO, "path": "src/checkout.rs", "ref": "v1"}),
    )
    .await
    .unwrap();
    assert_eq!(old["content"], "fn old_checkout() {}\n");
    assert_eq!(stub.requests()[1].query["ref"], "v1");

    let binary = call(
        &connector,
        "github.get_file",
        json!({"repo": REPO, "path": "assets/logo.bin"}),
    )
    .await
    .unwrap();
    assert_eq!(binary["content_base64"], "/wD+");

    let dir = call(
        &connector,
        "github.get_file",
        json!({"repo": REPO, "path": "src"}),
    )
    .await
    .unwrap();
    assert_eq!(dir["type"], "dir");
    assert_eq!(dir["entries"].as_array().unwrap().len(), 2);

    let missing = call(
        &connector,
        "github.get_file",
        json!({"repo": REPO, "path": "nope.rs"}),
    )
    .await;
    assert!(
        matches!(missing, Err(ConnectorError::Rejected { status: 404, .. })),
        "{missing:?}"
    );
}

#[tokio::test]
async fn create_issue_sends_title_body_and_labels() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let args = json!({"repo": REPO, "title": "Double charge on retry", "body": "Seen on thread T-1.",
                      "labels": ["bug", "support"]});
    let created = call(&connector, "github.create_issue", args).await.unwrap();
    assert_eq!(created["number"], 1);
    assert_eq!(
        created["html_url"],
        "https://github.test/acme/shop/issues/1"
    );
    let issues = stub.issues();
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0]["title"], "Double charge on retry");
    assert_eq!(issues[0]["body"], "Seen on thread T-1.");
    assert_eq!(
        issues[0]["labels"],
        json!([{"name": "bug"}, {"name": "support"}])
    );
}

#[tokio::test]
async fn validation_failures_are_rejections_with_details() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let error = call(
        &connector,
        "github.search_code",
        json!({"query": "language:rust"}),
    )
    .await
    .unwrap_err();
    match error {
        ConnectorError::Rejected {
            status,
            code,
            message,
        } => {
            assert_eq!(status, 422);
            assert_eq!(code.as_deref(), Some("missing"));
            assert!(message.contains("Validation Failed"), "{message}");
            assert!(message.contains("q"), "{message}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_classified() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let reset = chrono::Utc::now().timestamp() + 120;
    stub.fail_next(Failure::RateLimited { reset_unix: reset });
    let error = call(&connector, "github.search_code", json!({"query": "total"}))
        .await
        .unwrap_err();
    let ConnectorError::RateLimited { retry_after } = error else {
        panic!("expected a rate limit, got {error:?}");
    };
    assert!(
        retry_after.as_secs() > 100 && retry_after.as_secs() <= 120,
        "{retry_after:?}"
    );

    stub.fail_next(Failure::BadGateway);
    let args = json!({"repo": REPO, "title": "t"});
    let error = call(&connector, "github.create_issue", args)
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectorError::Unknown { .. }), "{error:?}");
    assert!(!connector.supports_idempotency());
}

#[tokio::test]
async fn bad_arguments_send_nothing() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    let cases = [
        ("github.get_file", json!({"repo": "acme", "path": "x"})),
        (
            "github.get_file",
            json!({"repo": REPO, "path": "../secrets"}),
        ),
        ("github.get_file", json!({"repo": REPO, "path": "a//b"})),
        ("github.create_issue", json!({"repo": REPO})),
        (
            "github.create_issue",
            json!({"repo": REPO, "title": "t", "labels": "bug"}),
        ),
        ("github.search_code", json!({"q": "x"})),
        ("github.delete_repo", json!({})),
    ];
    for (tool, args) in cases {
        let result = call(&connector, tool, args.clone()).await;
        assert!(
            matches!(result, Err(ConnectorError::InvalidArgs { .. })),
            "{tool} {args}: {result:?}"
        );
    }
    assert!(stub.requests().is_empty());
}

#[tokio::test]
async fn the_token_never_appears_in_errors_or_debug_output() {
    let stub = stub_with_files().await;
    let secret = "ghp_wrong_token_do_not_print_91f2";
    let wrong = GithubConnector::new(stub.base_url(), Credential::new(secret))
        .unwrap()
        .with_repos(&[REPO.to_owned()]);
    let error = call(&wrong, "github.search_code", json!({"query": "x"}))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectorError::Rejected { status: 401, .. }),
        "{error:?}"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = GithubConnector::new(&format!("http://127.0.0.1:{port}"), Credential::new(secret))
        .unwrap()
        .with_repos(&[REPO.to_owned()]);
    let unreachable = call(&dead, "github.search_code", json!({"query": "x"}))
        .await
        .unwrap_err();
    assert!(
        matches!(unreachable, ConnectorError::Unreachable { .. }),
        "{unreachable:?}"
    );
    for text in [
        error.to_string(),
        format!("{unreachable:?}"),
        format!("{wrong:?}"),
    ] {
        assert!(!text.contains(secret), "{text}");
    }
}

#[tokio::test]
async fn only_configured_repositories_are_reached() {
    let stub = stub_with_files().await;
    let connector = connector(&stub);
    // Another repository, by argument or by a qualifier inside the query: refused here,
    // nothing sent.
    for (tool, args) in [
        (
            "github.create_issue",
            json!({"repo": "attacker/drop", "title": "x"}),
        ),
        (
            "github.get_file",
            json!({"repo": "acme/other", "path": "lib.rs"}),
        ),
        (
            "github.search_code",
            json!({"query": "retry_payment", "repo": "acme/other"}),
        ),
        (
            "github.search_code",
            json!({"query": "retry_payment repo:acme/other"}),
        ),
        (
            "github.search_code",
            json!({"query": "retry_payment ORG:acme"}),
        ),
        (
            "github.search_code",
            json!({"query": "retry_payment user:acme"}),
        ),
    ] {
        let error = call(&connector, tool, args.clone()).await.unwrap_err();
        assert!(
            matches!(error, ConnectorError::InvalidArgs { .. }),
            "{tool} {args}: {error:?}"
        );
    }
    assert!(stub.requests().is_empty(), "{:?}", stub.requests());
    assert!(stub.issues().is_empty());

    // A search without `repo` is limited to the configured repositories: acme/other's
    // match is not searched for, nor returned.
    let found = call(
        &connector,
        "github.search_code",
        json!({"query": "retry_payment"}),
    )
    .await
    .unwrap();
    let repos: Vec<&str> = found["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["repository"].as_str().unwrap())
        .collect();
    assert_eq!(repos, vec![REPO]);
    assert_eq!(
        stub.requests()[0].query["q"],
        format!("retry_payment repo:{REPO}")
    );

    // No repository configured: every tool is refused.
    let none = GithubConnector::new(stub.base_url(), Credential::new(TOKEN)).unwrap();
    let error = call(
        &none,
        "github.search_code",
        json!({"query": "retry_payment"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, ConnectorError::InvalidArgs { .. }),
        "{error:?}"
    );
    assert_eq!(stub.requests().len(), 1);
}
