//! What checking a `Stripe-Signature` costs (issue 17 item 1): the flood's header of
//! 6,000 `v1` entries over a 1 MiB body, refused by the length limit and, with that
//! limit raised, by the entry limit; and a genuine delivery of 1 MiB (its one MAC).
//! Before the fix the flood's header cost one HMAC of the body per entry.

#![expect(
    clippy::unwrap_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use threadgate::connectors::stripe::events::{SignatureLimits, sign, verify};

const SECRET: &[u8] = b"whsec_bench_secret";
const NOW: i64 = 1_700_000_000;

fn bench(c: &mut Criterion) {
    let body = vec![b'x'; 1 << 20];
    let flood = format!("t={NOW}{}", format!(",v1={}", "ab".repeat(32)).repeat(6000));
    let genuine = sign(&body, SECRET, NOW);
    let limits = SignatureLimits::default();
    let long_headers_allowed = SignatureLimits {
        max_bytes: 1 << 20,
        ..limits
    };
    let mut group = c.benchmark_group("stripe_signature");
    group.bench_function("flood_refused_by_max_bytes", |b| {
        b.iter(|| verify(Some(black_box(&flood)), &body, SECRET, NOW, limits).unwrap_err())
    });
    group.bench_function("flood_refused_by_max_entries", |b| {
        b.iter(|| {
            verify(
                Some(black_box(&flood)),
                &body,
                SECRET,
                NOW,
                long_headers_allowed,
            )
            .unwrap_err()
        })
    });
    group.bench_function("genuine_1mib_delivery", |b| {
        b.iter(|| verify(Some(black_box(&genuine)), &body, SECRET, NOW, limits).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
