//! The tools the runner runs itself, inside the sandbox: list, read, write and search
//! files in the workspace, and run a command there with a time cap and an output cap.
//!
//! Every path is relative to the workspace root and must stay inside it: `..`, absolute
//! paths elsewhere and symlinks that lead out are refused before anything is touched.

use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

/// The most bytes `read_file` returns in one call.
const READ_CAP: usize = 64 * 1024;
/// The largest file `write_file` writes.
const WRITE_CAP: usize = 1024 * 1024;
/// The most entries `list_files` returns.
const LIST_CAP: usize = 500;
/// The most bytes kept of a command's (or a search's) stdout and of its stderr.
const OUTPUT_CAP: usize = 16 * 1024;
/// A command's default and largest time limit.
const DEFAULT_TIMEOUT: u64 = 30;
const MAX_TIMEOUT: u64 = 120;

/// The tool that asks threadgate for a checkpoint (`POST /v1/checkpoint`); the runner
/// answers it itself, through the socket, not in the workspace.
pub(crate) const CHECKPOINT: &str = "workspace__checkpoint";

/// The local tools' names and JSON schemas, as OpenAI function tools.
pub(crate) fn definitions() -> Vec<Value> {
    let str_ = |d: &str| json!({"type": "string", "description": d});
    let int_ = |d: &str| json!({"type": "integer", "description": d});
    vec![
        function(
            "workspace__list_files",
            "List files and directories under a directory of the workspace (/workspace), recursively up to a depth.",
            json!({"path": str_("Directory relative to /workspace (default: the root)"), "max_depth": int_("How deep to go (default 3)")}),
            &[],
        ),
        function(
            "workspace__read_file",
            "Read a text file of the workspace (at most 64 KiB per call; use offset to read on).",
            json!({"path": str_("File relative to /workspace"), "offset": int_("Byte offset to start at (default 0)")}),
            &["path"],
        ),
        function(
            "workspace__write_file",
            "Write (create or replace) a file in the workspace; it lands on the thread's branch for engineers.",
            json!({"path": str_("File relative to /workspace"), "content": str_("The whole new content")}),
            &["path", "content"],
        ),
        function(
            "workspace__search_code",
            "Search the workspace's code with ripgrep (a regular expression); answers file:line:text.",
            json!({"pattern": str_("Regular expression"), "path": str_("Directory or file relative to /workspace (default: the root)"), "glob": str_("Only files matching this glob, e.g. *.rs")}),
            &["pattern"],
        ),
        function(
            "workspace__run_command",
            "Run a shell command in /workspace (no network) to reproduce a bug; output is capped at 16 KiB per stream.",
            json!({"command": str_("The bash command line"), "timeout_secs": int_("Time limit in seconds (default 30, at most 120)")}),
            &["command"],
        ),
        function(
            CHECKPOINT,
            "Save the workspace now: threadgate commits it onto the thread's branch and pushes the branch, so the work survives if the session moves to another server. Use it after a meaningful change (at most once per 10 s).",
            json!({}),
            &[],
        ),
    ]
}

fn function(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({"type": "function", "function": {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": false},
    }})
}

/// Runs local tool `name` with `args`; `None` when `name` is not a local tool.
pub(crate) async fn run(root: &Path, name: &str, args: &Value) -> Option<anyhow::Result<Value>> {
    let result = match name {
        "workspace__list_files" => list_files(root, args),
        "workspace__read_file" => read_file(root, args),
        "workspace__write_file" => write_file(root, args),
        "workspace__search_code" => search_code(root, args).await,
        "workspace__run_command" => run_command(root, args).await,
        _ => return None,
    };
    Some(result)
}

fn arg_str<'a>(args: &'a Value, key: &str) -> anyhow::Result<Option<&'a str>> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => bail!("argument `{key}` must be a string"),
    }
}

fn arg_u64(args: &Value, key: &str) -> anyhow::Result<Option<u64>> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| anyhow!("argument `{key}` must be a non-negative integer")),
    }
}

