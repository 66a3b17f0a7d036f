//! The schema, as an ordered list of migrations applied once each at open.
//!
//! `PRAGMA user_version` records how many have been applied. Append new migrations;
//! never edit one that has shipped.

use rusqlite::Connection;

use super::StoreError;

/// One step of the schema.
struct Migration {
    name: &'static str,
    sql: &'static str,
}

/// Every migration in order. A domain module that needs tables adds a file here.
const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "0001_meta",
        sql: include_str!("migrations/0001_meta.sql"),
    },
    Migration {
        name: "0002_events",
        sql: include_str!("migrations/0002_events.sql"),
    },
    Migration {
        name: "0003_secrets",
        sql: include_str!("migrations/0003_secrets.sql"),
    },
    Migration {
        name: "0004_audit",
        sql: include_str!("migrations/0004_audit.sql"),
    },
    Migration {
        name: "0005_reviewers",
        sql: include_str!("migrations/0005_reviewers.sql"),
    },
    Migration {
        name: "0006_sessions",
        sql: include_str!("migrations/0006_sessions.sql"),
    },
    Migration {
        name: "0007_executions",
        sql: include_str!("migrations/0007_executions.sql"),
    },
    Migration {
        name: "0008_model",
        sql: include_str!("migrations/0008_model.sql"),
    },
    Migration {
        name: "0009_review",
        sql: include_str!("migrations/0009_review.sql"),
    },
    Migration {
        name: "0010_thread_events",
        sql: include_str!("migrations/0010_thread_events.sql"),
    },
    Migration {
        name: "0011_oidc",
        sql: include_str!("migrations/0011_oidc.sql"),
    },
    Migration {
        name: "0012_oidc_sealed",
        sql: include_str!("migrations/0012_oidc_sealed.sql"),
    },
    Migration {
        name: "0013_mcp_redeemed",
        sql: include_str!("migrations/0013_mcp_redeemed.sql"),
    },
    Migration {
        name: "0014_leases",
        sql: include_str!("migrations/0014_leases.sql"),
    },
];

/// Applies every migration newer than the database's `user_version`, each in its own
/// transaction together with the version bump.
pub(super) fn apply(conn: &mut Connection) -> Result<(), StoreError> {
    let version = conn
        .pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0))
        .map_err(StoreError::Sql)?;
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
        let fail = |source| StoreError::Migration {
            name: migration.name,
            source,
        };
        let tx = conn.transaction().map_err(fail)?;
        tx.execute_batch(migration.sql).map_err(fail)?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}
