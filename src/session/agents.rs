//! Agent definitions: `agents/NAME.yaml`, read only from threadgate's configured
//! directory (never from a session's branch), plus the playbooks in `skills/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One agent: what its container runs, which tools it may call and which secrets it
/// asks for inside its sandbox.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The container's command; the image's default when absent.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Tool patterns (`stripe.*`) this agent is granted; anything else is refused
    /// before the policy is asked.
    pub tools: Vec<String>,
    /// Secrets injected into the sandbox as `/run/secrets/NAME`; each must also be
    /// granted to this agent in the secrets store.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Playbooks from `skills/` served to the agent.
    #[serde(default)]
    pub skills: Vec<String>,
    /// The agent's standing instructions.
    #[serde(default)]
    pub instructions: String,
}

impl AgentDefinition {
    /// Whether the agent is granted `tool`.
    pub fn grants(&self, tool: &str) -> bool {
        self.tools
            .iter()
            .any(|pattern| crate::policy::tool_pattern_matches(pattern, tool))
    }
}

/// Errors loading agents.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("agent {name} asks for skill {skill}, but {path} does not exist")]
    MissingSkill {
        name: String,
        skill: String,
        path: PathBuf,
    },
}

/// Every agent definition and skill, loaded once at start.
#[derive(Debug, Clone, Default)]
pub struct AgentBook {
    agents: BTreeMap<String, AgentDefinition>,
    skills: BTreeMap<String, String>,
}

impl AgentBook {
    /// Loads `agents_dir/*.yaml` and the skills they name from `skills_dir/NAME.md`.
    pub fn load(agents_dir: &Path, skills_dir: &Path) -> Result<AgentBook, AgentError> {
        let mut book = AgentBook::default();
        let read_dir = |dir: &Path| {
            std::fs::read_dir(dir).map_err(|source| AgentError::Read {
                path: dir.to_owned(),
                source,
            })
        };
        let mut paths: Vec<PathBuf> = read_dir(agents_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|source| AgentError::Read {
                path: path.clone(),
                source,
            })?;
            let agent: AgentDefinition =
                serde_norway::from_str(&text).map_err(|e| AgentError::Invalid {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            for skill in &agent.skills {
                let skill_path = skills_dir.join(format!("{skill}.md"));
                let body =
                    std::fs::read_to_string(&skill_path).map_err(|_| AgentError::MissingSkill {
                        name: agent.name.clone(),
                        skill: skill.clone(),
                        path: skill_path.clone(),
                    })?;
                book.skills.insert(skill.clone(), body);
            }
            book.agents.insert(agent.name.clone(), agent);
        }
        Ok(book)
    }

    /// Adds an agent (tests, embedded defaults).
    pub fn insert(&mut self, agent: AgentDefinition) {
        self.agents.insert(agent.name.clone(), agent);
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&AgentDefinition> {
        self.agents.get(name)
    }

    /// A skill's text.
    pub fn skill(&self, name: &str) -> Option<&str> {
        self.skills.get(name).map(String::as_str)
    }
}
