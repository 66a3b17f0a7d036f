//! The encrypted secret store and its grants, in the `secrets` and `secret_grants`
//! tables (migration 0003).
//!
//! Values are sealed before they reach the writer thread and opened on the read pool,
//! so the database only ever sees ciphertext. Each operation is one async method, for
//! the server and the CLI alike.

use crate::secrets::ExposeSecret as _;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use crate::store::{Conn, OptionalExtension as _, params};
use chrono::{DateTime, Utc};

use super::cipher::{self, SCHEME_XCHACHA_V1};
use super::{MasterKey, Redactor, SecretString, SecretsError, validate_name};
use crate::store::Db;

/// The largest secret value accepted, in bytes.
pub const MAX_SECRET_LEN: usize = 64 * 1024;

/// What [`SecretStore::set`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The name was new.
    Created,
    /// The name existed; its value was replaced (grants are kept).
    Updated,
}

/// A stored secret as listed: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretMeta {
    /// The secret's name.
    pub name: String,
    /// When it was first set.
    pub created_at: DateTime<Utc>,
    /// When its value was last set.
    pub updated_at: DateTime<Utc>,
    /// The agents it is granted to, sorted.
    pub grants: Vec<String>,
}

/// Secrets encrypted at rest under the master key, granted by name to agents.
#[derive(Clone)]
pub struct SecretStore {
    db: Db,
    key: Arc<MasterKey>,
}

/// A domain result inside a database job: SQL errors roll the job back, domain errors
/// are answered after the (empty) job commits.
type Job<T> = crate::store::Result<Result<T, SecretsError>>;

/// Secrets with their values, by name.
type Values = Vec<(String, SecretString)>;

impl SecretStore {
    /// A store over `db`, sealing and opening values with `key`.
    pub fn new(db: Db, key: Arc<MasterKey>) -> SecretStore {
        SecretStore { db, key }
    }

    /// The key derived from the master key for `purpose` (the same on every instance
    /// with this master key).
    pub fn sealing_key(&self, purpose: super::SealPurpose) -> super::SealingKey {
        super::SealingKey::derive(&self.key, purpose)
    }

    /// The master key the store seals under: other uses derive keys of their own from
    /// it (HKDF with their own label), never use it as it is.
    pub(crate) fn master_key(&self) -> &MasterKey {
        &self.key
    }

    /// Stores `value` under `name`, replacing any earlier value with a fresh nonce.
    pub async fn set(&self, name: &str, value: SecretString) -> Result<Written, SecretsError> {
        let job = self.set_job(name, &value)?;
        self.db.write(job).await?
    }

    /// Every secret's name, times and grants, sorted by name; never values.
    pub async fn list(&self) -> Result<Vec<SecretMeta>, SecretsError> {
        Ok(self.db.read(list_meta).await?)
    }

    /// The value of `name`.
    pub async fn get(&self, name: &str) -> Result<SecretString, SecretsError> {
        let job = self.get_job(name)?;
        self.db.read(job).await?
    }

    /// Deletes `name` and its grants.
    pub async fn delete(&self, name: &str) -> Result<(), SecretsError> {
        let job = delete_job(name)?;
        self.db.write(job).await?
    }

    /// Grants `name` to `agent` (granting twice is not an error).
    pub async fn grant(&self, name: &str, agent: &str) -> Result<(), SecretsError> {
        let job = grant_job(name, agent)?;
        self.db.write(job).await?
    }

    /// Withdraws the grant of `name` to `agent`.
    pub async fn revoke(&self, name: &str, agent: &str) -> Result<(), SecretsError> {
        let job = revoke_job(name, agent)?;
        self.db.write(job).await?
    }

    /// The names granted to `agent`, sorted.
    pub async fn granted(&self, agent: &str) -> Result<Vec<String>, SecretsError> {
        validate_name("agent", agent)?;
        let agent = agent.to_owned();
        Ok(self.db.read(move |c| granted_names(c, &agent)).await?)
    }

    /// The values of the secrets `asked` for by `agent`, in the order asked (duplicates
    /// dropped). Fails with [`SecretsError::NotGranted`] naming every asked secret that
    /// is not granted to the agent; nothing is decrypted then.
    pub async fn resolve_for_agent(
        &self,
        agent: &str,
        asked: &[String],
    ) -> Result<Vec<(String, SecretString)>, SecretsError> {
        let job = self.resolve_job(agent, asked)?;
        self.db.read(job).await?
    }

    /// Every stored secret with its value, sorted by name: the input of the
    /// [`Redactor`].
    pub async fn all_values(&self) -> Result<Vec<(String, SecretString)>, SecretsError> {
        let key = Arc::clone(&self.key);
        self.db.read(move |c| all_values(c, &key)).await?
    }

