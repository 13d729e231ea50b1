//! The dependency rule, read from the code's own paths: the CLI calls the
//! services, the services call the core, the core calls the provider
//! crates through one registry, and nothing points the other way or in a
//! circle. A module here is a top-level folder or file of a layer
//! (`core::gang`, `services::host`); the files inside one may use each
//! other. The rule covers every path spelled `crate::...` or `super::...`
//! outside comments and string literals, in tests too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top first.
const LAYERS: &[&str] = &["cli", "services", "core"];

/// The one file that may name provider crates.
const REGISTRY: &str = "core/registry.rs";

/// Files outside the layers: the crate root (it re-exports the core's
/// public parts under short names for users outside) and these checks.
const OUTSIDE: &[&str] = &[
    "lib.rs",
    "main.rs",
    "layers.rs",
    "no_provider_names.rs",
    "laptop_portable.rs",
];

/// One reference from a module to another.
#[derive(Clone, Debug)]
struct Use {
    from: String,
    to: String,
    file: String,
    line: usize,
    text: String,
}

/// The module path of a file under `src/` (`core/gang/driver.rs` →
/// `core::gang::driver`; a `mod.rs` is its folder).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The unit a module path belongs to: its layer and, below the CLI, the
/// layer's module (`cli` is one unit: it is the top).
fn unit(path: &[String]) -> Option<String> {
    match path {
        [layer, ..] if layer == "cli" => Some("cli".into()),
        [layer, m, ..] if LAYERS.contains(&layer.as_str()) => Some(format!("{layer}::{m}")),
        _ => None,
    }
}

fn layer_rank(unit: &str) -> usize {
    let layer = unit.split("::").next().unwrap_or("");
    LAYERS
        .iter()
        .position(|l| *l == layer)
        .unwrap_or(usize::MAX)
}

/// A line without its comment and the insides of its string literals.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// The first segments of every path a `{...}` group at the start of
/// `rest` names (`{a, b::c, d::{e}}` → a, b, d).
fn group_heads(rest: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    let mut taking = true;
    for c in rest.chars().skip(1) {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(std::mem::take(&mut current));
                taking = true;
                continue;
            }
            _ => {}
        }
        if depth == 0 && taking {
            if c.is_alphanumeric() || c == '_' {
                current.push(c);
            } else if !current.is_empty() {
                taking = false;
            }
        }
    }
    heads.push(current);
    heads.retain(|h| !h.is_empty() && h != "self");
    heads
}

/// The module paths a line of `from` (a module path) refers to, each
/// given as far as the unit needs: `crate::core::gang::x` → core::gang.
fn targets(from: &[String], code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let (base, tail) = if let Some(t) = rest.strip_prefix("crate::") {
            (Vec::new(), t)
        } else if rest.starts_with("super::") {
            let mut base = from.to_vec();
            let mut t = rest;
            while let Some(after) = t.strip_prefix("super::") {
                base.pop();
                t = after;
            }
            (base, t)
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // Not a path that merely ends in `crate::` (`$crate::`, `my_crate::`).
        let boundary = at == 0 || {
            let before = code[..at].chars().next_back().unwrap_or(' ');
            !(before.is_alphanumeric() || before == '_' || before == '$' || before == ':')
        };
        let consumed = rest.len() - tail.len();
        at += consumed;
        if !boundary {
            continue;
        }
        // Two more segments are enough to name a unit.
        let mut segments = base.clone();
        let mut t = tail;
        for _ in 0..2 {
            if t.starts_with('{') {
                for h in group_heads(t) {
                    let mut p = segments.clone();
                    p.push(h);
                    found.push(p);
                }
                segments.clear();
                break;
            }
            let name: String = t
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() {
                break;
            }
            segments.push(name.clone());
            t = &t[name.len()..];
            match t.strip_prefix("::") {
                Some(after) => t = after,
                None => break,
            }
        }
        if !segments.is_empty() {
            found.push(segments);
        }
    }
    found
        .into_iter()
        .map(|p| match p.first().map(String::as_str) {
            // The crate root's re-export of the error type.
            Some("Error" | "ExitCode") => vec!["core".into(), "error".into()],
            _ => p,
        })
        .collect()
}

