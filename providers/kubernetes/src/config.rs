//! `$GANGWAY_HOME/kubernetes.yaml`: which contexts of the kubeconfig
//! gangway may use and how it shapes pods there. Every key is optional; a
//! kubeconfig alone (`$KUBECONFIG`, else `~/.kube/config`) is enough.
//!
//! ```yaml
//! kubeconfig: ~/.kube/config        # default: $KUBECONFIG, else ~/.kube/config
//! allowed_contexts: [prod-gpu]      # default: the kubeconfig's current context
//! namespace: ml                     # default: the context's namespace, else default
//! image: ubuntu:24.04               # any image with bash, tar and python3 for the examples
//! price_per_gpu_hour: 0.0           # what the optimizer charges (0: already paid for)
//! price_per_node_hour: 0.0
//! gpu_label_keys: [nvidia.com/gpu.product, cloud.google.com/gke-accelerator]
//! gpu_names: {NVIDIA-H100-80GB-HBM3: H100}   # a label value the built-in reading misses
//! topology_label_keys: [topology.kubernetes.io/zone, cloud.google.com/gce-topology-block,
//!   cloud.google.com/gce-topology-subblock, cloud.google.com/gce-topology-host,
//!   topology.k8s.aws/network-node-layer-1, topology.k8s.aws/network-node-layer-2,
//!   topology.k8s.aws/network-node-layer-3]
//! tolerations:                      # added to every pod
//!   - {key: dedicated, operator: Equal, value: ml, effect: NoSchedule}
//! launch_timeout: 5m                # a pod still unschedulable after this fails the launch
//! not_ready_tolerance: 30s          # a pod's node NotReady this long is a preemption
//! queue: team-a                     # Kueue's LocalQueue for every context, or per context:
//! # queue: {prod-gpu: team-a, default: team-b}    (default: any other context)
//! # without it: the namespace's only LocalQueue (or the one named default), if Kueue is there
//! topology: cloud.google.com/gce-topology-block   # Kueue TAS: a gang's pods in one such domain
//! # topology: {preferred: cloud.google.com/gce-topology-block}   (as close as Kueue can)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gangway_yaml::{self as yaml, expand_home, Cx, Kind, LocatedError};

/// The file's name under `$GANGWAY_HOME`.
pub const FILE: &str = "kubernetes.yaml";

/// The default image: bash, tar, coreutils and util-linux's `setsid`;
/// python3 is not in it (tasks that need it install it in `setup`, or
/// name an image with it).
pub const DEFAULT_IMAGE: &str = "ubuntu:24.04";

/// Label keys that name a node's GPU product, in the order they are asked.
pub const DEFAULT_GPU_LABEL_KEYS: &[&str] =
    &["nvidia.com/gpu.product", "cloud.google.com/gke-accelerator"];

/// Label keys of a node's place in the network, root first.
pub const DEFAULT_TOPOLOGY_LABEL_KEYS: &[&str] = &[
    "topology.kubernetes.io/zone",
    "cloud.google.com/gce-topology-block",
    "cloud.google.com/gce-topology-subblock",
    "cloud.google.com/gce-topology-host",
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
];

/// Kueue's topology-aware scheduling asked of a gang's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Every pod in one domain of this node label (or not admitted).
    Required(String),
    /// In as few domains of this level as Kueue can.
    Preferred(String),
}

/// One toleration every pod gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Toleration {
    /// Taint key (empty with `Exists`: every taint).
    pub key: Option<String>,
    /// `Equal` or `Exists`.
    pub operator: Option<String>,
    /// Value, with `Equal`.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute`, or every effect.
    pub effect: Option<String>,
}

/// The parsed file (or the defaults, without one).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where it was read from (empty: no file).
    pub path: String,
    /// The kubeconfig, when the file names one.
    pub kubeconfig: Option<PathBuf>,
    /// Contexts gangway may use; empty: the current context.
    pub allowed_contexts: Vec<String>,
    /// Namespace; `None`: the context's, else `default`.
    pub namespace: Option<String>,
    /// Image of every pod.
    pub image: String,
    /// USD per GPU-hour.
    pub price_per_gpu_hour: f64,
    /// USD per node-hour, on top.
    pub price_per_node_hour: f64,
    /// Label keys naming the GPU product.
    pub gpu_label_keys: Vec<String>,
    /// Label value → gangway's GPU name, over the built-in reading.
    pub gpu_names: BTreeMap<String, String>,
    /// Label keys of the topology path, root first.
    pub topology_label_keys: Vec<String>,
    /// Tolerations every pod gets.
    pub tolerations: Vec<Toleration>,
    /// How long a launch waits for every pod to run.
    pub launch_timeout: Duration,
    /// How long a pod's node may be NotReady before the pod counts as lost.
    pub not_ready_tolerance: Duration,
    /// Kueue's LocalQueue by context (`default`: any other context).
    pub queues: BTreeMap<String, String>,
    /// Kueue's topology-aware scheduling of a gang.
    pub topology: Option<Topology>,
}

