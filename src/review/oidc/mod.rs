//! Reviewer sign-in through the team's OpenID provider: the authorization code flow
//! with PKCE (`openidconnect`), beside the password sign-in.
//!
//! At start the provider's discovery document and keys are fetched ([`Oidc::discover`];
//! a setting that is wrong, a provider that cannot be reached or a client secret that
//! is not stored stops the start with an error naming the key). `GET /login/oidc`
//! seals a fresh state, nonce and PKCE verifier into the browser's HttpOnly cookie
//! ([`sealed`]: ten minutes, under a key derived from the master key, nothing kept on
//! the server, so any instance finishes what another started) and sends the browser to
//! the provider; `GET /login/oidc/callback` opens them (its `state` must be the sealed
//! one), exchanges the code with the
//! verifier, verifies the ID token (signature by the provider's keys, issuer, audience,
//! expiry, nonce, and the access token's hash when present; a token signed by a key not
//! yet known makes the server fetch the keys again, at most once per
//! [`REFRESH_EVERY`]), checks the person against
//! the team's allow-list ([`identity`]) and opens the same session (cookie and CSRF
//! token) a password sign-in opens. The reviewer's name in decisions and the audit is
//! the configured claim's value ([`crate::reviewers::provider`]).

pub mod http;
pub mod identity;
mod routes;
pub mod sealed;
pub mod settings;

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
    CoreRevocableToken, CoreRevocationErrorResponse, CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AccessTokenHash, AdditionalClaims, AuthorizationCode, ClientId, ClientSecret,
    EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenVerifier,
    IssuerUrl, Nonce, OAuth2TokenResponse as _, PkceCodeVerifier, RedirectUrl,
    StandardErrorResponse, StandardTokenResponse, TokenResponse as _,
};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openidconnect::ClaimsVerificationError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use routes::{begin, finish};
pub use settings::{OidcSettings, ReviewSettings};

use crate::secrets::{ExposeSecret as _, SealingKey, SecretString};
use http::ProviderHttp;
use sealed::CookieSealer;

/// The path the provider sends the browser back to, under the public URL.
pub const CALLBACK_PATH: &str = "/login/oidc/callback";

/// The claims of an ID token beyond the standard ones (groups, a provider's own).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProviderClaims(pub Map<String, Value>);

impl AdditionalClaims for ProviderClaims {}

/// An ID token with the provider's own claims kept.
pub type IdToken = openidconnect::IdToken<
    ProviderClaims,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

type IdTokenFields = openidconnect::IdTokenFields<
    ProviderClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

type Client = openidconnect::Client<
    ProviderClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    StandardTokenResponse<IdTokenFields, CoreTokenType>,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// A setting that stops the start, with the key it is about.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct OidcSetupError {
    /// `review.oidc.<key>`, or `public_url`.
    pub key: String,
    pub message: String,
}

fn setup_error(key: &str, message: impl std::fmt::Display) -> OidcSetupError {
    OidcSetupError {
        key: key.to_owned(),
        message: message.to_string(),
    }
}

/// Why a provider's answer to a sign-in was not accepted (logged; the person is told
/// only that it did not verify).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the token request failed: {0}")]
    Exchange(String),
    #[error("the provider sent no ID token")]
    NoIdToken,
    #[error("the ID token did not verify: {0}")]
    Claims(#[from] openidconnect::ClaimsVerificationError),
    #[error("the access token does not match the ID token's at_hash")]
    AccessTokenHash,
    #[error("the ID token's claims cannot be read: {0}")]
    Unreadable(String),
}

/// The shortest time between two fetches of the provider's keys (after an ID token
/// signed by a key the server does not have yet: the provider rotated its keys).
pub const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// The team's provider, discovered.
pub struct Oidc {
    settings: OidcSettings,
    issuer: String,
    parts: ClientParts,
    client: RwLock<Arc<Client>>,
    last_refresh: Mutex<Option<Instant>>,
    http: ProviderHttp,
    /// Seals started sign-ins into the browser's cookie.
    cookies: CookieSealer,
}

impl Oidc {
    /// Checks `settings`, fetches the provider's discovery document and keys, and makes
    /// the client whose redirect URL is `<public_url>/login/oidc/callback`. Started
    /// sign-ins are sealed under `cookie_key` (derived from the master key with
    /// [`crate::secrets::SealPurpose::OidcSignIn`]).
    pub async fn discover(
        settings: &OidcSettings,
        public_url: &str,
        client_secret: SecretString,
        cookie_key: SealingKey,
    ) -> Result<Oidc, OidcSetupError> {
        if let Some(problem) = settings.problem() {
            return Err(setup_error("review.oidc", problem));
        }
        let issuer_url = IssuerUrl::new(settings.issuer_url.trim().to_owned())
            .map_err(|e| setup_error("review.oidc.issuer_url", e))?;
        let redirect = RedirectUrl::new(format!(
            "{}{CALLBACK_PATH}",
            public_url.trim().trim_end_matches('/')
        ))
        .map_err(|e| setup_error("public_url", e))?;
        let http = ProviderHttp::new().map_err(|e| setup_error("review.oidc", e))?;
        let secret = ClientSecret::new(client_secret.expose_secret().to_owned());
        let parts = ClientParts {
            issuer_url: issuer_url.clone(),
            client_id: ClientId::new(settings.client_id.trim().to_owned()),
            secret,
            redirect,
        };
        let client = fetch_client(&http, &parts).await.map_err(|e| {
            setup_error(
                "review.oidc.issuer_url",
                format!("cannot read the provider's discovery document or keys: {e}"),
            )
        })?;
        Ok(Oidc {
            settings: settings.clone(),
            issuer: issuer_url.as_str().to_owned(),
            parts,
            client: RwLock::new(Arc::new(client)),
            last_refresh: Mutex::new(None),
            http,
            cookies: CookieSealer::new(cookie_key),
        })
    }

