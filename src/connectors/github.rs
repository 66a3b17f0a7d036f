//! The GitHub connector: the `github.*` tools over GitHub's REST API.
//!
//! Requests carry `Authorization: Bearer <token>`, `Accept: application/vnd.github+json`
//! and a pinned `X-GitHub-Api-Version`. Errors (`{"message", "errors": [...]}`) become
//! [`ConnectorError::Rejected`]; 429, and 403 with an exhausted rate limit or a
//! `retry-after`, become [`ConnectorError::RateLimited`].

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use chrono::Utc;
use reqwest::{Client, StatusCode, Url};
use serde_json::{Value, json};

use super::args::Args;
use super::http::{self, HttpResponse};
use super::rate_limit::retry_after_from_headers;
use super::{CallContext, ConfigError, Connector, ConnectorError, Credential, action_name};

/// The tools this connector runs, as the policy catalog names them.
pub const TOOLS: &[&str] = &[
    "github.search_code",
    "github.get_file",
    "github.create_issue",
];

/// The REST API version every request asks for.
pub const API_VERSION: &str = "2022-11-28";
/// How many search results one `github.search_code` returns.
const SEARCH_PAGE_SIZE: u32 = 20;

/// A pull request [`GithubConnector::upsert_draft_pull`] opened or updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// Its number in the repository.
    pub number: u64,
    /// Its page.
    pub html_url: String,
    /// True when it was opened now, false when an existing one was updated.
    pub created: bool,
    /// Its GraphQL node id (what marking it ready for review takes).
    pub node_id: String,
    /// Whether it is a draft now.
    pub draft: bool,
}

/// The GitHub connector. Cheap to clone.
#[derive(Clone)]
pub struct GithubConnector {
    client: Client,
    base: Url,
    token: Credential,
    /// The repositories (`owner/name`, lowercased) the tools may reach; empty reaches none.
    repos: Vec<String>,
}

impl std::fmt::Debug for GithubConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubConnector")
            .field("base", &self.base.as_str())
            .field("token", &self.token)
            .finish()
    }
}

impl GithubConnector {
    /// A connector for the GitHub REST API at `base_url` (e.g. `https://api.github.com`
    /// or a stub's address), authenticating with `token`.
    pub fn new(base_url: &str, token: Credential) -> Result<Self, ConfigError> {
        Self::with_timeout(base_url, token, http::DEFAULT_TIMEOUT)
    }

