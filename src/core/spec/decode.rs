//! From the located YAML tree to the task model, with one precise error.

use super::model::*;
use super::yaml::{Kind, Node};
use super::SpecError;

type R<T> = Result<T, SpecError>;

/// Clouds a task may name (SkyPilot's list plus ours). Unknown names get a hint.
pub(crate) const KNOWN_CLOUDS: &[&str] = &[
    "aws",
    "gcp",
    "azure",
    "lambda",
    "kubernetes",
    "k8s",
    "runpod",
    "nebius",
    "oci",
    "ibm",
    "scp",
    "fluidstack",
    "paperspace",
    "cudo",
    "do",
    "vast",
    "vsphere",
    "hyperbolic",
    "seeweb",
    "primeintellect",
    "shadeform",
    "ssh",
    "slurm",
    "local",
];

const TOP_FIELDS: &[&str] = &[
    "name",
    "workdir",
    "num_nodes",
    "resources",
    "envs",
    "secrets",
    "file_mounts",
    "setup",
    "run",
    "config",
    "checkpoint",
    "deadline",
];

/// SkyPilot features we recognise but do not run yet.
const TOP_UNSUPPORTED: &[(&str, &str)] = &[
    (
        "service",
        "service (serving replicas; use `sky serve` for now)",
    ),
    ("pool", "pool (worker pools)"),
    ("volumes", "volumes"),
    ("execution", "job groups (`execution:`)"),
    ("primary_tasks", "job groups (`primary_tasks:`)"),
    ("event_callback", "event_callback"),
    ("inputs", "inputs"),
    ("outputs", "outputs"),
];

const RESOURCE_FIELDS: &[&str] = &[
    "infra",
    "cloud",
    "region",
    "zone",
    "accelerators",
    "accelerator_args",
    "cpus",
    "memory",
    "instance_type",
    "use_spot",
    "disk_size",
    "disk_tier",
    "network_tier",
    "image_id",
    "ports",
    "labels",
    "autostop",
    "max_hourly_cost",
    "spot_risk",
    "any_of",
    "ordered",
    "job_recovery",
    "spot_recovery",
];

const ITEM_EXCLUDED: &[&str] = &["any_of", "ordered", "job_recovery", "spot_recovery"];

struct Cx<'a> {
    file: &'a str,
}

impl Cx<'_> {
    /// An error at `node`; every error says what to do about it.
    fn err(
        &self,
        node: &Node,
        field: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> SpecError {
        SpecError {
            file: self.file.to_string(),
            line: node.pos.line,
            col: node.pos.col,
            field: field.to_string(),
            message: message.into(),
            hint: Some(hint.into()),
            unsupported: false,
        }
    }

    fn expected(&self, node: &Node, field: &str, what: &str, hint: impl Into<String>) -> SpecError {
        self.err(
            node,
            field,
            format!("expected {what}, found {}", node.describe()),
            hint,
        )
    }

    /// The entries of a mapping, with unknown keys refused. (Duplicate keys
    /// never get here: the YAML reader refuses them.) `hint` is for when the
    /// node is not a mapping at all.
    fn fields<'n>(
        &self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
        hint: &str,
    ) -> R<Vec<(&'n str, &'n Node, &'n Node)>> {
        let Kind::Map(items) = &node.kind else {
            return Err(self.expected(node, field, "a mapping of fields", hint));
        };
        let mut out: Vec<(&str, &Node, &Node)> = Vec::with_capacity(items.len());
        for (k, v) in items {
            let Kind::Scalar { text: key, .. } = &k.kind else {
                return Err(self.expected(
                    k,
                    field,
                    "a field name",
                    format!("field names are plain words: {}", allowed.join(", ")),
                ));
            };
            if !allowed.contains(&key.as_str()) {
                return Err(self.unknown_field(k, field, key, allowed));
            }
            out.push((key.as_str(), k, v));
        }
        Ok(out)
    }

    fn unknown_field(&self, k: &Node, field: &str, key: &str, allowed: &[&str]) -> SpecError {
        let path = join(field, key);
        let best = closest(key, allowed);
        let hint = match best {
            Some(b) => format!("did you mean '{b}'?"),
            None => format!("expected one of: {}", allowed.join(", ")),
        };
        self.err(k, &path, format!("unknown field '{key}'"), hint)
    }

    fn string(&self, node: &Node, field: &str) -> R<String> {
        match &node.kind {
            Kind::Scalar { text, .. } => Ok(text.clone()),
            Kind::Null => {
                Err(self.expected(node, field, "a string", "write a value after the ':'"))
            }
            _ => Err(self.expected(
                node,
                field,
                "a string",
                "write a single value; quote it if it starts with '[' or '{'",
            )),
        }
    }

    fn opt_string(&self, node: &Node, field: &str) -> R<Option<String>> {
        match &node.kind {
            Kind::Null => Ok(None),
            _ => self.string(node, field).map(Some),
        }
    }

    fn boolean(&self, node: &Node, field: &str) -> R<bool> {
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
        {
            match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "on" => return Ok(true),
                "false" | "False" | "FALSE" | "no" | "No" | "off" => return Ok(false),
                _ => {}
            }
        }
        Err(self.err(
            node,
            field,
            format!("expected true or false, found {}", shown(node)),
            "write true or false without quotes",
        ))
    }

    fn number(&self, node: &Node, field: &str, hint: &str) -> R<f64> {
        if let Kind::Scalar { text, .. } = &node.kind {
            if let Ok(v) = text.trim().parse::<f64>() {
                if v.is_finite() {
                    return Ok(v);
                }
            }
        }
        Err(self.err(
            node,
            field,
            format!("expected a number, found {}", shown(node)),
            hint,
        ))
    }

    fn whole(&self, node: &Node, field: &str, min: u64, max: u64, hint: &str) -> R<u64> {
        if let Kind::Scalar { text, .. } = &node.kind {
            if let Ok(v) = text.trim().parse::<u64>() {
                if (min..=max).contains(&v) {
                    return Ok(v);
                }
            }
        }
        Err(self.err(
            node,
            field,
            format!(
                "expected a whole number from {min} to {max}, found {}",
                shown(node)
            ),
            hint,
        ))
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn shown(node: &Node) -> String {
    const MAX: usize = 40;
    match &node.kind {
        Kind::Scalar { text, .. } => {
            let t: String = text.chars().take(MAX).collect();
            let more = if text.chars().nth(MAX).is_some() {
                "..."
            } else {
                ""
            };
            format!("'{t}{more}'")
        }
        _ => node.describe().to_string(),
    }
}

/// The allowed name closest to `key`, if it is close enough to be a typo.
pub(crate) use gangway_yaml::closest;

pub(crate) fn task(doc: &Node, file: &str) -> R<Task> {
    let cx = Cx { file };
    if let Kind::Map(items) = &doc.kind {
        for (k, _) in items {
            if let Kind::Scalar { text, .. } = &k.kind {
                if let Some((_, what)) = TOP_UNSUPPORTED.iter().find(|(n, _)| n == text) {
                    return Err(SpecError {
                        unsupported: true,
                        ..cx.err(
                            k,
                            text,
                            format!("not supported yet: {what}"),
                            "remove this section to launch the task as a plain job",
                        )
                    });
                }
            }
        }
    }
    let fields = cx.fields(
        doc,
        "",
        TOP_FIELDS,
        "a task file is a mapping of fields such as `run: python train.py`; \
         see examples/hello.yaml",
    )?;
    let mut t = Task {
        num_nodes: 1,
        ..Task::default()
    };
    let mut git_credentials = None;
    for (key, _k, v) in fields {
        match key {
            "name" => t.name = cx.opt_string(v, key)?,
            "workdir" => {
                if let Some((w, credentials)) = workdir(&cx, v)? {
                    t.workdir = Some(w);
                    git_credentials = credentials;
                }
            }
            "num_nodes" => {
                t.num_nodes =
                    cx.whole(v, key, 1, 4096, "write how many machines to launch, e.g. 2")? as u32
            }
            "resources" => t.resources = resources(&cx, v)?,
            "envs" => t.envs = env_map(&cx, v, key)?,
            "secrets" => {
                t.secrets = env_map(&cx, v, key)?
                    .into_iter()
                    .map(|(k, v)| (k, v.map(Secret::new)))
                    .collect()
            }
            "file_mounts" => t.file_mounts = file_mounts(&cx, v)?,
            "setup" => t.setup = command(&cx, v, key)?,
            "run" => t.run = command(&cx, v, key)?,
            "config" => t.config = config(&cx, v)?,
            "checkpoint" => t.checkpoint = Some(checkpoint(&cx, v)?),
            "deadline" => deadline(&cx, v, &mut t)?,
            _ => unreachable!("fields() only returns allowed keys"),
        }
    }
    if let Some(c) = git_credentials {
        t.secrets.retain(|(k, _)| k != GIT_CREDENTIALS);
        t.secrets.push((GIT_CREDENTIALS.to_string(), Some(c)));
    }
    Ok(t)
}

fn command(cx: &Cx, v: &Node, field: &str) -> R<Option<String>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some(text.clone())),
        _ => Err(cx.err(
            v,
            field,
            format!(
                "expected a shell command (a string), found {}",
                v.describe()
            ),
            format!("use a block string: `{field}: |` followed by indented lines"),
        )),
    }
}

