//! Agent files: `agents/NAME.md` and `skills/NAME/SKILL.md` are checked with file:line
//! by `threadgate lint agents/` and when `threadgate serve` builds the application,
//! never at the first webhook.

use std::path::{Path, PathBuf};
use std::process::Command;

use threadgate::app::{Application, Overrides};
use threadgate::config::Settings;
use threadgate::model::ModelSettings;
use threadgate::policy::Catalog;
use threadgate::sandbox::FakeRuntime;
use threadgate::secrets::SecretString;
use threadgate::session::AgentBook;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A copy of the repository's agents and skills with `support.md` edited by `edit`.
fn tree(edit: impl Fn(String) -> String) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).expect("mkdir");
    let text = std::fs::read_to_string(repo().join("agents/support.md")).expect("read");
    std::fs::write(agents.join("support.md"), edit(text)).expect("write");
    for skill in std::fs::read_dir(repo().join("skills")).expect("skills") {
        let skill = skill.expect("entry").path();
        let to = dir
            .path()
            .join("skills")
            .join(skill.file_name().expect("name"));
        std::fs::create_dir_all(&to).expect("mkdir");
        std::fs::copy(skill.join("SKILL.md"), to.join("SKILL.md")).expect("copy");
    }
    (dir, agents)
}

/// The 1-based line of `support.md` holding `needle`.
fn line_of(agents: &Path, needle: &str) -> usize {
    let text = std::fs::read_to_string(agents.join("support.md")).expect("read");
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle")
        + 1
}

/// What `threadgate lint DIR` checks, through the library: (passed, problems one per
/// line as the command prints them).
fn lint(agents: &Path) -> (bool, String) {
    let skills = agents.parent().expect("parent").join("skills");
    match AgentBook::load_checked(
        agents,
        &skills,
        &Catalog::builtin(),
        &ModelSettings::default(),
    ) {
        Ok(_) => (true, String::new()),
        Err(e) => (false, e.to_string()),
    }
}