impl Config {
    /// The LocalQueue `kubernetes.yaml` names for `context`, if any.
    pub fn queue_for(&self, context: &str) -> Option<&str> {
        self.queues
            .get(context)
            .or_else(|| self.queues.get("default"))
            .map(String::as_str)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            path: String::new(),
            kubeconfig: None,
            allowed_contexts: Vec::new(),
            namespace: None,
            image: DEFAULT_IMAGE.into(),
            price_per_gpu_hour: 0.0,
            price_per_node_hour: 0.0,
            gpu_label_keys: DEFAULT_GPU_LABEL_KEYS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            gpu_names: BTreeMap::new(),
            topology_label_keys: DEFAULT_TOPOLOGY_LABEL_KEYS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            tolerations: Vec::new(),
            launch_timeout: Duration::from_secs(300),
            not_ready_tolerance: Duration::from_secs(30),
            queues: BTreeMap::new(),
            topology: None,
        }
    }
}

const KEYS: &[&str] = &[
    "kubeconfig",
    "allowed_contexts",
    "namespace",
    "image",
    "price_per_gpu_hour",
    "price_per_node_hour",
    "gpu_label_keys",
    "gpu_names",
    "topology_label_keys",
    "tolerations",
    "launch_timeout",
    "not_ready_tolerance",
    "queue",
    "topology",
];

const TOLERATION_KEYS: &[&str] = &["key", "operator", "value", "effect"];

/// Seconds (`600`) or `30s`, `10m`, `2h`.
pub use gangway_yaml::parse_duration;

fn list(cx: &Cx<'_>, v: &yaml::Node, field: &str) -> Result<Vec<String>, LocatedError> {
    match &v.kind {
        Kind::Seq(items) => items.iter().map(|i| cx.text(i, field)).collect(),
        Kind::Scalar { .. } => Ok(vec![cx.text(v, field)?]),
        _ => Err(cx.err(
            v,
            field,
            format!("expected a list, found {}", v.describe()),
            Some("write e.g. [a, b]"),
        )),
    }
}

