//! ID tokens the browser cannot forge in the browser tests: signed here with a test-only
//! key, verified by [`verified_claims`] as the callback verifies the provider's.

use chrono::{Duration, Utc};
use openidconnect::core::{CoreIdTokenVerifier, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey};
use openidconnect::{
    Audience, ClientId, ClientSecret, EndUserEmail, IdTokenClaims, IssuerUrl, JsonWebKeyId,
    JsonWebKeySet, Nonce, PrivateSigningKey as _, StandardClaims, SubjectIdentifier,
};

use super::*;

/// A key made for these tests only (`openssl genrsa -traditional 2048`); it signs
/// nothing but the tokens below.
const TEST_KEY: &str = include_str!("../../../tests/fixtures/oidc-test-only-rsa-key.pem");
const ISSUER: &str = "https://id.acme.test";
const CLIENT: &str = "threadgate";

fn key() -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(TEST_KEY, Some(JsonWebKeyId::new("k1".into())))
        .expect("the test key reads")
}

/// A token signed with the test key for `audience`, with `nonce`, expiring in `ttl`.
fn token(audience: &str, nonce: &str, ttl: Duration) -> IdToken {
    let mut standard = StandardClaims::new(SubjectIdentifier::new("alice-1".into()));
    standard = standard.set_email(Some(EndUserEmail::new("alice@acme.test".into())));
    let mut extra = Map::new();
    extra.insert("groups".into(), serde_json::json!(["support-leads"]));
    let claims = IdTokenClaims::new(
        IssuerUrl::new(ISSUER.into()).expect("issuer"),
        vec![Audience::new(audience.into())],
        Utc::now() + ttl,
        Utc::now(),
        standard,
        ProviderClaims(extra),
    )
    .set_nonce(Some(Nonce::new(nonce.into())));
    IdToken::new(
        claims,
        &key(),
        CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
        None,
        None,
    )
    .expect("signed")
}

/// The verifier the client builds from the provider's metadata: this client, this
/// issuer, the provider's keys.
fn verifier(keys: Vec<CoreJsonWebKey>) -> CoreIdTokenVerifier<'static> {
    CoreIdTokenVerifier::new_confidential_client(
        ClientId::new(CLIENT.into()),
        ClientSecret::new("unused-for-rs256".into()),
        IssuerUrl::new(ISSUER.into()).expect("issuer"),
        JsonWebKeySet::new(keys),
    )
}

fn provider_keys() -> Vec<CoreJsonWebKey> {
    vec![key().as_verification_key()]
}

#[test]
fn a_token_for_this_client_with_its_nonce_gives_its_claims() {
    let claims = verified_claims(
        &verifier(provider_keys()),
        &token(CLIENT, "n-1", Duration::minutes(5)),
        &Nonce::new("n-1".into()),
    )
    .expect("verified");
    assert_eq!(claims["sub"], "alice-1");
    assert_eq!(claims["email"], "alice@acme.test");
    assert_eq!(claims["groups"], serde_json::json!(["support-leads"]));
}

#[test]
fn a_token_for_another_audience_is_refused() {
    let got = verified_claims(
        &verifier(provider_keys()),
        &token("another-app", "n-1", Duration::minutes(5)),
        &Nonce::new("n-1".into()),
    );
    let err = got.expect_err("another audience").to_string();
    assert!(err.contains("audience"), "{err}");
}

#[test]
fn a_token_with_another_nonce_is_refused() {
    let got = verified_claims(
        &verifier(provider_keys()),
        &token(CLIENT, "n-of-another-sign-in", Duration::minutes(5)),
        &Nonce::new("n-1".into()),
    );
    let err = got.expect_err("wrong nonce").to_string();
    assert!(err.contains("nonce"), "{err}");
}

#[test]
fn an_expired_token_or_one_signed_by_another_key_is_refused() {
    let expired = verified_claims(
        &verifier(provider_keys()),
        &token(CLIENT, "n-1", Duration::minutes(-5)),
        &Nonce::new("n-1".into()),
    );
    let err = expired.expect_err("expired").to_string();
    assert!(err.to_lowercase().contains("expired"), "{err}");
    // The provider publishes no key of this token's signer.
    let unknown = verified_claims(
        &verifier(Vec::new()),
        &token(CLIENT, "n-1", Duration::minutes(5)),
        &Nonce::new("n-1".into()),
    );
    assert!(unknown.is_err(), "a token no published key signed verified");
}
