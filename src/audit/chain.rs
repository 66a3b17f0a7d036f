//! The hash that chains audit rows: SHA-256 over the previous hash and a canonical,
//! unambiguous encoding of the row's fields.

use sha2::{Digest as _, Sha256};

use super::AuditRecordRow;

/// The `prev_hash` of the first row.
pub(super) const GENESIS: [u8; 32] = [0; 32];

/// Separates this encoding from any other use of SHA-256; bump the version if the
/// encoding changes.
const DOMAIN: &[u8] = b"threadgate audit v1\0";

/// `SHA-256(prev_hash || DOMAIN || fields)`, each field in column order: an absent value
/// is `0x00`; text is `0x01`, its length as a big-endian u64, then its bytes; an integer
/// is `0x02` and its big-endian i64. `row.hash` is not read.
pub(super) fn row_hash(row: &AuditRecordRow) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&row.prev_hash);
    h.update(DOMAIN);
    int(&mut h, Some(row.id));
    int(&mut h, Some(row.at_ms));
    text(&mut h, row.execution_id.as_deref());
    text(&mut h, Some(&row.event));
    for field in [
        &row.session_id,
        &row.thread_id,
        &row.agent,
        &row.tool,
        &row.args_redacted,
        &row.decision,
        &row.rule,
        &row.policy_hash,
        &row.reviewer,
        &row.outcome,
    ] {
        text(&mut h, field.as_deref());
    }
    int(&mut h, row.duration_ms);
    h.finalize().into()
}

fn text(h: &mut Sha256, value: Option<&str>) {
    match value {
        None => h.update([0u8]),
        Some(s) => {
            h.update([1u8]);
            h.update((s.len() as u64).to_be_bytes());
            h.update(s.as_bytes());
        }
    }
}

fn int(h: &mut Sha256, value: Option<i64>) {
    match value {
        None => h.update([0u8]),
        Some(n) => {
            h.update([2u8]);
            h.update(n.to_be_bytes());
        }
    }
}