/// The command itself (the binary of this build; in a target directory shared with
/// other branches' builds it can be replaced under the test, so the rest of this file
/// goes through the library).
fn lint_command(agents: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_threadgate"))
        .arg("lint")
        .arg(agents)
        .current_dir(agents.parent().expect("parent"))
        .env_remove("THREADGATE_DATA_DIR")
        .output()
        .expect("run threadgate lint");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_lint_command_passes_good_files_and_fails_bad_ones_with_file_and_line() {
    let (ok, out) = lint_command(&repo().join("agents"));
    assert!(ok, "{out}");
    assert!(out.contains("1 agents, no problems"), "{out}");
    let (_dir, agents) = tree(|t| t.replace("model: scripted-model", "model: gpt-9"));
    let (ok, out) = lint_command(&agents);
    let expected = format!(
        "{}:{}: model \"gpt-9\" is not allowed",
        agents.join("support.md").display(),
        line_of(&agents, "gpt-9")
    );
    assert!(!ok && out.contains(&expected), "{out}");
}

#[test]
fn the_shipped_agents_and_skills_pass() {
    let (ok, out) = lint(&repo().join("agents"));
    assert!(ok, "{out}");
    let book = AgentBook::load_checked(
        &repo().join("agents"),
        &repo().join("skills"),
        &Catalog::builtin(),
        &ModelSettings::default(),
    )
    .expect("valid");
    let support = book.get("support").expect("support");
    assert_eq!(support.skills.len(), 3);
    for name in &support.skills {
        let skill = book.skill(name).expect("skill");
        assert!(!skill.description.is_empty() && !skill.body.is_empty());
    }
    for words in [
        "Investigate first",
        "Never retry a held call with other arguments",
        "which call you want and why",
    ] {
        assert!(support.instructions.contains(words), "{words}");
    }
    assert!(support.command.is_some());
}

#[test]
fn every_bad_entry_is_reported_with_its_file_and_line() {
    let (_dir, agents) = tree(|t| {
        t.replace("model: scripted-model", "model: gpt-9")
            .replace("  - reply-tone", "  - reply-tone\n  - haggling")
            .replace("\"github.*\"", "\"gitlab.*\"")
    });
    let file = agents.join("support.md").display().to_string();
    let (ok, out) = lint(&agents);
    assert!(!ok, "{out}");
    for (needle, what) in [
        ("haggling", "unknown skill \"haggling\""),
        ("gitlab", "matches no tool"),
        ("gpt-9", "not allowed by the config"),
    ] {
        let expected = format!("{file}:{}: ", line_of(&agents, needle));
        assert!(
            out.lines()
                .any(|l| l.starts_with(&expected) && l.contains(what)),
            "{expected} {what}\n{out}"
        );
    }
}

#[test]
fn an_unknown_key_a_yaml_agent_and_a_misnamed_skill_are_refused() {
    let (dir, agents) = tree(|t| t.replace("secrets: []", "secrets: []\ntemperature: 2"));
    let (ok, out) = lint(&agents);
    let line = line_of(&agents, "temperature");
    assert!(
        !ok && out.contains(&format!("support.md:{line}: unknown field `temperature`")),
        "{out}"
    );

    std::fs::write(agents.join("old.yaml"), "name: old\n").expect("write");
    let skill = dir.path().join("skills/reply-tone/SKILL.md");
    let text = std::fs::read_to_string(&skill).expect("read");
    std::fs::write(&skill, text.replace("name: reply-tone", "name: tone")).expect("write");
    let (_, out) = lint(&agents);
    assert!(
        out.contains("old.yaml:0: agents are Markdown files now"),
        "{out}"
    );
    assert!(
        out.contains("SKILL.md:2: name \"tone\" must equal its directory's name"),
        "{out}"
    );
}

#[tokio::test]
async fn serve_refuses_to_start_with_a_bad_agent() {
    let (dir, agents) = tree(|t| {
        t.replace(
            "  - \"helpdesk.*\"",
            "  - \"helpdesk.*\"\n  - \"zendesk.*\"",
        )
    });
    let mut settings = Settings {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        policy_file: repo().join("policies/support.yaml"),
        agents_dir: agents.clone(),
        skills_dir: dir.path().join("skills"),
        master_key_file: dir.path().join("master.key"),
        ..Settings::default()
    };
    settings.plain.signing_secret = Some(SecretString::from("whsec_agents_lint_test_0123456789"));
    settings.repo.path = dir.path().to_owned();
    let overrides = Overrides {
        sandbox: Some(std::sync::Arc::new(FakeRuntime::new())),
        clock: None,
    };
    let err = Application::build(settings, overrides)
        .await
        .err()
        .expect("refused at start");
    let expected = format!(
        "{}:{}: tool pattern \"zendesk.*\" matches no tool",
        agents.join("support.md").display(),
        line_of(&agents, "zendesk")
    );
    assert!(format!("{err:#}").contains(&expected), "{err:#}");
}

#[test]
fn the_harness_choice_is_checked_with_its_line() {
    let good = "harness:\n  command: [\"/opt/agent\", \"--mcp\", \"{mcp_url}\"]\nlimits:\n";
    let (_dir, agents) = tree(|t| t.replacen("limits:\n", good, 1));
    let (ok, out) = lint(&agents);
    assert!(ok, "{out}");
    let book = AgentBook::load(&agents, &repo().join("skills")).expect("loads");
    let harness = book
        .get("support")
        .and_then(|a| a.harness.clone())
        .expect("a harness");
    assert_eq!(
        harness.port,
        threadgate::session::agents::DEFAULT_HARNESS_PORT
    );

    for bad in [
        "harness:\n  command: []\nlimits:\n",
        "harness:\n  command: [\"/opt/agent\"]\n  port: 0\nlimits:\n",
    ] {
        let (_dir, agents) = tree(|t| t.replacen("limits:\n", bad, 1));
        let (ok, out) = lint(&agents);
        let text = std::fs::read_to_string(agents.join("support.md")).expect("read");
        let key_line = 1 + text
            .lines()
            .position(|l| l == "harness:")
            .expect("the harness key");
        let expected = format!(
            "{}:{key_line}: harness: command must name a program",
            agents.join("support.md").display(),
        );
        assert!(!ok && out.contains(&expected), "{bad}: {out}");
    }
    let unknown = "harness:\n  command: [\"/opt/agent\"]\n  colour: red\nlimits:\n";
    let (_dir, agents) = tree(|t| t.replacen("limits:\n", unknown, 1));
    let (ok, out) = lint(&agents);
    assert!(!ok && out.contains("colour"), "{out}");
}

/// The TOML block of the README's "Real credentials" section.
fn readme_real_credentials() -> (String, String) {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let section = readme
        .split("### Real credentials")
        .nth(1)
        .expect("a Real credentials section");
    let toml = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its TOML block")
        .to_owned();
    (
        toml,
        section.split("\n## ").next().unwrap_or_default().to_owned(),
    )
}

// Before: the README's [model] example allowed only gpt-4.1-mini while the shipped
// agent names scripted-model, so `serve` refused it and nothing said why.
#[test]
fn the_readmes_real_credentials_config_is_accepted_once_the_agent_names_its_model() {
    let (toml, section) = readme_real_credentials();
    let settings: Settings = toml::from_str(&toml).expect("the README's TOML parses");
    for table in ["[plain]", "[stripe]", "[model]"] {
        assert!(toml.contains(table), "{table} in {toml}");
    }
    for secret in ["plain_api_key", "stripe_api_key", "model_api_key"] {
        assert!(
            section.contains(&format!("secrets set {secret}")),
            "{secret}"
        );
    }
    let model = &settings.model.allowed[0];
    let check = |agents: &Path| {
        let skills = agents.parent().expect("parent").join("skills");
        AgentBook::load_checked(agents, &skills, &Catalog::builtin(), &settings.model)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    // As shipped, the agent names the scripted model: refused, and the README says so.
    let (_dir, shipped) = tree(|t| t);
    let refused = check(&shipped).expect_err("the shipped model is not allowed");
    assert!(refused.contains("support.md:"), "{refused}");
    let edit = format!("`model: {model}`");
    assert!(section.contains(&edit), "the README says to write {edit}");
    // With the README's edit, accepted.
    let (_dir, edited) = tree(|t| t.replace("model: scripted-model", &format!("model: {model}")));
    check(&edited).expect("the edited agent passes");
}
