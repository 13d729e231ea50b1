//! Every `gangway` command the README and `docs/` show is one the CLI
//! accepts, and one a test or a `bench/` script runs.
//!
//! Commands are taken from fenced code lines that start with `gangway ` or
//! `cargo run --release -- ` (with `\` continuations joined and `# comments`
//! dropped) and from inline code spans that start with `gangway `. A
//! concrete command must parse; a synopsis (`[--down]`, `NAME`, `a|b`, `...`)
//! must name a real subcommand and real flags of it. Each must then be
//! covered: some file of the tests or of `bench/` names its subcommand
//! words, every flag it uses and every file of the repository it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use gangway::cli::Cli;

use crate::common::root;

/// One command as a doc shows it.
#[derive(Debug)]
struct DocCommand {
    /// `docs/aws.md:12`.
    at: String,
    /// The words after `gangway`.
    words: Vec<String>,
    /// An inline span in prose (`gangway launch --down`) names a command
    /// or a flag; it need not be whole.
    inline: bool,
}

impl DocCommand {
    /// A synopsis: placeholders rather than a command to run.
    fn is_synopsis(&self) -> bool {
        self.words.iter().any(|w| {
            w.contains(['[', ']', '|'])
                || w.contains("...")
                || w.starts_with('<')
                || w.starts_with('$')
                || is_metavar(w.trim_end_matches(".yaml").trim_end_matches(".json"))
        })
    }
}

/// `NAME`, `CLUSTER`, `TASK`, `R,...`: upper-case words stand for values.
fn is_metavar(w: &str) -> bool {
    w.len() > 1
        && w.chars().any(|c| c.is_ascii_uppercase())
        && w.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "_,.".contains(c))
}

fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn commands_in(file: &Path) -> Vec<DocCommand> {
    let text = std::fs::read_to_string(file).expect("read doc");
    let name = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            let (start, joined) = match pending.take() {
                Some((start, so_far)) => (start, format!("{so_far} {}", line.trim())),
                None => (lineno, line.trim().to_string()),
            };
            if let Some(rest) = joined.strip_suffix('\\') {
                pending = Some((start, rest.trim_end().to_string()));
                continue;
            }
            let cmd = joined.trim_start_matches("$ ");
            let rest = cmd
                .strip_prefix("gangway ")
                .or_else(|| cmd.strip_prefix("cargo run --release -- "))
                .or_else(|| cmd.strip_prefix("cargo run --release --no-default-features -- "));
            if let Some(rest) = rest {
                let rest = match rest.find(" #") {
                    Some(i) => &rest[..i],
                    None => rest,
                };
                out.push(DocCommand {
                    at: format!("{name}:{start}"),
                    words: rest.split_whitespace().map(str::to_string).collect(),
                    inline: false,
                });
            }
            continue;
        }
        let mut spans = line.split('`');
        spans.next(); // text before the first span
        while let Some(span) = spans.next() {
            if let Some(rest) = span.strip_prefix("gangway ") {
                let words: Vec<String> = rest
                    .replace("\\|", "|")
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                // `gangway is installed on a node`: prose, not a command.
                if Cli::command().find_subcommand(&words[0]).is_some() || words[0].starts_with('-')
                {
                    out.push(DocCommand {
                        at: format!("{name}:{lineno}"),
                        words,
                        inline: true,
                    });
                }
            }
            spans.next(); // the text between this span and the next
        }
    }
    out
}

/// The subcommand words of `words` (`jobs launch`) and the flags used.
fn shape(words: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    let mut cmd = Cli::command();
    let mut path = Vec::new();
    let mut flags = Vec::new();
    let mut rest = words.iter();
    for w in rest.by_ref() {
        if w.starts_with('-') {
            flags.push(w.clone());
            break;
        }
        match cmd.find_subcommand(w) {
            Some(sub) => {
                path.push(w.clone());
                cmd = sub.clone();
            }
            None => break,
        }
    }
    for w in rest {
        let w = w.trim_start_matches('[').trim_end_matches(']');
        for alt in w.split('|') {
            if alt.starts_with('-') && alt.len() > 1 {
                flags.push(alt.to_string());
            }
        }
    }
    flags.sort();
    flags.dedup();
    let root_cmd = Cli::command();
    for f in &flags {
        let flag = f.split('=').next().unwrap_or(f);
        // Global flags (`-o json`) are declared on the root command.
        let globals = root_cmd.get_arguments().filter(|a| a.is_global_set());
        let known = cmd.get_arguments().chain(globals).any(|a| {
            if let Some(long) = flag.strip_prefix("--") {
                a.get_long() == Some(long)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&long))
            } else {
                flag.len() == 2 && a.get_short() == flag.chars().nth(1)
            }
        }) || ["--help", "-h", "--version", "-V"].contains(&flag);
        if !known {
            return Err(format!("`{}` has no flag {flag}", path.join(" ")));
        }
    }
    Ok((path, flags))
}

