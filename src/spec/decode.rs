//! From the located YAML tree to the task model, with one precise error.

use super::model::*;
use super::yaml::{Kind, Node};
use super::SpecError;

type R<T> = Result<T, SpecError>;

/// Clouds a task may name (SkyPilot's list plus ours). Unknown names get a hint.
pub const KNOWN_CLOUDS: &[&str] = &[
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
    ("service", "service (serving replicas; use `sky serve` for now)"),
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
    fn err(&self, node: &Node, field: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.to_string(),
            line: node.pos.line,
            col: node.pos.col,
            field: field.to_string(),
            message: message.into(),
            hint: None,
            unsupported: false,
        }
    }

    fn err_hint(
        &self,
        node: &Node,
        field: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> SpecError {
        SpecError {
            hint: Some(hint.into()),
            ..self.err(node, field, message)
        }
    }

    fn expected(&self, node: &Node, field: &str, what: &str) -> SpecError {
        self.err(
            node,
            field,
            format!("expected {what}, found {}", node.describe()),
        )
    }

    /// The entries of a mapping, with unknown and duplicate keys refused.
    fn fields<'n>(
        &self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
    ) -> R<Vec<(&'n str, &'n Node, &'n Node)>> {
        let Kind::Map(items) = &node.kind else {
            return Err(self.expected(node, field, "a mapping of fields"));
        };
        let mut out: Vec<(&str, &Node, &Node)> = Vec::with_capacity(items.len());
        for (k, v) in items {
            let Kind::Scalar { text: key, .. } = &k.kind else {
                return Err(self.expected(k, field, "a field name"));
            };
            let path = join(field, key);
            if !allowed.contains(&key.as_str()) {
                return Err(self.unknown_field(k, field, key, allowed));
            }
            if out.iter().any(|(seen, _, _)| *seen == key) {
                return Err(self.err_hint(
                    k,
                    &path,
                    format!("field '{key}' appears twice"),
                    "remove one of them",
                ));
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
        self.err_hint(k, &path, format!("unknown field '{key}'"), hint)
    }

    fn string(&self, node: &Node, field: &str) -> R<String> {
        match &node.kind {
            Kind::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.expected(node, field, "a string")),
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
        Err(self.err_hint(
            node,
            field,
            format!("expected true or false, found {}", shown(node)),
            "write true or false without quotes",
        ))
    }

    fn number(&self, node: &Node, field: &str) -> R<f64> {
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
        ))
    }

    fn whole(&self, node: &Node, field: &str, min: u64, max: u64) -> R<u64> {
        if let Kind::Scalar { text, .. } = &node.kind {
            if let Ok(v) = text.trim().parse::<u64>() {
                if (min..=max).contains(&v) {
                    return Ok(v);
                }
                return Err(self.err(
                    node,
                    field,
                    format!("expected a whole number from {min} to {max}, found {v}"),
                ));
            }
        }
        Err(self.err(
            node,
            field,
            format!(
                "expected a whole number from {min} to {max}, found {}",
                shown(node)
            ),
        ))
    }

    fn seq<'n>(&self, node: &'n Node, field: &str, what: &str) -> R<&'n [Node]> {
        match &node.kind {
            Kind::Seq(items) => Ok(items),
            _ => Err(self.expected(node, field, what)),
        }
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
    match &node.kind {
        Kind::Scalar { text, .. } => {
            let t: String = text.chars().take(40).collect();
            format!("'{t}'")
        }
        _ => node.describe().to_string(),
    }
}

/// The allowed name closest to `key`, if it is close enough to be a typo.
pub fn closest<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    allowed
        .iter()
        .map(|a| (strsim::damerau_levenshtein(&lower, a), *a))
        .filter(|(d, a)| *d <= 2.max(a.len() / 4))
        .min()
        .map(|(_, a)| a)
}

