//! The bug-report script ("total is wrong"): the agent follows the `bug-reports` skill in
//! its workspace. It searches the code for the discount, reads the file that applies it,
//! writes a repro script `repro/<thread>.sh`, runs it with the runner's local command
//! tool, writes its findings (the code it suspects and the repro's output) to
//! `notes/<thread>.md`, leaves the finding on the thread as an internal note for staff
//! and the engineers, and tells the customer it is with an engineer. What it writes in
//! the workspace lands on the thread's branch when the thread is done.
//!
//! The thread id comes from the system message ("You work Plain thread `th_...`"), the
//! suspected file from the search's answer (the first `path:line:` match), the output
//! from the command's answer: each step reads only the conversation, like every script.

use serde_json::{Value, json};

use super::step::{LABEL, Step};
use crate::model::types::{ChatRequest, Role};

/// The file the script reads when the search found nothing it can name.
const FALLBACK_FILE: &str = "billing/invoice_total.sh";
/// The most characters of a tool's output the findings quote.
const QUOTED_OUTPUT_CHARS: usize = 2000;

/// The step of the bug-report script at assistant turn `turn`.
pub(super) fn step(request: &ChatRequest, turn: usize) -> Step {
    let thread = thread_id(request);
    match turn {
        0 => local(
            "Searching the code for where the invoice's discount is applied.",
            "workspace__search_code",
            json!({"pattern": "discount", "glob": "*.sh"}),
        ),
        1 => local(
            "Reading the file that computes the invoice total.",
            "workspace__read_file",
            json!({"path": suspect(request)}),
        ),
        2 => local(
            "Writing the smallest script that shows the wrong total.",
            "workspace__write_file",
            json!({"path": repro_path(&thread), "content": repro_script(&thread, &suspect(request))}),
        ),
        3 => local(
            "Running the repro script.",
            "workspace__run_command",
            json!({"command": format!("bash {}", repro_path(&thread)), "timeout_secs": 30}),
        ),
        4 => local(
            "Writing down what I found for the engineers.",
            "workspace__write_file",
            json!({"path": notes_path(&thread), "content": findings(request, &thread)}),
        ),
        5 => Step::Call {
            text: finding_line(request, &thread),
            tool: "helpdesk.add_note".into(),
            arguments: json!({"text": finding_line(request, &thread)}).to_string(),
        },
        6 => Step::Call {
            text: "Replying to the customer with what I found.".into(),
            tool: "helpdesk.reply_to_thread".into(),
            arguments: json!({"text": format!(
                "{LABEL} Thanks for the report: we reproduced the wrong total (the discount is taken off twice). \
                 An engineer has the details; we will write again when it is fixed, and your next invoice will be checked by a person."
            )})
            .to_string(),
        },
        _ => Step::Say(
            "Done: the bug is reproduced, the findings are on the thread's branch and the customer is told."
                .into(),
        ),
    }
}

fn local(text: &str, tool: &str, args: Value) -> Step {
    Step::Call {
        text: text.to_owned(),
        tool: tool.to_owned(),
        arguments: args.to_string(),
    }
}

/// The thread the session works, from the system message (`thread` when it names none).
fn thread_id(request: &ChatRequest) -> String {
    let Ok(re) = regex::Regex::new(r"Plain thread `([A-Za-z0-9_]+)`") else {
        return "thread".into();
    };
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .find_map(|m| re.captures(&m.content).map(|c| c[1].to_owned()))
        .unwrap_or_else(|| "thread".into())
}

fn repro_path(thread: &str) -> String {
    format!("repro/{thread}.sh")
}

fn notes_path(thread: &str) -> String {
    format!("notes/{thread}.md")
}

/// The tool results so far, as JSON (a result that is not JSON is skipped).
fn results(request: &ChatRequest) -> Vec<Value> {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| serde_json::from_str(&m.content).ok())
        .collect()
}

/// The first file the search named (`path:line:text`), else [`FALLBACK_FILE`].
fn suspect(request: &ChatRequest) -> String {
    let matches = search_matches(request);
    matches
        .lines()
        .find_map(|l| {
            let (path, rest) = l.split_once(':')?;
            let (line, _) = rest.split_once(':')?;
            (line.parse::<u32>().is_ok() && !path.starts_with("repro/")).then(|| path.to_owned())
        })
        .unwrap_or_else(|| FALLBACK_FILE.into())
}

