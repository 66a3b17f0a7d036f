//! The master key that encrypts every stored secret.
//!
//! 32 random bytes, kept outside the database: in a file (base64 text, mode 0600) or in
//! an environment variable (base64). Without it the secrets table is useless. Errors
//! name where the key came from and never include any of its bytes.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use rand::Rng as _;
use zeroize::Zeroizing;

/// The length of the master key in bytes.
pub const MASTER_KEY_LEN: usize = 32;

/// Where a master key was read from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A key file.
    File(PathBuf),
    /// An environment variable, by name.
    Env(String),
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(path) => write!(f, "file {}", path.display()),
            KeySource::Env(var) => write!(f, "environment variable {var}"),
        }
    }
}

/// Errors loading or writing a master key. None of them carries key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read.
    #[error("cannot read master key file {path}: {source}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The environment variable is not set (or not Unicode).
    #[error("environment variable {var} is not set; it should hold the base64 master key")]
    EnvMissing {
        /// The variable's name.
        var: String,
    },
    /// The text is not base64 of exactly 32 bytes.
    #[error("master key from {origin} is not valid: expected base64 of exactly 32 bytes")]
    Malformed {
        /// Where the text came from.
        origin: KeySource,
    },
    /// Refusing to replace an existing key: that would make every stored secret
    /// unreadable.
    #[error("master key file {path} already exists; refusing to overwrite it")]
    Exists {
        /// The key file.
        path: PathBuf,
    },
    /// The key file could not be written.
    #[error("cannot write master key file {path}: {source}")]
    Write {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The 32-byte key that encrypts secrets at rest; wiped from memory on drop and never
/// printed.
#[derive(Clone)]
pub struct MasterKey {
    bytes: Zeroizing<[u8; MASTER_KEY_LEN]>,
}

impl MasterKey {
    /// A fresh key from the operating system's random source (through the thread-local
    /// CSPRNG, which it seeds).
    pub fn generate() -> MasterKey {
        let mut bytes = Zeroizing::new([0u8; MASTER_KEY_LEN]);
        rand::rng().fill_bytes(bytes.as_mut());
        MasterKey { bytes }
    }

    /// Reads a key file holding the key in base64 (surrounding whitespace is ignored).
    pub fn from_file(path: &Path) -> Result<MasterKey, KeyError> {
        let text = std::fs::read_to_string(path)
            .map(Zeroizing::new)
            .map_err(|source| KeyError::Read {
                path: path.to_owned(),
                source,
            })?;
        warn_if_shared(path);
        MasterKey::from_base64(&text, KeySource::File(path.to_owned()))
    }

    /// Reads the key, in base64, from the environment variable `var`.
    pub fn from_env(var: &str) -> Result<MasterKey, KeyError> {
        let text = std::env::var(var)
            .map(Zeroizing::new)
            .map_err(|_| KeyError::EnvMissing {
                var: var.to_owned(),
            })?;
        MasterKey::from_base64(&text, KeySource::Env(var.to_owned()))
    }

    /// Parses base64 text (padded or not; surrounding whitespace ignored) holding exactly
    /// 32 bytes. `origin` only names the origin in an error.
    pub fn from_base64(text: &str, origin: KeySource) -> Result<MasterKey, KeyError> {
        let trimmed = text.trim();
        let decoded = STANDARD
            .decode(trimmed)
            .or_else(|_| STANDARD_NO_PAD.decode(trimmed))
            .map(Zeroizing::new)
            // The decoder's error can quote an offending character: never pass it on.
            .map_err(|_| KeyError::Malformed {
                origin: origin.clone(),
            })?;
        let mut bytes = Zeroizing::new([0u8; MASTER_KEY_LEN]);
        if decoded.len() != MASTER_KEY_LEN {
            return Err(KeyError::Malformed { origin });
        }
        bytes.copy_from_slice(&decoded);
        Ok(MasterKey { bytes })
    }

    /// Writes the key as base64 to a new file with mode 0600. An existing file is never
    /// overwritten.
    pub fn write_to(&self, path: &Path) -> Result<(), KeyError> {
        let write_err = |source| KeyError::Write {
            path: path.to_owned(),
            source,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let mut file = options.open(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists {
                    path: path.to_owned(),
                }
            } else {
                write_err(source)
            }
        })?;
        let mut text = Zeroizing::new(STANDARD.encode(self.bytes.as_ref()));
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        Ok(())
    }

    /// The raw key bytes, for the cipher.
    pub(crate) fn bytes(&self) -> &[u8; MASTER_KEY_LEN] {
        &self.bytes
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey([redacted])")
    }
}

/// Logs a warning when a key file can be read by other users: the key is then only as
/// safe as every account on the machine.
fn warn_if_shared(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the master key file is readable by other users; chmod 600 it"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}
