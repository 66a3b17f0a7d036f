//! What one reviewer credential check costs: an API token (SHA-256 digest and a
//! constant-time comparison, issue 7 item 5), a made-up token for an unknown id, and a
//! sign-in password (argon2id through the bounded pool), each including its database
//! read.

#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

use std::hint::black_box;
use threadgate::secrets::ExposeSecret as _;

use criterion::{Criterion, criterion_group, criterion_main};
use threadgate::approvals::hasher::Hasher;
use threadgate::approvals::reviewers;
use threadgate::secrets::SecretString;
use threadgate::store::Db;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("bench.db")).expect("db");
    let hasher = Hasher::new(2, 32);
    let password = "correct horse battery staple";
    let token = rt.block_on(async {
        let added = reviewers::add(&db, "alice").await.expect("add");
        reviewers::set_password(&db, &hasher, "alice", SecretString::from(password))
            .await
            .expect("password");
        added.token.expose_secret().to_owned()
    });
    let made_up = format!("tgr_999_{}", "A".repeat(43));
    let mut group = c.benchmark_group("reviewer_auth");
    group.bench_function("api_token_digest", |b| {
        b.iter(|| {
            rt.block_on(reviewers::authenticate_with(
                &db,
                &hasher,
                black_box(&token),
            ))
        })
    });
    group.bench_function("made_up_token_unknown_id", |b| {
        b.iter(|| {
            rt.block_on(reviewers::authenticate_with(
                &db,
                &hasher,
                black_box(&made_up),
            ))
        })
    });
    group.sample_size(10);
    group.bench_function("password_argon2id", |b| {
        b.iter(|| {
            rt.block_on(reviewers::verify_password(
                &db,
                &hasher,
                "alice",
                SecretString::from(password),
            ))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