const WORKDIR_HINT: &str = "write e.g. workdir: {url: https://github.com/org/repo, ref: main}";

/// The secret a git workdir's URL credentials travel in (taken out of the
/// URL: never in logs, events or the state database).
pub const GIT_CREDENTIALS: &str = "GANGWAY_GIT_CREDENTIALS";

fn workdir(cx: &Cx, v: &Node) -> R<Option<(Workdir, Option<Secret>)>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some((Workdir::Path(text.clone()), None))),
        Kind::Map(_) => {
            let mut url = None;
            let mut git_ref = None;
            for (key, _k, val) in cx.fields(v, "workdir", &["url", "ref"], WORKDIR_HINT)? {
                let path = join("workdir", key);
                let value = match key {
                    "url" => {
                        url = Some(cx.string(val, &path)?);
                        url.clone()
                    }
                    _ => {
                        git_ref = cx.opt_string(val, &path)?;
                        git_ref.clone()
                    }
                };
                if let Some(bad) =
                    value.filter(|t| t.starts_with('-') || t.contains(char::is_control))
                {
                    return Err(cx.err(
                        val,
                        &path,
                        format!(
                            "'{}' begins with '-' or holds a control character: git would read it as an option",
                            bad.escape_debug()
                        ),
                        WORKDIR_HINT,
                    ));
                }
            }
            let url =
                url.ok_or_else(|| cx.err(v, "workdir", "a git workdir needs 'url'", WORKDIR_HINT))?;
            let (url, credentials) = split_credentials(&url);
            Ok(Some((
                Workdir::Git { url, git_ref },
                credentials.map(Secret::new),
            )))
        }
        _ => Err(cx.expected(v, "workdir", "a directory path or {url, ref}", WORKDIR_HINT)),
    }
}

