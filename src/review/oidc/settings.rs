//! `[review]` and `[review.oidc]`: the review page's settings, and sign-in through the
//! team's OpenID provider.

use serde::{Deserialize, Serialize};

/// The review page's settings (`[review]`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReviewSettings {
    /// Sign-in through the team's OpenID provider (`[review.oidc]`); none: passwords
    /// only.
    pub oidc: Option<OidcSettings>,
}

/// Sign-in through the team's OpenID provider: the authorization code flow with PKCE.
/// The redirect URL is `<public_url>/login/oidc/callback`; register it at the provider.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The provider's issuer (its discovery document is fetched at start).
    pub issuer_url: String,
    /// threadgate's client id at the provider.
    pub client_id: String,
    /// The name of the stored secret (`threadgate secrets set NAME`) holding the client
    /// secret; the value is never in this file.
    #[serde(default = "default_client_secret_name")]
    pub client_secret_name: String,
    /// The ID token claim whose value names the reviewer in decisions and the audit
    /// (`email`, `preferred_username`, `sub`, or a claim of the provider's own).
    #[serde(default = "default_name_claim")]
    pub name_claim: String,
    /// Who may sign in: a verified email (`email_verified` true) at one of these
    /// domains ...
    #[serde(default)]
    pub allowed_email_domains: Vec<String>,
    /// ... or one of these subjects (`sub`) ...
    #[serde(default)]
    pub allowed_subjects: Vec<String>,
    /// ... or a member of one of these groups (in [`OidcSettings::groups_claim`]).
    #[serde(default)]
    pub allowed_groups: Vec<String>,
    /// The ID token claim listing the person's groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Scopes asked for besides `openid`.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// What the sign-in button calls the provider ("Sign in with ...").
    #[serde(default = "default_label")]
    pub label: String,
}

fn default_client_secret_name() -> String {
    "oidc_client_secret".into()
}

fn default_name_claim() -> String {
    "email".into()
}

fn default_groups_claim() -> String {
    "groups".into()
}

fn default_scopes() -> Vec<String> {
    vec!["email".into(), "profile".into()]
}

fn default_label() -> String {
    "your identity provider".into()
}

impl OidcSettings {
    /// Settings for `issuer_url` and `client_id` with every other key at its default
    /// and an empty allow-list (which [`super::Oidc::discover`] refuses).
    pub fn new(issuer_url: &str, client_id: &str) -> OidcSettings {
        OidcSettings {
            issuer_url: issuer_url.to_owned(),
            client_id: client_id.to_owned(),
            client_secret_name: default_client_secret_name(),
            name_claim: default_name_claim(),
            allowed_email_domains: Vec::new(),
            allowed_subjects: Vec::new(),
            allowed_groups: Vec::new(),
            groups_claim: default_groups_claim(),
            scopes: default_scopes(),
            label: default_label(),
        }
    }

    /// What is wrong with these settings before anything is fetched, naming the key.
    pub fn problem(&self) -> Option<String> {
        let key = |k: &str| format!("review.oidc.{k}");
        if self.client_id.trim().is_empty() {
            return Some(format!("{}: must not be empty", key("client_id")));
        }
        if self.client_secret_name.trim().is_empty() {
            return Some(format!("{}: must not be empty", key("client_secret_name")));
        }
        if self.name_claim.trim().is_empty() {
            return Some(format!("{}: must not be empty", key("name_claim")));
        }
        let nobody = self.allowed_email_domains.is_empty()
            && self.allowed_subjects.is_empty()
            && self.allowed_groups.is_empty();
        if nobody {
            return Some(
                "review.oidc: set allowed_email_domains, allowed_subjects or allowed_groups \
                 (an empty allow-list would let in everyone the provider knows)"
                    .into(),
            );
        }
        if let Some(d) = self.allowed_email_domains.iter().find(|d| !plain_domain(d)) {
            return Some(format!(
                "{}: {d:?} is not a domain name (write it without '@', e.g. \"example.com\")",
                key("allowed_email_domains")
            ));
        }
        None
    }
}

fn plain_domain(d: &str) -> bool {
    !d.is_empty()
        && d.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && !d.starts_with('.')
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    fn parse(text: &str) -> Result<Settings, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_oidc_table_is_read_with_its_defaults_and_unknown_keys_are_errors() {
        let s = parse(
            "[review.oidc]\nissuer_url = \"https://id.acme.test\"\nclient_id = \"tg\"\n\
             allowed_email_domains = [\"acme.test\"]\n",
        )
        .expect("parses");
        let oidc = s.review.oidc.expect("set");
        assert_eq!(oidc.client_secret_name, "oidc_client_secret");
        assert_eq!(oidc.name_claim, "email");
        assert_eq!(oidc.problem(), None);
        assert!(Settings::default().review.oidc.is_none());

        let err =
            parse("[review.oidc]\nissuer_url = \"x\"\nclient_id = \"tg\"\nclient_secret = \"s\"\n")
                .expect_err("unknown key");
        assert!(err.contains("client_secret"), "{err}");
        let err = parse("[review.oidc]\nclient_id = \"tg\"\n").expect_err("no issuer");
        assert!(err.contains("issuer_url"), "{err}");
        // The caps on started sign-ins are gone with the rows they capped (issue 19):
        // a file that still sets one is told so by name, not silently obeyed.
        let err = parse(
            "[review.oidc]\nissuer_url = \"x\"\nclient_id = \"tg\"\nmax_pending_per_address = 20\n",
        )
        .expect_err("removed key");
        assert!(err.contains("max_pending_per_address"), "{err}");
    }

    #[test]
    fn the_readmes_oidc_example_is_read_as_written() {
        let readme = include_str!("../../../README.md");
        let block = readme
            .split("```toml\n[review.oidc]")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the README's [review.oidc] example");
        let s = parse(&format!("[review.oidc]{block}")).expect("the example parses");
        let oidc = s.review.oidc.expect("set");
        assert_eq!(oidc.label, "Example ID");
        assert_eq!(oidc.problem(), None);
    }

    #[test]
    fn a_setting_that_would_let_anyone_in_or_cannot_match_names_its_key() {
        let mut oidc = super::OidcSettings::new("https://id.acme.test", "tg");
        let problem = oidc.problem().expect("empty allow-list");
        assert!(problem.contains("allow-list"), "{problem}");
        oidc.allowed_email_domains = vec!["@acme.test".into()];
        let problem = oidc.problem().expect("not a domain");
        assert!(
            problem.contains("review.oidc.allowed_email_domains"),
            "{problem}"
        );
        oidc.allowed_email_domains = vec!["acme.test".into()];
        assert_eq!(oidc.problem(), None);
    }
}
