//! Reading the settings: the defaults, then the TOML file, then the environment, merged
//! by `figment`, which keeps where each value came from; then the two secrets, read
//! apart so that no error of the layering can carry them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};

use super::env::{self, MASTER_KEY_VAR, SIGNING_SECRET_VAR};
use super::{ConfigError, Origin, Settings};
use crate::secrets::SecretString;

/// The file read when no path is given, if it exists.
const DEFAULT_FILE: &str = "threadgate.toml";

impl Settings {
    /// Reads `path` when given (or `threadgate.toml` when it exists), then the process's
    /// `THREADGATE_*` variables.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let default_path = Path::new(DEFAULT_FILE);
        let file = match path {
            Some(p) => Some(p),
            None if default_path.exists() => Some(default_path),
            None => None,
        };
        Self::load_with_env(file, std::env::vars_os())
    }

    /// Reads the file at `path` if given, then the variables `vars` (the environment,
    /// given so a test need not touch the process's).
    pub fn load_with_env(
        path: Option<&Path>,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Settings, ConfigError> {
        let vars: Vec<(OsString, OsString)> = vars.into_iter().collect();
        let file = path.map(TomlFile::read).transpose()?;
        let mut figment = Figment::new();
        if let Some(file) = &file {
            figment = figment.merge(file);
        }
        for variable in env::layer(vars.iter().cloned())? {
            figment = figment.merge(variable);
        }
        let mut settings: Settings = figment.extract().map_err(|error| {
            let source = file.as_ref().map(|f| (f.path.as_path(), f.text.as_str()));
            ConfigError::from_figment(error, source)
        })?;
        settings.master_key = secret(&vars, MASTER_KEY_VAR, "master_key")?;
        settings.plain.signing_secret = secret(&vars, SIGNING_SECRET_VAR, "plain.signing_secret")?;
        settings.read_signing_secret_file()?;
        Ok(settings)
    }

    fn read_signing_secret_file(&mut self) -> Result<(), ConfigError> {
        if self.plain.signing_secret.is_some() {
            return Ok(());
        }
        let Some(path) = &self.plain.signing_secret_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            what: "plain.signing_secret_file",
            path: path.clone(),
            source,
        })?;
        self.plain.signing_secret = Some(SecretString::from(text.trim().to_owned()));
        Ok(())
    }
}

/// The secret `key` from the variable `name`, if set.
fn secret(
    vars: &[(OsString, OsString)],
    name: &str,
    key: &str,
) -> Result<Option<SecretString>, ConfigError> {
    let Some((_, value)) = vars.iter().find(|(n, _)| n == name) else {
        return Ok(None);
    };
    let text = value.to_str().ok_or_else(|| ConfigError::Value {
        key: key.to_owned(),
        origin: Origin::Env {
            name: name.to_owned(),
        },
        message: "not valid UTF-8".into(),
    })?;
    Ok(Some(SecretString::from(text.to_owned())))
}

/// The settings file, read once: its text finds a wrong key's line.
struct TomlFile {
    path: PathBuf,
    text: String,
    table: toml::Table,
}

impl TomlFile {
    fn read(path: &Path) -> Result<TomlFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            what: "config file",
            path: path.to_owned(),
            source,
        })?;
        let table = text.parse::<toml::Table>().map_err(|e| {
            let at = e.span().map_or(0, |span| span.start);
            let before = text.get(..at).unwrap_or_default();
            ConfigError::Syntax {
                path: path.to_owned(),
                line: before.matches('\n').count() + 1,
                column: before
                    .rsplit('\n')
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .count()
                    + 1,
                message: e.message().trim_end().to_owned(),
            }
        })?;
        Ok(TomlFile {
            path: path.to_owned(),
            text,
            table,
        })
    }
}

impl Provider for &TomlFile {
    fn metadata(&self) -> Metadata {
        Metadata::named("TOML file").source(Source::File(self.path.clone()))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let value = Value::serialize(&self.table)?;
        Ok(Profile::Default.collect(value.into_dict().unwrap_or_default()))
    }
}