/// Resolves `rel` inside `root`, refusing anything that leads out of it: `..`, an
/// absolute path elsewhere, or a symlink (at any existing level) pointing outside.
pub(crate) fn confine(root: &Path, rel: &str) -> anyhow::Result<PathBuf> {
    let root = root
        .canonicalize()
        .with_context(|| format!("workspace {} is missing", root.display()))?;
    let given = Path::new(rel);
    let rel = given.strip_prefix(&root).unwrap_or(given);
    let rel = rel.strip_prefix("/workspace").unwrap_or(rel);
    let mut path = root.clone();
    for part in rel.components() {
        match part {
            Component::Normal(p) => path.push(p),
            Component::CurDir => {}
            _ => bail!("path {rel:?} must stay inside the workspace (relative, no `..`)"),
        }
        // Each existing level is resolved, so a symlink cannot lead out.
        if let Ok(real) = path.canonicalize() {
            if !real.starts_with(&root) {
                bail!("path {rel:?} leads outside the workspace");
            }
            path = real;
        }
    }
    Ok(path)
}

fn shown(root: &Path, path: &Path) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    path.strip_prefix(&root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

fn list_files(root: &Path, args: &Value) -> anyhow::Result<Value> {
    let dir = confine(root, arg_str(args, "path")?.unwrap_or("."))?;
    let depth = arg_u64(args, "max_depth")?.unwrap_or(3).min(10);
    let mut entries = Vec::new();
    let mut stack = vec![(dir, 0u64)];
    let mut truncated = false;
    while let Some((d, level)) = stack.pop() {
        let mut items: Vec<_> = std::fs::read_dir(&d)
            .with_context(|| format!("cannot list {}", shown(root, &d)))?
            .filter_map(Result::ok)
            .collect();
        items.sort_by_key(|e| e.file_name());
        for item in items {
            if item.file_name() == ".git" {
                continue;
            }
            if entries.len() >= LIST_CAP {
                truncated = true;
                break;
            }
            let kind = item.file_type()?;
            let name = shown(root, &item.path());
            if kind.is_dir() {
                entries.push(format!("{name}/"));
                if level + 1 < depth {
                    stack.push((item.path(), level + 1));
                }
            } else {
                entries.push(name);
            }
        }
    }
    Ok(json!({"entries": entries, "truncated": truncated}))
}

fn read_file(root: &Path, args: &Value) -> anyhow::Result<Value> {
    let rel = arg_str(args, "path")?.ok_or_else(|| anyhow!("argument `path` is required"))?;
    let path = confine(root, rel)?;
    let offset = usize::try_from(arg_u64(args, "offset")?.unwrap_or(0)).unwrap_or(usize::MAX);
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {rel}"))?;
    let start = offset.min(bytes.len());
    let end = (start + READ_CAP).min(bytes.len());
    Ok(json!({
        "path": shown(root, &path),
        "size": bytes.len(),
        "offset": start,
        "content": String::from_utf8_lossy(bytes.get(start..end).unwrap_or_default()),
        "next_offset": (end < bytes.len()).then_some(end),
    }))
}

fn write_file(root: &Path, args: &Value) -> anyhow::Result<Value> {
    let rel = arg_str(args, "path")?.ok_or_else(|| anyhow!("argument `path` is required"))?;
    let content =
        arg_str(args, "content")?.ok_or_else(|| anyhow!("argument `content` is required"))?;
    if content.len() > WRITE_CAP {
        bail!("content is {} bytes; the cap is {WRITE_CAP}", content.len());
    }
    let path = confine(root, rel)?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {rel}'s directory"))?;
        // Created levels are checked again: a race could have swapped one for a symlink.
        confine(root, &shown(root, parent))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags_nofollow()
        .open(&path)
        .with_context(|| format!("cannot write {rel}"))?;
    file.write_all(content.as_bytes())?;
    Ok(json!({"path": shown(root, &path), "bytes": content.len()}))
}

/// Opening without following a final symlink.
trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
    }
}

