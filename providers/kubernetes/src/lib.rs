//! The `kubernetes` provider (`infra: k8s[/CONTEXT[/NAMESPACE]]`, or
//! SkyPilot's `kubernetes`): a cluster's nodes are pods, one per node.
//!
//! Region = the kubeconfig context, zone = the namespace: what a launch
//! needs to know where to create pods, and what `infra:` can pin. The
//! Kubernetes node a pod landed on gives the rest: its zone and network
//! labels are the pod's topology path (root first, the node's name last).
//!
//! A launch creates the shortfall of pods labelled with the cluster
//! (`gangway-cluster`), the owner id (`gangway-owner`) and the user
//! (`gangway-user`), each asking for the GPUs, CPUs and memory of the
//! catalog's shape, restricted to nodes with the GPU product by node
//! affinity, with `restartPolicy: Never` and a command that sleeps until
//! SIGTERM. It waits until every pod runs with an IP; a pod still
//! unschedulable after `launch_timeout` makes it delete every pod of the
//! cluster (and wait until they are gone) and fail with the scheduler's
//! words as [`ErrorKind::Capacity`], so failover moves on. Where the
//! namespace has a Kueue LocalQueue the gang is one Kueue pod group,
//! admitted whole or not at all ([`kueue`]).
//!
//! A gang that lost pods keeps the others: `remove_nodes` deletes only
//! the lost pods, and the launch that follows creates only the shortfall
//! under unused names, preferring the survivors' topology domain, or, under
//! Kueue, as new members of the gang's admitted pod group. Such a launch
//! that fails deletes only the pods it created.
//!
//! Commands reach pods through the API's `pods/exec` (the transport), so
//! any image with a shell works: no SSH, no privileges, no secret in the
//! pod spec. Pods cannot be stopped: `stop` refuses.
#![deny(missing_docs)]

pub mod config;
pub mod kueue;
pub mod names;
mod rt;
mod transport;

pub use transport::ExecTransport;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_provider::{
    Capacity, CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState,
    Offer, Placement, Provider, ProviderError, Result, TaggedCluster,
};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use config::Config;
use names::Shape;

/// The provider's name in `infra:` and the catalog.
pub const NAME: &str = "kubernetes";

/// Labels and annotations on everything a launch creates.
pub mod labels {
    /// The cluster's name (or a hash of it, where it is no label value).
    pub const CLUSTER: &str = "gangway-cluster";
    /// The launching installation's owner id.
    pub const OWNER: &str = "gangway-owner";
    /// The launching user.
    pub const USER: &str = "gangway-user";
    /// The cluster's exact name.
    pub const CLUSTER_NAME: &str = "gangway.dev/cluster-name";
    /// The user's exact name.
    pub const USER_NAME: &str = "gangway.dev/user";
    /// The catalog's instance type the pod was made for.
    pub const INSTANCE_TYPE: &str = "gangway.dev/instance-type";
    /// The number the gang's next new pod takes (`PREFIX-N`).
    pub const NEXT_INDEX: &str = "gangway.dev/next-index";
}

/// Facts on every node (read by the transport).
pub mod keys {
    /// The kubeconfig context.
    pub const CONTEXT: &str = "k8s.context";
    /// The namespace.
    pub const NAMESPACE: &str = "k8s.namespace";
    /// The Kubernetes node the pod runs on.
    pub const NODE: &str = "k8s.node";
    /// The pod's `$HOME`.
    pub const HOME: &str = "home";
}

/// The container every pod runs (and every exec names).
pub const CONTAINER: &str = "main";

/// The pods' command: sleep until SIGTERM, then exit at once.
const SLEEPER: &str = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done";

/// The share of a node's allocatable CPU and memory a full-node pod asks
/// for: the rest is left to the node's own daemons (device plugins, log
/// agents), which real clusters always run.
const REQUEST_SHARE: f64 = 0.9;

/// Taints on nodes about to go away (GKE's spot termination, Karpenter's
/// disruption): their pods' notice.
const LEAVING_TAINTS: &[&str] = &[
    "cloud.google.com/impending-node-termination",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "aws-node-termination-handler/spot-itn",
];

/// Says how a launch is going.
pub type Progress = Box<dyn Fn(&str) + Send + Sync>;

fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::new(kind, NAME, location, message)
}