/// `https://user:token@host/repo` -> (`https://host/repo`, `user:token`),
/// the credentials percent-decoded as git would; a URL without any is
/// returned as it is.
pub fn split_credentials(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_string(), None);
    };
    let userinfo = &rest[..at];
    // Only HTTP(S) URLs carry passwords and tokens: elsewhere
    // (`ssh://git@host/...`) the user is a user name, not a credential.
    let http = scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http");
    if userinfo.is_empty() || !http {
        return (url.to_string(), None);
    }
    (
        format!("{scheme}://{}", &rest[at + 1..]),
        Some(percent_decode(userinfo)),
    )
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn env_map(cx: &Cx, v: &Node, field: &str) -> R<Vec<(String, Option<String>)>> {
    let items = match &v.kind {
        Kind::Null => return Ok(Vec::new()),
        Kind::Map(items) => items,
        _ => {
            return Err(cx.expected(
                v,
                field,
                "a mapping of NAME: value",
                format!("write `NAME: value` lines indented under {field}:"),
            ))
        }
    };
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for (k, val) in items {
        let name = cx.string(k, field)?;
        let path = join(field, &name);
        if !super::valid_env_name(&name) {
            return Err(cx.err(
                k,
                &path,
                format!("'{name}' is not a valid environment variable name"),
                "use letters, digits and _, not starting with a digit",
            ));
        }
        let value = match &val.kind {
            Kind::Null => None,
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => {
                return Err(cx.err(
                    val,
                    &path,
                    format!(
                        "expected a string, number or null, found {}",
                        val.describe()
                    ),
                    "quote the value; null means it must be given with --env/--secret",
                ))
            }
        };
        out.push((name, value));
    }
    Ok(out)
}

const MOUNT_HINT: &str =
    "write e.g. /data: ./data, /data: s3://bucket, or /data: {source: s3://bucket, mode: MOUNT}";

/// Reads `file_mounts`, a mapping of destination on the node to source.
fn file_mounts(cx: &Cx, v: &Node) -> R<Vec<FileMount>> {
    let items = match &v.kind {
        Kind::Null => return Ok(Vec::new()),
        Kind::Map(items) => items,
        _ => {
            return Err(cx.expected(
                v,
                "file_mounts",
                "a mapping of /node/path: source",
                "write `/path/on/node: source` lines indented under file_mounts:",
            ))
        }
    };
    let mut out = Vec::new();
    for (k, val) in items {
        let dest = mount_dest(cx, k)?;
        let source = mount_source(cx, val, &join("file_mounts", &dest))?;
        out.push(FileMount {
            dest,
            source,
            at: (val.pos.line, val.pos.col),
        });
    }
    Ok(out)
}

/// Reads a mount's destination on the node, refusing one that climbs out
/// with `..`, is empty or holds a control character.
fn mount_dest(cx: &Cx, k: &Node) -> R<String> {
    let dest = cx.string(k, "file_mounts")?;
    if dest.split('/').any(|seg| seg == "..") || dest.is_empty() || dest.contains(char::is_control)
    {
        return Err(cx.err(
            k,
            &join("file_mounts", &dest),
            format!(
                "the destination '{}' climbs out with '..', is empty or holds a control character",
                dest.escape_debug()
            ),
            "name the path on the node itself, e.g. /data or ~/data (no '..')",
        ));
    }
    Ok(dest)
}

/// Reads a mount's source: a bucket URI, a local path, or a storage mapping.
fn mount_source(cx: &Cx, val: &Node, path: &str) -> R<MountSource> {
    match &val.kind {
        Kind::Scalar { text, .. } if text.contains("://") => Ok(MountSource::Uri(text.clone())),
        Kind::Scalar { text, .. } => Ok(MountSource::Local(text.clone())),
        Kind::Map(_) => storage_mount(cx, val, path),
        _ => Err(cx.expected(
            val,
            path,
            "a local path, a bucket URI, or {name, source, store, mode}",
            MOUNT_HINT,
        )),
    }
}

/// Reads the `{name, source, store, persistent, mode}` form of a mount.
fn storage_mount(cx: &Cx, val: &Node, path: &str) -> R<MountSource> {
    let (mut name, mut source, mut store, mut persistent, mut mode) =
        (None, None, None, None, None);
    for (key, _k, fv) in cx.fields(
        val,
        path,
        &["name", "source", "store", "persistent", "mode"],
        MOUNT_HINT,
    )? {
        let fp = join(path, key);
        match key {
            "name" => name = cx.opt_string(fv, &fp)?,
            "source" => source = cx.opt_string(fv, &fp)?,
            "store" => store = cx.opt_string(fv, &fp)?,
            "persistent" => persistent = Some(cx.boolean(fv, &fp)?),
            _ => mode = Some(mount_mode(cx, fv, &fp)?),
        }
    }
    Ok(MountSource::Storage {
        name,
        source,
        store,
        persistent,
        mode,
    })
}

/// Reads a mount mode, MOUNT, COPY or MOUNT_CACHED in any case, uppercased.
fn mount_mode(cx: &Cx, fv: &Node, fp: &str) -> R<String> {
    let m = cx.string(fv, fp)?;
    let up = m.to_ascii_uppercase();
    if !["MOUNT", "COPY", "MOUNT_CACHED"].contains(&up.as_str()) {
        return Err(cx.err(
            fv,
            fp,
            format!("unknown mode '{m}'"),
            "expected MOUNT, COPY or MOUNT_CACHED",
        ));
    }
    Ok(up)
}

fn config(cx: &Cx, v: &Node) -> R<Option<serde_json::Value>> {
    if matches!(v.kind, Kind::Null) {
        return Ok(None);
    }
    if !matches!(v.kind, Kind::Map(_)) {
        return Err(cx.expected(
            v,
            "config",
            "a mapping",
            "write provider settings as `key: value` lines indented under config:",
        ));
    }
    super::identity::check_identities(cx.file, v, "config.")?;
    Ok(Some(to_json(v)))
}

