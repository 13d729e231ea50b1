//! The contract between gangway and the places it runs nodes.
//!
//! Every provider (the embedded `local` one, `ssh` pools, AWS, GCP) implements
//! [`Provider`]. The failover loop in the main crate only ever sees this trait
//! and the one error type, [`ProviderError`], whose kind tells it whether to
//! fail over ([`ErrorKind::Capacity`], [`ErrorKind::Quota`]), retry
//! ([`ErrorKind::Transient`]) or stop and tell the user.
//!
//! What differs between providers is said here and answered in each
//! provider's crate, never by the core comparing provider names: how a
//! node is reached ([`Provider::transport`], [`SshEndpoint`]), how long its
//! first contact may take, how a preemption notice is read on it, whether
//! its machines outlive a cluster, whether it can stop.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

pub mod children;
mod endpoint;
pub mod host_keys;
#[cfg(feature = "http")]
pub mod http;
pub mod notice;
mod registry;
mod transport;
pub mod tree;
pub use tree::{copy_tree, merge_newest, unpack_merging, Skipped};

pub use endpoint::SshEndpoint;
pub use registry::{
    no_capacity, Capacity, ConfigError, Offer, Registration, Setup, StoreAccess, StoreFuture,
    StoreKeys, DEFAULT_CPUS, DEFAULT_MEMORY_GIB,
};
pub use transport::{
    kill_option, kill_where, on_path, output_with_input, release_mounts, shell, signal_token,
    NodeCommand, NodeProcess, NodeRow, Transport, TransportError, KEPT_ENV, TOKEN_VAR,
};

use serde::{Deserialize, Serialize};

/// Where a launch should land: one zone of one region of one cloud.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// Provider name, e.g. `aws`, `gcp`, `local`.
    pub cloud: String,
    /// Region, e.g. `us-east-1`.
    pub region: String,
    /// Zone, e.g. `us-east-1a` (or a zone id such as `use1-az2`).
    pub zone: String,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.cloud, self.region, self.zone)
    }
}

/// A cluster's name as the user gave it, used to tag every resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterName(pub String);

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A provider's own id for one node (an EC2 instance id, a GCE name, a pid group).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to launch: exactly `count` nodes of one type in one zone.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// The cluster every node is tagged with.
    pub cluster: ClusterName,
    /// The owner id of the gangway installation launching it (tagged too,
    /// for `down --orphans` sweeps).
    pub owner: String,
    /// Where.
    pub placement: Placement,
    /// Provider instance type.
    pub instance_type: String,
    /// Number of nodes; fewer is a failure, never a partial success.
    pub count: u32,
    /// Spot (preemptible) or on-demand.
    pub use_spot: bool,
    /// Accelerator name and count per node, if any.
    pub accelerator: Option<(String, f32)>,
    /// Root disk size in GiB.
    pub disk_size_gib: Option<u32>,
    /// Image (AMI id, image family, docker image) if pinned.
    pub image_id: Option<String>,
    /// Idempotency token: a retried launch with the same token never doubles the cluster.
    pub client_token: String,
    /// Provider-specific options from the task's `config.<provider>` section.
    pub provider_config: Option<serde_json::Value>,
    /// `network_tier` (`best` asks for the fastest interconnect, e.g. EFA).
    #[serde(default)]
    pub network_tier: Option<String>,
    /// Most to pay per node-hour (USD); caps the spot bid where a provider has one.
    #[serde(default)]
    pub max_price: Option<f64>,
    /// Ports to open to the world besides SSH, as inclusive ranges.
    #[serde(default)]
    pub ports: Vec<(u16, u16)>,
    /// The task's `labels`, tagged on every resource.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The observed state of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Requested, not yet running.
    Pending,
    /// Running.
    Running,
    /// Stopped (disk kept).
    Stopped,
    /// Terminated by the user or gangway.
    Terminated,
    /// Taken away by the provider (spot reclaim); `reason` is the provider's words.
    Preempted {
        /// The provider's reason.
        reason: String,
    },
}

