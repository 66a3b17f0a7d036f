//! Agent definitions: `agents/NAME.md` (a YAML front matter and the instructions as the
//! Markdown body), read only from threadgate's configured directory (never from a
//! session's branch), and the playbooks in `skills/NAME/SKILL.md` (a front matter with
//! `name` and `description`, and the playbook as the body).
//!
//! Problems carry `file:line`. [`AgentBook::load`] refuses a file that does not parse,
//! has an unknown key or names a missing skill; [`AgentBook::check`] then refuses a tool
//! pattern that matches no tool of the catalog and a model the config does not allow.
//! `threadgate serve` and `threadgate lint agents/` run both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::Catalog;

/// What a session may spend on the model before it stops and a person takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// Prompt and completion tokens, as the upstream reports them, over the session.
    pub max_tokens: u64,
    /// Model calls over the session.
    pub max_turns: u64,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_tokens: 200_000,
            max_turns: 40,
        }
    }
}

/// One agent: what its container runs, which model it uses, which tools it may call
/// and which secrets it asks for inside its sandbox.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The model the proxy forwards this agent's calls to; must be in `[model].allowed`.
    pub model: String,
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
    /// The token budget and turn cap.
    #[serde(default)]
    pub limits: AgentLimits,
    /// The agent harness the runner starts: absent, the built-in model loop; set, a
    /// team's own harness that reaches the gated tools over MCP.
    #[serde(default)]
    pub harness: Option<HarnessCommand>,
    /// The agent's standing instructions: the Markdown body.
    #[serde(skip)]
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

/// A team's own agent harness, run in the sandbox by `threadgate-agent-runner` instead
/// of its built-in loop. The runner opens its bridge on `127.0.0.1:port` and starts
/// `command` with `THREADGATE_MCP_URL` (`http://127.0.0.1:PORT/mcp`) and
/// `OPENAI_BASE_URL` (the model proxy, OpenAI-compatible) in its environment; the
/// arguments `{mcp_url}` and `{model_base_url}` are replaced by the same URLs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessCommand {
    /// The program and its arguments; must not be empty.
    pub command: Vec<String>,
    /// The bridge's port on the container's loopback.
    #[serde(default = "default_harness_port")]
    pub port: u16,
}

/// The bridge's port when the agent file names none.
pub const DEFAULT_HARNESS_PORT: u16 = 7345;

fn default_harness_port() -> u16 {
    DEFAULT_HARNESS_PORT
}

/// A playbook: `skills/NAME/SKILL.md`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// The playbook: the Markdown body.
    #[serde(skip)]
    pub body: String,
}

/// One problem in an agent or skill file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: PathBuf,
    /// 1-based; 0 when the problem concerns the whole file.
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
    }
}

/// Errors loading agents: every problem found, one per line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct AgentError(pub Vec<Problem>);

/// A file's front matter (with the line it starts on) and its body.
struct Document {
    path: PathBuf,
    front: String,
    /// The file line of the front matter's first line.
    front_line: usize,
    body: String,
}

impl Document {
    fn read(path: &Path) -> Result<Document, Problem> {
        let problem = |line, message: String| Problem {
            path: path.to_owned(),
            line,
            message,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| problem(0, format!("cannot read: {e}")))?;
        let mut lines = text.split_inclusive('\n');
        if lines.next().map(str::trim_end) != Some("---") {
            return Err(problem(
                1,
                "must start with a YAML front matter between --- lines".into(),
            ));
        }
        let mut front = String::new();
        let mut closed = false;
        for line in lines.by_ref() {
            if line.trim_end() == "---" {
                closed = true;
                break;
            }
            front.push_str(line);
        }
        if !closed {
            return Err(problem(
                1,
                "the front matter is not closed with a --- line".into(),
            ));
        }
        let body: String = lines.collect();
        Ok(Document {
            path: path.to_owned(),
            front,
            front_line: 2,
            body: body.trim().to_owned(),
        })
    }

    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, Problem> {
        serde_norway::from_str(&self.front).map_err(|e| {
            let line = e
                .location()
                .map_or(self.front_line, |l| l.line() + self.front_line - 1);
            let text = e.to_string();
            // serde's own position counts from the front matter: drop it for ours.
            let message = match text.rfind(" at line ") {
                Some(i) => text[..i].to_owned(),
                None => text,
            };
            Problem {
                path: self.path.clone(),
                line,
                message,
            }
        })
    }