/// Parses the file's text.
pub fn parse(text: &str, file: &str) -> Result<Config, LocatedError> {
    let cx = Cx { file };
    let docs = yaml::parse(text).map_err(|e| LocatedError::from_yaml(file, e))?;
    let mut c = Config {
        path: file.to_string(),
        ..Config::default()
    };
    let Some(root) = docs.docs.first() else {
        return Ok(c);
    };
    if matches!(root.kind, Kind::Null) {
        return Ok(c);
    }
    for (k, v) in cx.map(root, "")? {
        let key = cx.key(k, "")?;
        let field = key.clone();
        let number = |v: &yaml::Node| -> Result<f64, LocatedError> {
            let t = cx.text(v, &field)?;
            t.parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| {
                    cx.err(
                        v,
                        &field,
                        format!("'{t}' is not a price"),
                        Some("write USD per hour, e.g. 2.5"),
                    )
                })
        };
        let duration = |v: &yaml::Node| -> Result<Duration, LocatedError> {
            let t = cx.text(v, &field)?;
            parse_duration(&t).ok_or_else(|| {
                cx.err(
                    v,
                    &field,
                    format!("'{t}' is not a duration"),
                    Some("write seconds (600) or 10m, 2h"),
                )
            })
        };
        match key.as_str() {
            "kubeconfig" => {
                c.kubeconfig = Some(PathBuf::from(expand_home(&cx.text(v, &field)?)));
            }
            "allowed_contexts" => c.allowed_contexts = list(&cx, v, &field)?,
            "namespace" => c.namespace = Some(cx.text(v, &field)?),
            "image" => c.image = cx.text(v, &field)?,
            "price_per_gpu_hour" => c.price_per_gpu_hour = number(v)?,
            "price_per_node_hour" => c.price_per_node_hour = number(v)?,
            "gpu_label_keys" => c.gpu_label_keys = list(&cx, v, &field)?,
            "topology_label_keys" => c.topology_label_keys = list(&cx, v, &field)?,
            "gpu_names" => {
                for (gk, gv) in cx.map(v, &field)? {
                    let label = cx.key(gk, &field)?;
                    let name = cx.text(gv, &format!("{field}.{label}"))?;
                    c.gpu_names.insert(label, name);
                }
            }
            "tolerations" => {
                let Kind::Seq(items) = &v.kind else {
                    return Err(cx.err(
                        v,
                        &field,
                        format!("expected a list, found {}", v.describe()),
                        Some("write - {key: dedicated, operator: Equal, value: ml, effect: NoSchedule}"),
                    ));
                };
                for (i, item) in items.iter().enumerate() {
                    let tf = format!("{field}[{i}]");
                    let mut t = Toleration::default();
                    for (tk, tv) in cx.map(item, &tf)? {
                        let name = cx.key(tk, &tf)?;
                        let val = Some(cx.text(tv, &format!("{tf}.{name}"))?);
                        match name.as_str() {
                            "key" => t.key = val,
                            "operator" => {
                                if !matches!(val.as_deref(), Some("Equal" | "Exists")) {
                                    return Err(cx.err(
                                        tv,
                                        &format!("{tf}.operator"),
                                        "operator is Equal or Exists",
                                        None,
                                    ));
                                }
                                t.operator = val
                            }
                            "value" => t.value = val,
                            "effect" => {
                                if !matches!(
                                    val.as_deref(),
                                    Some("NoSchedule" | "PreferNoSchedule" | "NoExecute")
                                ) {
                                    return Err(cx.err(
                                        tv,
                                        &format!("{tf}.effect"),
                                        "effect is NoSchedule, PreferNoSchedule or NoExecute",
                                        None,
                                    ));
                                }
                                t.effect = val
                            }
                            other => return Err(cx.unknown(tk, &tf, other, TOLERATION_KEYS)),
                        }
                    }
                    c.tolerations.push(t);
                }
            }
            "launch_timeout" => c.launch_timeout = duration(v)?,
            "not_ready_tolerance" => c.not_ready_tolerance = duration(v)?,
            "queue" => match &v.kind {
                Kind::Map(_) => {
                    for (qk, qv) in cx.map(v, &field)? {
                        let context = cx.key(qk, &field)?;
                        let q = cx.text(qv, &format!("{field}.{context}"))?;
                        c.queues.insert(context, q);
                    }
                }
                _ => {
                    c.queues.insert("default".into(), cx.text(v, &field)?);
                }
            },
            "topology" => {
                c.topology = Some(match &v.kind {
                    Kind::Map(_) => {
                        let entries = cx.map(v, &field)?;
                        let [(tk, tv)] = entries else {
                            return Err(cx.err(
                                v,
                                &field,
                                "one of required or preferred",
                                Some("write {required: LABEL} or {preferred: LABEL}"),
                            ));
                        };
                        let mode = cx.key(tk, &field)?;
                        let level = cx.text(tv, &format!("{field}.{mode}"))?;
                        match mode.as_str() {
                            "required" => Topology::Required(level),
                            "preferred" => Topology::Preferred(level),
                            other => {
                                return Err(cx.unknown(
                                    tk,
                                    &field,
                                    other,
                                    &["required", "preferred"],
                                ))
                            }
                        }
                    }
                    _ => Topology::Required(cx.text(v, &field)?),
                })
            }
            other => return Err(cx.unknown(k, "", other, KEYS)),
        }
    }
    Ok(c)
}

/// Where the file lives.
pub fn path(home: &Path) -> PathBuf {
    home.join(FILE)
}

/// The kubeconfig gangway reads: the file's `kubeconfig`, else
/// `$KUBECONFIG` (its first entry), else `~/.kube/config`; `None` when
/// none of them is there.
pub fn kubeconfig_path(c: &Config) -> Option<PathBuf> {
    if let Some(p) = &c.kubeconfig {
        return Some(p.clone());
    }
    if let Some(v) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let first = std::env::split_paths(&v).next()?;
        return Some(first);
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".kube/config");
    p.is_file().then_some(p)
}