/// One node as a provider reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Node {
    /// Provider id.
    pub id: InstanceId,
    /// State.
    pub state: NodeState,
    /// Private address the other nodes reach it on.
    pub private_ip: String,
    /// Address gangway reaches it on (may equal `private_ip`).
    pub public_ip: Option<String>,
    /// Where it is.
    pub placement: Placement,
    /// Network path from the root switch down, e.g. `["spine1", "leaf2"]`.
    pub topology: Vec<String>,
    /// Free-form provider facts (work directory, market...), read only by
    /// the provider and its transport, with three exceptions the core knows:
    /// keys starting with `env.` are environment variables every command on
    /// the node gets (e.g. `env.CUDA_VISIBLE_DEVICES`), an [`SshEndpoint`]
    /// is recorded here, and [`PORT_RANGE_FACT`] gives a node that shares
    /// its address with others the ports that are its own.
    pub extra: BTreeMap<String, String>,
}

/// The [`Node::extra`] key of a node's own port range, `FIRST-LAST`, where
/// nodes share one address (the local provider on a machine that answers
/// only on 127.0.0.1): the gang puts the head's first port in
/// `MASTER_PORT` and the task's `ports` into each node's range, so ranks
/// are told apart by port instead of address.
pub const PORT_RANGE_FACT: &str = "port_range";

/// The [`Node::extra`] key of what the provider reported this node is
/// billed per hour, in USD, when it launched it (the spot market price in
/// its zone then, say): the cost ledger takes it over the plan's price when
/// every node of a cluster has one.
pub const PRICE_FACT: &str = "price_per_hour";

/// The [`Node::extra`] key that says which stores a node reaches with its
/// own identity (an instance profile, a service account attached by its
/// provider): URL schemes, comma-separated (`s3`, `gs`). Where every node
/// of a run has a bucket's scheme here, the nodes' rclone is told to use
/// that identity and no credentials of the user's leave this machine for
/// that bucket. Only the provider sets it, from what the node really has.
pub const IDENTITY_STORES_FACT: &str = "identity_stores";

/// The stores (URL schemes) a node's own identity reaches, from its
/// [`IDENTITY_STORES_FACT`].
pub fn identity_stores(extra: &BTreeMap<String, String>) -> Vec<String> {
    extra
        .get(IDENTITY_STORES_FACT)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Parses a [`PORT_RANGE_FACT`] value, `FIRST-LAST` with FIRST <= LAST.
pub fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let (a, b) = text.trim().split_once('-')?;
    let (a, b) = (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?);
    (a <= b).then_some((a, b))
}

/// What kind of failure a provider hit; decides what the failover loop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// No capacity for this request here: block this zone/type and try the next.
    Capacity,
    /// Over a quota or limit: block this region and try the next.
    Quota,
    /// Credentials missing or refused: stop.
    Auth,
    /// The request itself is wrong: stop.
    InvalidRequest,
    /// Try again later (throttling, network): retry with backoff.
    Transient,
    /// Anything else: stop.
    Fatal,
}

impl ErrorKind {
    /// Whether the failover loop should move on to the next candidate.
    pub fn fails_over(self) -> bool {
        matches!(self, ErrorKind::Capacity | ErrorKind::Quota)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Capacity => "out of capacity",
            ErrorKind::Quota => "quota exceeded",
            ErrorKind::Auth => "authentication failed",
            ErrorKind::InvalidRequest => "invalid request",
            ErrorKind::Transient => "transient error",
            ErrorKind::Fatal => "error",
        })
    }
}

/// The one error every provider returns.
#[derive(Clone, Debug, thiserror::Error, Serialize, Deserialize)]
#[error("{provider} {location}: {kind}: {message}")]
pub struct ProviderError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Provider name.
    pub provider: String,
    /// Region and/or zone, as precise as known.
    pub location: String,
    /// The provider's own words (never credentials).
    pub message: String,
}

/// An error and its causes on one line, `: `-joined, each cause once (a
/// client's top line alone is often just "dispatch failure" or "could not
/// create default credentials").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

