//! The secret scanner on a 4 KiB argument blob against 20 stored secrets: the common
//! miss, a hit at the end, a blob with URL escapes (the decoded pass), redaction, and
//! building the automaton.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

use std::hint::black_box;
use threadgate::secrets::ExposeSecret as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use criterion::{Criterion, criterion_group, criterion_main};
use threadgate::secrets::{Redactor, SecretString};

/// 20 secrets shaped like real credentials, 24 to 62 bytes.
fn secrets() -> Vec<(String, SecretString)> {
    (0..20)
        .map(|i| {
            let body: String = (0..(24 + i * 2))
                .map(|j| {
                    let n = (i * 31 + j * 17 + 7) % 62;
                    (match n {
                        0..=9 => b'0' + n as u8,
                        10..=35 => b'a' + u8::try_from(n - 10).unwrap_or(0),
                        _ => b'A' + u8::try_from(n - 36).unwrap_or(0),
                    }) as char
                })
                .collect();
            (
                format!("secret_{i}"),
                SecretString::from(format!("sk_{body}")),
            )
        })
        .collect()
}

/// About 4 KiB of JSON arguments with no secret in them.
fn blob() -> String {
    let mut items = Vec::new();
    let mut i = 0;
    loop {
        items.push(format!(
            r#"{{"id":"ch_3MmlLrLkdIwHu7ix{i:04}","amount":{},"currency":"usd","description":"Refund for order #{i} requested by customer via chat","metadata":{{"thread":"th_01HXYZ{i}"}}}}"#,
            1000 + i * 7
        ));
        let text = format!(
            r#"{{"charges":[{}],"reason":"duplicate"}}"#,
            items.join(",")
        );
        if text.len() >= 4096 {
            return text;
        }
        i += 1;
    }
}

fn bench(c: &mut Criterion) {
    let secrets = secrets();
    let redactor = Redactor::new(secrets.clone()).expect("redactor");
    let miss = blob();
    let last = secrets[19].1.expose_secret().to_owned();
    let hit = format!("{}{}", &miss[..miss.len() - 80], STANDARD.encode(&last));
    let escaped = miss.replace("Refund for", "Refund%20for");
    let json: serde_json::Value = serde_json::from_str(&miss).expect("json");
    eprintln!(
        "blob {} bytes, {} secrets, escaped blob {} bytes",
        miss.len(),
        redactor.names().len(),
        escaped.len()
    );

    let mut group = c.benchmark_group("redact_4KiB_20_secrets");
    group.bench_function("find_miss", |b| {
        b.iter(|| redactor.find(black_box(miss.as_bytes())))
    });
    group.bench_function("find_hit_base64_at_end", |b| {
        b.iter(|| redactor.find(black_box(hit.as_bytes())))
    });
    group.bench_function("find_miss_with_url_escapes", |b| {
        b.iter(|| redactor.find(black_box(escaped.as_bytes())))
    });
    group.bench_function("redact_miss", |b| {
        b.iter(|| redactor.redact(black_box(&miss)).len())
    });
    group.bench_function("redact_json_miss", |b| {
        b.iter(|| {
            let mut v = json.clone();
            redactor.redact_json(black_box(&mut v));
            v
        })
    });
    group.bench_function("build_automaton", |b| {
        b.iter(|| Redactor::new(black_box(secrets.clone())).expect("redactor"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