/// What a kube error means to the failover loop.
fn api_err(location: &str, what: &str, e: kube::Error) -> ProviderError {
    let kind = match &e {
        kube::Error::Api(s) => match s.code {
            401 | 403 => ErrorKind::Auth,
            400 | 404 | 409 | 422 => ErrorKind::InvalidRequest,
            429 | 500..=599 => ErrorKind::Transient,
            _ => ErrorKind::Fatal,
        },
        kube::Error::Auth(_) => ErrorKind::Auth,
        kube::Error::HyperError(_) | kube::Error::Service(_) => ErrorKind::Transient,
        _ => ErrorKind::Fatal,
    };
    let words = match &e {
        kube::Error::Api(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        other => gangway_provider::error_chain(other),
    };
    err(kind, location, format!("{what}: {words}"))
}

/// The kubeconfig and the clients made from it, one per context.
pub(crate) struct Shared {
    cfg: Config,
    kubeconfig: Option<PathBuf>,
    clients: tokio::sync::Mutex<HashMap<String, kube::Client>>,
}

impl Shared {
    fn new(cfg: Config) -> Shared {
        Shared {
            kubeconfig: config::kubeconfig_path(&cfg),
            cfg,
            clients: tokio::sync::Mutex::default(),
        }
    }

    fn read_kubeconfig(&self) -> Result<Kubeconfig> {
        let Some(p) = &self.kubeconfig else {
            return Err(err(
                ErrorKind::Auth,
                "",
                "no kubeconfig: set KUBECONFIG, write ~/.kube/config, or name one as kubeconfig: in $GANGWAY_HOME/kubernetes.yaml",
            ));
        };
        Kubeconfig::read_from(p).map_err(|e| {
            err(
                ErrorKind::Auth,
                "",
                format!(
                    "cannot read the kubeconfig {}: {}",
                    p.display(),
                    gangway_provider::error_chain(&e)
                ),
            )
        })
    }

    /// The (context, namespace) pairs gangway may use: the allowed
    /// contexts (else the current one) with the configured namespace, else
    /// the context's own, else `default`.
    fn places(&self) -> Result<Vec<(String, String)>> {
        let kc = self.read_kubeconfig()?;
        let names: Vec<String> = if self.cfg.allowed_contexts.is_empty() {
            match &kc.current_context {
                Some(c) if !c.is_empty() => vec![c.clone()],
                _ => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        "",
                        "the kubeconfig has no current-context; name the contexts to use as allowed_contexts: in $GANGWAY_HOME/kubernetes.yaml",
                    ))
                }
            }
        } else {
            self.cfg.allowed_contexts.clone()
        };
        let mut out = Vec::new();
        for name in names {
            let Some(ctx) = kc.contexts.iter().find(|c| c.name == name) else {
                return Err(err(
                    ErrorKind::InvalidRequest,
                    &name,
                    format!(
                        "no context '{name}' in the kubeconfig (it has: {})",
                        kc.contexts
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            let ns = self
                .cfg
                .namespace
                .clone()
                .or_else(|| ctx.context.as_ref().and_then(|c| c.namespace.clone()))
                .unwrap_or_else(|| "default".into());
            out.push((name, ns));
        }
        Ok(out)
    }

    /// A new client for `context` (on the current runtime).
    async fn new_client(&self, context: &str) -> Result<kube::Client> {
        let kc = self.read_kubeconfig()?;
        let opts = KubeConfigOptions {
            context: Some(context.to_string()),
            ..KubeConfigOptions::default()
        };
        let conf = kube::Config::from_custom_kubeconfig(kc, &opts)
            .await
            .map_err(|e| {
                err(
                    ErrorKind::Auth,
                    context,
                    format!(
                        "context '{context}' of the kubeconfig: {}",
                        gangway_provider::error_chain(&e)
                    ),
                )
            })?;
        kube::Client::try_from(conf).map_err(|e| api_err(context, "cannot make a client", e))
    }

    /// The client for `context` (made once, on the provider's runtime).
    async fn client(&self, context: &str) -> Result<kube::Client> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(context) {
            return Ok(c.clone());
        }
        let c = self.new_client(context).await?;
        clients.insert(context.to_string(), c.clone());
        Ok(c)
    }

    /// gangway's name for the GPU a node carries, if any.
    fn node_gpu(&self, n: &core::Node) -> Option<(String, String, String)> {
        let labels = n.metadata.labels.as_ref()?;
        self.cfg.gpu_label_keys.iter().find_map(|k| {
            let v = labels.get(k)?;
            let name = self
                .cfg
                .gpu_names
                .get(v)
                .cloned()
                .unwrap_or_else(|| names::gpu_name(v));
            Some((name, k.clone(), v.clone()))
        })
    }

    /// A node's topology path: the configured labels it has, root first,
    /// then its name.
    fn topology(&self, n: Option<&core::Node>, node_name: &str) -> Vec<String> {
        let mut path: Vec<String> = n
            .and_then(|n| n.metadata.labels.as_ref())
            .map(|l| {
                self.cfg
                    .topology_label_keys
                    .iter()
                    .filter_map(|k| l.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default();
        if !node_name.is_empty() {
            path.push(node_name.to_string());
        }
        path
    }

    /// Whether pods asking for GPUs (`gpu`) may land on `n` given its
    /// taints and the configured tolerations.
    fn tolerates(&self, n: &core::Node, gpu: bool) -> bool {
        let taints = n.spec.as_ref().and_then(|s| s.taints.as_ref());
        taints.is_none_or(|ts| {
            ts.iter().all(|t| {
                t.effect == "PreferNoSchedule"
                    || gpu && t.key == "nvidia.com/gpu"
                    || self.cfg.tolerations.iter().any(|tol| {
                        let key_ok = tol.key.as_ref().is_none_or(|k| *k == t.key);
                        let effect_ok = tol.effect.as_ref().is_none_or(|e| *e == t.effect);
                        let value_ok = tol.operator.as_deref() == Some("Exists")
                            || tol.value.as_deref().unwrap_or("")
                                == t.value.as_deref().unwrap_or("");
                        key_ok && effect_ok && value_ok
                    })
            })
        })
    }

    /// The catalog's offers from `nodes` in (context, namespace): per
    /// schedulable, Ready node shape, every GPU count up to its
    /// allocatable GPUs, with that share of its CPU and memory.
    fn offers(&self, context: &str, namespace: &str, nodes: &[core::Node]) -> Vec<Offer> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for n in nodes {
            if n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) || !is_ready(n) {
                continue;
            }
            let alloc = allocatable(n);
            let gpus = alloc.gpus.floor() as u32;
            let gpu = self.node_gpu(n).filter(|_| gpus > 0);
            if !self.tolerates(n, gpu.is_some()) {
                continue;
            }
            let counts: Vec<u32> = if gpu.is_some() {
                (1..=gpus.min(64)).collect()
            } else {
                vec![0]
            };
            for k in counts {
                let share = if k == 0 {
                    REQUEST_SHARE
                } else {
                    REQUEST_SHARE * f64::from(k) / f64::from(gpus)
                };
                let shape = Shape {
                    gpu: gpu.as_ref().map(|g| (g.0.clone(), k)),
                    cpus: ((alloc.cpus * share) * 10.0).floor() / 10.0,
                    memory_gib: ((alloc.memory_gib * share) * 10.0).floor() / 10.0,
                };
                if shape.cpus <= 0.0 || shape.memory_gib <= 0.0 {
                    continue;
                }
                let it = shape.instance_type();
                if !seen.insert(it.clone()) {
                    continue;
                }
                out.push(Offer {
                    instance_type: it,
                    accelerator: shape.gpu.as_ref().map(|g| g.0.clone()),
                    accelerator_count: k as f32,
                    vcpus: shape.cpus as f32,
                    memory_gib: shape.memory_gib as f32,
                    region: context.to_string(),
                    zone: namespace.to_string(),
                    price: self.cfg.price_per_gpu_hour * f64::from(k)
                        + self.cfg.price_per_node_hour,
                });
            }
        }
        out
    }
}

/// A node's allocatable GPUs, CPUs and memory (GiB).
struct Alloc {
    gpus: f64,
    cpus: f64,
    memory_gib: f64,
}

fn allocatable(n: &core::Node) -> Alloc {
    let a = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |k: &str| {
        a.and_then(|a| a.get(k))
            .map(|q| q.0.as_str())
            .unwrap_or("0")
    };
    Alloc {
        gpus: quantity(get("nvidia.com/gpu")).unwrap_or(0.0),
        cpus: quantity(get("cpu")).unwrap_or(0.0),
        memory_gib: quantity(get("memory")).unwrap_or(0.0) / (1024.0 * 1024.0 * 1024.0),
    }
}

/// A Kubernetes quantity as a number (`500m` = 0.5, `16Gi`, `1k`, `2e3`).
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(num * mult)
}

fn is_ready(n: &core::Node) -> bool {
    ready_condition(n).is_some_and(|c| c.status == "True")
}

fn ready_condition(n: &core::Node) -> Option<&core::NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

fn is_spot(n: &core::Node) -> bool {
    n.metadata.labels.as_ref().is_some_and(|l| {
        l.get("cloud.google.com/gke-spot")
            .is_some_and(|v| v == "true")
            || l.get("cloud.google.com/gke-preemptible")
                .is_some_and(|v| v == "true")
            || l.get("karpenter.sh/capacity-type")
                .is_some_and(|v| v == "spot")
            || l.get("eks.amazonaws.com/capacityType")
                .is_some_and(|v| v == "SPOT")
    })
}

/// What a pod's state means to gangway: `node` is the Kubernetes node it
/// is bound to (`None` when that node is gone), `tolerance` how long the
/// node may be NotReady. A pod on a node tainted as leaving still runs:
/// the taint is its notice ([`leaving`], read by the transport), which
/// gives the run its `checkpoint.signal` first; were it a loss here, the
/// managed-job controller could see it before the notice and recover
/// from the last kept checkpoint instead.
pub fn pod_state(
    pod: &core::Pod,
    node: Option<Option<&core::Node>>,
    tolerance: Duration,
) -> NodeState {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("");
    if pod.metadata.deletion_timestamp.is_some() {
        return NodeState::Preempted {
            reason: format!("pod {name} is being deleted (not by gangway)"),
        };
    }
    match phase {
        "Failed" | "Succeeded" => {
            let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
            let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
            return NodeState::Preempted {
                reason: if reason == "Evicted" {
                    format!("pod {name} was evicted from node {node_name}: {message}")
                } else if !reason.is_empty() || !message.is_empty() {
                    format!("pod {name} ended ({phase}): {reason} {message}")
                        .trim_end()
                        .to_string()
                } else {
                    format!("pod {name} ended ({phase})")
                },
            };
        }
        "Running" => {}
        _ => return NodeState::Pending,
    }
    match node {
        // Not asked.
        None => NodeState::Running,
        Some(None) => NodeState::Preempted {
            reason: format!("pod {name}'s node {node_name} is gone"),
        },
        Some(Some(n)) => {
            let spot = if is_spot(n) { "spot " } else { "" };
            match ready_condition(n) {
                Some(c) if c.status != "True" => {
                    let since = c.last_transition_time.as_ref().map(|t| t.0);
                    let long = since.is_none_or(|s| {
                        let now = k8s_openapi::jiff::Timestamp::now();
                        now.duration_since(s).as_secs() as u64 >= tolerance.as_secs()
                    });
                    if long {
                        NodeState::Preempted {
                            reason: format!(
                                "pod {name}'s {spot}node {node_name} is NotReady ({}: {})",
                                c.reason.as_deref().unwrap_or(""),
                                c.message.as_deref().unwrap_or("")
                            ),
                        }
                    } else {
                        NodeState::Running
                    }
                }
                _ => NodeState::Running,
            }
        }
    }
}

/// The notice of a pod whose node is tainted as about to go away
/// ([`LEAVING_TAINTS`]: GKE's spot termination, Karpenter's disruption).
pub fn leaving(pod: &core::Pod, node: Option<&core::Node>) -> Option<String> {
    let n = node?;
    let t = n
        .spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| LEAVING_TAINTS.contains(&t.key.as_str()))?;
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let node_name = n.metadata.name.as_deref().unwrap_or("?");
    let spot = if is_spot(n) { "spot " } else { "" };
    Some(format!(
        "pod {name}'s {spot}node {node_name} is being reclaimed (taint {})",
        t.key
    ))
}