fn search_matches(request: &ChatRequest) -> String {
    results(request)
        .iter()
        .find_map(|r| r["matches"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The repro's run: (exit code, stdout), from the latest command result.
fn repro_run(request: &ChatRequest) -> Option<(Option<i64>, String)> {
    results(request)
        .iter()
        .rev()
        .find(|r| r.get("stdout").is_some())
        .map(|r| {
            (
                r["exit_code"].as_i64(),
                r["stdout"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

fn repro_script(thread: &str, file: &str) -> String {
    format!(
        "#!/usr/bin/env bash\n\
         # Repro of Plain thread {thread}: a 5000-cent plan with a 20% discount must total\n\
         # 4000 cents. Run from the repository's root: bash repro/{thread}.sh\n\
         set -u\n\
         expected=4000\n\
         got=$(bash {file} 5000 20)\n\
         echo \"{file} 5000 20: expected $expected, got $got\"\n\
         if [ \"$got\" != \"$expected\" ]; then\n\
         \x20   echo \"FAIL: the total is off by $((expected - got)) cents\"\n\
         \x20   exit 1\n\
         fi\n\
         echo PASS\n"
    )
}

fn cut(text: &str) -> String {
    text.chars().take(QUOTED_OUTPUT_CHARS).collect()
}

/// The notes file: the report, the code found, how to reproduce and what it printed.
fn findings(request: &ChatRequest, thread: &str) -> String {
    let (code, output) = repro_run(request).unwrap_or((None, "(the repro did not run)".into()));
    let exit = code.map_or("none (it did not finish)".into(), |c| c.to_string());
    format!(
        "# Findings for Plain thread {thread}\n\n\
         Written by the support agent ({LABEL}).\n\n\
         ## The report\n\nThe customer's invoice total is wrong when a discount applies.\n\n\
         ## Where the discount is applied\n\n```\n{}```\n\n\
         ## How to reproduce\n\n`bash {}` (exit code {exit}):\n\n```\n{}```\n\n\
         ## Proposed fix\n\nApply the discount once: {} takes it off the subtotal and \
         again from the discounted total.\n",
        cut(&search_matches(request)),
        repro_path(thread),
        cut(&output),
        suspect(request),
    )
}

/// One line for the thread's note: the repro's verdict and where the evidence is.
fn finding_line(request: &ChatRequest, thread: &str) -> String {
    let verdict = repro_run(request)
        .and_then(|(_, out)| out.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "the repro did not run".into());
    format!(
        "Bug reproduced in {}: {verdict}. Repro: bash {}; findings in {} on branch threadgate/{thread}.",
        suspect(request),
        repro_path(thread),
        notes_path(thread),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::openai::parse_request;

    /// A conversation on thread `th_1` after `results` (one tool result per turn).
    fn convo(results: &[Value]) -> ChatRequest {
        let mut m = vec![
            json!({"role": "system", "content": "You work Plain thread `th_1`. Tools..."}),
            json!({"role": "user", "content": "My invoice total is wrong with the discount."}),
        ];
        for (i, r) in results.iter().enumerate() {
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "x", "arguments": "{}"}}]}));
            m.push(
                json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": r.to_string()}),
            );
        }
        parse_request(&json!({"model": "m", "messages": m})).expect("parses")
    }

    fn call(step: &Step) -> (String, Value) {
        match step {
            Step::Call {
                tool, arguments, ..
            } => (tool.clone(), serde_json::from_str(arguments).expect("json")),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn the_script_reproduces_in_the_workspace_and_writes_down_what_it_found() {
        let search =
            json!({"matches": "src/total.sh:7:total=$((total - discount))\n", "found": true});
        let run = json!({"exit_code": 1, "stdout": "src/total.sh 5000 20: expected 4000, got 3200\nFAIL\n", "stderr": ""});
        let ok = json!({"path": "x", "bytes": 1});
        let steps: Vec<(String, Value)> = [
            vec![],
            vec![search.clone()],
            vec![search.clone(), ok.clone()],
            vec![search.clone(), ok.clone(), ok.clone()],
            vec![search.clone(), ok.clone(), ok.clone(), run.clone()],
            vec![
                search.clone(),
                ok.clone(),
                ok.clone(),
                run.clone(),
                ok.clone(),
            ],
        ]
        .iter()
        .enumerate()
        .map(|(turn, results)| call(&step(&convo(results), turn)))
        .collect();
        assert_eq!(steps[0].0, "workspace__search_code");
        assert_eq!(
            steps[1],
            (
                "workspace__read_file".into(),
                json!({"path": "src/total.sh"})
            )
        );
        assert_eq!(steps[2].1["path"], "repro/th_1.sh");
        assert!(
            steps[2].1["content"]
                .as_str()
                .unwrap()
                .contains("bash src/total.sh 5000 20")
        );
        assert_eq!(steps[3].1["command"], "bash repro/th_1.sh");
        let notes = steps[4].1["content"].as_str().unwrap();
        assert_eq!(steps[4].1["path"], "notes/th_1.md");
        for expected in ["expected 4000, got 3200", "exit code 1", "src/total.sh:7:"] {
            assert!(notes.contains(expected), "{expected:?} in {notes}");
        }
        assert_eq!(steps[5].0, "helpdesk.add_note");
        let note = steps[5].1["text"].as_str().unwrap();
        assert!(
            note.contains("got 3200") && note.contains("threadgate/th_1"),
            "{note}"
        );
        let (tool, args) = call(&step(&convo(&[]), 6));
        assert_eq!(tool, "helpdesk.reply_to_thread");
        assert!(args["text"].as_str().unwrap().starts_with(LABEL));
        assert!(matches!(step(&convo(&[]), 7), Step::Say(_)));
    }

    #[test]
    fn without_a_search_match_or_a_thread_the_script_falls_back_to_fixed_names() {
        let r = parse_request(
            &json!({"model": "m", "messages": [{"role": "user", "content": "total is wrong"}]}),
        )
        .expect("parses");
        assert_eq!(call(&step(&r, 1)).1["path"], FALLBACK_FILE);
        assert_eq!(call(&step(&r, 2)).1["path"], "repro/thread.sh");
    }
}