impl ProviderError {
    /// Builds an error.
    pub fn new(
        kind: ErrorKind,
        provider: impl Into<String>,
        location: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ProviderError {
            kind,
            provider: provider.into(),
            location: location.into(),
            message: message.into(),
        }
    }
}

/// Result of a provider call.
pub type Result<T> = std::result::Result<T, ProviderError>;

/// What `check` found: whether the provider can be used, and how to fix it if not.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckReport {
    /// Usable at all.
    pub ok: bool,
    /// Identity in use (account, project, user), never a secret.
    pub identity: Option<String>,
    /// Regions that can be used.
    pub regions: Vec<String>,
    /// What to do when not ok.
    pub hint: Option<String>,
}

/// A live price for one instance type, from a provider's own API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriceQuote {
    /// Instance type.
    pub instance_type: String,
    /// Region.
    pub region: String,
    /// Zone, or `None` for a price that holds in every zone of the region.
    pub zone: Option<String>,
    /// On-demand USD/hour, if quoted.
    pub price: Option<f64>,
    /// Spot USD/hour, if quoted.
    pub spot_price: Option<f64>,
    /// The accelerator (catalog name, e.g. `T4`) this quote is for, where a
    /// type takes several (GCP's N1 hosts with attached GPUs): it then
    /// applies only to the catalog rows with that accelerator; `Some("")`
    /// only to rows without one. `None`: the type with whatever it carries.
    #[serde(default)]
    pub accelerator: Option<String>,
    /// With `accelerator`: how many of it (rows of one type and accelerator
    /// may differ by count). `None`: any count.
    #[serde(default)]
    pub accelerator_count: Option<f64>,
}

impl PriceQuote {
    /// Whether this quote is about a catalog row of this type, accelerator
    /// (name, count) and region (any zone).
    pub fn is_for(
        &self,
        instance_type: &str,
        accelerator: Option<&str>,
        count: f64,
        region: &str,
    ) -> bool {
        self.instance_type == instance_type
            && self.region == region
            && self
                .accelerator
                .as_deref()
                .is_none_or(|a| match accelerator {
                    Some(b) => a.eq_ignore_ascii_case(b),
                    None => a.is_empty(),
                })
            && self.accelerator_count.is_none_or(|n| n == count)
    }
}

/// What a provider's price API said: the quotes, and plain words about
/// what it could not say (prices it has no API for, credentials that do
/// not reach the billing API), for the user to read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices {
    /// One per (type, accelerator, zone) the provider offers.
    pub quotes: Vec<PriceQuote>,
    /// What was not quoted, and why.
    pub notes: Vec<String>,
}

