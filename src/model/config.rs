//! The `[model]` table of the settings: which upstream the proxy forwards to, which
//! models it may forward, where its key is stored, and how it retries.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which wire format the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Provider {
    /// OpenAI chat completions (also vLLM, llama.cpp's server, Ollama, LiteLLM,
    /// OpenRouter): `POST {base_url}/chat/completions` with a bearer key.
    Openai,
    /// Anthropic Messages: `POST {base_url}/v1/messages` with `x-api-key`.
    Anthropic,
    /// threadgate's scripted model server (`threadgate scripted-model`), spoken to in
    /// the OpenAI format; no key needed. Not a real model.
    Scripted,
}

impl Provider {
    /// The name used in config and audit rows.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `[model]`: the model proxy's upstream and its limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    pub provider: Provider,
    /// For `openai`/`scripted` the API root that `/chat/completions` is appended to
    /// (`https://api.openai.com/v1`); for `anthropic` the host root
    /// (`https://api.anthropic.com`).
    pub base_url: String,
    /// The models an agent file may name; anything else is refused at start.
    pub allowed: Vec<String>,
    /// The name of the stored secret holding the upstream's key (never given to a
    /// container). Optional for `scripted`.
    pub key_secret: String,
    /// One upstream attempt's timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Retries after a timeout, a 429 or a 5xx.
    pub retries: u32,
    /// The first backoff; doubled after each retry.
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    /// The longest single wait between attempts (a larger `Retry-After` is cut to it).
    #[serde(with = "humantime_serde")]
    pub max_retry_wait: Duration,
    /// The longest one model call may take, its attempts and waits included: no retry
    /// starts (nor waits) past it, whatever `Retry-After` asks.
    #[serde(with = "humantime_serde")]
    pub retry_deadline: Duration,
    /// `anthropic-version` header.
    pub anthropic_version: String,
    /// `max_tokens` sent to Anthropic when the runner gives none.
    pub default_max_tokens: u32,
    /// The largest request body the socket accepts for a model call.
    pub max_request_bytes: usize,
    /// Model calls of one session that may wait while one of its calls runs (calls of
    /// a session run one at a time); one more is refused with 429 `too_many_calls`.
    /// A waiting call holds only its raw body, parsed once its turn comes.
    pub max_queued_calls: usize,
    /// The most request bytes one token is taken to cover when a call's size is
    /// checked against the session's remaining token budget before it is sent: a
    /// request of N bytes counts as at least N / `bytes_per_token` tokens. Tokenizers
    /// cover about 3 to 4 bytes of English or JSON per token, so 8 errs on the side of
    /// letting a call through.
    pub bytes_per_token: u64,
    /// The largest upstream answer read.
    pub max_answer_bytes: usize,
    /// The largest transcript a session may store (413 above).
    pub transcript_max_bytes: usize,
    /// A transcript not written for this long is deleted (checked at start and hourly);
    /// a session resumed after that starts a new conversation.
    #[serde(with = "humantime_serde")]
    pub transcript_retention: Duration,
}

impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            provider: Provider::Scripted,
            base_url: "http://127.0.0.1:8090/v1".into(),
            allowed: vec![super::scripted::MODEL_ID.into()],
            key_secret: "model_api_key".into(),
            timeout: Duration::from_secs(120),
            retries: 3,
            retry_base: Duration::from_millis(500),
            max_retry_wait: Duration::from_secs(30),
            retry_deadline: Duration::from_secs(300),
            anthropic_version: "2023-06-01".into(),
            default_max_tokens: 4096,
            max_request_bytes: 4 * 1024 * 1024,
            max_queued_calls: 2,
            bytes_per_token: 8,
            max_answer_bytes: 4 * 1024 * 1024,
            transcript_max_bytes: 2 * 1024 * 1024,
            transcript_retention: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl ModelSettings {
    /// Whether an agent may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.allowed.iter().any(|m| m == model)
    }
}

impl crate::session::AllowedModels for ModelSettings {
    fn allowed_models(&self) -> &[String] {
        &self.allowed
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    #[test]
    fn the_model_table_parses_and_refuses_unknown_keys() {
        let text = "[model]\nprovider = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\n\
                    allowed = [\"claude-x\"]\ntimeout = \"30s\"\nretries = 2\n\
                    retry_deadline = \"2m\"\nmax_queued_calls = 1\nbytes_per_token = 6\n\
                    transcript_retention = \"7d\"\n";
        let s: Settings = toml::from_str(text).expect("parses");
        assert_eq!(s.model.provider, super::Provider::Anthropic);
        assert!(s.model.allows("claude-x") && !s.model.allows("scripted-model"));
        assert_eq!(s.model.timeout, std::time::Duration::from_secs(30));
        assert_eq!(s.model.retry_deadline, std::time::Duration::from_secs(120));
        assert_eq!((s.model.max_queued_calls, s.model.bytes_per_token), (1, 6));
        assert_eq!(
            s.model.transcript_retention,
            std::time::Duration::from_secs(7 * 24 * 3600)
        );
        let err = toml::from_str::<Settings>("[model]\nprovder = \"openai\"\n").expect_err("typo");
        assert!(err.to_string().contains("provder"), "{err}");
        let err =
            toml::from_str::<Settings>("[model]\nprovider = \"gemini\"\n").expect_err("unknown");
        assert!(err.to_string().contains("gemini"), "{err}");
    }
}