    /// A counter that changes with every `set` or `delete` (from any process on the same
    /// database): caches of stored values compare it to know when to read again.
    ///
    /// Read on the calling thread: one indexed row on a pooled read connection takes
    /// microseconds, less than handing it to the blocking pool and back, and every
    /// gateway call asks several times.
    pub async fn generation(&self) -> Result<u64, SecretsError> {
        // One statement outside a transaction: one round trip on Postgres (a credential
        // checks it before every provider request).
        let rows = crate::store::meta::get_inline(&self.db, [GENERATION_KEY])?;
        Ok(parse_generation(rows.first().map(|(_, v)| v.as_str()))
            .map_err(crate::store::StoreError::from)?)
    }

    /// A [`Redactor`] over every stored value.
    pub async fn redactor(&self) -> Result<Redactor, SecretsError> {
        Redactor::new(self.all_values().await?)
    }

    fn set_job(
        &self,
        name: &str,
        value: &SecretString,
    ) -> Result<impl Fn(&Conn<'_>) -> Job<Written> + Send + 'static, SecretsError> {
        validate_name("secret", name)?;
        if value.expose_secret().is_empty() {
            return Err(SecretsError::Empty {
                name: name.to_owned(),
            });
        }
        if value.expose_secret().len() > MAX_SECRET_LEN {
            return Err(SecretsError::TooLarge {
                name: name.to_owned(),
                len: value.expose_secret().len(),
            });
        }
        let sealed = cipher::seal(&self.key, name, value)?;
        let name = name.to_owned();
        Ok(move |c: &Conn<'_>| {
            let now = now_ms();
            let existed = c
                .query_row("SELECT 1 FROM secrets WHERE name = ?1", [&name], |_| Ok(()))
                .optional()?
                .is_some();
            c.execute(
                "INSERT INTO secrets (name, scheme, nonce, ciphertext, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)
                 ON CONFLICT (name) DO UPDATE SET scheme = excluded.scheme,
                     nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                     updated_at = excluded.updated_at",
                params![
                    name,
                    SCHEME_XCHACHA_V1,
                    &sealed.nonce[..],
                    sealed.ciphertext,
                    now
                ],
            )?;
            bump_generation(c)?;
            Ok(Ok(if existed {
                Written::Updated
            } else {
                Written::Created
            }))
        })
    }

    fn get_job(
        &self,
        name: &str,
    ) -> Result<impl FnOnce(&Conn<'_>) -> Job<SecretString> + Send + 'static, SecretsError> {
        validate_name("secret", name)?;
        let key = Arc::clone(&self.key);
        let name = name.to_owned();
        Ok(move |c: &Conn<'_>| {
            let Some(row) = sealed_row(c, &name)? else {
                return Ok(Err(SecretsError::NotFound { name }));
            };
            Ok(row.open(&key, &name))
        })
    }

    fn resolve_job(
        &self,
        agent: &str,
        asked: &[String],
    ) -> Result<impl FnOnce(&Conn<'_>) -> Job<Values> + Send + 'static, SecretsError> {
        validate_name("agent", agent)?;
        let key = Arc::clone(&self.key);
        let agent = agent.to_owned();
        let mut seen = BTreeSet::new();
        let asked: Vec<String> = asked
            .iter()
            .filter(|name| seen.insert(name.as_str()))
            .cloned()
            .collect();
        Ok(move |c: &Conn<'_>| {
            let granted: BTreeSet<String> = granted_names(c, &agent)?.into_iter().collect();
            let mut missing: Vec<String> = asked
                .iter()
                .filter(|name| !granted.contains(*name))
                .cloned()
                .collect();
            if !missing.is_empty() {
                missing.sort();
                return Ok(Err(SecretsError::NotGranted {
                    agent,
                    names: missing,
                }));
            }
            let mut values = Vec::with_capacity(asked.len());
            for name in asked {
                // INVARIANT: a grant's foreign key cascades on delete, so a granted name
                // has a row; a missing one means a concurrent delete.
                let Some(row) = sealed_row(c, &name)? else {
                    return Ok(Err(SecretsError::NotFound { name }));
                };
                match row.open(&key, &name) {
                    Ok(value) => values.push((name, value)),
                    Err(err) => return Ok(Err(err)),
                }
            }
            Ok(Ok(values))
        })
    }
}

impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretStore")
            .field("db", &self.db.path())
            .field("key", &*self.key)
            .finish()
    }
}

/// One `secrets` row, still sealed.
struct SealedRow {
    scheme: i64,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
}

impl SealedRow {
    fn open(&self, key: &MasterKey, name: &str) -> Result<SecretString, SecretsError> {
        cipher::open(key, name, self.scheme, &self.nonce, &self.ciphertext)
    }
}

fn sealed_row(c: &Conn<'_>, name: &str) -> crate::store::Result<Option<SealedRow>> {
    c.query_row(
        "SELECT scheme, nonce, ciphertext FROM secrets WHERE name = ?1",
        [name],
        |r| {
            Ok(SealedRow {
                scheme: r.get(0)?,
                nonce: r.get(1)?,
                ciphertext: r.get(2)?,
            })
        },
    )
    .optional()
}