    /// The current client.
    fn client(&self) -> Arc<Client> {
        match self.client.read() {
            Ok(client) => client.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Fetches the provider's keys again, at most once per [`REFRESH_EVERY`]; whether
    /// the client changed.
    async fn refresh(&self) -> bool {
        {
            let mut last = match self.last_refresh.lock() {
                Ok(last) => last,
                Err(poisoned) => poisoned.into_inner(),
            };
            if last.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match fetch_client(&self.http, &self.parts).await {
            Ok(client) => {
                let mut current = match self.client.write() {
                    Ok(current) => current,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *current = Arc::new(client);
                tracing::info!("the identity provider's keys were fetched again");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fetch the identity provider's keys again");
                false
            }
        }
    }

    /// What the sign-in button calls the provider.
    pub fn label(&self) -> &str {
        &self.settings.label
    }

    /// Exchanges `code` with the PKCE `verifier` and returns the verified ID token's
    /// claims (standard and the provider's own) as JSON; the token must carry `nonce`.
    /// A token signed by a key the server does not have makes it fetch the provider's
    /// keys once more ([`REFRESH_EVERY`]) and verify again.
    async fn redeem(
        &self,
        code: String,
        verifier: String,
        nonce: String,
    ) -> Result<Map<String, Value>, VerifyError> {
        let client = self.client();
        let request = client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| VerifyError::Exchange(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(verifier));
        let answer = request
            .request_async(&self.http.caller())
            .await
            .map_err(|e| VerifyError::Exchange(e.to_string()))?;
        match verify_answer(&client, &answer, &nonce) {
            Err(VerifyError::Claims(ClaimsVerificationError::SignatureVerification(_)))
                if self.refresh().await =>
            {
                verify_answer(&self.client(), &answer, &nonce)
            }
            verified => verified,
        }
    }
}

type TokenAnswer = StandardTokenResponse<IdTokenFields, CoreTokenType>;

/// The claims of the answer's ID token, verified by `client` (and its access token
/// against `at_hash`).
fn verify_answer(
    client: &Client,
    answer: &TokenAnswer,
    nonce: &str,
) -> Result<Map<String, Value>, VerifyError> {
    let id_token = answer.id_token().ok_or(VerifyError::NoIdToken)?;
    let verifier = client.id_token_verifier();
    let claims = verified_claims(&verifier, id_token, &Nonce::new(nonce.to_owned()))?;
    check_access_token(&verifier, id_token, answer.access_token())?;
    Ok(claims)
}

/// What a client is made of besides the provider's metadata.
struct ClientParts {
    issuer_url: IssuerUrl,
    client_id: ClientId,
    secret: ClientSecret,
    redirect: RedirectUrl,
}

/// A client made from the provider's discovery document and keys as they are now.
async fn fetch_client(http: &ProviderHttp, parts: &ClientParts) -> Result<Client, String> {
    let metadata = CoreProviderMetadata::discover_async(parts.issuer_url.clone(), &http.caller())
        .await
        .map_err(|e| e.to_string())?;
    Ok(Client::from_provider_metadata(
        metadata,
        parts.client_id.clone(),
        Some(parts.secret.clone()),
    )
    .set_redirect_uri(parts.redirect.clone()))
}

/// The claims of `id_token` once its signature (the provider's keys), issuer, audience
/// (this client), expiry and `nonce` are verified; an error otherwise.
pub fn verified_claims(
    verifier: &IdTokenVerifier<'_, CoreJsonWebKey>,
    id_token: &IdToken,
    nonce: &Nonce,
) -> Result<Map<String, Value>, VerifyError> {
    let claims = id_token.claims(verifier, nonce)?;
    match serde_json::to_value(claims) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(VerifyError::Unreadable("not an object".into())),
        Err(e) => Err(VerifyError::Unreadable(e.to_string())),
    }
}

/// When the ID token carries `at_hash`, the access token must be the one it was issued
/// with.
fn check_access_token(
    verifier: &IdTokenVerifier<'_, CoreJsonWebKey>,
    id_token: &IdToken,
    access_token: &openidconnect::AccessToken,
) -> Result<(), VerifyError> {
    let claims = id_token.claims(verifier, |_: Option<&Nonce>| Ok(()))?;
    let Some(expected) = claims.access_token_hash() else {
        return Ok(());
    };
    let unreadable = |e: &dyn std::fmt::Display| VerifyError::Unreadable(e.to_string());
    let alg = id_token.signing_alg().map_err(|e| unreadable(&e))?;
    let key = id_token.signing_key(verifier).map_err(|e| unreadable(&e))?;
    let actual = AccessTokenHash::from_token(access_token, alg, key).map_err(|e| unreadable(&e))?;
    if actual == *expected {
        Ok(())
    } else {
        Err(VerifyError::AccessTokenHash)
    }
}

#[cfg(test)]
mod tests;