/// A place gangway can run nodes. Every method is idempotent.
///
/// # The contract
///
/// Every provider keeps these rules; `gangway_test::contract` checks them
/// against each provider's emulator (docs/testing.md), and a provider that
/// cannot keep one names the exception there with its reason.
///
/// * **Idempotence.** A launch reconciles: it finds the cluster's nodes by
///   its tags (or records), reuses those that fit and creates only the
///   shortfall, so a second launch of the same request (same client token,
///   same cluster) returns the same nodes and creates nothing. `terminate`
///   and `stop` may be called again, and `terminate` of a cluster that
///   never existed is `Ok`.
/// * **Describe.** `describe` reports the nodes a launch returned, in the
///   placement they were launched in, with their current state; nodes the
///   provider ended on our request are left out, nodes it took away
///   (preemption) are reported as [`NodeState::Preempted`].
/// * **Tags.** Everything a launch makes (nodes, groups, rules, keys,
///   records, allocations) carries the cluster's name and the owner id of
///   the installation that launched it, so that `terminate` finds all of
///   it without ids kept elsewhere and [`Provider::clusters`] can list it.
///   Another owner's resources are never listed as ours, reused, stopped
///   or terminated, even under the same cluster name.
/// * **Half-created clusters.** A launch can fail, or its caller can die,
///   at any point. `terminate` then removes whatever was made, leaving
///   nothing of the cluster; a later launch of the name starts afresh.
/// * **Stopping.** Where [`Provider::cannot_stop`] is `None`, `stop` keeps
///   every node (stopped) and `start` brings the same nodes back; otherwise
///   `stop` refuses with [`ErrorKind::InvalidRequest`] and changes nothing.
/// * **Errors.** Failures are [`ProviderError`]s whose kind steers the
///   failover loop: no capacity is [`ErrorKind::Capacity`] and a limit
///   [`ErrorKind::Quota`] (both fail over to the next candidate); refused
///   credentials are [`ErrorKind::Auth`] and a request the provider cannot
///   serve [`ErrorKind::InvalidRequest`] (neither fails over: the user
///   must act); throttling and lost connections are
///   [`ErrorKind::Transient`]. Each names the provider and, as precisely
///   as known, the region (and zone) it happened in, never credentials.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// Provider name as used in `infra:` (e.g. `aws`).
    fn name(&self) -> &str;

    /// Credentials and usable regions.
    async fn check(&self) -> Result<CheckReport>;

    /// Launch exactly `req.count` nodes in one zone, or fail leaving none of
    /// them running. Reuses nodes already tagged with the cluster and creates
    /// only the shortfall; a retry with the same client token never doubles.
    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>>;

    /// Every node tagged with the cluster, including preempted ones.
    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>>;

    /// Stop (keep disks). Safe on half-created clusters.
    async fn stop(&self, cluster: &ClusterName) -> Result<()>;

    /// Why `stop` could not work for a cluster on this market (`None`: it
    /// can), so `autostop` and `stop` refuse up front instead of failing
    /// later where nobody watches.
    fn cannot_stop(&self, use_spot: bool) -> Option<&'static str> {
        let _ = use_spot;
        None
    }

    /// Start stopped nodes. `provider_config` is the task's
    /// `config.<provider>` section the cluster was launched with (capacity
    /// and similar limits apply to a restart as to a launch).
    async fn start(
        &self,
        cluster: &ClusterName,
        provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>>;

    /// Terminate everything tagged with the cluster. Safe on half-created
    /// clusters and when nothing exists.
    async fn terminate(&self, cluster: &ClusterName) -> Result<()>;

    /// Why a running cluster of this provider cannot have lost nodes
    /// replaced in place (`None`: it can). A provider that can promises
    /// two things: [`Provider::remove_nodes`] removes single nodes, and a
    /// [`Provider::launch`] for a cluster that has nodes keeps them and
    /// adds only the shortfall in the same placement (placement group,
    /// compact policy, pod group), all or nothing. A managed gang that
    /// loses a node then keeps its survivors; elsewhere it is recovered
    /// whole.
    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        Some("this provider cannot add nodes to a running cluster")
    }

    /// Terminates these nodes of the cluster and returns once the
    /// provider confirms them gone (ids it no longer knows count as
    /// gone). Its other nodes are not touched.
    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let _ = ids;
        Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            self.name(),
            cluster.0.clone(),
            self.cannot_replace_nodes()
                .unwrap_or("removing single nodes is not implemented"),
        ))
    }

    /// The first machine of this provider's own configuration in `region`
    /// (an SSH pool's first host), as SSH reaches it: where
    /// `jobs.controller: PROVIDER/REGION` runs the managed-job controller.
    /// Default: none (a provider whose machines are made, not listed).
    fn configured_host(&self, region: &str) -> Option<SshEndpoint> {
        let _ = region;
        None
    }

    /// Variables a gangway running on one of this provider's machines
    /// (a managed-job controller host) needs from the gangway that
    /// launched it to act as the same account: never credentials (the
    /// machine has its own identity), only where to act (a project).
    /// Default: none.
    fn host_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Stops the machine this process runs on, one of this provider's,
    /// found through the provider's metadata service and asked with the
    /// machine's own identity (its credentials from the SDK's default
    /// chain, never a user's keys): what a managed-job controller host
    /// does when it has been idle. Its disk is kept and
    /// [`Provider::start`] brings it back. Default: refused
    /// ([`ErrorKind::InvalidRequest`]).
    async fn stop_this_machine(&self) -> Result<()> {
        Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            self.name(),
            "",
            "this provider cannot stop the machine gangway runs on",
        ))
    }

    /// Whether [`Provider::prices`] asks a live price API (what `gangway
    /// catalog refresh` offers to refresh). Say `true` where it is
    /// implemented.
    fn has_price_api(&self) -> bool {
        false
    }

    /// Whether the nodes are this machine's own processes: a launch costs
    /// nothing real, so the CLI asks no question before it.
    fn runs_on_this_machine(&self) -> bool {
        false
    }

    /// Live prices for these instance types in these regions: the catalog
    /// refresh hook. Providers without a price API keep the default.
    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let _ = (instance_types, regions);
        Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            self.name(),
            "",
            "this provider has no price API; its catalog prices stay as shipped",
        ))
    }

    /// The interruption buckets this provider publishes for its spot
    /// offers, as `(region, instance type, bucket)` with buckets 0 (least
    /// interrupted, `<5%` a month) to 4 (`>20%`): what `catalog refresh`
    /// writes over the shipped table. `Ok(None)`: it publishes none.
    async fn interruption_buckets(&self) -> Result<Option<Vec<(String, String, u8)>>> {
        Ok(None)
    }

    /// Network path per node, root first. Providers without topology data
    /// return the paths already on the nodes.
    async fn topology(&self, nodes: &[Node]) -> Result<Vec<Vec<String>>> {
        Ok(nodes.iter().map(|n| n.topology.clone()).collect())
    }

    /// The transport for this provider's nodes in `cluster`, with gangway's
    /// state under `home`; `None` (the default): the nodes are reached over
    /// SSH, at each node's [`SshEndpoint`], by the core's generic transport,
    /// which runs [`Provider::notice_probe`] for preemption notices.
    /// Nothing else about how nodes are reached is decided by name.
    fn transport(&self, home: &Path, cluster: &str) -> Option<Box<dyn Transport>> {
        let _ = (home, cluster);
        None
    }

    /// For nodes reached over SSH: how long the first connection to new
    /// nodes keeps trying. A fresh cloud VM boots, runs cloud-init and only
    /// then answers on port 22 (minutes on GPU images): 10 minutes unless a
    /// provider knows its machines are up already.
    fn first_contact_wait(&self) -> Duration {
        Duration::from_secs(600)
    }

    /// For nodes reached over SSH: how long a node that refuses gangway's
    /// key is asked again. A fresh VM's guest agent may install the key a
    /// little after sshd starts; machines that were up before refuse for
    /// good at once (zero).
    fn key_refusal_grace(&self) -> Duration {
        Duration::from_secs(90)
    }

    /// For nodes reached over SSH: whether the machines outlive their
    /// clusters (machines you already have, not VMs made for the cluster).
    /// Their host keys are then kept across clusters, beside the user's own
    /// `~/.ssh/known_hosts`, so a key that changed between two clusters is
    /// refused instead of learnt again; a cloud VM's address is reused by
    /// other machines, so its keys stay with its cluster.
    fn hosts_outlive_clusters(&self) -> bool {
        false
    }

    /// The SSH host keys `node` published through this provider's own
    /// API (a boot console's cloud-init block, guest attributes), as
    /// [`host_keys::key_line`]s: what gangway pins a machine it hands
    /// secrets to (the managed-job controller host) by, before its first
    /// connection, so that whoever answers at its address first is not
    /// trusted for it. `Ok(Some(empty))`: the provider publishes them but
    /// has none of this node yet (still booting); `Ok(None)` (the
    /// default): it publishes none.
    async fn host_keys(&self, node: &Node) -> Result<Option<Vec<String>>> {
        let _ = node;
        Ok(None)
    }

    /// For nodes reached over SSH: a shell command that asks the node for
    /// the provider's advance notice of a preemption, or `None` when this
    /// node has none to ask (not spot, or a provider without notices). The
    /// core runs it over the node's connection; whatever it prints after
    /// [`NOTICE_MARK`], up to the end of its output, is the notice (in the
    /// provider's words, joined into one line); no mark, or nothing after
    /// it, is no notice. Failing commands read as no notice.
    fn notice_probe(&self, node: &NodeRow) -> Option<String> {
        let _ = node;
        None
    }

    /// Whether this provider's machines outlive the clusters placed on
    /// them (machines in a pool), so a teardown first kills whatever the
    /// cluster still runs there. Cloud VMs go with everything on them.
    fn machines_outlive_clusters(&self) -> bool {
        false
    }

    /// The stores (URL schemes: `s3`, `gs`) that nodes launched with
    /// `provider_config` (the task's `config.<provider>` section, with the
    /// user's `<provider>.remote_identity`) will reach with an identity of
    /// their own, so gangway need not make credentials for them before
    /// they exist. Where nodes have one, [`IDENTITY_STORES_FACT`] says so
    /// on each. Default: none.
    fn identity_stores(&self, provider_config: Option<&serde_json::Value>) -> Vec<String> {
        let _ = provider_config;
        Vec::new()
    }

    /// Every cluster this provider holds resources for under gangway's
    /// tags, whoever's, found wherever the provider can look, each with its
    /// owner tag (and user tag, where there is one): the sweep that finds
    /// what a lost state database no longer knows. The caller decides
    /// which are its own ([`is_owner_id`]). A cluster tagged by several
    /// owners is listed once per owner. Providers whose every resource is
    /// in local records return an empty list.
    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        Ok(Vec::new())
    }
}