fn list_meta(c: &Conn<'_>) -> crate::store::Result<Vec<SecretMeta>> {
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut stmt = c.prepare("SELECT secret, agent FROM secret_grants ORDER BY secret, agent")?;
    let rows = stmt.query_map((), |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    for row in rows {
        let (secret, agent) = row?;
        grants.entry(secret).or_default().push(agent);
    }
    let mut stmt = c.prepare("SELECT name, created_at, updated_at FROM secrets ORDER BY name")?;
    let rows = stmt.query_map((), |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut metas = Vec::new();
    for row in rows {
        let (name, created, updated) = row?;
        metas.push(SecretMeta {
            grants: grants.remove(&name).unwrap_or_default(),
            name,
            created_at: from_ms(created),
            updated_at: from_ms(updated),
        });
    }
    Ok(metas)
}

/// The `meta` key of the counter every write of a value bumps.
pub(crate) const GENERATION_KEY: &str = "secrets_generation";

/// Bumps the generation counter, inside the writing transaction.
fn bump_generation(c: &Conn<'_>) -> crate::store::Result<()> {
    crate::store::meta::increment(c, GENERATION_KEY)
}

/// The generation counter as stored under [`GENERATION_KEY`] (0 before the first
/// write). A value that is not a number is an error, never 0: caches of the secrets (the
/// redactor among them) refresh only when the counter moves, and a counter read as 0
/// would never move.
pub(crate) fn parse_generation(value: Option<&str>) -> crate::store::Result<u64> {
    let Some(value) = value else {
        return Ok(0);
    };
    value.parse().map_err(|e| crate::store::SqlError::Decode {
        idx: 0,
        message: format!("the secrets generation is not a number: {e}"),
    })
}

fn delete_job(name: &str) -> Result<impl Fn(&Conn<'_>) -> Job<()> + Send + 'static, SecretsError> {
    validate_name("secret", name)?;
    let name = name.to_owned();
    Ok(move |c: &Conn<'_>| {
        // Grants go by the foreign key's cascade; deleting them here as well keeps this
        // correct on a connection without `foreign_keys`.
        c.execute("DELETE FROM secret_grants WHERE secret = ?1", [&name])?;
        let deleted = c.execute("DELETE FROM secrets WHERE name = ?1", [&name])?;
        if deleted > 0 {
            bump_generation(c)?;
        }
        Ok(if deleted == 0 {
            Err(SecretsError::NotFound { name: name.clone() })
        } else {
            Ok(())
        })
    })
}

fn grant_job(
    name: &str,
    agent: &str,
) -> Result<impl Fn(&Conn<'_>) -> Job<()> + Send + 'static, SecretsError> {
    validate_name("secret", name)?;
    validate_name("agent", agent)?;
    let (name, agent) = (name.to_owned(), agent.to_owned());
    Ok(move |c: &Conn<'_>| {
        if !secret_exists(c, &name)? {
            return Ok(Err(SecretsError::NotFound { name: name.clone() }));
        }
        c.execute(
            "INSERT INTO secret_grants (secret, agent, granted_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
            params![name, agent, now_ms()],
        )?;
        Ok(Ok(()))
    })
}

fn revoke_job(
    name: &str,
    agent: &str,
) -> Result<impl Fn(&Conn<'_>) -> Job<()> + Send + 'static, SecretsError> {
    validate_name("secret", name)?;
    validate_name("agent", agent)?;
    let (name, agent) = (name.to_owned(), agent.to_owned());
    Ok(move |c: &Conn<'_>| {
        let removed = c.execute(
            "DELETE FROM secret_grants WHERE secret = ?1 AND agent = ?2",
            params![name, agent],
        )?;
        if removed > 0 {
            return Ok(Ok(()));
        }
        Ok(Err(if secret_exists(c, &name)? {
            SecretsError::GrantNotFound {
                name: name.clone(),
                agent: agent.clone(),
            }
        } else {
            SecretsError::NotFound { name: name.clone() }
        }))
    })
}

fn granted_names(c: &Conn<'_>, agent: &str) -> crate::store::Result<Vec<String>> {
    let mut stmt =
        c.prepare("SELECT secret FROM secret_grants WHERE agent = ?1 ORDER BY secret")?;
    let names = stmt.query_map([agent], |r| r.get(0))?;
    names.collect()
}

fn all_values(c: &Conn<'_>, key: &MasterKey) -> Job<Values> {
    let mut stmt =
        c.prepare("SELECT name, scheme, nonce, ciphertext FROM secrets ORDER BY name")?;
    let rows = stmt.query_map((), |r| {
        Ok((
            r.get::<_, String>(0)?,
            SealedRow {
                scheme: r.get(1)?,
                nonce: r.get(2)?,
                ciphertext: r.get(3)?,
            },
        ))
    })?;
    let mut values = Vec::new();
    for row in rows {
        let (name, sealed) = row?;
        match sealed.open(key, &name) {
            Ok(value) => values.push((name, value)),
            Err(err) => return Ok(Err(err)),
        }
    }
    Ok(Ok(values))
}

fn secret_exists(c: &Conn<'_>, name: &str) -> crate::store::Result<bool> {
    c.query_row("SELECT 1 FROM secrets WHERE name = ?1", [name], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}