/// Converts any subtree to JSON, resolving plain scalars to numbers and booleans.
pub(crate) fn to_json(v: &Node) -> serde_json::Value {
    use serde_json::Value;
    match &v.kind {
        Kind::Null => Value::Null,
        Kind::Scalar { text, quoted: true } => Value::String(text.clone()),
        Kind::Scalar { text, .. } => match text.as_str() {
            "true" | "True" | "TRUE" => Value::Bool(true),
            "false" | "False" | "FALSE" => Value::Bool(false),
            t => {
                if let Ok(i) = t.parse::<i64>() {
                    Value::from(i)
                } else if let Some(f) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
                {
                    Value::Number(f)
                } else {
                    Value::String(t.to_string())
                }
            }
        },
        Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        Kind::Map(items) => Value::Object(
            items
                .iter()
                .map(|(k, v)| {
                    let key = match &k.kind {
                        Kind::Scalar { text, .. } => text.clone(),
                        _ => String::new(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
    }
}

fn checkpoint(cx: &Cx, v: &Node) -> R<Checkpoint> {
    let mut c = Checkpoint::default();
    if matches!(v.kind, Kind::Null) {
        return Ok(c);
    }
    for (key, _k, val) in cx.fields(
        v,
        "checkpoint",
        &[
            "path",
            "storage",
            "sync_interval",
            "signal",
            "grace_period",
            "keep",
        ],
        "write e.g. checkpoint: {path: /ckpt, storage: s3://bucket/run1, sync_interval: 10m}",
    )? {
        let path = join("checkpoint", key);
        match key {
            "path" => c.path = cx.opt_string(val, &path)?,
            "storage" => {
                c.storage = cx.opt_string(val, &path)?;
                c.storage_at = (val.pos.line, val.pos.col);
            }
            "keep" => {
                let n = cx.string(val, &path)?;
                c.keep = match n.parse::<u32>() {
                    Ok(k) if k >= 1 => k,
                    _ => {
                        return Err(cx.err(
                            val,
                            &path,
                            format!(
                            "keep must be a whole number of checkpoints, at least 1; found '{n}'"
                        ),
                            "write e.g. keep: 3 (the newest three stay in the bucket)",
                        ))
                    }
                };
            }
            "sync_interval" => c.sync_interval_s = duration(cx, val, &path)?,
            "grace_period" => c.grace_s = duration(cx, val, &path)?,
            _ => {
                let written = cx.string(val, &path)?;
                let up = written.to_ascii_uppercase();
                let s = if up.starts_with("SIG") {
                    up
                } else {
                    format!("SIG{up}")
                };
                const SIGNALS: &[&str] = &["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"];
                if !SIGNALS.contains(&s.as_str()) {
                    return Err(cx.err(
                        val,
                        &path,
                        format!("unknown signal '{written}'"),
                        format!("expected one of {}", SIGNALS.join(", ")),
                    ));
                }
                c.signal = s;
            }
        }
    }
    Ok(c)
}

/// `deadline: 48h`, or `deadline: {within: 52h, work: 48h, policy: ...}`.
fn deadline(cx: &Cx, v: &Node, t: &mut Task) -> R<()> {
    if !matches!(v.kind, Kind::Map(_)) {
        t.deadline_s = Some(duration(cx, v, "deadline")?);
        return Ok(());
    }
    let mut within = None;
    let mut work_node = v;
    for (key, _k, val) in cx.fields(
        v,
        "deadline",
        &["within", "work", "policy"],
        "write e.g. deadline: {within: 52h, work: 48h, policy: uniform_progress}",
    )? {
        let path = join("deadline", key);
        match key {
            "within" => within = Some(duration(cx, val, &path)?),
            "work" => {
                t.deadline_work_s = Some(duration(cx, val, &path)?);
                work_node = val;
            }
            _ => {
                let p = cx.string(val, &path)?;
                const POLICIES: &[&str] = &["uniform_progress", "greedy", "on_demand"];
                if !POLICIES.contains(&p.as_str()) {
                    return Err(cx.err(
                        val,
                        &path,
                        format!("unknown policy '{p}'"),
                        format!("expected one of {}", POLICIES.join(", ")),
                    ));
                }
                t.deadline_policy = Some(p);
            }
        }
    }
    let Some(within) = within else {
        return Err(cx.err(
            v,
            "deadline.within",
            "missing field 'within'".to_string(),
            "write e.g. deadline: {within: 52h, work: 48h}".to_string(),
        ));
    };
    if t.deadline_work_s.is_some_and(|w| w > within) {
        return Err(cx.err(
            work_node,
            "deadline.work",
            "more work than time before the deadline".to_string(),
            "work must not exceed within".to_string(),
        ));
    }
    t.deadline_s = Some(within);
    Ok(())
}

/// `90`, `"90s"`, `"15m"`, `"6h"`, `"2d"` as seconds.
fn duration(cx: &Cx, v: &Node, field: &str) -> R<u64> {
    let bad = || {
        cx.err(
            v,
            field,
            format!("expected a duration, found {}", shown(v)),
            "write seconds as a number, or a number with s, m, h or d (e.g. 30m)",
        )
    };
    let Kind::Scalar { text, .. } = &v.kind else {
        return Err(bad());
    };
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'd')) => (&t[..i], 86400),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(bad)
}

fn resources(cx: &Cx, v: &Node) -> R<Resources> {
    let mut r = Resources::default();
    if matches!(v.kind, Kind::Null) {
        return Ok(r);
    }
    let fields = cx.fields(
        v,
        "resources",
        RESOURCE_FIELDS,
        "write fields such as `accelerators: A100:8` indented under resources:; \
         for alternatives, use any_of: or ordered: with a list",
    )?;
    r.base = resource_spec(cx, &fields, "resources")?;
    for (key, k, val) in &fields {
        let path = join("resources", key);
        match *key {
            "any_of" | "ordered" => {
                if r.choice != Choice::Single {
                    return Err(cx.err(
                        k,
                        &path,
                        "any_of and ordered cannot both be set",
                        "use any_of for cheapest-of, ordered for a preference order",
                    ));
                }
                let items = items(cx, val, &path)?;
                r.choice = if *key == "any_of" {
                    Choice::AnyOf(items)
                } else {
                    Choice::Ordered(items)
                };
            }
            "job_recovery" | "spot_recovery" => {
                if r.job_recovery.is_some() {
                    return Err(cx.err(
                        k,
                        &path,
                        "both job_recovery and spot_recovery are set",
                        "spot_recovery is the old name; keep only job_recovery",
                    ));
                }
                r.job_recovery = Some(job_recovery(cx, val, &path)?);
            }
            _ => {}
        }
    }
    Ok(r)
}

fn items(cx: &Cx, v: &Node, field: &str) -> R<Vec<ResourceSpec>> {
    let example = "e.g. `- accelerators: A100:8` for each alternative";
    let list = match &v.kind {
        Kind::Seq(list) if !list.is_empty() => list,
        Kind::Seq(_) => {
            return Err(cx.err(
                v,
                field,
                "expected at least one resource set, found an empty list",
                format!("remove the key or add items, {example}"),
            ))
        }
        _ => {
            return Err(cx.expected(
                v,
                field,
                "a list of resource sets",
                format!("write a list, {example}"),
            ))
        }
    };
    let allowed: Vec<&str> = RESOURCE_FIELDS
        .iter()
        .copied()
        .filter(|f| !ITEM_EXCLUDED.contains(f))
        .collect();
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let path = format!("{field}[{i}]");
        // A nested any_of/ordered/job_recovery deserves a plainer message
        // than "unknown field".
        if let Kind::Map(kv) = &item.kind {
            for (k, _) in kv {
                if let Kind::Scalar { text, .. } = &k.kind {
                    if ITEM_EXCLUDED.contains(&text.as_str()) {
                        let hint = if text.ends_with("_recovery") {
                            "put it at the top level of resources; it applies to every item"
                        } else {
                            "alternatives do not nest; list every combination as its own item"
                        };
                        return Err(cx.err(
                            k,
                            &join(&path, text),
                            format!("'{text}' cannot appear inside {field}"),
                            hint,
                        ));
                    }
                }
            }
        }
        let fields = cx.fields(
            item,
            &path,
            &allowed,
            &format!("each item is a set of fields, {example}"),
        )?;
        out.push(resource_spec(cx, &fields, &path)?);
    }
    Ok(out)
}

/// Decodes one item's fields into a `ResourceSpec`, then rejects the
/// combinations of fields that no single field can judge alone.
fn resource_spec(cx: &Cx, fields: &[(&str, &Node, &Node)], parent: &str) -> R<ResourceSpec> {
    let mut s = ResourceSpec::default();
    let mut has_infra = false;
    let mut legacy: Option<(&str, &Node)> = None;
    for (key, k, v) in fields {
        let path = join(parent, key);
        match *key {
            "infra" => {
                has_infra = true;
                s.infra = infra(cx, v, &path)?;
            }
            "cloud" | "region" | "zone" => {
                legacy.get_or_insert((key, k));
                legacy_location(cx, v, &path, key, &mut s.infra)?;
            }
            "accelerators" => s.accelerators = accelerators(cx, v, &path)?,
            "cpus" => s.cpus = quantity(cx, v, &path, "vCPUs")?,
            "memory" => s.memory = quantity(cx, v, &path, "GiB of memory")?,
            "instance_type" => s.instance_type = cx.opt_string(v, &path)?,
            "use_spot" => {
                s.use_spot = match v.kind {
                    Kind::Null => None,
                    _ => Some(cx.boolean(v, &path)?),
                }
            }
            "disk_size" => s.disk_size = disk_size(cx, v, &path)?,
            "disk_tier" => s.disk_tier = tier(cx, v, &path, key, DISK_TIERS)?,
            "network_tier" => s.network_tier = tier(cx, v, &path, key, NETWORK_TIERS)?,
            "image_id" => s.image_id = image_id(cx, v, &path)?,
            "ports" => s.ports = ports(cx, v, &path)?,
            "labels" => s.labels.extend(env_like_pairs(cx, v, &path)?),
            "max_hourly_cost" => s.max_hourly_cost = Some(max_hourly_cost(cx, v, &path)?),
            "spot_risk" => s.spot_risk = spot_risk(cx, v, &path)?,
            // Accepted for compatibility; they do not change placement.
            "accelerator_args" | "autostop" => {}
            _ => {}
        }
    }
    if has_infra {
        no_legacy_beside_infra(cx, parent, legacy)?;
    }
    no_accelerator_choice_beside_instance_type(cx, fields, parent, &s)?;
    Ok(s)
}

/// Sets the cloud, region or zone (`key`) of `infra` from the legacy
/// per-field form; `*` means any.
fn legacy_location(cx: &Cx, v: &Node, path: &str, key: &str, infra: &mut Infra) -> R<()> {
    let val = cx.opt_string(v, path)?.filter(|x| x != "*");
    match key {
        "cloud" => {
            infra.cloud = match val {
                Some(c) => Some(cloud_name(cx, v, path, &c)?),
                None => None,
            }
        }
        "region" => infra.region = val,
        _ => infra.zone = val,
    }
    Ok(())
}

const DISK_TIERS: &[&str] = &["low", "medium", "high", "ultra", "best"];
const NETWORK_TIERS: &[&str] = &["standard", "best"];

/// Reads a disk or network tier (`key`), one of `ok` in any case, lowercased.
fn tier(cx: &Cx, v: &Node, path: &str, key: &str, ok: &[&str]) -> R<Option<String>> {
    let t = cx.opt_string(v, path)?;
    if let Some(t) = &t {
        if !ok.contains(&t.to_ascii_lowercase().as_str()) {
            return Err(cx.err(
                v,
                path,
                format!("unknown {key} '{t}'"),
                format!("expected one of {}", ok.join(", ")),
            ));
        }
    }
    Ok(t.map(|t| t.to_ascii_lowercase()))
}

/// Reads `image_id`: one image, or per-region images (`{us-east-1: ami-1, ...}`)
/// kept as JSON text.
fn image_id(cx: &Cx, v: &Node, path: &str) -> R<Option<String>> {
    match &v.kind {
        Kind::Map(_) => Ok(Some(to_json(v).to_string())),
        _ => cx.opt_string(v, path),
    }
}

/// Reads `max_hourly_cost`, a positive price in USD per node-hour.
fn max_hourly_cost(cx: &Cx, v: &Node, path: &str) -> R<f64> {
    let hint = "write the most to pay per node-hour in USD, e.g. 12.5";
    let c = cx.number(v, path, hint)?;
    if c <= 0.0 {
        return Err(cx.err(
            v,
            path,
            format!(
                "expected a positive price in USD per node-hour, found {}",
                shown(v)
            ),
            hint,
        ));
    }
    Ok(c)
}

/// Rejects the legacy `cloud`/`region`/`zone` field seen first (`legacy`)
/// in an item that also has `infra`.
fn no_legacy_beside_infra(cx: &Cx, parent: &str, legacy: Option<(&str, &Node)>) -> R<()> {
    let Some((name, k)) = legacy else {
        return Ok(());
    };
    Err(cx.err(
        k,
        &join(parent, name),
        format!("{name} cannot be combined with infra"),
        format!("infra replaces cloud, region and zone (e.g. infra: aws/us-east-1); remove {name}"),
    ))
}

/// Rejects a set or list of accelerators in an item that names an
/// `instance_type`: the type fixes the accelerator.
fn no_accelerator_choice_beside_instance_type(
    cx: &Cx,
    fields: &[(&str, &Node, &Node)],
    parent: &str,
    s: &ResourceSpec,
) -> R<()> {
    let (Some(it), Some(Accelerators::AnyOf(_) | Accelerators::Ordered(_))) =
        (&s.instance_type, &s.accelerators)
    else {
        return Ok(());
    };
    let node = fields
        .iter()
        .find(|(k, _, _)| *k == "accelerators")
        .map(|(_, k, _)| *k)
        .expect("accelerators was set from a field");
    Err(cx.err(
        node,
        &join(parent, "accelerators"),
        format!("a set or list of accelerators cannot be combined with instance_type '{it}'"),
        "use any_of with one instance_type per item",
    ))
}

fn env_like_pairs(cx: &Cx, v: &Node, field: &str) -> R<Vec<(String, String)>> {
    let Kind::Map(items) = &v.kind else {
        return Err(cx.expected(
            v,
            field,
            "a mapping of key: value",
            "write `key: value` lines indented under labels:",
        ));
    };
    items
        .iter()
        .map(|(k, val)| {
            let key = cx.string(k, field)?;
            let path = join(field, &key);
            Ok((key, cx.string(val, &path)?))
        })
        .collect()
}

fn cloud_name(cx: &Cx, v: &Node, field: &str, name: &str) -> R<String> {
    let lower = name.to_ascii_lowercase();
    if KNOWN_CLOUDS.contains(&lower.as_str()) {
        return Ok(if lower == "k8s" {
            "kubernetes".into()
        } else {
            lower
        });
    }
    let hint = match closest(&lower, KNOWN_CLOUDS) {
        Some(c) => format!("did you mean '{c}'?"),
        None => "expected a cloud such as aws, gcp, azure, lambda, local or ssh".into(),
    };
    Err(cx.err(v, field, format!("unknown cloud '{name}'"), hint))
}

fn infra(cx: &Cx, v: &Node, field: &str) -> R<Infra> {
    let Some(text) = cx.opt_string(v, field)? else {
        return Ok(Infra::default());
    };
    let parts: Vec<&str> = text.split('/').collect();
    let hint = if parts.len() > 3 {
        Some("infra has at most three parts, e.g. gcp/us-central1/us-central1-a")
    } else if parts.iter().any(|p| p.trim().is_empty()) {
        Some("no part may be empty; write * for any, e.g. */us-east-1")
    } else {
        None
    };
    if let Some(hint) = hint {
        return Err(cx.err(
            v,
            field,
            format!("expected cloud[/region[/zone]], found '{text}'"),
            hint,
        ));
    }
    let part = |i: usize| {
        parts
            .get(i)
            .map(|p| p.trim())
            .filter(|p| *p != "*")
            .map(str::to_string)
    };
    let cloud = match part(0) {
        Some(c) => Some(cloud_name(cx, v, field, &c)?),
        None => None,
    };
    Ok(Infra {
        cloud,
        region: part(1),
        zone: part(2),
    })
}

fn accel_text(cx: &Cx, v: &Node, field: &str, text: &str, count: Option<&Node>) -> R<Accel> {
    let hint = "write NAME or NAME:COUNT, e.g. A100:8";
    let (name, count_text) = match text.split_once(':') {
        Some((n, c)) => (n.trim(), Some(c.trim().to_string())),
        None => (text.trim(), None),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(cx.err(
            v,
            field,
            format!("expected an accelerator name, found '{text}'"),
            hint,
        ));
    }
    // The count, and the node to blame if it is out of range.
    let (count, at) = match (count_text, count.filter(|n| !matches!(n.kind, Kind::Null))) {
        (Some(_), Some(n)) => {
            return Err(cx.err(n, field, format!("'{text}' already has a count"), hint))
        }
        (Some(c), None) => match c.parse::<f32>() {
            Ok(c) => (c, v),
            Err(_) => {
                return Err(cx.err(
                    v,
                    field,
                    format!("expected a GPU count after ':', found '{c}'"),
                    hint,
                ))
            }
        },
        (None, Some(n)) => {
            let count = cx.number(
                n,
                field,
                "write a GPU count per name, e.g. {A100: 8, H100: 8}",
            )?;
            (count as f32, n)
        }
        (None, None) => (1.0, v),
    };
    if !(count > 0.0 && count <= 64.0) {
        return Err(cx.err(
            at,
            field,
            format!("expected a GPU count above 0 and at most 64, found {count}"),
            "write GPUs per node, e.g. A100:8 (fractions like T4:0.5 share a GPU)",
        ));
    }
    Ok(Accel {
        name: name.to_string(),
        count,
    })
}

fn accel_pairs(cx: &Cx, items: &[(Node, Node)], field: &str) -> R<Vec<Accel>> {
    items
        .iter()
        .map(|(k, val)| {
            let name = cx.string(k, field)?;
            accel_text(cx, k, field, &name, Some(val))
        })
        .collect()
}

const NO_GPUS_HINT: &str = "write e.g. A100:8, or remove the field for no GPUs";

fn accelerators(cx: &Cx, v: &Node, field: &str) -> R<Option<Accelerators>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some(Accelerators::One(accel_text(
            cx, v, field, text, None,
        )?))),
        Kind::Map(items) => {
            if items.is_empty() {
                return Err(cx.err(
                    v,
                    field,
                    "expected at least one accelerator, found an empty mapping",
                    NO_GPUS_HINT,
                ));
            }
            let mut v = accel_pairs(cx, items, field)?;
            Ok(Some(if v.len() == 1 {
                Accelerators::One(v.remove(0))
            } else {
                Accelerators::AnyOf(v)
            }))
        }
        Kind::Seq(list) => {
            if list.is_empty() {
                return Err(cx.err(
                    v,
                    field,
                    "expected at least one accelerator, found an empty list",
                    NO_GPUS_HINT,
                ));
            }
            let mut out = Vec::new();
            for item in list {
                match &item.kind {
                    Kind::Scalar { text, .. } => out.push(accel_text(cx, item, field, text, None)?),
                    Kind::Map(pairs) if pairs.len() == 1 => {
                        out.extend(accel_pairs(cx, pairs, field)?)
                    }
                    _ => {
                        return Err(cx.err(
                            item,
                            field,
                            format!(
                                "expected an accelerator such as A100:8, found {}",
                                item.describe()
                            ),
                            "list items are NAME:COUNT strings or single `NAME: COUNT` pairs",
                        ))
                    }
                }
            }
            Ok(Some(Accelerators::Ordered(out)))
        }
    }
}