/// The scheduler's words for a pod that is not scheduled, if any.
fn unschedulable(pod: &core::Pod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(
        c.message
            .clone()
            .or_else(|| c.reason.clone())
            .unwrap_or_else(|| "not scheduled".into()),
    )
}

/// Why a pod's container is not running yet (`ErrImagePull`: message).
fn waiting(pod: &core::Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let r = w.reason.clone().unwrap_or_default();
            (r != "ContainerCreating" && !r.is_empty())
                .then(|| format!("{r}: {}", w.message.clone().unwrap_or_default()))
        })
}

/// The keys a task may set under `config.kubernetes`.
pub const TASK_KEYS: &[&str] = &["image", "launch_timeout"];

/// Refuses unknown keys and wrong types in a task's `config.kubernetes`.
pub fn check_task_config(cfg: Option<&serde_json::Value>) -> std::result::Result<(), String> {
    let Some(cfg) = cfg else { return Ok(()) };
    let Some(map) = cfg.as_object() else {
        return Err("config.kubernetes must be a mapping".into());
    };
    for (k, v) in map {
        let ok = match k.as_str() {
            "image" => v.is_string(),
            "launch_timeout" => {
                v.as_u64().is_some() || v.as_str().and_then(config::parse_duration).is_some()
            }
            _ => {
                return Err(format!(
                    "config.kubernetes.{k} is not a setting (known: {})",
                    TASK_KEYS.join(", ")
                ))
            }
        };
        if !ok {
            return Err(format!("config.kubernetes.{k}: {v} is not a valid value"));
        }
    }
    Ok(())
}

struct Inner {
    shared: Arc<Shared>,
    owner: String,
    user: String,
    progress: Progress,
    poll: Duration,
}

/// The provider.
pub struct KubernetesProvider {
    inner: Arc<Inner>,
}

impl KubernetesProvider {
    /// A provider with this configuration, tagging with `owner` and
    /// `user`; progress goes to stderr.
    pub fn new(cfg: Config, owner: &str, user: &str) -> KubernetesProvider {
        KubernetesProvider {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared::new(cfg)),
                owner: owner.to_string(),
                user: user.to_string(),
                progress: Box::new(|line| eprintln!("  {line}")),
                poll: Duration::from_secs(1),
            }),
        }
    }

    /// Where progress lines go (before the provider is shared).
    pub fn with_progress(mut self, progress: Progress) -> KubernetesProvider {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.progress = progress;
        }
        self
    }

    /// Runs `f` with the provider's state on its own runtime.
    async fn on_rt<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let fut = f(self.inner.clone());
        rt::run(fut)
            .await
            .map_err(|e| err(ErrorKind::Fatal, "", e))?
    }
}

impl Inner {
    fn selector(&self, cluster: &str) -> String {
        format!(
            "{}={},{}={}",
            labels::CLUSTER,
            names::label_value(cluster),
            labels::OWNER,
            names::label_value(&self.owner)
        )
    }

    async fn pods(&self, context: &str, namespace: &str) -> Result<Api<core::Pod>> {
        Ok(Api::namespaced(
            self.shared.client(context).await?,
            namespace,
        ))
    }

