//! The schema, as an ordered list of migrations applied once each at open.
//!
//! Each migration is written twice, once per dialect, with the same number and the same
//! schema (`migrations/NNNN_*.sql` for SQLite, `migrations/postgres/NNNN_*.sql` with
//! `BIGINT` for `INTEGER` and `BYTEA` for `BLOB`). SQLite's `PRAGMA user_version` and
//! Postgres' `threadgate_schema` table record how many have been applied. Append new
//! migrations; never edit one that has shipped.

use rusqlite::Connection;

use super::StoreError;

/// One step of the schema.
struct Migration {
    name: &'static str,
    sql: &'static str,
    postgres: &'static str,
}

/// Every migration in order. A domain module that needs tables adds a file here.
const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "0001_meta",
        sql: include_str!("migrations/0001_meta.sql"),
        postgres: include_str!("migrations/postgres/0001_meta.sql"),
    },
    Migration {
        name: "0002_events",
        sql: include_str!("migrations/0002_events.sql"),
        postgres: include_str!("migrations/postgres/0002_events.sql"),
    },
    Migration {
        name: "0003_secrets",
        sql: include_str!("migrations/0003_secrets.sql"),
        postgres: include_str!("migrations/postgres/0003_secrets.sql"),
    },
    Migration {
        name: "0004_audit",
        sql: include_str!("migrations/0004_audit.sql"),
        postgres: include_str!("migrations/postgres/0004_audit.sql"),
    },
    Migration {
        name: "0005_reviewers",
        sql: include_str!("migrations/0005_reviewers.sql"),
        postgres: include_str!("migrations/postgres/0005_reviewers.sql"),
    },
    Migration {
        name: "0006_sessions",
        sql: include_str!("migrations/0006_sessions.sql"),
        postgres: include_str!("migrations/postgres/0006_sessions.sql"),
    },
    Migration {
        name: "0007_executions",
        sql: include_str!("migrations/0007_executions.sql"),
        postgres: include_str!("migrations/postgres/0007_executions.sql"),
    },
    Migration {
        name: "0008_model",
        sql: include_str!("migrations/0008_model.sql"),
        postgres: include_str!("migrations/postgres/0008_model.sql"),
    },
    Migration {
        name: "0009_review",
        sql: include_str!("migrations/0009_review.sql"),
        postgres: include_str!("migrations/postgres/0009_review.sql"),
    },
    Migration {
        name: "0010_thread_events",
        sql: include_str!("migrations/0010_thread_events.sql"),
        postgres: include_str!("migrations/postgres/0010_thread_events.sql"),
    },
    Migration {
        name: "0011_oidc",
        sql: include_str!("migrations/0011_oidc.sql"),
        postgres: include_str!("migrations/postgres/0011_oidc.sql"),
    },
    Migration {
        name: "0012_oidc_sealed",
        sql: include_str!("migrations/0012_oidc_sealed.sql"),
        postgres: include_str!("migrations/postgres/0012_oidc_sealed.sql"),
    },
    Migration {
        name: "0013_mcp_redeemed",
        sql: include_str!("migrations/0013_mcp_redeemed.sql"),
        postgres: include_str!("migrations/postgres/0013_mcp_redeemed.sql"),
    },
    Migration {
        name: "0014_leases",
        sql: include_str!("migrations/0014_leases.sql"),
        postgres: include_str!("migrations/postgres/0014_leases.sql"),
    },
    Migration {
        name: "0015_execution_runner",
        sql: include_str!("migrations/0015_execution_runner.sql"),
        postgres: include_str!("migrations/postgres/0015_execution_runner.sql"),
    },
    Migration {
        name: "0016_auth_failures",
        sql: include_str!("migrations/0016_auth_failures.sql"),
        postgres: include_str!("migrations/postgres/0016_auth_failures.sql"),
    },
    Migration {
        name: "0017_label_claims",
        sql: include_str!("migrations/0017_label_claims.sql"),
        postgres: include_str!("migrations/postgres/0017_label_claims.sql"),
    },
    Migration {
        name: "0018_relay_addr",
        sql: include_str!("migrations/0018_relay_addr.sql"),
        postgres: include_str!("migrations/postgres/0018_relay_addr.sql"),
    },
    Migration {
        name: "0019_audit_pending",
        sql: include_str!("migrations/0019_audit_pending.sql"),
        postgres: include_str!("migrations/postgres/0019_audit_pending.sql"),
    },
];

/// Applies every migration newer than the database's `user_version`, each in its own
/// transaction together with the version bump.
pub(super) fn apply(conn: &mut Connection) -> Result<(), StoreError> {
    let version = conn
        .pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0))
        .map_err(|e| StoreError::Sql(e.into()))?;
    // A version this binary does not know is never "nothing applied": a newer binary
    // wrote it, and running the old code on the new schema could lose data.
    let current = usize::try_from(version)
        .ok()
        .filter(|v| *v <= MIGRATIONS.len())
        .ok_or(StoreError::SchemaNewer {
            found: version,
            known: MIGRATIONS.len(),
        })?;
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
        let fail = |source: rusqlite::Error| StoreError::Migration {
            name: migration.name,
            source: source.into(),
        };
        let tx = conn.transaction().map_err(fail)?;
        tx.execute_batch(migration.sql).map_err(fail)?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}

/// The advisory lock key held while migrations run ("threadgt" in ASCII).
const MIGRATION_LOCK: i64 = 0x7468_7265_6164_6774;

/// Applies every Postgres migration newer than the recorded version, under an advisory
/// lock so that instances starting at once apply each migration once. `shown` is the
/// database's URL without its password.
pub(super) fn apply_postgres(client: &mut postgres::Client, shown: &str) -> Result<(), StoreError> {
    let setup = |e: postgres::Error| StoreError::Connect {
        url: shown.to_owned(),
        reason: format!(
            "cannot read the schema version: {}",
            super::sql::SqlError::Postgres(e)
        ),
    };
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .map_err(setup)?;
    let result = apply_postgres_locked(client, shown);
    // The lock goes with the session too; unlocking keeps a pooled connection clean.
    let _ = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
    result
}

fn apply_postgres_locked(client: &mut postgres::Client, shown: &str) -> Result<(), StoreError> {
    let setup = |e: postgres::Error| StoreError::Connect {
        url: shown.to_owned(),
        reason: format!(
            "cannot read the schema version: {}",
            super::sql::SqlError::Postgres(e)
        ),
    };
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS threadgate_schema (\
                 id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL); \
             INSERT INTO threadgate_schema (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING",
        )
        .map_err(setup)?;
    let version: i64 = client
        .query_one("SELECT version FROM threadgate_schema WHERE id = 1", &[])
        .and_then(|row| row.try_get(0))
        .map_err(setup)?;
    let current = usize::try_from(version)
        .ok()
        .filter(|v| *v <= MIGRATIONS.len())
        .ok_or(StoreError::SchemaNewer {
            found: version,
            known: MIGRATIONS.len(),
        })?;
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
        let fail = |e: postgres::Error| StoreError::Migration {
            name: migration.name,
            source: super::sql::SqlError::Postgres(e),
        };
        let mut tx = client.transaction().map_err(fail)?;
        tx.batch_execute(migration.postgres).map_err(fail)?;
        let applied = i64::try_from(index + 1).unwrap_or(i64::MAX);
        tx.execute(
            "UPDATE threadgate_schema SET version = $1 WHERE id = 1",
            &[&applied],
        )
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}