fn quantity(cx: &Cx, v: &Node, field: &str, unit: &str) -> R<Option<Quantity>> {
    let Kind::Scalar { text, .. } = &v.kind else {
        if matches!(v.kind, Kind::Null) {
            return Ok(None);
        }
        return Err(cx.expected(
            v,
            field,
            &format!("a number of {unit}"),
            format!("write e.g. 8 for exactly 8, or \"8+\" for at least 8 {unit}"),
        ));
    };
    let t = text.trim();
    let (num, at_least) = match t.strip_suffix('+') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    // Only memory takes a unit; `cpus: 4GB` is a mistake, not 4 vCPUs.
    let num = if unit.contains("memory") {
        num.strip_suffix("GB")
            .or_else(|| num.strip_suffix("GiB"))
            .unwrap_or(num)
            .trim()
    } else {
        num
    };
    match num.parse::<f64>() {
        Ok(value) if value > 0.0 && value.is_finite() => Ok(Some(Quantity { value, at_least })),
        _ => Err(cx.err(
            v,
            field,
            format!("expected a positive number of {unit}, found '{text}'"),
            format!("write e.g. 8 for exactly 8, or \"8+\" for at least 8 {unit}"),
        )),
    }
}

const DISK_HINT: &str = "write e.g. 256 or 1024GB";

