//! The task model: what a task file means once parsed.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// A whole task.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Task {
    /// `name`.
    pub name: Option<String>,
    /// `workdir`.
    pub workdir: Option<Workdir>,
    /// `num_nodes` (default 1).
    pub num_nodes: u32,
    /// `resources`.
    pub resources: Resources,
    /// `envs`: `None` means required, to be given with `--env`.
    pub envs: Vec<(String, Option<String>)>,
    /// `secrets`: like envs, never printed.
    pub secrets: Vec<(String, Option<Secret>)>,
    /// `file_mounts`.
    pub file_mounts: Vec<FileMount>,
    /// `setup`.
    pub setup: Option<String>,
    /// `run`.
    pub run: Option<String>,
    /// `config` (provider-specific overrides), kept as JSON.
    pub config: Option<serde_json::Value>,
    /// `checkpoint` (gangway extension).
    pub checkpoint: Option<Checkpoint>,
    /// `deadline` (gangway extension): finish within this many seconds.
    pub deadline_s: Option<u64>,
    /// `deadline.work`: how much running time the job needs (what the
    /// deadline policies plan with).
    pub deadline_work_s: Option<u64>,
    /// `deadline.policy`: `uniform_progress` (default), `greedy`, `on_demand`.
    pub deadline_policy: Option<String>,
}

/// A secret value; its `Debug`, `Display` and `Serialize` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(v: impl Into<String>) -> Self {
        Secret(v.into())
    }
    /// The value itself, for handing to a node's environment only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// `workdir`: a local directory or a git repository.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub enum Workdir {
    /// A local path.
    Path(String),
    /// `{url, ref}`.
    Git {
        /// Repository URL.
        url: String,
        /// Branch, tag or commit.
        git_ref: Option<String>,
    },
}

/// One `file_mounts` entry.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FileMount {
    /// Path on the node.
    pub dest: String,
    /// What goes there.
    pub source: MountSource,
    /// Where the source is written in the task file (1-based line and
    /// column), for errors found after parsing (a bucket that is missing).
    pub at: (usize, usize),
}

/// What a mount is made of.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub enum MountSource {
    /// A local file or directory.
    Local(String),
    /// A bucket URI (`s3://`, `gs://`, `r2://`, `https://...blob...`).
    Uri(String),
    /// A storage object: `{name, source, store, persistent, mode}`.
    Storage {
        /// Bucket name.
        name: Option<String>,
        /// Local path or URI to fill it from.
        source: Option<String>,
        /// `s3`, `gcs`, ...
        store: Option<String>,
        /// Keep the bucket after the task.
        persistent: Option<bool>,
        /// `MOUNT`, `COPY`, `MOUNT_CACHED`.
        mode: Option<String>,
    },
}

/// A `cpus`/`memory` request: exactly `value`, or at least it with `+`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Quantity {
    /// The number.
    pub value: f64,
    /// `true` for `"4+"`.
    pub at_least: bool,
}

impl Quantity {
    /// Whether an offering's amount satisfies this request.
    pub fn admits(&self, have: f64) -> bool {
        if self.at_least {
            have + 1e-9 >= self.value
        } else {
            (have - self.value).abs() < 1e-9
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.value, if self.at_least { "+" } else { "" })
    }
}

/// One accelerator request: a name and a count per node.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Accel {
    /// GPU name as written (matched case-insensitively).
    pub name: String,
    /// GPUs per node (fractions allowed, e.g. `K80:0.5`).
    pub count: f32,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.count)
    }
}

/// `accelerators`: one, a set (cheapest of) or a list (in order).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub enum Accelerators {
    /// `A100:8`.
    One(Accel),
    /// `{A100:8, H100:8}`: any, cheapest first.
    AnyOf(Vec<Accel>),
    /// `[A100:8, H100:8]`: in this order of preference.
    Ordered(Vec<Accel>),
}

/// `infra` (or the older `cloud`/`region`/`zone`): `None` is a wildcard.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Infra {
    /// Cloud, lower case.
    pub cloud: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Zone.
    pub zone: Option<String>,
}