pub fn task(doc: &Node, file: &str) -> R<Task> {
    let cx = Cx { file };
    if let Kind::Map(items) = &doc.kind {
        for (k, _) in items {
            if let Kind::Scalar { text, .. } = &k.kind {
                if let Some((_, what)) = TOP_UNSUPPORTED.iter().find(|(n, _)| n == text) {
                    return Err(SpecError {
                        unsupported: true,
                        ..cx.err_hint(
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
    let fields = cx.fields(doc, "", TOP_FIELDS)?;
    let mut t = Task {
        num_nodes: 1,
        ..Task::default()
    };
    for (key, _k, v) in fields {
        match key {
            "name" => t.name = cx.opt_string(v, key)?,
            "workdir" => t.workdir = workdir(&cx, v)?,
            "num_nodes" => t.num_nodes = cx.whole(v, key, 1, 4096)? as u32,
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
            "deadline" => t.deadline_s = Some(duration(&cx, v, key)?),
            _ => unreachable!("fields() only returns allowed keys"),
        }
    }
    Ok(t)
}

fn command(cx: &Cx, v: &Node, field: &str) -> R<Option<String>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some(text.clone())),
        _ => Err(cx.err_hint(
            v,
            field,
            format!("expected a shell command (a string), found {}", v.describe()),
            format!("use a block string: `{field}: |` followed by indented lines"),
        )),
    }
}

fn workdir(cx: &Cx, v: &Node) -> R<Option<Workdir>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some(Workdir::Path(text.clone()))),
        Kind::Map(_) => {
            let mut url = None;
            let mut git_ref = None;
            for (key, _k, val) in cx.fields(v, "workdir", &["url", "ref"])? {
                let path = join("workdir", key);
                match key {
                    "url" => url = Some(cx.string(val, &path)?),
                    _ => git_ref = cx.opt_string(val, &path)?,
                }
            }
            let url = url.ok_or_else(|| {
                cx.err_hint(
                    v,
                    "workdir",
                    "a git workdir needs 'url'",
                    "workdir: {url: https://github.com/org/repo, ref: main}",
                )
            })?;
            Ok(Some(Workdir::Git { url, git_ref }))
        }
        _ => Err(cx.expected(v, "workdir", "a directory path or {url, ref}")),
    }
}

fn env_map(cx: &Cx, v: &Node, field: &str) -> R<Vec<(String, Option<String>)>> {
    let items = match &v.kind {
        Kind::Null => return Ok(Vec::new()),
        Kind::Map(items) => items,
        _ => return Err(cx.expected(v, field, "a mapping of NAME: value")),
    };
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for (k, val) in items {
        let name = cx.string(k, field)?;
        let path = join(field, &name);
        if name.is_empty()
            || name.starts_with(|c: char| c.is_ascii_digit())
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(cx.err_hint(
                k,
                &path,
                format!("'{name}' is not a valid environment variable name"),
                "use letters, digits and _, not starting with a digit",
            ));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(cx.err_hint(
                k,
                &path,
                format!("'{name}' appears twice"),
                "remove one of them",
            ));
        }
        let value = match &val.kind {
            Kind::Null => None,
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => {
                return Err(cx.err_hint(
                    val,
                    &path,
                    format!("expected a string, number or null, found {}", val.describe()),
                    "quote the value; null means it must be given with --env/--secret",
                ))
            }
        };
        out.push((name, value));
    }
    Ok(out)
}