fn disk_size(cx: &Cx, v: &Node, field: &str) -> R<Option<u32>> {
    let Kind::Scalar { text, .. } = &v.kind else {
        if matches!(v.kind, Kind::Null) {
            return Ok(None);
        }
        return Err(cx.expected(v, field, "a disk size in GB", DISK_HINT));
    };
    let t = text.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("TB").or_else(|| t.strip_suffix("TiB")) {
        (n, 1024)
    } else if let Some(n) = t.strip_suffix("GB").or_else(|| t.strip_suffix("GiB")) {
        (n, 1)
    } else {
        (t, 1)
    };
    match num.trim().parse::<u32>() {
        Ok(n) if n > 0 && n.checked_mul(mult).is_some_and(|g| g <= 65_536) => Ok(Some(n * mult)),
        _ => Err(cx.err(
            v,
            field,
            format!("expected a disk size from 1 to 65536 GB, found '{text}'"),
            DISK_HINT,
        )),
    }
}

fn ports(cx: &Cx, v: &Node, field: &str) -> R<Vec<PortRange>> {
    let hint = "write e.g. 8080, 8000-8010, or a list of them";
    let one = |n: &Node| -> R<PortRange> {
        let Kind::Scalar { text, .. } = &n.kind else {
            return Err(cx.expected(n, field, "a port like 8080 or a range like 8000-8010", hint));
        };
        let p = |s: &str| s.trim().parse::<u16>().ok().filter(|p| *p > 0);
        let range = match text.split_once('-') {
            Some((a, b)) => p(a).zip(p(b)).map(|(start, end)| PortRange { start, end }),
            None => p(text).map(|start| PortRange { start, end: start }),
        };
        match range {
            Some(r) if r.start <= r.end => Ok(r),
            Some(r) => Err(cx.err(
                n,
                field,
                format!("port range '{text}' ends before it starts"),
                format!("write the lower port first: {}-{}", r.end, r.start),
            )),
            None => Err(cx.err(
                n,
                field,
                format!("expected a port from 1 to 65535 or a range, found '{text}'"),
                hint,
            )),
        }
    };
    let ranges: Vec<PortRange> = match &v.kind {
        Kind::Null => return Ok(Vec::new()),
        Kind::Seq(list) => list.iter().map(one).collect::<R<_>>()?,
        _ => vec![one(v)?],
    };
    // Each port becomes a variable of every rank's environment
    // (`GANGWAY_PORT_<p>`); 1-65535 made one too large to start a process.
    let wanted: std::collections::BTreeSet<u16> =
        ranges.iter().flat_map(|r| r.start..=r.end).collect();
    if wanted.len() > MAX_PORTS {
        return Err(cx.err(
            v,
            field,
            format!(
                "{} ports; a task may open at most {MAX_PORTS} (each is a variable of every rank's environment)",
                wanted.len()
            ),
            "open the ports the job listens on, e.g. 8000-8010",
        ));
    }
    Ok(ranges)
}