impl fmt::Display for Infra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "*".into());
        write!(f, "{}", part(&self.cloud))?;
        if self.region.is_some() || self.zone.is_some() {
            write!(f, "/{}", part(&self.region))?;
        }
        if self.zone.is_some() {
            write!(f, "/{}", part(&self.zone))?;
        }
        Ok(())
    }
}

/// A port or an inclusive range of ports.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct PortRange {
    /// First port.
    pub start: u16,
    /// Last port (equal to `start` for one port).
    pub end: u16,
}

/// One set of resource constraints (the top level, or one `any_of`/`ordered` item).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ResourceSpec {
    /// Where.
    pub infra: Infra,
    /// GPUs.
    pub accelerators: Option<Accelerators>,
    /// vCPUs per node.
    pub cpus: Option<Quantity>,
    /// Memory per node, GiB.
    pub memory: Option<Quantity>,
    /// Exact instance type.
    pub instance_type: Option<String>,
    /// Spot or on-demand (`None`: on-demand).
    pub use_spot: Option<bool>,
    /// Root disk, GiB.
    pub disk_size: Option<u32>,
    /// `disk_tier`.
    pub disk_tier: Option<String>,
    /// `network_tier`.
    pub network_tier: Option<String>,
    /// Image or `docker:` image.
    pub image_id: Option<String>,
    /// Ports to open.
    pub ports: Vec<PortRange>,
    /// Labels/tags for the instances.
    pub labels: BTreeMap<String, String>,
    /// gangway extension: most to pay per node-hour, USD.
    pub max_hourly_cost: Option<f64>,
    /// gangway extension: how spot offers are ranked (`spot_risk:`).
    pub spot_risk: Option<SpotRisk>,
}

/// `resources.spot_risk` (a gangway extension): rank spot offers by their
/// price (the default, as SkyPilot does) or by the expected cost of an
/// hour of useful work, given how often each is interrupted.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SpotRisk {
    /// What spot offers are ranked by.
    pub rank: SpotRank,
    /// Minutes billed without progress after each interruption (a new
    /// instance's boot, setup and checkpoint restore).
    pub restart_minutes: f64,
    /// Minutes between checkpoints: an interruption loses half of it on
    /// average.
    pub checkpoint_minutes: f64,
}

impl SpotRisk {
    /// Restart overhead when the task gives none: the simulator's default
    /// (`gangway sim --restart-hours 0.05`).
    pub const DEFAULT_RESTART_MINUTES: f64 = 3.0;
    /// Checkpoint interval when the task gives none.
    pub const DEFAULT_CHECKPOINT_MINUTES: f64 = 30.0;
}

/// What spot offers are ranked by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpotRank {
    /// The spot price.
    Price,
    /// The expected cost per hour of useful work.
    ExpectedCost,
}

impl ResourceSpec {
    /// This spec with every unset field taken from `base`.
    pub fn over(&self, base: &ResourceSpec) -> ResourceSpec {
        fn pick<T: Clone>(a: &Option<T>, b: &Option<T>) -> Option<T> {
            a.clone().or_else(|| b.clone())
        }
        let infra = if self.infra == Infra::default() {
            base.infra.clone()
        } else {
            self.infra.clone()
        };
        let mut labels = base.labels.clone();
        labels.extend(self.labels.clone());
        ResourceSpec {
            infra,
            accelerators: pick(&self.accelerators, &base.accelerators),
            cpus: pick(&self.cpus, &base.cpus),
            memory: pick(&self.memory, &base.memory),
            instance_type: pick(&self.instance_type, &base.instance_type),
            use_spot: pick(&self.use_spot, &base.use_spot),
            disk_size: pick(&self.disk_size, &base.disk_size),
            disk_tier: pick(&self.disk_tier, &base.disk_tier),
            network_tier: pick(&self.network_tier, &base.network_tier),
            image_id: pick(&self.image_id, &base.image_id),
            ports: if self.ports.is_empty() {
                base.ports.clone()
            } else {
                self.ports.clone()
            },
            labels,
            max_hourly_cost: pick(&self.max_hourly_cost, &base.max_hourly_cost),
            spot_risk: pick(&self.spot_risk, &base.spot_risk),
        }
    }
}