/// The words of every test file and `bench/` script, file by file.
fn coverage_corpus() -> Vec<(PathBuf, BTreeSet<String>)> {
    let mut dirs = vec![root().join("tests/it"), root().join("bench")];
    for e in std::fs::read_dir(root().join("providers")).expect("providers/") {
        dirs.push(e.expect("entry").path().join("tests"));
    }
    let mut out = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.expect("entry").path();
            // This file names every documented command: it covers none.
            if p.ends_with("tests/it/docs.rs") || !p.is_file() {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let words = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || "-_./".contains(c)))
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect();
            out.push((p, words));
        }
    }
    out
}

#[test]
fn every_documented_command_parses_and_is_run_by_a_test_or_bench() {
    let commands: Vec<DocCommand> = doc_files().iter().flat_map(|f| commands_in(f)).collect();
    // The README alone shows the first command, jobs and the tests.
    assert!(
        commands.len() >= 30,
        "found only {} commands: {commands:?}",
        commands.len()
    );
    let corpus = coverage_corpus();
    let mut problems = Vec::new();
    for c in &commands {
        if !c.is_synopsis() {
            let argv = std::iter::once("gangway".to_string()).chain(c.words.iter().cloned());
            if let Err(e) = Cli::try_parse_from(argv) {
                use clap::error::ErrorKind;
                // Inline spans may name a command without its arguments.
                let partial = c.inline
                    && matches!(
                        e.kind(),
                        ErrorKind::MissingRequiredArgument
                            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    );
                if !partial
                    && !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                {
                    problems.push(format!(
                        "{}: `gangway {}` does not parse: {e}",
                        c.at,
                        c.words.join(" ")
                    ));
                    continue;
                }
            }
        }
        let (path, flags) = match shape(&c.words) {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("{}: {e}", c.at));
                continue;
            }
        };
        // Files of the repository the command names (examples/x.yaml).
        let files: Vec<String> = c
            .words
            .iter()
            .filter(|w| w.contains('/') && root().join(w.as_str()).is_file())
            .cloned()
            .collect();
        let mut needed: Vec<String> = path.iter().chain(&flags).chain(&files).cloned().collect();
        // Short and long forms are one flag: a test may use either.
        needed.retain(|w| w != "--help" && w != "-h");
        let covered = needed.is_empty()
            || corpus.iter().any(|(_, words)| {
                needed.iter().all(|w| {
                    words.contains(w)
                        || alias_of(&path, w).is_some_and(|other| words.contains(&other))
                })
            });
        if !covered {
            problems.push(format!(
                "{}: no test or bench/ script runs `gangway {}` (needs all of {needed:?} in one file)",
                c.at,
                c.words.join(" ")
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} documented commands:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The other spelling of `flag` (`-o` for `--output`) on `path`'s command.
fn alias_of(path: &[String], flag: &str) -> Option<String> {
    let mut cmd = Cli::command();
    for p in path {
        cmd = cmd.find_subcommand(p)?.clone();
    }
    let root_cmd = Cli::command();
    let globals = root_cmd.get_arguments().filter(|a| a.is_global_set());
    let arg = cmd.get_arguments().chain(globals).find(|a| {
        if let Some(long) = flag.strip_prefix("--") {
            a.get_long() == Some(long)
        } else {
            flag.len() == 2 && a.get_short() == flag.chars().nth(1)
        }
    })?;
    if flag.starts_with("--") {
        arg.get_short().map(|s| format!("-{s}"))
    } else {
        arg.get_long().map(|l| format!("--{l}"))
    }
}

#[test]
fn the_doc_command_reader_finds_fenced_inline_and_continued_commands() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.md");
    std::fs::write(
        &p,
        "Run `gangway status -r` or `gangway is installed`.\n```\ngangway sim a.json \\\n  --job-hours 4   # comment\n$ cargo run --release -- jobs queue\nnot gangway\n```\n",
    )
    .unwrap();
    let got: Vec<String> = commands_in(&p).iter().map(|c| c.words.join(" ")).collect();
    assert_eq!(got, ["status -r", "sim a.json --job-hours 4", "jobs queue"]);
    let (path, flags) =
        shape(&["jobs".into(), "launch".into(), "x.yaml".into(), "-d".into()]).unwrap();
    assert_eq!(
        (path, flags),
        (
            vec!["jobs".to_string(), "launch".to_string()],
            vec!["-d".to_string()]
        )
    );
    assert!(shape(&["down".into(), "--no-such-flag".into()]).is_err());
}