/// The label (tag) of a managed-job controller host's nodes: they launch,
/// stop and terminate machines with their own identity, so a provider that
/// narrows its nodes' identity (GCP's OAuth scopes) widens it to that for
/// these.
pub const CONTROLLER_LABEL: &str = "gangway-controller";

/// What precedes a preemption notice in the output of a
/// [`Provider::notice_probe`], so that nothing else a node's shell prints
/// (a banner, a profile's echo) is ever taken for one.
pub const NOTICE_MARK: &str = "gangway-spot-notice:";

/// The notice in a notice probe's output, on one line, e.g.
/// `spot/instance-action: {json}` or `instance/preempted: TRUE`; `None`
/// without [`NOTICE_MARK`] or without a value after the notice's name.
pub fn parse_notice(out: &str) -> Option<String> {
    let (_, notice) = out.split_once(NOTICE_MARK)?;
    let notice = notice.split_whitespace().collect::<Vec<_>>().join(" ");
    (notice.split_once(": ").is_some_and(|(_, v)| !v.is_empty())).then_some(notice)
}

/// Quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A cluster found by gangway's tags on a provider's resources.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaggedCluster {
    /// The cluster's exact name.
    pub name: ClusterName,
    /// Its `gangway-owner` tag: the owner id of the gangway installation
    /// that made it, or, on what versions before owner ids made, the
    /// launching user's name.
    pub owner: String,
    /// Its `gangway-user` tag (the launching user, readable), if any.
    pub user: Option<String>,
}

