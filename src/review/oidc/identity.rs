//! Who a verified ID token names, and whether the team lets them review: pure, over the
//! token's claims as JSON (the standard ones and the provider's own alike).

use serde_json::{Map, Value};

use super::settings::OidcSettings;

/// A person the provider vouched for and the team allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `<issuer> <sub>`: the same person at the same provider, whatever their name.
    pub subject: String,
    /// The configured claim's value: the reviewer's name in decisions and the audit.
    pub name: String,
}

/// Why a verified person may not review.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token has no `sub` (the library checks it; kept so nothing is assumed).
    #[error("the identity provider's ID token has no subject")]
    NoSubject,
    /// The token lacks the claim that names the reviewer.
    #[error("the identity provider's ID token has no {0:?} claim, which names reviewers here")]
    NoName(String),
    /// Not on the team's allow-list.
    #[error("{0} signed in at the identity provider, but this team has not allowed them to review")]
    NotAllowed(String),
    /// Reviewers are named by email here, and the provider has not verified this one:
    /// a person could otherwise pick a colleague's address and decide under their name.
    #[error(
        "the identity provider has not verified the email {0}, which names reviewers here; \
         verify it there, then sign in again"
    )]
    UnverifiedEmail(String),
}

/// The identity of `claims` (an ID token's, verified) at `issuer`, if the allow-list of
/// `settings` lets them in: their subject, a verified email at an allowed domain, or a
/// group.
pub fn judge(
    settings: &OidcSettings,
    issuer: &str,
    claims: &Map<String, Value>,
) -> Result<Identity, Refusal> {
    let sub = text(claims.get("sub")).ok_or(Refusal::NoSubject)?;
    let name = text(claims.get(&settings.name_claim))
        .ok_or_else(|| Refusal::NoName(settings.name_claim.clone()))?;
    // INVARIANT: a name read from `email` is one the provider verified, whichever route
    // of the allow-list lets the person in (a group or subject does not vouch for it).
    let verified = claims.get("email_verified") == Some(&Value::Bool(true));
    if settings.name_claim == "email" && !verified {
        return Err(Refusal::UnverifiedEmail(name));
    }
    let allowed = settings.allowed_subjects.contains(&sub)
        || allowed_email(settings, claims)
        || allowed_group(settings, claims);
    if !allowed {
        return Err(Refusal::NotAllowed(name));
    }
    Ok(Identity {
        subject: format!("{issuer} {sub}"),
        name,
    })
}

/// A verified email whose domain is allowed (compared without case).
fn allowed_email(settings: &OidcSettings, claims: &Map<String, Value>) -> bool {
    let verified = claims.get("email_verified") == Some(&Value::Bool(true));
    let Some(email) = text(claims.get("email")).filter(|_| verified) else {
        return false;
    };
    let Some((_, domain)) = email.rsplit_once('@') else {
        return false;
    };
    settings
        .allowed_email_domains
        .iter()
        .any(|d| d.eq_ignore_ascii_case(domain))
}

/// A group (the groups claim as a list of strings, or one string) that is allowed.
fn allowed_group(settings: &OidcSettings, claims: &Map<String, Value>) -> bool {
    let groups: Vec<&str> = match claims.get(&settings.groups_claim) {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        Some(Value::String(one)) => vec![one.as_str()],
        _ => Vec::new(),
    };
    groups
        .iter()
        .any(|g| settings.allowed_groups.iter().any(|a| a == g))
}

/// A claim's value as text: a non-empty string, or a number.
fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://id.acme.test";

    fn settings() -> OidcSettings {
        let mut s = OidcSettings::new(ISSUER, "threadgate");
        s.allowed_email_domains = vec!["acme.test".into()];
        s.allowed_subjects = vec!["contractor-7".into()];
        s.allowed_groups = vec!["support-leads".into()];
        s
    }

    fn check(claims: Value, expected: Result<&str, Refusal>) {
        let Value::Object(claims) = claims else {
            panic!("claims are an object")
        };
        let got = judge(&settings(), ISSUER, &claims).map(|i| i.name);
        assert_eq!(got, expected.map(str::to_owned), "{claims:?}");
    }

    #[test]
    fn the_allow_list_lets_in_a_verified_domain_a_subject_or_a_group() {
        check(
            json!({"sub": "a1", "email": "alice@ACME.test", "email_verified": true}),
            Ok("alice@ACME.test"),
        );
        check(
            json!({"sub": "contractor-7", "email": "c@elsewhere.test", "email_verified": true}),
            Ok("c@elsewhere.test"),
        );
        check(
            json!({"sub": "l1", "email": "lee@elsewhere.test", "email_verified": true,
                "groups": ["x", "support-leads"]}),
            Ok("lee@elsewhere.test"),
        );
    }

    #[test]
    fn anyone_else_is_refused_by_name() {
        let not = |who: &str| Err(Refusal::NotAllowed(who.into()));
        // An unverified email never names a reviewer: not at an allowed domain, and
        // not for someone a group or their subject lets in, who could otherwise set a
        // colleague's address at the provider and decide under it.
        let unverified = |who: &str| Err(Refusal::UnverifiedEmail(who.into()));
        check(
            json!({"sub": "m1", "email": "mallory@acme.test", "email_verified": false}),
            unverified("mallory@acme.test"),
        );
        check(
            json!({"sub": "m2", "email": "mallory@acme.test"}),
            unverified("mallory@acme.test"),
        );
        check(
            json!({"sub": "l2", "email": "boss@acme.test", "groups": ["support-leads"]}),
            unverified("boss@acme.test"),
        );
        check(
            json!({"sub": "contractor-7", "email": "boss@acme.test", "email_verified": "true"}),
            unverified("boss@acme.test"),
        );
        // A domain that only ends like an allowed one.
        check(
            json!({"sub": "m3", "email": "m@evilacme.test", "email_verified": true}),
            not("m@evilacme.test"),
        );
        check(
            json!({"sub": "m4", "email": "m@x.test", "email_verified": true, "groups": ["support"]}),
            not("m@x.test"),
        );
        check(
            json!({"sub": "m5", "email_verified": true}),
            Err(Refusal::NoName("email".into())),
        );
        check(json!({"email": "a@acme.test"}), Err(Refusal::NoSubject));
    }

    #[test]
    fn the_subject_is_bound_to_the_issuer_and_the_name_to_the_configured_claim() {
        let mut s = settings();
        s.name_claim = "preferred_username".into();
        let Value::Object(claims) = json!({"sub": "a1", "preferred_username": "alice",
            "email": "alice@acme.test", "email_verified": true})
        else {
            panic!("object")
        };
        let got = judge(&s, ISSUER, &claims).expect("allowed");
        assert_eq!(
            got,
            Identity {
                subject: format!("{ISSUER} a1"),
                name: "alice".into()
            }
        );
    }
}