/// The most ports a task may open (`ports:`, all ranges together).
pub const MAX_PORTS: usize = 1000;

const RECOVERY_HINT: &str =
    "write e.g. job_recovery: FAILOVER or job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 3}";

fn job_recovery(cx: &Cx, v: &Node, field: &str) -> R<JobRecovery> {
    let strategy = |n: &Node, path: &str| -> R<Option<String>> {
        let Some(s) = cx.opt_string(n, path)? else {
            return Ok(None);
        };
        let up = s.to_ascii_uppercase();
        const STRATEGIES: &[&str] = &[
            "REPLACE_LOST_NODES",
            "FAILOVER",
            "EAGER_NEXT_REGION",
            "NONE",
        ];
        if !STRATEGIES.contains(&up.as_str()) {
            return Err(cx.err(
                n,
                path,
                format!("unknown recovery strategy '{s}'"),
                format!("expected one of {}", STRATEGIES.join(", ")),
            ));
        }
        Ok(Some(up))
    };
    let mut r = JobRecovery {
        strategy: None,
        max_restarts_on_errors: 0,
        recover_on_exit_codes: Vec::new(),
    };
    match &v.kind {
        Kind::Null => {}
        Kind::Scalar { .. } => r.strategy = strategy(v, field)?,
        Kind::Map(_) => {
            for (key, _k, val) in cx.fields(
                v,
                field,
                &[
                    "strategy",
                    "max_restarts_on_errors",
                    "recover_on_exit_codes",
                ],
                RECOVERY_HINT,
            )? {
                let path = join(field, key);
                match key {
                    "strategy" => r.strategy = strategy(val, &path)?,
                    "max_restarts_on_errors" => {
                        r.max_restarts_on_errors = cx.whole(
                            val,
                            &path,
                            0,
                            1000,
                            "write how many times to restart after the job fails, e.g. 3",
                        )? as u32
                    }
                    _ => {
                        let codes: Vec<&Node> = match &val.kind {
                            Kind::Seq(l) => l.iter().collect(),
                            _ => vec![val],
                        };
                        for c in codes {
                            r.recover_on_exit_codes.push(cx.whole(
                                c,
                                &path,
                                0,
                                255,
                                "write exit codes or a list of them, e.g. [33, 34]",
                            )? as i32);
                        }
                    }
                }
            }
        }
        _ => {
            return Err(cx.expected(
                v,
                field,
                "a strategy name or {strategy, max_restarts_on_errors, recover_on_exit_codes}",
                RECOVERY_HINT,
            ))
        }
    }
    Ok(r)
}