async fn search_code(root: &Path, args: &Value) -> anyhow::Result<Value> {
    let pattern =
        arg_str(args, "pattern")?.ok_or_else(|| anyhow!("argument `pattern` is required"))?;
    let target = confine(root, arg_str(args, "path")?.unwrap_or("."))?;
    let mut cmd = tokio::process::Command::new("rg");
    cmd.args([
        "--line-number",
        "--no-heading",
        "--color=never",
        "--max-count=50",
    ])
    .arg("--max-columns=300");
    if let Some(glob) = arg_str(args, "glob")? {
        cmd.arg("--glob").arg(glob);
    }
    cmd.arg("--regexp")
        .arg(pattern)
        .arg(&target)
        .current_dir(root);
    let out = capped(cmd, Duration::from_secs(DEFAULT_TIMEOUT)).await?;
    let root_prefix = format!("{}/", root.canonicalize()?.display());
    Ok(json!({
        "matches": out.stdout.replace(&root_prefix, ""),
        "error": (!out.stderr.is_empty()).then_some(out.stderr),
        "truncated": out.truncated,
        "found": out.code == Some(0),
    }))
}

async fn run_command(root: &Path, args: &Value) -> anyhow::Result<Value> {
    let command =
        arg_str(args, "command")?.ok_or_else(|| anyhow!("argument `command` is required"))?;
    let secs = arg_u64(args, "timeout_secs")?
        .unwrap_or(DEFAULT_TIMEOUT)
        .clamp(1, MAX_TIMEOUT);
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c").arg(command).current_dir(root.canonicalize()?);
    let out = capped(cmd, Duration::from_secs(secs)).await?;
    Ok(json!({
        "exit_code": out.code,
        "timed_out": out.timed_out,
        "stdout": out.stdout,
        "stderr": out.stderr,
        "truncated": out.truncated,
    }))
}

/// What a capped process left.
struct Output {
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    truncated: bool,
}

/// Runs `cmd` in its own process group, keeps at most [`OUTPUT_CAP`] bytes of each
/// stream (reading on so the child never blocks on a full pipe), and kills the whole
/// group at `limit`.
async fn capped(mut cmd: tokio::process::Command, limit: Duration) -> anyhow::Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{program}`"))?;
    let pid = child.id();
    let stdout = child.stdout.take().map(|s| tokio::spawn(drain(s)));
    let stderr = child.stderr.take().map(|s| tokio::spawn(drain(s)));
    let (code, timed_out) = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => (status?.code(), false),
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.kill().await;
            (None, true)
        }
    };
    let (out, out_cut) = join_drain(stdout).await;
    let (err, err_cut) = join_drain(stderr).await;
    Ok(Output {
        code,
        timed_out,
        stdout: out,
        stderr: err,
        truncated: out_cut || err_cut,
    })
}

async fn join_drain(task: Option<tokio::task::JoinHandle<(String, bool)>>) -> (String, bool) {
    let Some(task) = task else {
        return (String::new(), false);
    };
    // Grandchildren that escaped the kill could hold the pipe open: do not wait forever.
    match tokio::time::timeout(Duration::from_secs(2), task).await {
        Ok(Ok(v)) => v,
        _ => (String::new(), true),
    }
}

async fn drain(mut stream: impl tokio::io::AsyncRead + Unpin) -> (String, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut truncated = false;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                kept.extend_from_slice(buf.get(..n.min(room)).unwrap_or_default());
                truncated |= n > room;
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
}

/// The local tools' names.
pub(crate) fn definitions_names() -> impl Iterator<Item = &'static str> {
    [
        "workspace__list_files",
        "workspace__read_file",
        "workspace__write_file",
        "workspace__search_code",
        "workspace__run_command",
        CHECKPOINT,
    ]
    .into_iter()
}