    async fn list(
        &self,
        api: &Api<core::Pod>,
        loc: &str,
        selector: &str,
    ) -> Result<Vec<core::Pod>> {
        Ok(api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| api_err(loc, "cannot list pods", e))?
            .items)
    }

    /// Deletes the pods of `selector` (`only`: those of these names) and
    /// waits (up to 2 minutes) until none of them is left; `now`: no grace
    /// period.
    ///
    /// `whole`: they are the whole gang. A Kueue pod group among them is
    /// ended first: every pod of it is marked `retriable-in-group: "false"`
    /// (Kueue's way to end a group), so Kueue finishes the Workload, lifts
    /// its finalizers once the pods have ended and releases the quota.
    /// Otherwise they are single pods of a gang that goes on: Kueue's
    /// finalizer is lifted from each once its deletion is under way. Kueue
    /// would hold a deleted pod of a retriable group until the pod reads
    /// Failed (on a node that is gone: podgc, 40 s or more later) and count
    /// it as one of the group meanwhile, and the replacement that then
    /// joins would be the excess pod it deletes.
    async fn delete_and_wait(
        &self,
        api: &Api<core::Pod>,
        loc: &str,
        selector: &str,
        only: Option<&BTreeSet<String>>,
        now: bool,
        whole: bool,
    ) -> Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: now.then_some(0),
            ..DeleteParams::default()
        };
        let pick = |p: &core::Pod| {
            let n = p.metadata.name.clone().unwrap_or_default();
            only.is_none_or(|o| o.contains(&n)).then_some(n)
        };
        let listed = self.list(api, loc, selector).await?;
        if whole {
            // The group of any pod to delete ends: every pod of it is
            // marked, those of the group this deletion does not name too
            // (a group is one Workload; a gang never shares its group).
            let groups: BTreeSet<&str> = listed
                .iter()
                .filter(|p| pick(p).is_some())
                .filter_map(kueue::group_of)
                .collect();
            for p in &listed {
                if !kueue::group_of(p).is_some_and(|g| groups.contains(g)) || kueue::unretriable(p)
                {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let mark = serde_json::json!({"metadata": {"annotations": {
                    kueue::RETRIABLE_ANNOTATION: "false"
                }}});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&mark))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(api_err(
                            loc,
                            &format!(
                                "cannot end Kueue pod group {} (marking pod {name} {}: \"false\")",
                                kueue::group_of(p).unwrap_or(""),
                                kueue::RETRIABLE_ANNOTATION
                            ),
                            e,
                        ))
                    }
                }
            }
        }
        for p in &listed {
            let Some(name) = pick(p) else { continue };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_err(loc, &format!("cannot delete pod {name}"), e)),
            }
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        let mut forced = now;
        let mut pause = Duration::from_millis(100);
        loop {
            let left: Vec<core::Pod> = self
                .list(api, loc, selector)
                .await?
                .into_iter()
                .filter(|p| pick(p).is_some())
                .collect();
            if left.is_empty() {
                return Ok(());
            }
            let names: Vec<String> = left.iter().filter_map(pick).collect();
            if !whole {
                for p in left
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_some() && kueue::finalized(p))
                {
                    self.lift_kueue_finalizer(api, loc, p).await?;
                }
            }
            // A pod whose kubelet is gone (its node deleted or cut off)
            // never confirms a graceful deletion: past the pods' own grace
            // period it is deleted without one.
            if !forced && started.elapsed() > Duration::from_secs(12) {
                forced = true;
                let force = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                for name in &names {
                    match api.delete(name, &force).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            return Err(api_err(loc, &format!("cannot delete pod {name}"), e))
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(err(
                    ErrorKind::Transient,
                    loc,
                    format!(
                        "pods still there 120 s after their deletion: {}",
                        names.join(", ")
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.poll);
        }
    }

    /// Lifts Kueue's finalizer from a pod being deleted (its other
    /// finalizers stay; a pod changed meanwhile is left to the next try).
    async fn lift_kueue_finalizer(
        &self,
        api: &Api<core::Pod>,
        loc: &str,
        p: &core::Pod,
    ) -> Result<()> {
        let name = p.metadata.name.clone().unwrap_or_default();
        let rest: Vec<&String> = p
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != kueue::FINALIZER)
            .collect();
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": p.metadata.resource_version,
            "finalizers": rest,
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(api_err(
                loc,
                &format!("cannot lift Kueue's finalizer from pod {name}"),
                e,
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn pod_spec(
        &self,
        req: &LaunchRequest,
        name: &str,
        namespace: &str,
        shape: &Shape,
        image: &str,
        gpu_labels: &[(String, String)],
        prefer: &[(String, String)],
        next: u32,
        group: Option<&kueue::Group>,
    ) -> core::Pod {
        let cluster = &req.cluster.0;
        let mut labels = BTreeMap::new();
        labels.insert(labels::CLUSTER.to_string(), names::label_value(cluster));
        labels.insert(labels::OWNER.to_string(), names::label_value(&self.owner));
        labels.insert(labels::USER.to_string(), names::label_value(&self.user));
        labels.insert("app.kubernetes.io/managed-by".into(), "gangway".into());
        let mut ann = BTreeMap::new();
        ann.insert(labels::CLUSTER_NAME.to_string(), cluster.clone());
        ann.insert(labels::USER_NAME.to_string(), self.user.clone());
        ann.insert(labels::INSTANCE_TYPE.to_string(), req.instance_type.clone());
        ann.insert(labels::NEXT_INDEX.to_string(), next.to_string());
        if let Some(g) = group {
            g.mark(&mut labels, &mut ann);
        }
        let mut requests = BTreeMap::new();
        let mut limits = BTreeMap::new();
        requests.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (shape.cpus * 1000.0).floor() as u64)),
        );
        requests.insert(
            "memory".to_string(),
            Quantity(format!("{}Mi", (shape.memory_gib * 1024.0).floor() as u64)),
        );
        let mut tolerations: Vec<core::Toleration> = self
            .shared
            .cfg
            .tolerations
            .iter()
            .map(|t| core::Toleration {
                key: t.key.clone(),
                operator: t.operator.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                toleration_seconds: None,
            })
            .collect();
        let mut required = None;
        if let Some((_, n)) = &shape.gpu {
            requests.insert("nvidia.com/gpu".to_string(), Quantity(n.to_string()));
            limits.insert("nvidia.com/gpu".to_string(), Quantity(n.to_string()));
            tolerations.push(core::Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..core::Toleration::default()
            });
            // One term per label key (terms are ORed): any node whose
            // product reads as the GPU asked for.
            let mut by_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for (k, v) in gpu_labels {
                by_key.entry(k).or_default().insert(v);
            }
            required = Some(core::NodeSelector {
                node_selector_terms: by_key
                    .into_iter()
                    .map(|(k, vs)| core::NodeSelectorTerm {
                        match_expressions: Some(vec![core::NodeSelectorRequirement {
                            key: k.to_string(),
                            operator: "In".into(),
                            values: Some(vs.into_iter().map(str::to_string).collect()),
                        }]),
                        match_fields: None,
                    })
                    .collect(),
            });
        }
        // The survivors' domain, root first: the deeper, the heavier.
        let preferred: Vec<core::PreferredSchedulingTerm> = prefer
            .iter()
            .enumerate()
            .map(|(i, (k, v))| core::PreferredSchedulingTerm {
                weight: ((i + 1) * 100 / prefer.len()).max(1) as i32,
                preference: core::NodeSelectorTerm {
                    match_expressions: Some(vec![core::NodeSelectorRequirement {
                        key: k.clone(),
                        operator: "In".into(),
                        values: Some(vec![v.clone()]),
                    }]),
                    match_fields: None,
                },
            })
            .collect();
        let affinity = (required.is_some() || !preferred.is_empty()).then(|| core::Affinity {
            node_affinity: Some(core::NodeAffinity {
                required_during_scheduling_ignored_during_execution: required,
                preferred_during_scheduling_ignored_during_execution: (!preferred.is_empty())
                    .then_some(preferred),
            }),
            ..core::Affinity::default()
        });
        core::Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(labels),
                annotations: Some(ann),
                ..Default::default()
            },
            spec: Some(core::PodSpec {
                restart_policy: Some("Never".into()),
                termination_grace_period_seconds: Some(10),
                automount_service_account_token: Some(false),
                enable_service_links: Some(false),
                affinity,
                tolerations: (!tolerations.is_empty()).then_some(tolerations),
                containers: vec![core::Container {
                    name: CONTAINER.into(),
                    image: Some(image.to_string()),
                    command: Some(vec!["/bin/sh".into(), "-c".into(), SLEEPER.into()]),
                    resources: Some(core::ResourceRequirements {
                        requests: Some(requests),
                        limits: (!limits.is_empty()).then_some(limits),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let context = req.placement.region.as_str();
        let namespace = req.placement.zone.as_str();
        let loc = format!("{context}/{namespace}");
        if !self.shared.places()?.iter().any(|(c, _)| c == context) {
            return Err(err(
                ErrorKind::InvalidRequest,
                &loc,
                format!("context '{context}' is not one gangway may use (allowed_contexts in kubernetes.yaml, else the kubeconfig's current context)"),
            ));
        }
        if req.use_spot {
            return Err(err(
                ErrorKind::Capacity,
                &loc,
                "gangway offers no spot market on Kubernetes",
            ));
        }
        let cfg = req.provider_config.as_ref();
        check_task_config(cfg).map_err(|e| err(ErrorKind::InvalidRequest, &loc, e))?;
        let image = cfg
            .and_then(|c| c.get("image"))
            .and_then(|v| v.as_str())
            // SkyPilot writes `image_id: docker:IMAGE`.
            .or(req
                .image_id
                .as_deref()
                .map(|i| i.strip_prefix("docker:").unwrap_or(i)))
            .unwrap_or(&self.shared.cfg.image)
            .to_string();
        let timeout = cfg
            .and_then(|c| c.get("launch_timeout"))
            .and_then(|v| match v {
                serde_json::Value::Number(n) => n.as_u64().map(Duration::from_secs),
                serde_json::Value::String(s) => config::parse_duration(s),
                _ => None,
            })
            .unwrap_or(self.shared.cfg.launch_timeout);
        let shape = Shape::parse(&req.instance_type).ok_or_else(|| {
            err(
                ErrorKind::InvalidRequest,
                &loc,
                format!(
                    "'{}' is not a Kubernetes pod shape (GPUxN-Cc-Mg, e.g. H100x8-180c-1800g)",
                    req.instance_type
                ),
            )
        })?;
        let client = self.shared.client(context).await?;
        let nodes_api: Api<core::Node> = Api::all(client.clone());
        let mut gpu_labels = Vec::new();
        if let Some((gpu, _)) = &shape.gpu {
            let nodes = nodes_api
                .list(&ListParams::default())
                .await
                .map_err(|e| api_err(&loc, "cannot list nodes", e))?
                .items;
            for n in &nodes {
                if let Some((name, k, v)) = self.shared.node_gpu(n) {
                    if name.eq_ignore_ascii_case(gpu)
                        && !gpu_labels.contains(&(k.clone(), v.clone()))
                    {
                        gpu_labels.push((k, v));
                    }
                }
            }
            if gpu_labels.is_empty() {
                return Err(err(
                    ErrorKind::Capacity,
                    &loc,
                    format!(
                        "no node of context {context} has {gpu} GPUs (by labels {})",
                        self.shared.cfg.gpu_label_keys.join(", ")
                    ),
                ));
            }
        }
        let api: Api<core::Pod> = Api::namespaced(client.clone(), namespace);
        let selector = self.selector(&req.cluster.0);
        let prefix = names::pod_prefix(&req.cluster.0, &self.owner);
        let queue = kueue::queue(&client, &self.shared.cfg, context, namespace, &loc).await?;
        let count = req.count as usize;
        // Reconcile: live pods of this shape are kept (up to the count);
        // ended, leaving or other-shaped ones go first.
        let existing = self.list(&api, &loc, &selector).await?;
        let mut keep: Vec<&core::Pod> = Vec::new();
        let mut drop = BTreeSet::new();
        for p in &existing {
            let name = p.metadata.name.clone().unwrap_or_default();
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            let same_shape = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(labels::INSTANCE_TYPE))
                .is_some_and(|t| *t == req.instance_type);
            if p.metadata.deletion_timestamp.is_none()
                && matches!(phase, "Pending" | "Running")
                && same_shape
                && keep.len() < count
            {
                keep.push(p);
            } else {
                drop.insert(name);
            }
        }
        // Under Kueue a gang short of pods is topped up inside its own pod
        // group: Kueue admitted the group whole, keeps the Workload's quota
        // while a pod of it is missing and lifts a new member's gate on its
        // own. Kept pods that are no such group (plain pods from before the
        // queue, another size or queue, a group already ended) are made
        // again with the rest as one new group.
        let joined: Option<String> = match &queue {
            Some(q) if !keep.is_empty() && keep.len() < count => {
                let groups: BTreeSet<Option<&str>> =
                    keep.iter().map(|p| kueue::group_of(p)).collect();
                let fits = keep.iter().all(|p| {
                    let l = p.metadata.labels.as_ref();
                    let a = p.metadata.annotations.as_ref();
                    l.and_then(|l| l.get(kueue::QUEUE_LABEL)) == Some(q)
                        && a.and_then(|a| a.get(kueue::TOTAL_ANNOTATION))
                            .is_some_and(|t| *t == req.count.to_string())
                        && !kueue::unretriable(p)
                });
                match groups.into_iter().collect::<Vec<_>>().as_slice() {
                    [Some(g)] if fits => Some(g.to_string()),
                    _ => None,
                }
            }
            _ => None,
        };
        if queue.is_some() && keep.len() < count && joined.is_none() {
            drop.extend(keep.drain(..).filter_map(|p| p.metadata.name.clone()));
        }
        let group = queue.map(|queue| kueue::Group {
            queue,
            // A group of its own per launch that makes a gang anew: a
            // deleted group's Workload may linger a moment under its name.
            name: joined.clone().unwrap_or_else(|| {
                format!(
                    "{prefix}-{:06x}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64 >> 10)
                        & 0xff_ffff
                )
            }),
            total: req.count,
            topology: self.shared.cfg.topology.clone(),
        });
        // With survivors, what goes is single pods of a gang that goes on;
        // without, the gang as a whole (its Kueue group ended first).
        let survivors = !keep.is_empty();
        if !drop.is_empty() {
            self.delete_and_wait(&api, &loc, &selector, Some(&drop), true, !survivors)
                .await?;
        }
        // The new pods of a gang with survivors prefer the survivors'
        // topology domain (each configured topology label they all share,
        // the deepest weighing most): preferred, not required, so a domain
        // with no room left does not keep the gang short. Not under Kueue:
        // there a new pod's spec must be its group's (Kueue matches a pod
        // to its pod set by a hash of the spec, affinity included), and
        // Kueue's topology-aware scheduling places the replacement.
        let prefer = if survivors && group.is_none() && keep.len() < count {
            self.shared_domain(&nodes_api, &loc, &keep).await
        } else {
            Vec::new()
        };
        // New pods take numbers above every one the gang has used: each
        // pod carries the gang's next number (the survivors are stamped
        // anew before a top-up), so a lost pod's name, which may still be
        // held by a deletion being confirmed, is never taken again, and a
        // name that is taken when created means a racing launch made it.
        let mut i = existing
            .iter()
            .flat_map(|p| {
                let own = p
                    .metadata
                    .name
                    .as_deref()
                    .and_then(|n| n.strip_prefix(&prefix)?.strip_prefix('-'))
                    .and_then(|n| n.parse::<u32>().ok())
                    .map(|n| n + 1);
                let stamped = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::NEXT_INDEX))
                    .and_then(|n| n.parse::<u32>().ok());
                [own, stamped]
            })
            .flatten()
            .max()
            .unwrap_or(0);
        let next = i + (count - keep.len().min(count)) as u32;
        if survivors && keep.len() < count {
            for p in &keep {
                let name = p.metadata.name.clone().unwrap_or_default();
                let stamp = serde_json::json!({"metadata": {"annotations": {
                    labels::NEXT_INDEX: next.to_string()
                }}});
                if let Err(e) = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&stamp))
                    .await
                {
                    tracing::warn!(
                        "{loc}: cannot stamp pod {name} with the gang's next number: {e}"
                    );
                }
            }
        }
        let mut keep: Vec<String> = keep
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let mut made: BTreeSet<String> = BTreeSet::new();
        while keep.len() < count {
            let name = format!("{prefix}-{i}");
            i += 1;
            let pod = self.pod_spec(
                req,
                &name,
                namespace,
                &shape,
                &image,
                &gpu_labels,
                &prefer,
                next,
                group.as_ref(),
            );
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    made.insert(name.clone());
                }
                // Made by a launch racing this one: it is ours all the same.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    let e = api_err(&loc, &format!("cannot create pod {name}"), e);
                    // A ResourceQuota refuses with 403 Forbidden, like
                    // RBAC: told apart by its words.
                    let kind = if e.message.contains("exceeded quota")
                        || e.message.contains("status unknown for quota")
                    {
                        ErrorKind::Quota
                    } else {
                        e.kind
                    };
                    let _ = self
                        .undo_launch(&api, &loc, &selector, survivors, &made)
                        .await;
                    return Err(ProviderError { kind, ..e });
                }
            }
            keep.push(name);
        }
        if !made.is_empty() {
            let kueue = group
                .as_ref()
                .map(|g| {
                    let how = if joined.is_some() { "joining" } else { "as" };
                    format!(" {how} Kueue pod group {} in queue {}", g.name, g.queue)
                })
                .unwrap_or_default();
            let beside = if survivors {
                format!(" beside {} kept", count - made.len())
            } else {
                String::new()
            };
            (self.progress)(&format!(
                "kubernetes {loc}: created {} pod(s) {} ({}){beside}{kueue}, waiting for all {} to run",
                made.len(),
                made.iter().cloned().collect::<Vec<_>>().join(", "),
                req.instance_type,
                req.count
            ));
        }
        let pods = match self
            .wait_running(
                &client,
                &api,
                &loc,
                &selector,
                req.count,
                timeout,
                group.as_ref(),
            )
            .await
        {
            Ok(p) => p,
            Err(mut e) => {
                if survivors {
                    e.message = e.message.replace(
                        "every pod of the cluster deleted",
                        &format!(
                            "the {} new pod(s) deleted, the {} kept left running",
                            made.len(),
                            count - made.len()
                        ),
                    );
                }
                if let Err(d) = self
                    .undo_launch(&api, &loc, &selector, survivors, &made)
                    .await
                {
                    return Err(err(
                        e.kind,
                        &loc,
                        format!("{}; and deleting the pods failed: {}", e.message, d.message),
                    ));
                }
                return Err(e);
            }
        };
        self.nodes_of(&client, context, namespace, pods, true).await
    }

    /// Undoes a launch that failed: with `survivors` kept, only the pods it
    /// `made` go (the gang goes on without them, its Kueue group too);
    /// without, every pod of the cluster, as a whole.
    async fn undo_launch(
        &self,
        api: &Api<core::Pod>,
        loc: &str,
        selector: &str,
        survivors: bool,
        made: &BTreeSet<String>,
    ) -> Result<()> {
        if !survivors {
            return self
                .delete_and_wait(api, loc, selector, None, true, true)
                .await;
        }
        if made.is_empty() {
            return Ok(());
        }
        self.delete_and_wait(api, loc, selector, Some(made), true, false)
            .await
    }

    /// The topology domain every one of `pods` is in: each configured
    /// topology label (root first) whose value all their nodes share. A
    /// node that cannot be read counts as sharing nothing (the preference
    /// is dropped, never the launch).
    async fn shared_domain(
        &self,
        nodes_api: &Api<core::Node>,
        loc: &str,
        pods: &[&core::Pod],
    ) -> Vec<(String, String)> {
        let mut nodes = Vec::new();
        for p in pods {
            let name = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if name.is_empty() {
                return Vec::new();
            }
            match nodes_api.get_opt(&name).await {
                Ok(Some(n)) => nodes.push(n),
                Ok(None) => return Vec::new(),
                Err(e) => {
                    tracing::warn!(
                        "{loc}: cannot read node {name} for the survivors' topology: {e}"
                    );
                    return Vec::new();
                }
            }
        }
        let mut out = Vec::new();
        for key in &self.shared.cfg.topology_label_keys {
            let values: BTreeSet<Option<&String>> = nodes
                .iter()
                .map(|n| n.metadata.labels.as_ref().and_then(|l| l.get(key)))
                .collect();
            if let [Some(v)] = values.into_iter().collect::<Vec<_>>().as_slice() {
                out.push((key.clone(), (*v).clone()));
            }
        }
        out
    }

    /// Deletes the pods of the cluster named `ids` (no grace period: their
    /// node is gone or going) in every place gangway may use, and waits
    /// until they are gone; the cluster's other pods, and any Kueue pod
    /// group they form, go on.
    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let selector = self.selector(&cluster.0);
        let wanted: BTreeSet<String> = ids.iter().map(|i| i.0.clone()).collect();
        for (context, namespace) in self.shared.places()? {
            let loc = format!("{context}/{namespace}");
            let api = self.pods(&context, &namespace).await?;
            let here: BTreeSet<String> = self
                .list(&api, &loc, &selector)
                .await?
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .filter(|n| wanted.contains(n))
                .collect();
            if here.is_empty() {
                continue;
            }
            self.delete_and_wait(&api, &loc, &selector, Some(&here), true, false)
                .await?;
        }
        Ok(())
    }

    /// Waits until `count` pods of `selector` run with an IP (pods Kueue
    /// still gates wait for the admission of their `group`).
    #[allow(clippy::too_many_arguments)]
    async fn wait_running(
        &self,
        client: &kube::Client,
        api: &Api<core::Pod>,
        loc: &str,
        selector: &str,
        count: u32,
        timeout: Duration,
        group: Option<&kueue::Group>,
    ) -> Result<Vec<core::Pod>> {
        let started = Instant::now();
        let mut said = String::new();
        let mut pause = Duration::from_millis(100);
        loop {
            let pods: Vec<core::Pod> = self
                .list(api, loc, selector)
                .await?
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let mut running = 0;
            let mut why: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut gated = Vec::new();
            for p in &pods {
                let name = p.metadata.name.clone().unwrap_or_default();
                let s = p.status.as_ref();
                let phase = s.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
                let ip = s.and_then(|s| s.pod_ip.as_deref()).unwrap_or("");
                match phase {
                    "Running" if !ip.is_empty() => running += 1,
                    "Failed" | "Succeeded" => {
                        return Err(err(
                            ErrorKind::Fatal,
                            loc,
                            format!(
                                "pod {name} ended ({phase}) before the gang was up: {}",
                                describe_end(p)
                            ),
                        ))
                    }
                    _ if kueue::gated(p) => gated.push(name),
                    _ => {
                        let w = unschedulable(p)
                            .map(|u| format!("unschedulable: {u}"))
                            .or_else(|| waiting(p))
                            .unwrap_or_else(|| phase.to_string());
                        why.entry(w).or_default().push(name);
                    }
                }
            }
            if running >= count as usize {
                return Ok(pods);
            }
            let mut kueue_words = None;
            if !gated.is_empty() {
                let (queue, words) = match group {
                    Some(g) => (
                        g.queue.as_str(),
                        // `loc` is CONTEXT/NAMESPACE; a namespace has no '/'.
                        kueue::why_not_admitted(
                            client,
                            loc.rsplit('/').next().unwrap_or(""),
                            &g.name,
                        )
                        .await,
                    ),
                    None => ("?", None),
                };
                let words = words.unwrap_or_else(|| "no Workload condition yet".into());
                kueue_words = Some(format!("not admitted by Kueue (queue {queue}): {words}"));
                why.insert(
                    format!("gated by Kueue: {words}"),
                    std::mem::take(&mut gated),
                );
            }
            let line = why
                .iter()
                .map(|(w, ps)| format!("{} {w}", ps.len()))
                .collect::<Vec<_>>()
                .join("; ");
            let waited = started.elapsed();
            if waited >= timeout {
                if let Some(words) = kueue_words {
                    return Err(err(
                        ErrorKind::Capacity,
                        loc,
                        format!(
                            "{running} of {count} pods running after {} s, the gang {words}; every pod of the cluster deleted (launch_timeout)",
                            waited.as_secs()
                        ),
                    ));
                }
                let unsched = why.keys().find(|w| w.starts_with("unschedulable: "));
                let image = why
                    .keys()
                    .find(|w| w.contains("ImagePull") || w.contains("InvalidImageName"));
                let kind = if unsched.is_some() {
                    ErrorKind::Capacity
                } else if image.is_some() {
                    ErrorKind::InvalidRequest
                } else {
                    ErrorKind::Capacity
                };
                return Err(err(
                    kind,
                    loc,
                    format!(
                        "{running} of {count} pods running after {} s ({line}); every pod of the cluster deleted (launch_timeout)",
                        waited.as_secs()
                    ),
                ));
            }
            if line != said {
                (self.progress)(&format!(
                    "kubernetes {loc}: {running}/{count} pods running; {line} (waiting {} s of at most {} s)",
                    waited.as_secs(),
                    timeout.as_secs()
                ));
                said = line;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.poll);
        }
    }

    /// gangway's nodes for `pods` (with their homes when `homes`).
    async fn nodes_of(
        &self,
        client: &kube::Client,
        context: &str,
        namespace: &str,
        pods: Vec<core::Pod>,
        homes: bool,
    ) -> Result<Vec<Node>> {
        let loc = format!("{context}/{namespace}");
        let nodes_api: Api<core::Node> = Api::all(client.clone());
        let mut k8s_nodes: BTreeMap<String, Option<core::Node>> = BTreeMap::new();
        for p in &pods {
            let n = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if n.is_empty() || k8s_nodes.contains_key(&n) {
                continue;
            }
            let got = nodes_api
                .get_opt(&n)
                .await
                .map_err(|e| api_err(&loc, &format!("cannot read node {n}"), e))?;
            k8s_nodes.insert(n, got);
        }
        let api: Api<core::Pod> = Api::namespaced(client.clone(), namespace);
        let mut home_of: BTreeMap<String, String> = BTreeMap::new();
        if homes {
            let asks = pods.iter().map(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let api = api.clone();
                async move {
                    let out = transport::exec_collect(
                        &api,
                        &name,
                        vec!["/bin/sh".into(), "-c".into(), "printf %s \"$HOME\"".into()],
                        None,
                    )
                    .await;
                    (name, out)
                }
            });
            for (name, out) in futures::future::join_all(asks).await {
                match out {
                    Ok(o) if o.code == 0 && !o.stdout.is_empty() => {
                        home_of.insert(name, String::from_utf8_lossy(&o.stdout).into_owned());
                    }
                    Ok(o) => {
                        return Err(err(
                            ErrorKind::Fatal,
                            &loc,
                            format!(
                                "cannot run a command in pod {name} through exec (exit {}): {}",
                                o.code,
                                String::from_utf8_lossy(&o.stderr).trim()
                            ),
                        ))
                    }
                    Err(e) => {
                        return Err(err(
                            ErrorKind::Transient,
                            &loc,
                            format!("cannot exec in pod {name}: {e}"),
                        ))
                    }
                }
            }
        }
        let mut out = Vec::new();
        for p in pods {
            let name = p.metadata.name.clone().unwrap_or_default();
            let node_name = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let k8s_node = k8s_nodes.get(&node_name).map(Option::as_ref);
            let state = pod_state(&p, k8s_node, self.shared.cfg.not_ready_tolerance);
            let mut extra = BTreeMap::new();
            extra.insert(keys::CONTEXT.to_string(), context.to_string());
            extra.insert(keys::NAMESPACE.to_string(), namespace.to_string());
            extra.insert(keys::NODE.to_string(), node_name.clone());
            if let Some(h) = home_of.get(&name) {
                extra.insert(keys::HOME.to_string(), h.clone());
            }
            out.push(Node {
                id: InstanceId(name),
                state,
                private_ip: p
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .unwrap_or_default(),
                public_ip: None,
                placement: Placement {
                    cloud: NAME.into(),
                    region: context.to_string(),
                    zone: namespace.to_string(),
                },
                topology: self.shared.topology(k8s_node.flatten(), &node_name),
                extra,
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let selector = self.selector(&cluster.0);
        let mut out = Vec::new();
        for (context, namespace) in self.shared.places()? {
            let loc = format!("{context}/{namespace}");
            let client = self.shared.client(&context).await?;
            let api: Api<core::Pod> = Api::namespaced(client.clone(), &namespace);
            let pods = self.list(&api, &loc, &selector).await?;
            out.extend(
                self.nodes_of(&client, &context, &namespace, pods, false)
                    .await?,
            );
        }
        Ok(out)
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let selector = self.selector(&cluster.0);
        for (context, namespace) in self.shared.places()? {
            let loc = format!("{context}/{namespace}");
            let api = self.pods(&context, &namespace).await?;
            self.delete_and_wait(&api, &loc, &selector, None, false, true)
                .await?;
        }
        Ok(())
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        let mut out = BTreeSet::new();
        for (context, namespace) in self.shared.places()? {
            let loc = format!("{context}/{namespace}");
            let api = self.pods(&context, &namespace).await?;
            for p in self.list(&api, &loc, labels::OWNER).await? {
                let l = p.metadata.labels.clone().unwrap_or_default();
                let a = p.metadata.annotations.clone().unwrap_or_default();
                let Some(name) = a
                    .get(labels::CLUSTER_NAME)
                    .or_else(|| l.get(labels::CLUSTER))
                    .cloned()
                else {
                    continue;
                };
                out.insert(TaggedCluster {
                    name: ClusterName(name),
                    owner: l.get(labels::OWNER).cloned().unwrap_or_default(),
                    user: a
                        .get(labels::USER_NAME)
                        .or_else(|| l.get(labels::USER))
                        .cloned(),
                });
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn check(&self) -> Result<CheckReport> {
        let places = match self.shared.places() {
            Ok(p) => p,
            Err(e) => {
                return Ok(CheckReport {
                    ok: false,
                    identity: None,
                    regions: Vec::new(),
                    hint: Some(e.message),
                })
            }
        };
        let mut usable = Vec::new();
        let mut why = Vec::new();
        for (context, namespace) in places {
            match self.summary(&context, &namespace).await {
                Ok(s) => usable.push(s),
                Err(e) => why.push(format!("context {context}: {}", e.message)),
            }
        }
        Ok(CheckReport {
            ok: !usable.is_empty(),
            identity: self
                .shared
                .kubeconfig
                .as_ref()
                .map(|p| format!("kubeconfig {}", p.display())),
            regions: usable,
            hint: (!why.is_empty()).then(|| why.join("; ")),
        })
    }

    /// `context/namespace: GPU free/allocatable, ...` from its nodes and
    /// the GPUs its live pods ask for.
    async fn summary(&self, context: &str, namespace: &str) -> Result<String> {
        let client = self.shared.client(context).await?;
        let nodes: Api<core::Node> = Api::all(client.clone());
        let nodes = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| api_err(context, "cannot list nodes", e))?
            .items;
        let mut used: HashMap<String, f64> = HashMap::new();
        let pods: Api<core::Pod> = Api::all(client);
        let pods = pods
            .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
            .await;
        let free_known = pods.is_ok();
        for p in pods.map(|l| l.items).unwrap_or_default() {
            let Some(spec) = &p.spec else { continue };
            let Some(node) = &spec.node_name else {
                continue;
            };
            let gpus: f64 = spec
                .containers
                .iter()
                .filter_map(|c| {
                    c.resources
                        .as_ref()?
                        .requests
                        .as_ref()?
                        .get("nvidia.com/gpu")
                })
                .filter_map(|q| quantity(&q.0))
                .sum();
            *used.entry(node.clone()).or_default() += gpus;
        }
        let mut per_gpu: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for n in &nodes {
            let Some((gpu, _, _)) = self.shared.node_gpu(n) else {
                continue;
            };
            let alloc = allocatable(n).gpus;
            let name = n.metadata.name.clone().unwrap_or_default();
            let e = per_gpu.entry(gpu).or_default();
            e.1 += alloc;
            if is_ready(n) {
                e.0 += (alloc - used.get(&name).copied().unwrap_or(0.0)).max(0.0);
            }
        }
        let gpus = if per_gpu.is_empty() {
            "no GPUs".to_string()
        } else {
            per_gpu
                .iter()
                .map(|(g, (free, all))| {
                    if free_known {
                        format!("{g} {free}/{all} free")
                    } else {
                        format!("{g} {all} (free unknown: pods cannot be listed)")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        Ok(format!(
            "{context}/{namespace} ({} nodes; {gpus})",
            nodes.len()
        ))
    }
}

fn describe_end(p: &core::Pod) -> String {
    let s = p.status.as_ref();
    let mut parts = Vec::new();
    if let Some(r) = s.and_then(|s| s.reason.as_deref()) {
        parts.push(r.to_string());
    }
    if let Some(m) = s.and_then(|s| s.message.as_deref()) {
        parts.push(m.to_string());
    }
    for c in s
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(t) = c.state.as_ref().and_then(|st| st.terminated.as_ref()) {
            parts.push(format!(
                "container {} exited {} ({})",
                c.name,
                t.exit_code,
                t.reason.as_deref().unwrap_or("")
            ));
        }
    }
    if parts.is_empty() {
        "no reason given".into()
    } else {
        parts.join("; ")
    }
}

/// The provider in the core's registry: there when a kubeconfig is found
/// or `$GANGWAY_HOME/kubernetes.yaml` exists, and this installation has
/// an owner id to label pods with.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: NAME,
    build: |s| {
        let cfg = config::load(s.home).ok()??;
        let owner = s.owner?;
        Some(Arc::new(KubernetesProvider::new(cfg, owner, s.user)))
    },
    capacity,
    hosts_controller: false,
    stores: &[],
};

/// How long the catalog waits for a cluster's nodes.
const CAPACITY_TIMEOUT: Duration = Duration::from_secs(5);

/// The catalog's offers: each usable context's nodes, asked on a thread
/// of its own with a short timeout; a cluster that does not answer offers
/// nothing and says so (in the source's name, and in gangway's log).
fn capacity(home: &Path) -> std::result::Result<Option<Capacity>, gangway_provider::ConfigError> {
    let Some(cfg) = config::load(home)? else {
        return Ok(None);
    };
    // Without $GANGWAY_HOME/kubernetes.yaml the clusters are the
    // kubeconfig's, which may be a workplace's: offered only to tasks that
    // name k8s, never picked for a price of 0.
    let only_when_named = cfg.path.is_empty();
    let shared = Arc::new(Shared::new(cfg));
    let origin = match &shared.kubeconfig {
        Some(p) => format!("kubeconfig {}", p.display()),
        None => "no kubeconfig".into(),
    };
    let places = match shared.places() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("kubernetes: no offers: {}", e.message);
            return Ok(Some(Capacity {
                origin: format!("{origin} (no offers: {})", e.message),
                offers: Vec::new(),
                only_when_named,
            }));
        }
    };
    let s = shared.clone();
    let asked = rt::with_limit(CAPACITY_TIMEOUT, move || async move {
        let mut offers = Vec::new();
        let mut notes = Vec::new();
        for (context, namespace) in places {
            let nodes = match s.new_client(&context).await {
                Ok(c) => Api::<core::Node>::all(c)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| api_err(&context, "cannot list nodes", e)),
                Err(e) => Err(e),
            };
            match nodes {
                Ok(n) => offers.extend(s.offers(&context, &namespace, &n.items)),
                Err(e) => notes.push(format!("context {context}: {}", e.message)),
            }
        }
        (offers, notes)
    });
    let (offers, notes) = asked.unwrap_or_else(|e| (Vec::new(), vec![e]));
    for n in &notes {
        tracing::warn!("kubernetes: no offers from {n}");
    }
    Ok(Some(Capacity {
        origin: if notes.is_empty() {
            origin
        } else {
            format!("{origin} (no offers from {})", notes.join("; "))
        },
        offers,
        only_when_named,
    }))
}

#[async_trait::async_trait]
impl Provider for KubernetesProvider {
    fn name(&self) -> &str {
        NAME
    }

    /// Commands reach the pods through the API's `pods/exec`.
    fn transport(
        &self,
        _home: &Path,
        cluster: &str,
    ) -> Option<Box<dyn gangway_provider::Transport>> {
        Some(Box::new(ExecTransport::new(
            self.inner.shared.clone(),
            self.inner.selector(cluster),
        )))
    }

    async fn check(&self) -> Result<CheckReport> {
        self.on_rt(|i| async move { i.check().await }).await
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let req = req.clone();
        self.on_rt(|i| async move { i.launch(&req).await }).await
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let cluster = cluster.clone();
        self.on_rt(|i| async move { i.describe(&cluster).await })
            .await
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some("pods cannot be stopped and started again; use --down to delete them")
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        Err(err(
            ErrorKind::InvalidRequest,
            &cluster.0,
            "pods cannot be stopped and started again; use `gangway down`",
        ))
    }

    async fn start(
        &self,
        cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        Err(err(
            ErrorKind::InvalidRequest,
            &cluster.0,
            "pods cannot be stopped and started again; launch the cluster anew",
        ))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let cluster = cluster.clone();
        self.on_rt(|i| async move { i.terminate(&cluster).await })
            .await
    }

    fn first_contact_wait(&self) -> Duration {
        Duration::ZERO
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // `remove_nodes` deletes only the named pods (without a grace
        // period) and returns once they are gone; a launch for a cluster
        // with pods keeps its live pods of the shape and creates only the
        // shortfall, under fresh names, in the same context and namespace,
        // preferring the survivors' topology domain, or, under Kueue, as
        // new members of the gang's admitted pod group. If the new pods do
        // not all run in time they are deleted and the survivors left.
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let cluster = cluster.clone();
        let ids = ids.to_vec();
        self.on_rt(|i| async move { i.remove_nodes(&cluster, &ids).await })
            .await
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        self.on_rt(|i| async move { i.clusters().await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_numbers() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("16Gi"), Some(16.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("8"), Some(8.0));
        assert_eq!(quantity("1k"), Some(1000.0));
        assert_eq!(quantity("2e3"), Some(2000.0));
        assert_eq!(quantity("12Qi"), None);
    }

    fn node(
        name: &str,
        labels: &[(&str, &str)],
        alloc: &[(&str, &str)],
        ready: bool,
    ) -> core::Node {
        core::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(core::NodeSpec::default()),
            status: Some(core::NodeStatus {
                allocatable: Some(
                    alloc
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                conditions: Some(vec![core::NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn node_shapes_become_offers_priced_per_gpu() {
        let cfg = Config {
            price_per_gpu_hour: 2.0,
            price_per_node_hour: 0.5,
            ..Config::default()
        };
        let s = Shared::new(cfg);
        let nodes = [
            node(
                "g1",
                &[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")],
                &[("cpu", "40"), ("memory", "100Gi"), ("nvidia.com/gpu", "4")],
                true,
            ),
            // The same shape again: no new offers.
            node(
                "g2",
                &[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")],
                &[("cpu", "40"), ("memory", "100Gi"), ("nvidia.com/gpu", "4")],
                true,
            ),
            node("c1", &[], &[("cpu", "8"), ("memory", "32Gi")], true),
            node("down", &[], &[("cpu", "64"), ("memory", "64Gi")], false),
        ];
        let o = s.offers("ctx", "ns", &nodes);
        assert_eq!(o.len(), 5, "{o:?}");
        let four = o.iter().find(|o| o.accelerator_count == 4.0).unwrap();
        assert_eq!(four.instance_type, "H100x4-36c-90g");
        assert_eq!(four.accelerator.as_deref(), Some("H100"));
        assert_eq!(four.price, 8.5);
        assert_eq!((four.region.as_str(), four.zone.as_str()), ("ctx", "ns"));
        let one = o.iter().find(|o| o.accelerator_count == 1.0).unwrap();
        assert_eq!(one.instance_type, "H100x1-9c-22.5g");
        let cpu = o.iter().find(|o| o.accelerator.is_none()).unwrap();
        assert_eq!(cpu.instance_type, "cpu-7.2c-28.8g");
        assert_eq!(cpu.price, 0.5);
    }

    #[test]
    fn tainted_nodes_offer_only_what_tolerates_them() {
        let mut n = node("t", &[], &[("cpu", "8"), ("memory", "8Gi")], true);
        n.spec = Some(core::NodeSpec {
            taints: Some(vec![core::Taint {
                key: "dedicated".into(),
                value: Some("ml".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(Shared::new(Config::default())
            .offers("c", "n", std::slice::from_ref(&n))
            .is_empty());
        let mut cfg = Config::default();
        cfg.tolerations.push(config::Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("ml".into()),
            effect: Some("NoSchedule".into()),
        });
        assert_eq!(Shared::new(cfg).offers("c", "n", &[n]).len(), 1);
    }

    fn pod(phase: &str) -> core::Pod {
        core::Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p-0".into()),
                ..Default::default()
            },
            spec: Some(core::PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            }),
            status: Some(core::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn lost_pods_and_nodes_are_preemptions() {
        let t = Duration::from_secs(30);
        let ready = node("n1", &[], &[], true);
        assert_eq!(
            pod_state(&pod("Running"), Some(Some(&ready)), t),
            NodeState::Running
        );
        assert_eq!(pod_state(&pod("Pending"), None, t), NodeState::Pending);
        let gone = pod_state(&pod("Running"), Some(None), t);
        assert!(
            matches!(&gone, NodeState::Preempted { reason } if reason.contains("node n1 is gone")),
            "{gone:?}"
        );
        let mut evicted = pod("Failed");
        evicted.status.as_mut().unwrap().reason = Some("Evicted".into());
        evicted.status.as_mut().unwrap().message = Some("The node was low on resource".into());
        let s = pod_state(&evicted, None, t);
        assert!(
            matches!(&s, NodeState::Preempted { reason } if reason.contains("evicted")),
            "{s:?}"
        );
        // NotReady since long ago (no time given), and a spot node.
        let not_ready = node("n1", &[("karpenter.sh/capacity-type", "spot")], &[], false);
        let s = pod_state(&pod("Running"), Some(Some(&not_ready)), t);
        assert!(
            matches!(&s, NodeState::Preempted { reason } if reason.contains("spot node n1 is NotReady")),
            "{s:?}"
        );
        // NotReady just now: within the tolerance.
        let mut fresh = node("n1", &[], &[], false);
        fresh.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            pod_state(&pod("Running"), Some(Some(&fresh)), t),
            NodeState::Running
        );
        let mut leaving = node("n1", &[("cloud.google.com/gke-spot", "true")], &[], true);
        leaving.spec = Some(core::NodeSpec {
            taints: Some(vec![core::Taint {
                key: "cloud.google.com/impending-node-termination".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        // Still running: the taint is a notice, not a loss.
        assert_eq!(
            pod_state(&pod("Running"), Some(Some(&leaving)), t),
            NodeState::Running
        );
        leaving.metadata.name = Some("n1".into());
        let notice = super::leaving(&pod("Running"), Some(&leaving)).expect("a notice");
        assert!(
            notice.contains("spot node n1 is being reclaimed (taint cloud.google.com/impending-node-termination)"),
            "{notice}"
        );
        assert_eq!(super::leaving(&pod("Running"), Some(&ready)), None);
    }

    #[test]
    fn task_settings_are_checked_by_name() {
        assert!(check_task_config(Some(
            &serde_json::json!({"image": "x", "launch_timeout": "30s"})
        ))
        .is_ok());
        assert!(check_task_config(Some(&serde_json::json!({"imag": "x"})))
            .unwrap_err()
            .contains("imag"));
        assert!(check_task_config(Some(&serde_json::json!({"launch_timeout": "soon"}))).is_err());
    }
}