    /// The file line of the first front-matter line after `key:` that mentions `value`.
    fn line_of(&self, key: &str, value: &str) -> usize {
        let lines: Vec<&str> = self.front.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{key}:")))
            .unwrap_or(0);
        let found = lines
            .iter()
            .skip(start)
            .position(|l| l.contains(value))
            .map_or(start, |i| start + i);
        found + self.front_line
    }
}

/// The models this threadgate's configuration lets agents use (`[model].allowed`),
/// which [`AgentBook::check`] holds the agents to. Implemented by the model settings,
/// so sessions need not know the model module.
pub trait AllowedModels {
    /// The allowed model names.
    fn allowed_models(&self) -> &[String];
}

/// Every agent definition and skill, loaded once at start.
#[derive(Debug, Clone, Default)]
pub struct AgentBook {
    agents: BTreeMap<String, AgentDefinition>,
    skills: BTreeMap<String, Skill>,
    /// Where each agent came from, for problems found after loading.
    sources: BTreeMap<String, (PathBuf, String)>,
}

fn files(dir: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, Problem> {
    let read = std::fs::read_dir(dir).map_err(|e| Problem {
        path: dir.to_owned(),
        line: 0,
        message: format!("cannot read the directory: {e}"),
    })?;
    let mut paths: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| keep(p))
        .collect();
    paths.sort();
    Ok(paths)
}

impl AgentBook {
    /// Loads `agents_dir/*.md` and every `skills_dir/*/SKILL.md`; refuses the whole set
    /// with every problem found.
    pub fn load(agents_dir: &Path, skills_dir: &Path) -> Result<AgentBook, AgentError> {
        let (book, problems) = AgentBook::read_all(agents_dir, skills_dir);
        if problems.is_empty() {
            Ok(book)
        } else {
            Err(AgentError(problems))
        }
    }

    /// Every agent that parses, and every problem found.
    fn read_all(agents_dir: &Path, skills_dir: &Path) -> (AgentBook, Vec<Problem>) {
        let mut book = AgentBook::default();
        let mut problems = Vec::new();
        book.load_skills(skills_dir, &mut problems);
        let is_ext =
            |p: &Path, exts: &[&str]| p.extension().is_some_and(|x| exts.iter().any(|e| x == *e));
        match files(agents_dir, |p| is_ext(p, &["md", "yaml", "yml"])) {
            Ok(paths) => {
                for path in paths {
                    if is_ext(&path, &["yaml", "yml"]) {
                        problems.push(Problem {
                            path,
                            line: 0,
                            message: "agents are Markdown files now (NAME.md: a YAML front matter and the instructions as the body)".into(),
                        });
                        continue;
                    }
                    book.load_agent(&path, &mut problems);
                }
            }
            Err(p) => problems.push(p),
        }
        (book, problems)
    }

    fn load_skills(&mut self, skills_dir: &Path, problems: &mut Vec<Problem>) {
        if !skills_dir.exists() {
            return;
        }
        let dirs = match files(skills_dir, |p| p.join("SKILL.md").is_file()) {
            Ok(d) => d,
            Err(p) => return problems.push(p),
        };
        for dir in dirs {
            let path = dir.join("SKILL.md");
            let loaded = Document::read(&path).and_then(|doc| {
                let mut skill: Skill = doc.parse()?;
                skill.body = doc.body.clone();
                let dir_name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if skill.name != dir_name {
                    return Err(Problem {
                        path: path.clone(),
                        line: doc.line_of("name", &skill.name),
                        message: format!(
                            "name {:?} must equal its directory's name {dir_name:?}",
                            skill.name
                        ),
                    });
                }
                Ok(skill)
            });
            match loaded {
                Ok(skill) => {
                    self.skills.insert(skill.name.clone(), skill);
                }
                Err(p) => problems.push(p),
            }
        }
    }