/// Whether `tag` is an installation's owner id (`gw-` and 16 lowercase hex
/// digits), as opposed to the user name earlier versions tagged with.
pub fn is_owner_id(tag: &str) -> bool {
    tag.strip_prefix("gw-").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Why [`my_public_ip`] could not learn this machine's address.
#[derive(Debug, thiserror::Error)]
pub enum PublicIpError {
    /// Resolving, connecting, sending or reading failed.
    #[error("cannot learn your public address from checkip.amazonaws.com ({0})")]
    Io(#[from] std::io::Error),
    /// The name resolved to no address.
    #[error("cannot learn your public address from checkip.amazonaws.com (no address)")]
    NoAddress,
    /// The answer was not an IPv4 address.
    #[error(
        "cannot learn your public address from checkip.amazonaws.com (unexpected answer '{0}')"
    )]
    Unexpected(String),
}

/// Asks checkip.amazonaws.com (plain HTTP, 3 s) for this machine's public
/// IPv4 address (firewall rules open SSH to it only). The error says what
/// failed; callers add which setting replaces it.
pub fn my_public_ip() -> std::result::Result<String, PublicIpError> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    use std::time::Duration;
    let addr = ("checkip.amazonaws.com", 80)
        .to_socket_addrs()?
        .next()
        .ok_or(PublicIpError::NoAddress)?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: checkip.amazonaws.com\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let ip = body.rsplit("\r\n\r\n").next().unwrap_or_default().trim();
    ip.parse::<std::net::Ipv4Addr>()
        .map(|a| a.to_string())
        .map_err(|_| PublicIpError::Unexpected(ip.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn signals_reach_nodes_by_name_not_by_this_machines_number() {
        assert_eq!(super::kill_option(libc::SIGUSR1), "-s USR1");
        assert_eq!(super::kill_option(libc::SIGTERM), "-s TERM");
        assert_eq!(super::kill_option(libc::SIGKILL), "-s KILL");
        assert_eq!(super::kill_option(77), "-77");
        let script = super::signal_token("t1", libc::SIGUSR2);
        assert!(script.contains("kill -s USR2 -- -$p"), "{script}");
        assert!(!script.contains(&format!("-{}", libc::SIGUSR2)), "{script}");
    }

    #[test]
    fn port_ranges_parse() {
        assert_eq!(super::parse_port_range("20100-20149"), Some((20100, 20149)));
        assert_eq!(super::parse_port_range("7-7"), Some((7, 7)));
        for bad in ["", "1", "2-1", "a-b", "1-70000", "-5"] {
            assert_eq!(super::parse_port_range(bad), None, "{bad}");
        }
    }

    use super::*;

    #[test]
    fn a_notice_is_read_only_after_its_mark() {
        assert_eq!(parse_notice(""), None);
        assert_eq!(parse_notice("welcome to the node\n"), None);
        assert_eq!(parse_notice("gangway-spot-notice:\n"), None);
        assert_eq!(
            parse_notice("gangway-spot-notice:spot/instance-action: \n"),
            None
        );
        let json = r#"{"action": "terminate", "time": "2026-12-02T22:51:00Z"}"#;
        assert_eq!(
            parse_notice(&format!(
                "motd {{\"x\": 1}}\ngangway-spot-notice:spot/instance-action: {json}\n"
            )),
            Some(format!("spot/instance-action: {json}"))
        );
        // Spread over lines: one line in the job's events.
        assert_eq!(
            parse_notice(
                "gangway-spot-notice:spot/instance-action: {\n  \"action\": \"stop\"\n}\n"
            )
            .as_deref(),
            Some(r#"spot/instance-action: { "action": "stop" }"#)
        );
        assert_eq!(
            parse_notice("gangway-spot-notice:instance/preempted: TRUE\n").as_deref(),
            Some("instance/preempted: TRUE")
        );
    }

    #[test]
    fn owner_ids_are_told_from_user_names() {
        assert!(is_owner_id("gw-0123456789abcdef"));
        for not in [
            "ubuntu",
            "root",
            "gw-0123456789ABCDEF",
            "gw-0123456789abcde",
            "gw-0123456789abcdef0",
            "gw-0123456789abcdeg",
            "",
        ] {
            assert!(!is_owner_id(not), "{not}");
        }
    }

    #[test]
    fn only_capacity_and_quota_fail_over() {
        let all = [
            ErrorKind::Capacity,
            ErrorKind::Quota,
            ErrorKind::Auth,
            ErrorKind::InvalidRequest,
            ErrorKind::Transient,
            ErrorKind::Fatal,
        ];
        let over: Vec<_> = all.into_iter().filter(|k| k.fails_over()).collect();
        assert_eq!(over, vec![ErrorKind::Capacity, ErrorKind::Quota]);
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E(
            "dispatch failure: io error",
            Some(Box::new(E(
                "io error",
                Some(Box::new(E("connection refused", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "dispatch failure: io error: connection refused"
        );
    }

    #[test]
    fn error_names_provider_location_and_words() {
        let e = ProviderError::new(
            ErrorKind::Capacity,
            "aws",
            "us-east-1/us-east-1a",
            "InsufficientInstanceCapacity: no p5.48xlarge",
        );
        assert_eq!(
            e.to_string(),
            "aws us-east-1/us-east-1a: out of capacity: InsufficientInstanceCapacity: no p5.48xlarge"
        );
    }
}