/// The name of an inline module a line opens (`mod tests {`).
fn inline_mod(code: &str) -> Option<String> {
    let t = code.trim();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let name = t.strip_prefix("mod ")?.strip_suffix('{')?.trim();
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .then(|| name.to_string())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every reference between units, and every path that names a module the
/// layers do not know (the crate root's short names, used from inside).
fn uses(files: &[(String, String)]) -> (Vec<Use>, Vec<String>) {
    let mut edges = Vec::new();
    let mut unknown = Vec::new();
    for (rel, text) in files {
        if OUTSIDE.contains(&rel.as_str()) {
            continue;
        }
        let from_path = module_path(rel);
        if from_path.len() == 1 && LAYERS.contains(&from_path[0].as_str()) && from_path[0] != "cli"
        {
            // A layer's own mod.rs declares its modules; it may name nothing.
            if text.contains("crate::") || text.contains("super::") {
                unknown.push(format!("{rel}: a layer's mod.rs names other modules"));
            }
            continue;
        }
        let Some(from) = unit(&from_path) else {
            unknown.push(format!(
                "{rel}: outside the layers (cli/, services/, core/)"
            ));
            continue;
        };
        // Inline modules (`mod tests {`) move `super::` one level down
        // until the brace at their own indentation closes them.
        let mut inline: Vec<(usize, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let code = code_of(line);
            let indent = line.len() - line.trim_start().len();
            if inline
                .last()
                .is_some_and(|(at, _)| *at == indent && line.trim() == "}")
            {
                inline.pop();
                continue;
            }
            if let Some(name) = inline_mod(&code) {
                inline.push((indent, name));
                continue;
            }
            let here: Vec<String> = from_path
                .iter()
                .cloned()
                .chain(inline.iter().map(|(_, n)| n.clone()))
                .collect();
            for target in targets(&here, &code) {
                match unit(&target) {
                    Some(to) if to != from => edges.push(Use {
                        from: from.clone(),
                        to,
                        file: rel.clone(),
                        line: i + 1,
                        text: line.trim().to_string(),
                    }),
                    Some(_) => {}
                    None if target.first().is_some_and(|s| LAYERS.contains(&s.as_str())) => {}
                    None => unknown.push(format!(
                        "{rel}:{}: `{}` names the crate root's short name; write the layer's path (crate::core::..., crate::services::...)",
                        i + 1,
                        line.trim()
                    )),
                }
            }
        }
    }
    (edges, unknown)
}

/// References that point up a layer.
fn upward(edges: &[Use]) -> Vec<String> {
    edges
        .iter()
        .filter(|u| layer_rank(&u.to) < layer_rank(&u.from))
        .map(|u| {
            format!(
                "{}:{}: {} imports {} (a layer above it): {}",
                u.file, u.line, u.from, u.to, u.text
            )
        })
        .collect()
}

/// Every circle between units, each with one reference per step.
fn circles(edges: &[Use]) -> Vec<String> {
    let mut graph: BTreeMap<&str, BTreeMap<&str, &Use>> = BTreeMap::new();
    for u in edges {
        graph
            .entry(u.from.as_str())
            .or_default()
            .entry(u.to.as_str())
            .or_insert(u);
    }
    let mut found = Vec::new();
    let mut reported: BTreeSet<BTreeSet<&str>> = BTreeSet::new();
    for &start in graph.keys() {
        // Shortest way back to `start`, breadth first.
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closed = None;
        while let Some(n) = queue.pop_front() {
            for &m in graph
                .get(n)
                .map(|g| g.keys().collect::<Vec<_>>())
                .unwrap_or_default()
            {
                if m == start {
                    closed = Some(n);
                    break;
                }
                if !prev.contains_key(m) {
                    prev.insert(m, n);
                    queue.push_back(m);
                }
            }
            if closed.is_some() {
                break;
            }
        }
        let Some(last) = closed else { continue };
        let mut path = vec![last];
        while let Some(&p) = prev.get(path.last().copied().unwrap_or(start)) {
            if p == start {
                break;
            }
            path.push(p);
        }
        path.push(start);
        path.reverse();
        let members: BTreeSet<&str> = path.iter().copied().collect();
        if !reported.insert(members) {
            continue;
        }
        let mut steps = Vec::new();
        for w in path
            .iter()
            .chain(std::iter::once(&start))
            .collect::<Vec<_>>()
            .windows(2)
        {
            let u = graph[*w[0]][*w[1]];
            steps.push(format!(
                "  {} -> {} at {}:{}: {}",
                u.from, u.to, u.file, u.line, u.text
            ));
        }
        found.push(format!(
            "circle through {}:\n{}",
            path.join(", "),
            steps.join("\n")
        ));
    }
    found
}

/// Names of provider crates (those the registry registers) used outside
/// the registry.
fn provider_crates_named(files: &[(String, String)]) -> Vec<String> {
    let registry = &files
        .iter()
        .find(|(rel, _)| rel == REGISTRY)
        .expect("the registry")
        .1;
    let crates: BTreeSet<String> = registry
        .lines()
        .filter_map(|l| l.trim().strip_suffix("::REGISTRATION,"))
        .map(str::to_string)
        .collect();
    assert!(crates.len() >= 3, "registry crates: {crates:?}");
    let mut found = Vec::new();
    for (rel, text) in files {
        if rel == REGISTRY || OUTSIDE.contains(&rel.as_str()) {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = code_of(line);
            for c in &crates {
                if code.contains(&format!("{c}::")) {
                    found.push(format!("{rel}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    found
}

fn read_src() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&root, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .expect("under src")
                .to_string_lossy()
                .into_owned();
            (rel, std::fs::read_to_string(p).expect("read"))
        })
        .collect()
}

#[test]
fn nothing_imports_upward_or_in_a_circle() {
    let files = read_src();
    assert!(files.len() > 40, "{} files", files.len());
    let (edges, unknown) = uses(&files);
    // It saw the layers call down: the rule is not vacuous.
    assert!(edges
        .iter()
        .any(|u| u.from == "cli" && u.to.starts_with("services::")));
    assert!(edges
        .iter()
        .any(|u| u.from.starts_with("services::") && u.to.starts_with("core::")));
    let mut problems = unknown;
    problems.extend(upward(&edges));
    problems.extend(circles(&edges));
    assert!(
        problems.is_empty(),
        "the layers are cli -> services -> core -> providers; these point the wrong way:\n{}",
        problems.join("\n")
    );
}

#[test]
fn only_the_registry_names_provider_crates() {
    let found = provider_crates_named(&read_src());
    assert!(
        found.is_empty(),
        "the core reaches providers through the registry ({REGISTRY}) and the Provider trait; these name a provider crate:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_sees_upward_imports_circles_and_grouped_paths() {
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = vec![
        file("core/a.rs", "use crate::core::b::X;\n"),
        file("core/b/mod.rs", "use super::c::Y; // crate::cli is only a comment\n"),
        file("core/c.rs", "use crate::core::{a::Z, d};\nlet s = \"crate::services::x\";\n"),
        file("core/d.rs", "fn f() -> crate::Error { todo!() }\n"),
        file("core/e.rs", "use crate::services::jobs::Controller;\n"),
        file("services/jobs/mod.rs", "use crate::cli::Output;\nuse crate::spec::Task;\n"),
        file("cli/mod.rs", "use crate::services::jobs;\n#[cfg(test)]\nmod tests {\n    use super::x;\n}\nuse super::nothing;\n"),
    ];
    let (edges, unknown) = uses(&files);
    let pairs: BTreeSet<(String, String)> = edges
        .iter()
        .map(|u| (u.from.clone(), u.to.clone()))
        .collect();
    for (a, b) in [
        ("core::a", "core::b"),
        ("core::b", "core::c"),
        ("core::c", "core::a"),
        ("core::c", "core::d"),
        ("core::d", "core::error"),
        ("core::e", "services::jobs"),
        ("services::jobs", "cli"),
        ("cli", "services::jobs"),
    ] {
        assert!(
            pairs.contains(&(a.into(), b.into())),
            "{a} -> {b} in {pairs:?}"
        );
    }
    // Comments and strings are not references.
    assert!(
        !pairs.iter().any(|(a, b)| a == "core::b" && b == "cli"),
        "{pairs:?}"
    );
    assert!(
        !pairs
            .iter()
            .any(|(a, b)| a == "core::c" && b.starts_with("services")),
        "{pairs:?}"
    );
    // The short names from inside, and a `super::` above the crate; not the
    // test module's `super::`.
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    assert!(
        unknown[0].starts_with("services/jobs/mod.rs:2:"),
        "{unknown:?}"
    );
    assert!(unknown[1].starts_with("cli/mod.rs:6:"), "{unknown:?}");
    let up = upward(&edges);
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up
        .iter()
        .any(|l| l.starts_with("core/e.rs:1: core::e imports services::jobs")));
    let round = circles(&edges);
    assert!(
        round
            .iter()
            .any(|c| c.contains("core::a") && c.contains("core::b") && c.contains("core::c")),
        "{round:?}"
    );
    assert!(
        round
            .iter()
            .any(|c| c.contains("services::jobs") && c.contains("cli")),
        "{round:?}"
    );
    assert!(
        round.iter().any(|c| c.contains("core/b/mod.rs:1")),
        "{round:?}"
    );
}

#[test]
fn the_rule_sees_provider_crates_named_outside_the_registry() {
    let files = vec![
        (
            REGISTRY.to_string(),
            "const R: &[Registration] = &[\n    gangway_local::REGISTRATION,\n    gangway_ssh::REGISTRATION,\n    #[cfg(feature = \"aws\")]\n    gangway_aws::REGISTRATION,\n];\n".to_string(),
        ),
        ("core/storage/mod.rs".to_string(), "let c = gangway_aws::user_credentials();\n// gangway_ssh:: in a comment\n".to_string()),
    ];
    let found = provider_crates_named(&files);
    assert_eq!(
        found,
        vec!["core/storage/mod.rs:1: let c = gangway_aws::user_credentials();".to_string()]
    );
}