    fn load_agent(&mut self, path: &Path, problems: &mut Vec<Problem>) {
        let parsed = Document::read(path).and_then(|doc| {
            let agent: AgentDefinition = doc.parse()?;
            Ok((doc, agent))
        });
        let (doc, mut agent) = match parsed {
            Ok(p) => p,
            Err(p) => return problems.push(p),
        };
        agent.instructions = doc.body.clone();
        for s in agent
            .skills
            .iter()
            .filter(|s| !self.skills.contains_key(*s))
        {
            problems.push(Problem {
                path: path.to_owned(),
                line: doc.line_of("skills", s),
                message: format!("unknown skill {s:?}: no skills/{s}/SKILL.md"),
            });
        }
        if let Some(h) = &agent.harness
            && (h.command.first().is_none_or(|p| p.trim().is_empty()) || h.port == 0)
        {
            problems.push(Problem {
                path: path.to_owned(),
                line: doc.line_of("harness", ""),
                message: "harness: command must name a program and port must not be 0".into(),
            });
        }
        if self.agents.contains_key(&agent.name) {
            problems.push(Problem {
                path: path.to_owned(),
                line: doc.line_of("name", &agent.name),
                message: format!("a second agent named {:?}", agent.name),
            });
        }
        self.sources
            .insert(agent.name.clone(), (path.to_owned(), doc.front.clone()));
        self.agents.insert(agent.name.clone(), agent);
    }

    /// What the loaded agents ask that this threadgate cannot give: tool patterns that
    /// match no tool of `catalog`, models `model` does not allow.
    pub fn check(&self, catalog: &Catalog, model: &dyn AllowedModels) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (name, agent) in &self.agents {
            let Some((path, front)) = self.sources.get(name) else {
                continue;
            };
            let doc = Document {
                path: path.clone(),
                front: front.clone(),
                front_line: 2,
                body: String::new(),
            };
            for pattern in &agent.tools {
                if !catalog
                    .tools()
                    .iter()
                    .any(|t| crate::policy::tool_pattern_matches(pattern, t.name))
                {
                    problems.push(Problem {
                        path: path.clone(),
                        line: doc.line_of("tools", pattern),
                        message: format!("tool pattern {pattern:?} matches no tool of the catalog"),
                    });
                }
            }
            let allowed = model.allowed_models();
            if !allowed.iter().any(|m| m == &agent.model) {
                problems.push(Problem {
                    path: path.clone(),
                    line: doc.line_of("model", &agent.model),
                    message: format!(
                        "model {:?} is not allowed by the config ([model].allowed = {:?})",
                        agent.model, allowed
                    ),
                });
            }
        }
        problems
    }

    /// [`AgentBook::load`] then [`AgentBook::check`]: what `serve` and `lint` run.
    pub fn load_checked(
        agents_dir: &Path,
        skills_dir: &Path,
        catalog: &Catalog,
        model: &dyn AllowedModels,
    ) -> Result<AgentBook, AgentError> {
        let (book, mut problems) = AgentBook::read_all(agents_dir, skills_dir);
        problems.extend(book.check(catalog, model));
        if problems.is_empty() {
            Ok(book)
        } else {
            Err(AgentError(problems))
        }
    }

    /// Adds an agent (tests, embedded defaults).
    pub fn insert(&mut self, agent: AgentDefinition) {
        self.agents.insert(agent.name.clone(), agent);
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&AgentDefinition> {
        self.agents.get(name)
    }

    /// Every agent, by name.
    pub fn iter(&self) -> impl Iterator<Item = &AgentDefinition> {
        self.agents.values()
    }

    /// A skill.
    pub fn skill(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    /// How many agents are loaded.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether no agent is loaded.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}