fn file_mounts(cx: &Cx, v: &Node) -> R<Vec<FileMount>> {
    let items = match &v.kind {
        Kind::Null => return Ok(Vec::new()),
        Kind::Map(items) => items,
        _ => {
            return Err(cx.expected(
                v,
                "file_mounts",
                "a mapping of /node/path: source",
            ))
        }
    };
    let mut out = Vec::new();
    for (k, val) in items {
        let dest = cx.string(k, "file_mounts")?;
        let path = join("file_mounts", &dest);
        let source = match &val.kind {
            Kind::Scalar { text, .. } if text.contains("://") => MountSource::Uri(text.clone()),
            Kind::Scalar { text, .. } => MountSource::Local(text.clone()),
            Kind::Map(_) => {
                let mut s = (None, None, None, None, None);
                for (key, _k, fv) in cx.fields(
                    val,
                    &path,
                    &["name", "source", "store", "persistent", "mode"],
                )? {
                    let fp = join(&path, key);
                    match key {
                        "name" => s.0 = cx.opt_string(fv, &fp)?,
                        "source" => s.1 = cx.opt_string(fv, &fp)?,
                        "store" => s.2 = cx.opt_string(fv, &fp)?,
                        "persistent" => s.3 = Some(cx.boolean(fv, &fp)?),
                        _ => {
                            let m = cx.string(fv, &fp)?;
                            let up = m.to_ascii_uppercase();
                            if !["MOUNT", "COPY", "MOUNT_CACHED"].contains(&up.as_str()) {
                                return Err(cx.err_hint(
                                    fv,
                                    &fp,
                                    format!("unknown mode '{m}'"),
                                    "expected MOUNT, COPY or MOUNT_CACHED",
                                ));
                            }
                            s.4 = Some(up);
                        }
                    }
                }
                MountSource::Storage {
                    name: s.0,
                    source: s.1,
                    store: s.2,
                    persistent: s.3,
                    mode: s.4,
                }
            }
            _ => {
                return Err(cx.expected(
                    val,
                    &path,
                    "a local path, a bucket URI, or {name, source, store, mode}",
                ))
            }
        };
        out.push(FileMount { dest, source });
    }
    Ok(out)
}

fn config(cx: &Cx, v: &Node) -> R<Option<serde_json::Value>> {
    if matches!(v.kind, Kind::Null) {
        return Ok(None);
    }
    if !matches!(v.kind, Kind::Map(_)) {
        return Err(cx.expected(v, "config", "a mapping"));
    }
    Ok(Some(to_json(v)))
}

/// Converts any subtree to JSON, resolving plain scalars to numbers and booleans.
pub fn to_json(v: &Node) -> serde_json::Value {
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
                } else if let Some(f) = t
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
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
        &["path", "storage", "sync_interval", "signal", "grace_period"],
    )? {
        let path = join("checkpoint", key);
        match key {
            "path" => c.path = cx.opt_string(val, &path)?,
            "storage" => c.storage = cx.opt_string(val, &path)?,
            "sync_interval" => c.sync_interval_s = duration(cx, val, &path)?,
            "grace_period" => c.grace_s = duration(cx, val, &path)?,
            _ => {
                let s = cx.string(val, &path)?.to_ascii_uppercase();
                let s = if s.starts_with("SIG") {
                    s
                } else {
                    format!("SIG{s}")
                };
                const SIGNALS: &[&str] = &["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"];
                if !SIGNALS.contains(&s.as_str()) {
                    return Err(cx.err_hint(
                        val,
                        &path,
                        format!("unknown signal '{s}'"),
                        format!("expected one of {}", SIGNALS.join(", ")),
                    ));
                }
                c.signal = s;
            }
        }
    }
    Ok(c)
}