/// Parses a command-line override the same way as the task field it
/// replaces, so `--gpus`, `--infra`, `--cpus` and `--memory` accept and
/// refuse exactly what a task file would.
pub(crate) fn flag(flag: &str, text: &str) -> Result<ResourceSpec, SpecError> {
    let cx = Cx { file: flag };
    let node = Node {
        kind: Kind::Scalar {
            text: text.to_string(),
            quoted: false,
        },
        pos: Default::default(),
    };
    let mut s = ResourceSpec::default();
    match flag {
        "--gpus" => s.accelerators = accelerators(&cx, &node, flag)?,
        "--infra" => s.infra = infra(&cx, &node, flag)?,
        "--cpus" => s.cpus = quantity(&cx, &node, flag, "vCPUs")?,
        "--memory" => s.memory = quantity(&cx, &node, flag, "GiB of memory")?,
        _ => unreachable!("unknown override flag {flag}"),
    }
    Ok(s)
}

/// `spot_risk: price | expected_cost`, or `{rank: expected_cost,
/// restart_minutes: N, checkpoint_minutes: N}`.
fn spot_risk(cx: &Cx, v: &Node, path: &str) -> R<Option<SpotRisk>> {
    let hint = "write price or expected_cost, or {rank: expected_cost, restart_minutes: 5, checkpoint_minutes: 30}";
    let rank = |node: &Node, field: &str| -> R<SpotRank> {
        match cx.string(node, field)?.as_str() {
            "price" => Ok(SpotRank::Price),
            "expected_cost" => Ok(SpotRank::ExpectedCost),
            other => Err(cx.err(
                node,
                field,
                format!("unknown spot_risk '{other}'"),
                "expected price or expected_cost",
            )),
        }
    };
    let mut r = SpotRisk {
        rank: SpotRank::Price,
        restart_minutes: SpotRisk::DEFAULT_RESTART_MINUTES,
        checkpoint_minutes: SpotRisk::DEFAULT_CHECKPOINT_MINUTES,
    };
    match &v.kind {
        Kind::Null => return Ok(None),
        Kind::Scalar { .. } => r.rank = rank(v, path)?,
        _ => {
            let allowed = ["rank", "restart_minutes", "checkpoint_minutes"];
            for (key, _, node) in cx.fields(v, path, &allowed, hint)? {
                let field = format!("{path}.{key}");
                match key {
                    "rank" => r.rank = rank(node, &field)?,
                    _ => {
                        let m = cx.number(node, &field, "minutes, e.g. 5")?;
                        if m < 0.0 {
                            return Err(cx.err(
                                node,
                                &field,
                                format!("expected minutes at or above 0, found {}", shown(node)),
                                "minutes, e.g. 5",
                            ));
                        }
                        if key == "restart_minutes" {
                            r.restart_minutes = m;
                        } else {
                            r.checkpoint_minutes = m;
                        }
                    }
                }
            }
        }
    }
    Ok(Some(r))
}
