//! The demo's summary of one thread: the gated calls with what became of them, the
//! replies, every internal note whole as the Plain fake received it (a held call's note
//! carries the agent's whole diagnosis), the thread events of the held call's trail, the branch's commits as git has them (hash,
//! subject, files) and the draft pull request the GitHub fake received (title, body).

use serde_json::Value;

use crate::flow::Opened;
use crate::support::agent::AgentWorld;
use crate::support::app::TestApp;
use crate::support::plain_fake_model::Entry;

/// One gated call of a thread.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub id: String,
    pub tool: String,
    pub status: String,
    pub because: String,
    pub args: Value,
    pub result: Option<String>,
    pub error: Option<String>,
    pub reviewer: Option<String>,
    pub decision_message: Option<String>,
}

/// The gated calls of `thread`, oldest first (empty when they cannot be read).
pub(crate) async fn calls_of(app: &TestApp, thread: &str) -> Vec<Call> {
    let thread = thread.to_owned();
    app.db
        .read(move |c| {
            let mut stmt = c.prepare(
                "SELECT id, tool, status, because, args, result, error, reviewer, \
                 decision_message FROM executions WHERE thread_id = ?1 \
                 ORDER BY created_at_ms, id",
            )?;
            let rows = stmt.query_map([&thread], |r| {
                Ok(Call {
                    id: r.get(0)?,
                    tool: r.get(1)?,
                    status: r.get(2)?,
                    because: r.get(3)?,
                    args: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
                    result: r.get(5)?,
                    error: r.get(6)?,
                    reviewer: r.get(7)?,
                    decision_message: r.get(8)?,
                })
            })?;
            rows.collect()
        })
        .await
        .unwrap_or_default()
}

/// Prints the summary of thread `t`.
pub(crate) async fn thread(w: &AgentWorld, app: &TestApp, t: &Opened) {
    let thread = &t.thread;
    println!("== {}: thread {thread}", t.plan.title);
    println!("   the customer wrote: {:?}", t.plan.text);
    for c in calls_of(app, thread).await {
        let what = match c.status.as_str() {
            "succeeded" => "ran".to_owned(),
            "held" => format!("HELD for a person: {}", app.gate.approval_url(&c.id)),
            "blocked" => format!("BLOCKED ({})", c.because),
            other => format!("{other} {}", c.error.as_deref().unwrap_or("")),
        };
        println!("   call {:<26} {} {}", c.tool, compact(&c.args), what);
    }
    let plain = w.world.plain.thread(thread);
    for entry in &plain.timeline {
        match entry {
            Entry::Reply { text, .. } => {
                println!("   reply to the customer (written by the scripted model): {text:?}");
            }
            Entry::Note { text, markdown, .. } => {
                println!("   internal note on the thread, whole, as Plain received it:");
                print_quoted(markdown.as_deref().unwrap_or(text));
            }
            Entry::CustomerMessage { .. } => {}
        }
    }
    for event in plain.events() {
        let buttons: Vec<String> = event
            .link_buttons()
            .into_iter()
            .map(|(url, label)| format!("[{label}]({url})"))
            .collect();
        println!(
            "   thread event: {} {} {}",
            event.title,
            event.text().replace('\n', " / "),
            buttons.join(" ")
        );
    }
    commits(w, thread);
    pull_request(w, thread);
    println!();
}

/// Prints `text` indented behind a bar, line by line.
pub(crate) fn print_quoted(text: &str) {
    for line in text.lines() {
        println!("     | {line}");
    }
}

/// The branch's commits ahead of the default branch (`git log main..threadgate/<thread>`
/// in threadgate's repository), with the files each changed.
fn commits(w: &AgentWorld, thread: &str) {
    let name = format!("threadgate/{thread}");
    let log = branch_log(&w.world.settings.repo.path, &name);
    match log {
        Ok(commits) if commits.is_empty() => println!(
            "   branch {name}: no commits yet (the session is open; its work is committed when the thread is done)"
        ),
        Ok(commits) => {
            println!("   branch {name}: git log main..{name}");
            for c in commits {
                println!("     {} {}", c.hash, c.subject);
                for (status, path) in c.files {
                    println!("         {status:<8} {path}");
                }
            }
        }
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            println!("   branch {name}: not in git yet (the session has not committed)");
        }
        Err(e) => println!("   branch {name}: cannot read it: {}", e.message()),
    }
}

/// One commit of a branch.
pub(crate) struct Commit {
    pub hash: String,
    pub subject: String,
    /// `(added|modified|deleted|..., path)` against its first parent.
    pub files: Vec<(&'static str, String)>,
}

/// The commits of `branch` not on `main`, newest first.
pub(crate) fn branch_log(repo: &std::path::Path, branch: &str) -> Result<Vec<Commit>, git2::Error> {
    let repo = git2::Repository::open(repo)?;
    let tip = repo
        .find_branch(branch, git2::BranchType::Local)?
        .get()
        .peel_to_commit()?;
    let mut walk = repo.revwalk()?;
    walk.push(tip.id())?;
    walk.hide_ref("refs/heads/main")?;
    let mut out = Vec::new();
    for id in walk {
        let commit = repo.find_commit(id?)?;
        let parent = commit.parents().next().map(|p| p.tree()).transpose()?;
        let diff = repo.diff_tree_to_tree(parent.as_ref(), Some(&commit.tree()?), None)?;
        let files = diff
            .deltas()
            .map(|d| {
                let path = d.new_file().path().or(d.old_file().path());
                (
                    status_word(d.status()),
                    path.map(|p| p.display().to_string()).unwrap_or_default(),
                )
            })
            .collect();
        out.push(Commit {
            hash: commit
                .as_object()
                .short_id()?
                .as_str()
                .unwrap_or("")
                .to_owned(),
            subject: String::from_utf8_lossy(commit.summary_bytes().unwrap_or_default())
                .into_owned(),
            files,
        });
    }
    Ok(out)
}

fn status_word(delta: git2::Delta) -> &'static str {
    match delta {
        git2::Delta::Added => "added",
        git2::Delta::Deleted => "deleted",
        git2::Delta::Modified => "modified",
        git2::Delta::Renamed => "renamed",
        _ => "changed",
    }
}

/// The draft pull request the GitHub fake received from the thread's branch.
fn pull_request(w: &AgentWorld, thread: &str) {
    let head = format!("threadgate/{thread}");
    let pulls = w.world.github.pulls();
    let Some(pull) = pulls.iter().find(|p| p["head"] == head.as_str()) else {
        println!("   pull request: none (one is opened when a thread with commits is done)");
        return;
    };
    println!(
        "   draft pull request #{} on {} ({} -> {}), as the GitHub fake received it: {}",
        pull["number"],
        pull["repo"].as_str().unwrap_or("?"),
        head,
        pull["base"].as_str().unwrap_or("?"),
        pull["html_url"].as_str().unwrap_or("")
    );
    println!("     title: {}", pull["title"].as_str().unwrap_or(""));
    println!("     body:");
    print_quoted(pull["body"].as_str().unwrap_or(""));
}

/// A call's arguments on one line, cut at 60 characters.
pub(crate) fn compact(args: &Value) -> String {
    let text = args.to_string();
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}