/// Reads `$GANGWAY_HOME/kubernetes.yaml`: `Ok(None)` when there is
/// neither that file nor a kubeconfig (the provider is then off).
pub fn load(home: &Path) -> Result<Option<Config>, LocatedError> {
    let p = path(home);
    let c = match std::fs::read_to_string(&p) {
        Ok(text) => parse(&text, &p.display().to_string())?,
        Err(_) => Config::default(),
    };
    if c.path.is_empty() && kubeconfig_path(&c).is_none() {
        return Ok(None);
    }
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_and_defaults_hold() {
        let c = parse(
            "kubeconfig: /k/config\nallowed_contexts: [a, b]\nnamespace: ml\nimage: img:1\n\
             price_per_gpu_hour: 1.5\nprice_per_node_hour: 0.25\ngpu_label_keys: [x/gpu]\n\
             gpu_names: {NVIDIA-H100-80GB-HBM3: H100}\ntopology_label_keys: [t/a, t/b]\n\
             tolerations:\n  - {key: dedicated, operator: Equal, value: ml, effect: NoSchedule}\n\
             launch_timeout: 2m\nnot_ready_tolerance: 10s\n",
            "kubernetes.yaml",
        )
        .unwrap();
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/k/config")));
        assert_eq!(c.allowed_contexts, ["a", "b"]);
        assert_eq!(c.namespace.as_deref(), Some("ml"));
        assert_eq!((c.price_per_gpu_hour, c.price_per_node_hour), (1.5, 0.25));
        assert_eq!(c.gpu_names["NVIDIA-H100-80GB-HBM3"], "H100");
        assert_eq!(c.topology_label_keys, ["t/a", "t/b"]);
        assert_eq!(c.tolerations[0].effect.as_deref(), Some("NoSchedule"));
        assert_eq!(c.launch_timeout, Duration::from_secs(120));
        assert_eq!(c.not_ready_tolerance, Duration::from_secs(10));
        let d = parse("", "k.yaml").unwrap();
        assert_eq!(d.image, DEFAULT_IMAGE);
        assert_eq!(d.gpu_label_keys, DEFAULT_GPU_LABEL_KEYS);
        assert_eq!(d.launch_timeout, Duration::from_secs(300));
        assert_eq!(d.queue_for("any"), None);
        assert_eq!(d.topology, None);
    }

    #[test]
    fn kueue_queue_and_topology() {
        let c = parse(
            "queue: team-a\ntopology: cloud.google.com/gce-topology-block\n",
            "k.yaml",
        )
        .unwrap();
        assert_eq!(c.queue_for("any"), Some("team-a"));
        assert_eq!(
            c.topology,
            Some(Topology::Required(
                "cloud.google.com/gce-topology-block".into()
            ))
        );
        let c = parse(
            "queue: {prod: q1, default: q2}\ntopology: {preferred: t/block}\n",
            "k.yaml",
        )
        .unwrap();
        assert_eq!(c.queue_for("prod"), Some("q1"));
        assert_eq!(c.queue_for("dev"), Some("q2"));
        assert_eq!(c.topology, Some(Topology::Preferred("t/block".into())));
        let c = parse("queue: {prod: q1}\n", "k.yaml").unwrap();
        assert_eq!(c.queue_for("dev"), None);
        let e = parse("topology: {strict: t/block}\n", "k.yaml").unwrap_err();
        assert_eq!(e.field, "topology", "{e}");
        assert!(e.hint.as_deref().unwrap_or("").contains("required"), "{e}");
    }

    #[test]
    fn mistakes_are_located() {
        let e = parse("namespace: ml\nlaunch_timout: 5m\n", "k.yaml").unwrap_err();
        assert_eq!((e.line, e.col), (2, 1), "{e}");
        assert!(
            e.hint.as_deref().unwrap_or("").contains("launch_timeout"),
            "{e}"
        );
        let e = parse("launch_timeout: soon\n", "k.yaml").unwrap_err();
        assert_eq!(e.field, "launch_timeout");
        assert!(e.message.contains("not a duration"), "{e}");
        let e = parse("tolerations:\n  - {key: a, effect: Never}\n", "k.yaml").unwrap_err();
        assert_eq!(e.field, "tolerations[0].effect", "{e}");
        let e = parse("price_per_gpu_hour: -1\n", "k.yaml").unwrap_err();
        assert!(e.message.contains("not a price"), "{e}");
    }
}