/// How the items of `resources` combine.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub enum Choice {
    /// Only the top-level fields.
    #[default]
    Single,
    /// `any_of`: cheapest of these.
    AnyOf(Vec<ResourceSpec>),
    /// `ordered`: these, in order.
    Ordered(Vec<ResourceSpec>),
}

/// `resources`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Resources {
    /// Fields outside `any_of`/`ordered`; defaults for every item.
    pub base: ResourceSpec,
    /// The items.
    pub choice: Choice,
    /// `job_recovery` (or the legacy `spot_recovery`).
    pub job_recovery: Option<JobRecovery>,
}

/// One group of fully-resolved alternatives: the optimizer takes the
/// cheapest within a group, and earlier groups before later ones.
pub type PreferenceGroup = Vec<ResourceSpec>;

impl Resources {
    /// The alternatives in preference order. Every returned spec has at most
    /// one accelerator (`Accelerators::One`) and has the top-level defaults
    /// applied.
    pub fn preference_groups(&self) -> Vec<PreferenceGroup> {
        let items: Vec<ResourceSpec> = match &self.choice {
            Choice::Single => vec![self.base.clone()],
            Choice::AnyOf(v) | Choice::Ordered(v) => v.iter().map(|i| i.over(&self.base)).collect(),
        };
        let ordered_items = matches!(self.choice, Choice::Ordered(_));
        let mut groups: Vec<PreferenceGroup> = Vec::new();
        let mut any_group: PreferenceGroup = Vec::new();
        for item in items {
            let with = |a: &Accel| ResourceSpec {
                accelerators: Some(Accelerators::One(a.clone())),
                ..item.clone()
            };
            let expanded: Vec<PreferenceGroup> = match &item.accelerators {
                None | Some(Accelerators::One(_)) => vec![vec![item.clone()]],
                Some(Accelerators::AnyOf(v)) => vec![v.iter().map(with).collect()],
                // A list is an order of preference, except inside `any_of`,
                // where everything competes on price.
                Some(Accelerators::Ordered(v))
                    if ordered_items || self.choice == Choice::Single =>
                {
                    v.iter().map(|a| vec![with(a)]).collect()
                }
                Some(Accelerators::Ordered(v)) => vec![v.iter().map(with).collect()],
            };
            if ordered_items || self.choice == Choice::Single {
                groups.extend(expanded);
            } else {
                any_group.extend(expanded.into_iter().flatten());
            }
        }
        if !any_group.is_empty() {
            groups.push(any_group);
        }
        groups
    }
}

/// `job_recovery`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobRecovery {
    /// `REPLACE_LOST_NODES` (the default), `FAILOVER`,
    /// `EAGER_NEXT_REGION`, or `NONE`.
    pub strategy: Option<String>,
    /// Restarts allowed when the job fails on its own.
    pub max_restarts_on_errors: u32,
    /// Exit codes that count as recoverable.
    pub recover_on_exit_codes: Vec<i32>,
}

/// `checkpoint` (gangway extension).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Checkpoint {
    /// Directory on the node (default: `$GANGWAY_CHECKPOINT_DIR`).
    pub path: Option<String>,
    /// Durable storage: a local directory or a bucket URL.
    pub storage: Option<String>,
    /// Where `storage` is written (line, column), for errors found later.
    pub storage_at: (usize, usize),
    /// Complete checkpoints kept in a bucket (older ones are pruned).
    pub keep: u32,
    /// How often to sync, seconds.
    pub sync_interval_s: u64,
    /// Signal sent on a preemption notice (default `SIGTERM`).
    pub signal: String,
    /// How long the job has after the signal, seconds.
    pub grace_s: u64,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            path: None,
            storage: None,
            storage_at: (0, 0),
            keep: 3,
            sync_interval_s: 300,
            signal: "SIGTERM".into(),
            grace_s: 60,
        }
    }
}