/// `90`, `"90s"`, `"15m"`, `"6h"`, `"2d"` as seconds.
fn duration(cx: &Cx, v: &Node, field: &str) -> R<u64> {
    let bad = || {
        cx.err_hint(
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
    let fields = cx.fields(v, "resources", RESOURCE_FIELDS)?;
    r.base = resource_spec(cx, &fields, "resources")?;
    let mut any_of = None;
    let mut ordered = None;
    for (key, k, val) in &fields {
        let path = join("resources", key);
        match *key {
            "any_of" => any_of = Some((k, items(cx, val, &path)?)),
            "ordered" => ordered = Some((k, items(cx, val, &path)?)),
            "job_recovery" | "spot_recovery" => {
                if r.job_recovery.is_some() {
                    return Err(cx.err_hint(
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
    r.choice = match (any_of, ordered) {
        (Some((k, _)), Some(_)) => {
            return Err(cx.err_hint(
                k,
                "resources.any_of",
                "any_of and ordered cannot both be set",
                "use any_of for cheapest-of, ordered for a preference order",
            ))
        }
        (Some((_, v)), None) => Choice::AnyOf(v),
        (None, Some((_, v))) => Choice::Ordered(v),
        (None, None) => Choice::Single,
    };
    Ok(r)
}

fn items(cx: &Cx, v: &Node, field: &str) -> R<Vec<ResourceSpec>> {
    let list = cx.seq(v, field, "a list of resource sets")?;
    if list.is_empty() {
        return Err(cx.err_hint(
            v,
            field,
            "expected at least one resource set, found an empty list",
            "remove the key or add items like `- accelerators: A100:8`",
        ));
    }
    let allowed: Vec<&str> = RESOURCE_FIELDS
        .iter()
        .copied()
        .filter(|f| !ITEM_EXCLUDED.contains(f))
        .collect();
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let path = format!("{field}[{i}]");
        let fields = cx.fields(item, &path, &allowed).map_err(|e| {
            // A nested any_of/ordered/job_recovery deserves a plainer message.
            match &item.kind {
                Kind::Map(kv) => kv
                    .iter()
                    .find_map(|(k, _)| match &k.kind {
                        Kind::Scalar { text, .. } if ITEM_EXCLUDED.contains(&text.as_str()) => {
                            Some(cx.err_hint(
                                k,
                                &join(&path, text),
                                format!("'{text}' cannot appear inside {field}"),
                                "put it at the top level of resources",
                            ))
                        }
                        _ => None,
                    })
                    .unwrap_or(e),
                _ => e,
            }
        })?;
        out.push(resource_spec(cx, &fields, &path)?);
    }
    Ok(out)
}

fn resource_spec(cx: &Cx, fields: &[(&str, &Node, &Node)], parent: &str) -> R<ResourceSpec> {
    let mut s = ResourceSpec::default();
    let mut infra_node: Option<&Node> = None;
    let mut legacy: Option<&Node> = None;
    for (key, k, v) in fields {
        let path = join(parent, key);
        match *key {
            "infra" => {
                infra_node = Some(k);
                s.infra = infra(cx, v, &path)?;
            }
            "cloud" | "region" | "zone" => {
                legacy.get_or_insert(k);
                let val = cx.opt_string(v, &path)?;
                let val = val.filter(|x| x != "*");
                match *key {
                    "cloud" => {
                        s.infra.cloud = match val {
                            Some(c) => Some(cloud_name(cx, v, &path, &c)?),
                            None => None,
                        }
                    }
                    "region" => s.infra.region = val,
                    _ => s.infra.zone = val,
                }
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
            "disk_tier" | "network_tier" => {
                let t = cx.opt_string(v, &path)?;
                if let Some(t) = &t {
                    let ok: &[&str] = if *key == "disk_tier" {
                        &["low", "medium", "high", "ultra", "best"]
                    } else {
                        &["standard", "best"]
                    };
                    if !ok.contains(&t.to_ascii_lowercase().as_str()) {
                        return Err(cx.err_hint(
                            v,
                            &path,
                            format!("unknown {key} '{t}'"),
                            format!("expected one of {}", ok.join(", ")),
                        ));
                    }
                }
                let t = t.map(|t| t.to_ascii_lowercase());
                if *key == "disk_tier" {
                    s.disk_tier = t
                } else {
                    s.network_tier = t
                }
            }
            "image_id" => {
                s.image_id = match &v.kind {
                    // Per-region images: `{us-east-1: ami-1, ...}`. Kept as text.
                    Kind::Map(_) => Some(to_json(v).to_string()),
                    _ => cx.opt_string(v, &path)?,
                }
            }
            "ports" => s.ports = ports(cx, v, &path)?,
            "labels" => {
                for (lk, lv) in env_like_pairs(cx, v, &path)? {
                    s.labels.insert(lk, lv);
                }
            }
            "max_hourly_cost" => {
                let c = cx.number(v, &path)?;
                if c <= 0.0 {
                    return Err(cx.err(v, &path, "expected a positive price in USD per node-hour"));
                }
                s.max_hourly_cost = Some(c);
            }
            // Accepted for compatibility; they do not change placement.
            "accelerator_args" | "autostop" => {}
            _ => {}
        }
    }
    if let (Some(i), Some(_)) = (infra_node, legacy) {
        return Err(cx.err_hint(
            i,
            &join(parent, "infra"),
            "infra and cloud/region/zone cannot both be set",
            "keep infra: cloud/region/zone and remove the older fields",
        ));
    }
    if let (Some(it), Some(Accelerators::AnyOf(_) | Accelerators::Ordered(_))) =
        (&s.instance_type, &s.accelerators)
    {
        let node = fields
            .iter()
            .find(|(k, _, _)| *k == "accelerators")
            .map(|(_, k, _)| *k)
            .expect("accelerators was set from a field");
        return Err(cx.err_hint(
            node,
            &join(parent, "accelerators"),
            format!("a set or list of accelerators cannot be combined with instance_type '{it}'"),
            "use any_of with one instance_type per item",
        ));
    }
    Ok(s)
}

fn env_like_pairs(cx: &Cx, v: &Node, field: &str) -> R<Vec<(String, String)>> {
    let Kind::Map(items) = &v.kind else {
        return Err(cx.expected(v, field, "a mapping of key: value"));
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
    Err(cx.err_hint(v, field, format!("unknown cloud '{name}'"), hint))
}

fn infra(cx: &Cx, v: &Node, field: &str) -> R<Infra> {
    let Some(text) = cx.opt_string(v, field)? else {
        return Ok(Infra::default());
    };
    let parts: Vec<&str> = text.split('/').collect();
    if text.trim().is_empty() || parts.len() > 3 || parts.iter().any(|p| p.trim().is_empty()) {
        return Err(cx.err_hint(
            v,
            field,
            format!("expected cloud[/region[/zone]], found '{text}'"),
            "e.g. aws, aws/us-east-1, gcp/us-central1/us-central1-a, */us-east-1",
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
        return Err(cx.err_hint(
            v,
            field,
            format!("expected an accelerator name, found '{text}'"),
            hint,
        ));
    }
    let count = match (count_text, count) {
        (Some(_), Some(n)) if !matches!(n.kind, Kind::Null) => {
            return Err(cx.err_hint(
                n,
                field,
                format!("'{text}' already has a count"),
                hint,
            ))
        }
        (Some(c), _) => c.parse::<f32>().map_err(|_| {
            cx.err_hint(
                v,
                field,
                format!("expected a GPU count after ':', found '{c}'"),
                hint,
            )
        })?,
        (None, Some(n)) if !matches!(n.kind, Kind::Null) => cx.number(n, field)? as f32,
        _ => 1.0,
    };
    if !(count > 0.0 && count <= 64.0) {
        return Err(cx.err_hint(
            v,
            field,
            format!("expected a GPU count from 0 to 64, found {count}"),
            hint,
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

fn accelerators(cx: &Cx, v: &Node, field: &str) -> R<Option<Accelerators>> {
    match &v.kind {
        Kind::Null => Ok(None),
        Kind::Scalar { text, .. } => Ok(Some(Accelerators::One(accel_text(
            cx, v, field, text, None,
        )?))),
        Kind::Map(items) => {
            if items.is_empty() {
                return Err(cx.expected(v, field, "at least one accelerator"));
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
                return Err(cx.expected(v, field, "at least one accelerator"));
            }
            let mut out = Vec::new();
            for item in list {
                match &item.kind {
                    Kind::Scalar { text, .. } => out.push(accel_text(cx, item, field, text, None)?),
                    Kind::Map(pairs) if pairs.len() == 1 => {
                        out.extend(accel_pairs(cx, pairs, field)?)
                    }
                    _ => {
                        return Err(cx.err_hint(
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
        return Err(cx.expected(v, field, &format!("a number of {unit}, like 4 or \"4+\"")));
    };
    let t = text.trim();
    let (num, at_least) = match t.strip_suffix('+') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let num = num
        .strip_suffix("GB")
        .or_else(|| num.strip_suffix("GiB"))
        .unwrap_or(num)
        .trim();
    match num.parse::<f64>() {
        Ok(value) if value > 0.0 && value.is_finite() => Ok(Some(Quantity { value, at_least })),
        _ => Err(cx.err_hint(
            v,
            field,
            format!("expected a positive number of {unit}, found '{text}'"),
            format!("write e.g. 8 for exactly 8, or \"8+\" for at least 8 {unit}"),
        )),
    }
}

fn disk_size(cx: &Cx, v: &Node, field: &str) -> R<Option<u32>> {
    let Kind::Scalar { text, .. } = &v.kind else {
        if matches!(v.kind, Kind::Null) {
            return Ok(None);
        }
        return Err(cx.expected(v, field, "a disk size in GB"));
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
        _ => Err(cx.err_hint(
            v,
            field,
            format!("expected a disk size from 1 to 65536 GB, found '{text}'"),
            "write e.g. 256 or 1024GB",
        )),
    }
}

fn ports(cx: &Cx, v: &Node, field: &str) -> R<Vec<PortRange>> {
    let one = |n: &Node| -> R<PortRange> {
        let Kind::Scalar { text, .. } = &n.kind else {
            return Err(cx.expected(n, field, "a port like 8080 or a range like 8000-8010"));
        };
        let p = |s: &str| s.trim().parse::<u16>().ok().filter(|p| *p > 0);
        let range = match text.split_once('-') {
            Some((a, b)) => p(a).zip(p(b)).map(|(start, end)| PortRange { start, end }),
            None => p(text).map(|start| PortRange { start, end: start }),
        };
        match range {
            Some(r) if r.start <= r.end => Ok(r),
            _ => Err(cx.err_hint(
                n,
                field,
                format!("expected a port from 1 to 65535 or a range, found '{text}'"),
                "write e.g. 8080 or 8000-8010",
            )),
        }
    };
    match &v.kind {
        Kind::Null => Ok(Vec::new()),
        Kind::Seq(list) => list.iter().map(one).collect(),
        _ => Ok(vec![one(v)?]),
    }
}

fn job_recovery(cx: &Cx, v: &Node, field: &str) -> R<JobRecovery> {
    let strategy = |n: &Node, path: &str| -> R<Option<String>> {
        let Some(s) = cx.opt_string(n, path)? else {
            return Ok(None);
        };
        let up = s.to_ascii_uppercase();
        const STRATEGIES: &[&str] = &["FAILOVER", "EAGER_NEXT_REGION", "NONE"];
        if !STRATEGIES.contains(&up.as_str()) {
            return Err(cx.err_hint(
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
                &["strategy", "max_restarts_on_errors", "recover_on_exit_codes"],
            )? {
                let path = join(field, key);
                match key {
                    "strategy" => r.strategy = strategy(val, &path)?,
                    "max_restarts_on_errors" => {
                        r.max_restarts_on_errors = cx.whole(val, &path, 0, 1000)? as u32
                    }
                    _ => {
                        let codes: Vec<&Node> = match &val.kind {
                            Kind::Seq(l) => l.iter().collect(),
                            _ => vec![val],
                        };
                        for c in codes {
                            r.recover_on_exit_codes
                                .push(cx.whole(c, &path, 0, 255)? as i32);
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
            ))
        }
    }
    Ok(r)
}


/// Parses a command-line override the same way as the task field it
/// replaces, so `--gpus`, `--infra`, `--cpus` and `--memory` accept and
/// refuse exactly what a task file would.
pub fn flag(flag: &str, text: &str) -> Result<ResourceSpec, SpecError> {
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