    /// As [`GithubConnector::new`], with a bound on each request's total time.
    pub fn with_timeout(
        base_url: &str,
        token: Credential,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::build_client(timeout)?,
            base: http::parse_base_url(base_url)?,
            token,
            repos: Vec::new(),
        })
    }

    /// Limits the tools to `repos` (`owner/name`, compared without case).
    pub fn with_repos(mut self, repos: &[String]) -> Self {
        self.repos = repos.iter().map(|r| r.to_ascii_lowercase()).collect();
        self
    }

    /// The configured repositories, lowercased.
    pub fn repos(&self) -> &[String] {
        &self.repos
    }

    /// Whether `repo` is one of the configured repositories.
    pub fn allows_repo(&self, repo: &str) -> bool {
        self.repos.iter().any(|r| r.eq_ignore_ascii_case(repo))
    }

    fn check_repo(&self, args: &Args<'_>, repo: &str) -> Result<(), ConnectorError> {
        if self.allows_repo(repo) {
            Ok(())
        } else {
            Err(args.reject("repo", "one of the configured repositories"))
        }
    }

    async fn search_code(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new("github.search_code", args, &["query", "repo"])?;
        let mut query = args.str("query")?.to_owned();
        if let Some(qualifier) = scope_qualifier(&query) {
            return Err(args.reject(
                "query",
                &format!("a query without a `{qualifier}` qualifier (use `repo`)"),
            ));
        }
        let repos: Vec<String> = match args.opt_str("repo")? {
            Some(repo) => {
                let (owner, name) = split_repo(&args, repo)?;
                self.check_repo(&args, repo)?;
                vec![format!("{owner}/{name}")]
            }
            None => self.repos.clone(),
        };
        if repos.is_empty() {
            return Err(args.reject("repo", "one of the configured repositories (none is)"));
        }
        for repo in &repos {
            query.push_str(&format!(" repo:{repo}"));
        }
        let mut url = http::endpoint(&self.base, &["search", "code"]);
        url.query_pairs_mut()
            .append_pair("q", &query)
            .append_pair("per_page", &SEARCH_PAGE_SIZE.to_string());
        let found = self.send(self.client.get(url)).await?;
        let items: Vec<Value> = found
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|item| {
                item.pointer("/repository/full_name")
                    .and_then(Value::as_str)
                    .is_some_and(|r| self.allows_repo(r))
            })
            .map(|item| {
                json!({
                    "name": item["name"],
                    "path": item["path"],
                    "sha": item["sha"],
                    "html_url": item["html_url"],
                    "repository": item.pointer("/repository/full_name"),
                })
            })
            .collect();
        Ok(json!({
            "total_count": found.get("total_count"),
            "incomplete_results": found.get("incomplete_results"),
            "items": items,
        }))
    }

    async fn get_file(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new("github.get_file", args, &["repo", "path", "ref"])?;
        let (owner, name) = split_repo(&args, args.str("repo")?)?;
        self.check_repo(&args, args.str("repo")?)?;
        let path = args.str("path")?;
        let path_segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        if path_segments
            .iter()
            .any(|segment| segment.is_empty() || *segment == "." || *segment == "..")
        {
            return Err(args.reject("path", "a file path without empty, `.` or `..` parts"));
        }
        let mut segments = vec!["repos", owner, name, "contents"];
        segments.extend(path_segments);
        let mut url = http::endpoint(&self.base, &segments);
        if let Some(git_ref) = args.opt_str("ref")? {
            url.query_pairs_mut().append_pair("ref", git_ref);
        }
        let content = self.send(self.client.get(url)).await?;
        file_view(&content)
    }

    async fn create_issue(&self, args: &Value) -> Result<Value, ConnectorError> {
        let args = Args::new(
            "github.create_issue",
            args,
            &["repo", "title", "body", "labels"],
        )?;
        let (owner, name) = split_repo(&args, args.str("repo")?)?;
        self.check_repo(&args, args.str("repo")?)?;
        let mut issue = json!({"title": args.str("title")?});
        if let Some(body) = args.opt_str("body")?
            && let Some(fields) = issue.as_object_mut()
        {
            fields.insert("body".into(), json!(body));
        }
        if let Some(labels) = args.opt_str_list("labels")?
            && let Some(fields) = issue.as_object_mut()
        {
            fields.insert("labels".into(), json!(labels));
        }
        let url = http::endpoint(&self.base, &["repos", owner, name, "issues"]);
        let created = self.send(self.client.post(url).json(&issue)).await?;
        Ok(json!({
            "number": created.get("number"),
            "id": created.get("id"),
            "html_url": created.get("html_url"),
            "title": created.get("title"),
        }))
    }

    /// Opens a draft pull request from `head` (a branch of `repo`) into `base`, or, when
    /// one from `head` exists, updates its title and description (reopening it if it
    /// was closed unmerged). Idempotent: running it again (after a restart, after the
    /// thread's follow-up) never opens a second one while the first can be reopened.
    pub async fn upsert_draft_pull(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<PullRequest, ConnectorError> {
        let (owner, name) = self.pull_repo(repo)?;
        let pulls = http::endpoint(&self.base, &["repos", owner, name, "pulls"]);
        let mut find = pulls.clone();
        find.query_pairs_mut()
            .append_pair("head", &format!("{owner}:{head}"))
            .append_pair("state", "all");
        let found = self.send(self.client.get(find)).await?;
        let list = found.as_array().map(Vec::as_slice).unwrap_or_default();
        // An open one first, else one closed without being merged (it can be reopened).
        let existing = list
            .iter()
            .find(|pull| pull["state"] == "open")
            .or_else(|| list.iter().find(|pull| pull["merged_at"].is_null()))
            .and_then(|pull| pull["number"].as_u64());
        let (answer, created) = match existing {
            Some(number) => {
                let patch = json!({"title": title, "body": body, "state": "open"});
                (self.patch_pull(owner, name, number, &patch).await?, false)
            }
            None => {
                let create = json!({"title": title, "head": head, "base": base,
                                    "body": body, "draft": true});
                (
                    self.send(self.client.post(pulls).json(&create)).await?,
                    true,
                )
            }
        };
        Ok(pull_request(&answer, created))
    }

    /// Closes pull request `number` of `repo` (`PATCH .../pulls/{number}`).
    pub async fn close_pull(&self, repo: &str, number: u64) -> Result<(), ConnectorError> {
        let (owner, name) = self.pull_repo(repo)?;
        let patch = json!({"state": "closed"});
        self.patch_pull(owner, name, number, &patch).await?;
        Ok(())
    }

    /// Marks a draft pull request ready for review: REST cannot, so this is GraphQL's
    /// `markPullRequestReadyForReview` at `<api_url>/graphql` (api.github.com's layout).
    pub async fn mark_ready(&self, pull: &PullRequest) -> Result<(), ConnectorError> {
        let url = http::endpoint(&self.base, &["graphql"]);
        let request = json!({
            "query": "mutation($id: ID!) { markPullRequestReadyForReview(input: \
                      {pullRequestId: $id}) { pullRequest { isDraft } } }",
            "variables": {"id": pull.node_id},
        });
        let answer = self.send(self.client.post(url).json(&request)).await?;
        if let Some(errors) = answer
            .get("errors")
            .and_then(Value::as_array)
            .filter(|e| !e.is_empty())
        {
            let message: Vec<&str> = errors
                .iter()
                .filter_map(|e| e["message"].as_str())
                .collect();
            return Err(ConnectorError::Rejected {
                status: 200,
                code: errors
                    .first()
                    .and_then(|e| e.get("type"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                message: self.token.redact(&format!(
                    "github refused to mark pull request {} ready: {}",
                    pull.number,
                    message.join("; ")
                )),
            });
        }
        Ok(())
    }

    /// `owner` and `name` of `repo`, when it is one of the configured repositories.
    fn pull_repo<'a>(&self, repo: &'a str) -> Result<(&'a str, &'a str), ConnectorError> {
        let value = json!({"repo": repo});
        let args = Args::new("github.pull_request", &value, &["repo"])?;
        let (owner, name) = split_repo(&args, repo)?;
        self.check_repo(&args, repo)?;
        Ok((owner, name))
    }

    async fn patch_pull(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        patch: &Value,
    ) -> Result<Value, ConnectorError> {
        let url = http::endpoint(
            &self.base,
            &["repos", owner, name, "pulls", &number.to_string()],
        );
        self.send(self.client.patch(url).json(patch)).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ConnectorError> {
        let request = request
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", API_VERSION);
        let response = http::send(request, &self.token).await?;
        interpret(response, &self.token)
    }
}

#[async_trait]
impl Connector for GithubConnector {
    fn name(&self) -> &'static str {
        "github"
    }

    async fn call(
        &self,
        tool: &str,
        args: &Value,
        _ctx: &CallContext<'_>,
    ) -> Result<Value, ConnectorError> {
        match action_name(self.name(), tool) {
            "search_code" => self.search_code(args).await,
            "get_file" => self.get_file(args).await,
            "create_issue" => self.create_issue(args).await,
            other => Err(ConnectorError::invalid(format!(
                "unknown tool github.{other}"
            ))),
        }
    }

    fn supports_idempotency(&self) -> bool {
        false
    }
}

/// A pull request's answer as a [`PullRequest`].
fn pull_request(answer: &Value, created: bool) -> PullRequest {
    PullRequest {
        number: answer["number"].as_u64().unwrap_or_default(),
        html_url: answer["html_url"].as_str().unwrap_or_default().to_owned(),
        created,
        node_id: answer["node_id"].as_str().unwrap_or_default().to_owned(),
        draft: answer["draft"].as_bool().unwrap_or(false),
    }
}

/// The first search qualifier in `query` that would widen a search beyond the
/// configured repositories (`repo:`, `org:`, `user:`), if any.
pub fn scope_qualifier(query: &str) -> Option<&'static str> {
    let lower = query.to_ascii_lowercase();
    ["repo:", "org:", "user:"].into_iter().find(|q| {
        lower
            .split(|c: char| c.is_whitespace() || c == '(' || c == '-' || c == '"')
            .any(|word| word.starts_with(q))
    })
}

