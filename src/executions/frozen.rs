//! What freezes a call: the binding hash an approval is tied to, and the arguments as a
//! person or the audit may see them.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::secrets::Redactor;

/// Arguments as a person or the audit sees them: stored secrets replaced, and values of
/// credential-like keys masked.
pub fn redact_args(redactor: &Redactor, args: &Value) -> Value {
    let mut copy = args.clone();
    mask_credential_keys(&mut copy);
    redactor.redact_json(&mut copy);
    copy
}

fn mask_credential_keys(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, item) in map.iter_mut() {
                let key = k.to_ascii_lowercase();
                let sensitive = [
                    "secret",
                    "token",
                    "password",
                    "api_key",
                    "apikey",
                    "authorization",
                    "cvc",
                    "card_number",
                ]
                .iter()
                .any(|needle| key.contains(needle));
                if sensitive {
                    *item = Value::String("[redacted]".into());
                } else {
                    mask_credential_keys(item);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_credential_keys),
        _ => {}
    }
}

/// Binds an approval to one exact request: tool, canonical arguments, account, session.
pub fn binding_hash(tool: &str, canonical_args: &str, account: &str, session_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [tool, canonical_args, account, session_id] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// A fresh execution id (time-ordered).
pub fn new_execution_id() -> String {
    format!("ex_{}", uuid::Uuid::now_v7().simple())
}