/// `owner/name`, each part made of letters, digits, `-`, `_` and `.`.
fn split_repo<'a>(args: &Args<'_>, repo: &'a str) -> Result<(&'a str, &'a str), ConnectorError> {
    let valid_part = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
    };
    match repo.split_once('/') {
        Some((owner, name)) if valid_part(owner) && valid_part(name) => Ok((owner, name)),
        _ => Err(args.reject("repo", "`owner/name`")),
    }
}

/// A contents answer as the agent sees it: a decoded file, or a directory listing.
fn file_view(content: &Value) -> Result<Value, ConnectorError> {
    if let Some(entries) = content.as_array() {
        let entries: Vec<Value> = entries
            .iter()
            .map(|entry| json!({"name": entry["name"], "path": entry["path"], "type": entry["type"]}))
            .collect();
        return Ok(json!({"type": "dir", "entries": entries}));
    }
    let base = json!({
        "type": content["type"],
        "path": content["path"],
        "sha": content["sha"],
        "size": content["size"],
    });
    if content["type"].as_str() != Some("file") {
        return Ok(base);
    }
    let encoded = match content["encoding"].as_str() {
        Some("base64") => content["content"].as_str().unwrap_or_default(),
        _ => {
            return Err(ConnectorError::Rejected {
                status: 200,
                code: Some("file_too_large".into()),
                message: format!(
                    "github sent no content for `{}` (files over 1 MB are not served inline)",
                    content["path"].as_str().unwrap_or("?")
                ),
            });
        }
    };
    let compact: String = encoded
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|error| {
            ConnectorError::unknown(format!("github sent invalid base64 content: {error}"))
        })?;
    let mut view = base;
    let (key, decoded) = match String::from_utf8(bytes) {
        Ok(text) => ("content", json!(text)),
        Err(not_text) => (
            "content_base64",
            json!(base64::engine::general_purpose::STANDARD.encode(not_text.as_bytes())),
        ),
    };
    if let Some(fields) = view.as_object_mut() {
        fields.insert(key.into(), decoded);
    }
    Ok(view)
}

/// Maps GitHub's answer to a value or a [`ConnectorError`], scrubbing `token` from text.
fn interpret(response: HttpResponse, token: &Credential) -> Result<Value, ConnectorError> {
    let status = response.status;
    let code = status.as_u16();
    let header = |name: &str| response.headers.get(name).and_then(|v| v.to_str().ok());
    if status.is_success() {
        return serde_json::from_slice(&response.body).map_err(|_| ConnectorError::Unknown {
            message: token.redact(&format!(
                "github answered {code} with a body that is not json: {}",
                http::body_excerpt(&response.body)
            )),
        });
    }
    let exhausted = header("x-ratelimit-remaining") == Some("0") || header("retry-after").is_some();
    if status == StatusCode::TOO_MANY_REQUESTS || (status == StatusCode::FORBIDDEN && exhausted) {
        return Err(ConnectorError::RateLimited {
            retry_after: retry_after_from_headers(&response.headers, Utc::now()),
        });
    }
    let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    let mut message = body
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            format!(
                "github answered {code}: {}",
                http::body_excerpt(&response.body)
            )
        });
    let details: Vec<String> = body
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|error| match error {
            Value::String(text) => text.clone(),
            _ => [
                &error["resource"],
                &error["field"],
                &error["code"],
                &error["message"],
            ]
            .iter()
            .filter_map(|part| part.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        })
        .filter(|detail| !detail.is_empty())
        .collect();
    if !details.is_empty() {
        message.push_str(&format!(" ({})", details.join("; ")));
    }
    let message = token.redact(&message);
    if status.is_server_error() {
        return Err(ConnectorError::Unknown { message });
    }
    Err(ConnectorError::Rejected {
        status: code,
        code: body
            .get("errors")
            .and_then(|e| e.get(0))
            .and_then(|e| e.get("code"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_decoded_and_directories_listed() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("fn main() {}\n");
        let wrapped = format!("{}\n{}", &encoded[..8], &encoded[8..]);
        let file = json!({"type": "file", "path": "src/main.rs", "sha": "abc", "size": 13,
                          "encoding": "base64", "content": wrapped});
        let view = file_view(&file).unwrap();
        assert_eq!(view["content"], "fn main() {}\n");
        assert_eq!(view["path"], "src/main.rs");

        let dir = json!([{"name": "a.rs", "path": "src/a.rs", "type": "file"}]);
        assert_eq!(file_view(&dir).unwrap()["entries"][0]["name"], "a.rs");

        let big = json!({"type": "file", "path": "big.bin", "encoding": "none", "content": ""});
        assert!(matches!(
            file_view(&big),
            Err(ConnectorError::Rejected { .. })
        ));
    }

    #[test]
    fn repos_must_be_owner_slash_name() {
        let value = json!({});
        let args = Args::new("github.get_file", &value, &[]).unwrap();
        assert_eq!(
            split_repo(&args, "acme/shop.api").unwrap(),
            ("acme", "shop.api")
        );
        for bad in ["acme", "acme/", "/x", "a/b/c", "a/..", "a b/c"] {
            assert!(split_repo(&args, bad).is_err(), "{bad}");
        }
    }
}
