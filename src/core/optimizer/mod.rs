//! From a task and a catalog to a ranked failover plan.
//!
//! Every feasible (cloud, region, zone, instance type, market) for the
//! task's node count becomes a [`Candidate`]. Preference groups (from
//! `ordered` and accelerator lists) keep the user's order; inside a group
//! candidates compete on total hourly cost. The plan keeps the N cheapest
//! instance types per cloud and region, with all their zones, so failover
//! has somewhere to go.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::core::catalog::risk::expected_cost;
use crate::core::catalog::{Catalog, Offering, ANY_ACCELERATOR};
use crate::core::spec::{Accelerators, Quantity, ResourceSpec, SpotRank, SpotRisk, Task};

/// How many instance types to keep per (group, cloud, region).
pub(crate) const DEFAULT_TYPES_PER_REGION: usize = 3;

/// One place the task could run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Candidate {
    /// Cloud.
    pub(crate) cloud: String,
    /// Region.
    pub(crate) region: String,
    /// Zone.
    pub(crate) zone: String,
    /// Instance type.
    pub(crate) instance_type: String,
    /// GPU name (the task's spelling for the local provider's fake GPUs).
    pub(crate) accelerator: Option<String>,
    /// GPUs per node.
    pub(crate) accelerator_count: f32,
    /// Spot market.
    pub(crate) use_spot: bool,
    /// Nodes.
    pub(crate) nodes: u32,
    /// USD per node-hour.
    pub(crate) price_per_node_hour: f64,
    /// USD per hour for all nodes.
    pub(crate) total_per_hour: f64,
    /// The price is the catalog's estimate, not a published figure.
    pub(crate) price_estimated: bool,
    /// Spot only: how often the offer is interrupted (the advisor's
    /// bucket; `?` after it when it is the default for want of one).
    pub(crate) interruption: Option<String>,
    /// Spot only: the expected cost of a node's hour of useful work, given
    /// the interruption rate and the task's `spot_risk` restart overhead
    /// and checkpoint interval (or their defaults); `None` on demand or
    /// when interruptions would leave no progress.
    pub(crate) expected_cost_per_node_hour: Option<f64>,
    /// vCPUs per node.
    #[serde(skip)]
    pub(crate) vcpus: f32,
    /// Memory per node, GiB.
    #[serde(skip)]
    pub(crate) memory_gib: f32,
    /// Preference group (0 = most preferred).
    #[serde(skip)]
    pub(crate) group: usize,
    /// The resolved resources this candidate satisfies.
    #[serde(skip)]
    pub(crate) spec: Arc<ResourceSpec>,
}

/// One blocked place, until `until`. `None` fields match everything. The
/// one blocklist type: the failover walk blocks what failed, the
/// managed-job controller keeps the zones its jobs lost (serialized with
/// the job, times as unix ms).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Block {
    /// Cloud.
    pub(crate) cloud: String,
    /// Region.
    #[serde(default)]
    pub(crate) region: Option<String>,
    /// Zone.
    #[serde(default)]
    pub(crate) zone: Option<String>,
    /// Instance type.
    #[serde(default)]
    pub(crate) instance_type: Option<String>,
    /// Since when (unix ms; 0 when not recorded): the controller drops the
    /// oldest block first when everything is blocked.
    #[serde(default)]
    pub(crate) at_ms: i64,
    /// Expiry.
    #[serde(rename = "until_ms", with = "unix_ms")]
    pub(crate) until: SystemTime,
    /// Why (shown when everything is blocked).
    pub(crate) reason: String,
}

impl Block {
    /// Whether the block covers a planned candidate (expiry aside).
    pub(crate) fn covers(&self, c: &Candidate) -> bool {
        self.cloud == c.cloud
            && self.region.as_deref().is_none_or(|r| r == c.region)
            && self.zone.as_deref().is_none_or(|z| z == c.zone)
            && self
                .instance_type
                .as_deref()
                .is_none_or(|t| t == c.instance_type)
    }
}

/// `SystemTime` as unix milliseconds.
mod unix_ms {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        s.serialize_i64(ms)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let ms = i64::deserialize(d)?.max(0) as u64;
        Ok(UNIX_EPOCH + Duration::from_millis(ms))
    }
}

/// Places not to try for a while (capacity errors, preemptions).
#[derive(Clone, Debug, Default)]
pub struct Blocklist {
    /// Entries, expired ones included until pruned.
    pub(crate) entries: Vec<Block>,
}

impl Blocklist {
    /// Whether `o` is blocked at `now`.
    pub(crate) fn blocks(&self, o: &Offering, now: SystemTime) -> Option<&Block> {
        self.entries.iter().find(|b| {
            b.until > now
                && b.cloud == o.cloud
                && b.region.as_deref().is_none_or(|r| r == o.region)
                && b.zone.as_deref().is_none_or(|z| z == o.zone)
                && b.instance_type
                    .as_deref()
                    .is_none_or(|t| t == o.instance_type)
        })
    }
}

/// Optimizer settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Instance types kept per (group, cloud, region).
    pub(crate) types_per_region: usize,
    /// Time used for blocklist expiry.
    pub(crate) now: SystemTime,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            types_per_region: DEFAULT_TYPES_PER_REGION,
            now: SystemTime::now(),
        }
    }
}

/// No candidate survived; `reasons` says which constraint removed what.
#[derive(Clone, Debug, thiserror::Error)]
#[error("no feasible placement: {}", reasons.join("; "))]
pub struct Infeasible {
    /// One reason per resource alternative.
    pub(crate) reasons: Vec<String>,
}

fn accel_of(spec: &ResourceSpec) -> Option<(&str, f32)> {
    match &spec.accelerators {
        Some(Accelerators::One(a)) => Some((a.name.as_str(), a.count)),
        // preference_groups() resolves sets and lists to single accelerators.
        _ => None,
    }
}

fn same_count(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-4
}

/// Indexes of the offerings that could serve `spec`, before any filter but
/// the accelerator name.
fn pool(catalog: &Catalog, spec: &ResourceSpec) -> Vec<u32> {
    let mut out: Vec<u32> = match (accel_of(spec), &spec.instance_type) {
        (Some((name, _)), _) => catalog.indexes_with_accelerator(name).to_vec(),
        (None, Some(t)) => (0..catalog.offerings().len() as u32)
            .filter(|i| &catalog.get(*i).instance_type == t)
            .collect(),
        (None, None) => catalog.indexes_with_accelerator("").to_vec(),
    };
    // A named cloud whose rows take any GPU name (the local cloud's fake
    // GPUs) offers them under the task's name.
    if let (Some(cloud), Some(_)) = (spec.infra.cloud.as_deref(), accel_of(spec)) {
        out.extend(
            catalog
                .indexes_with_accelerator(ANY_ACCELERATOR)
                .iter()
                .filter(|i| catalog.get(**i).cloud == cloud),
        );
    }
    out
}

/// A CPU-only task that names no size gets at least 4 vCPUs, as SkyPilot
/// does, rather than the smallest burstable machine in the catalog.
pub(crate) const DEFAULT_CPUS: Quantity = Quantity {
    value: 4.0,
    at_least: true,
};

fn default_cpus(spec: &ResourceSpec) -> Option<Quantity> {
    (spec.accelerators.is_none() && spec.instance_type.is_none() && spec.memory.is_none())
        .then_some(DEFAULT_CPUS)
}

/// The filters, in the order they are explained when nothing survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Cloud,
    Count,
    Region,
    Zone,
    InstanceType,
    Cpus,
    Memory,
    Market,
    MaxCost,
    Blocked,
}

const STAGES: [Stage; 10] = [
    Stage::Cloud,
    Stage::Count,
    Stage::Region,
    Stage::Zone,
    Stage::InstanceType,
    Stage::Cpus,
    Stage::Memory,
    Stage::Market,
    Stage::MaxCost,
    Stage::Blocked,
];

/// One resolved spec's constraints, ready to test offerings against.
struct Filter<'a> {
    spec: &'a ResourceSpec,
    catalog: &'a Catalog,
    count: Option<f32>,
    cpus: Option<Quantity>,
    spot: bool,
    blocklist: &'a Blocklist,
    now: SystemTime,
}

impl<'a> Filter<'a> {
    fn new(
        spec: &'a ResourceSpec,
        catalog: &'a Catalog,
        blocklist: &'a Blocklist,
        now: SystemTime,
    ) -> Self {
        Filter {
            spec,
            catalog,
            count: accel_of(spec).map(|a| a.1),
            cpus: spec.cpus.or_else(|| default_cpus(spec)),
            spot: spec.use_spot.unwrap_or(false),
            blocklist,
            now,
        }
    }

    fn price(&self, o: &Offering) -> Option<f64> {
        if self.spot {
            o.spot_price
        } else {
            o.price
        }
    }

    fn pass(&self, stage: Stage, o: &Offering) -> bool {
        let infra = &self.spec.infra;
        match stage {
            Stage::Cloud => match infra.cloud.as_deref() {
                Some(c) => o.cloud == c,
                // A cloud on the user's own machine: only when asked for.
                None => !self.catalog.only_when_named(&o.cloud),
            },
            Stage::Count => self
                .count
                .is_none_or(|c| same_count(o.accelerator_count, c)),
            Stage::Region => infra.region.as_deref().is_none_or(|r| o.region == r),
            Stage::Zone => infra.zone.as_deref().is_none_or(|z| o.zone == z),
            Stage::InstanceType => self
                .spec
                .instance_type
                .as_deref()
                .is_none_or(|t| o.instance_type == t),
            Stage::Cpus => self.cpus.is_none_or(|q| q.admits(o.vcpus as f64)),
            Stage::Memory => self
                .spec
                .memory
                .is_none_or(|q| q.admits(o.memory_gib as f64)),
            Stage::Market => self.price(o).is_some(),
            Stage::MaxCost => match (self.spec.max_hourly_cost, self.price(o)) {
                (Some(max), Some(p)) => p <= max + 1e-9,
                _ => true,
            },
            Stage::Blocked => self.blocklist.blocks(o, self.now).is_none(),
        }
    }

    fn feasible(&self, o: &Offering) -> bool {
        STAGES.iter().all(|s| self.pass(*s, o))
    }
}

/// A feasible offering for one spec, before it becomes a [`Candidate`].
#[derive(Clone, Copy)]
struct Hit {
    price: f64,
    total: f64,
    /// What the hit is ranked by: `total`, or for spot with
    /// `spot_risk: expected_cost`, the expected cost of the nodes' useful
    /// hour.
    key: f64,
    spot: bool,
    rank: u32,
    idx: u32,
    spec: u32,
}

/// Ranks every feasible placement of `task`.
pub fn optimize(
    task: &Task,
    catalog: &Catalog,
    blocklist: &Blocklist,
    opts: &Options,
) -> Result<Vec<Candidate>, Infeasible> {
    let ranking = Ranking {
        catalog,
        blocklist,
        now: opts.now,
        nodes: task.num_nodes,
    };
    let mut plan: Vec<Candidate> = Vec::new();
    let mut reasons = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (gi, group) in task.resources.preference_groups().iter().enumerate() {
        let mut hits: Vec<Hit> = Vec::new();
        for (si, spec) in group.iter().enumerate() {
            let found = ranking.hits(spec, si as u32);
            if found.is_empty() {
                reasons.push(explain(catalog, spec, blocklist, opts.now));
            }
            hits.extend(found);
        }
        let specs: Vec<Arc<ResourceSpec>> = group.iter().cloned().map(Arc::new).collect();
        for h in keep_best_per_region(catalog, hits, opts.types_per_region) {
            let spec = &specs[h.spec as usize];
            let accelerator = accelerator_shown(catalog.get(h.idx), spec);
            // The same placement can come from two alternatives; keep the first.
            if !seen.insert((h.idx, h.spot, accelerator.clone())) {
                continue;
            }
            plan.push(ranking.candidate(&h, spec, accelerator, gi));
        }
    }
    if plan.is_empty() {
        reasons.dedup();
        return Err(Infeasible { reasons });
    }
    Ok(plan)
}

/// What ranking one task's placements needs besides its specs.
struct Ranking<'a> {
    catalog: &'a Catalog,
    blocklist: &'a Blocklist,
    now: SystemTime,
    nodes: u32,
}

impl Ranking<'_> {
    /// The feasible offerings for `spec`, item `si` of its group, priced
    /// for the task's nodes and keyed for ranking.
    fn hits(&self, spec: &ResourceSpec, si: u32) -> Vec<Hit> {
        let f = Filter::new(spec, self.catalog, self.blocklist, self.now);
        let mut hits = Vec::new();
        for idx in pool(self.catalog, spec) {
            let o = self.catalog.get(idx);
            if !f.feasible(o) {
                continue;
            }
            let Some(price) = f.price(o) else {
                continue;
            };
            let total = price * self.nodes as f64;
            hits.push(Hit {
                price,
                total,
                key: self.rank_key(&f, o, price, total),
                spot: f.spot,
                rank: self.catalog.keys(idx).rank,
                idx,
                spec: si,
            });
        }
        hits
    }

    /// What a hit at `price` per node (`total` for all nodes) is ranked by:
    /// `total`, or for spot with `spot_risk: expected_cost`, the expected
    /// cost of the nodes' useful hour (infinite when there is no progress).
    fn rank_key(&self, f: &Filter, o: &Offering, price: f64, total: f64) -> f64 {
        match f.spec.spot_risk {
            Some(r) if f.spot && r.rank == SpotRank::ExpectedCost => {
                let i = self.catalog.interruption(o);
                expected_cost(
                    price,
                    i.hourly_rate(),
                    r.restart_minutes / 60.0,
                    r.checkpoint_minutes / 60.0,
                )
                .map_or(f64::INFINITY, |e| e * self.nodes as f64)
            }
            _ => total,
        }
    }

    /// The plan's entry for a kept hit of preference group `group`.
    fn candidate(
        &self,
        h: &Hit,
        spec: &Arc<ResourceSpec>,
        accelerator: Option<String>,
        group: usize,
    ) -> Candidate {
        let o = self.catalog.get(h.idx);
        Candidate {
            cloud: o.cloud.to_string(),
            region: o.region.to_string(),
            zone: o.zone.to_string(),
            instance_type: o.instance_type.to_string(),
            accelerator,
            accelerator_count: o.accelerator_count,
            use_spot: h.spot,
            nodes: self.nodes,
            price_per_node_hour: h.price,
            total_per_hour: h.total,
            price_estimated: o.estimated.market(h.spot),
            interruption: h.spot.then(|| self.catalog.interruption(o).label()),
            expected_cost_per_node_hour: if h.spot {
                self.spot_expected_cost(o, h.price, spec)
            } else {
                None
            },
            vcpus: o.vcpus,
            memory_gib: o.memory_gib,
            group,
            spec: Arc::clone(spec),
        }
    }

    /// The expected cost of a spot node's useful hour at `price`, with the
    /// spec's `spot_risk` overheads or their defaults.
    fn spot_expected_cost(&self, o: &Offering, price: f64, spec: &ResourceSpec) -> Option<f64> {
        let r = spec.spot_risk.unwrap_or(SpotRisk {
            rank: SpotRank::Price,
            restart_minutes: SpotRisk::DEFAULT_RESTART_MINUTES,
            checkpoint_minutes: SpotRisk::DEFAULT_CHECKPOINT_MINUTES,
        });
        expected_cost(
            price,
            self.catalog.interruption(o).hourly_rate(),
            r.restart_minutes / 60.0,
            r.checkpoint_minutes / 60.0,
        )
    }
}

/// The GPU name a candidate shows: the task's spelling on a cloud whose
/// rows take any GPU name (the local provider's fake GPUs), else the row's.
fn accelerator_shown(o: &Offering, spec: &ResourceSpec) -> Option<String> {
    match (&o.accelerator, accel_of(spec)) {
        (Some(a), Some((asked, _))) if a == ANY_ACCELERATOR => Some(asked.to_string()),
        (a, _) => a.as_ref().map(|a| a.to_string()),
    }
}

/// Ranking order: cheapest first; spot before on-demand at equal price;
/// then (cloud, region, zone, type) order; then the user's item order.
fn by_rank(a: &Hit, b: &Hit) -> std::cmp::Ordering {
    a.key
        .total_cmp(&b.key)
        .then(b.spot.cmp(&a.spot))
        .then(a.rank.cmp(&b.rank))
        .then(a.spec.cmp(&b.spec))
}

/// FxHash: a fast hasher for the integer keys below (no untrusted input).
#[derive(Default)]
struct Fx(u64);

impl std::hash::Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fx>>;

/// Keeps, per (cloud, region), the `n` cheapest (instance type, market)
/// pairs with every zone they are offered in, and returns them ranked.
/// Selects before sorting, so only the survivors are sorted.
fn keep_best_per_region(catalog: &Catalog, hits: Vec<Hit>, n: usize) -> Vec<Hit> {
    let key = |h: &Hit| {
        let k = catalog.keys(h.idx);
        (u64::from(k.region) << 33) | (u64::from(k.ty) << 1) | u64::from(h.spot)
    };
    // The best hit of each (region, type, market).
    let mut best: FxMap<u64, Hit> = FxMap::default();
    for h in &hits {
        best.entry(key(h))
            .and_modify(|b| {
                if by_rank(h, b).is_lt() {
                    *b = *h
                }
            })
            .or_insert(*h);
    }
    // Per region, the n best pairs.
    let mut per_region: FxMap<u32, Vec<(u64, Hit)>> = FxMap::default();
    for (k, h) in best {
        per_region.entry((k >> 33) as u32).or_default().push((k, h));
    }
    let mut kept: FxMap<u64, ()> = FxMap::default();
    for pairs in per_region.values_mut() {
        pairs.sort_unstable_by(|a, b| by_rank(&a.1, &b.1));
        kept.extend(pairs.iter().take(n).map(|(k, _)| (*k, ())));
    }
    let mut out: Vec<Hit> = hits
        .into_iter()
        .filter(|h| kept.contains_key(&key(h)))
        .collect();
    out.sort_unstable_by(by_rank);
    out
}

fn list(items: impl IntoIterator<Item = String>) -> String {
    let set: BTreeSet<String> = items.into_iter().collect();
    let v: Vec<String> = set.into_iter().collect();
    if v.len() > 8 {
        format!("{}, ... ({} in all)", v[..8].join(", "), v.len())
    } else {
        v.join(", ")
    }
}

fn counts(v: &[&Offering]) -> String {
    let mut c: Vec<f32> = v.iter().map(|o| o.accelerator_count).collect();
    c.sort_by(f32::total_cmp);
    c.dedup();
    c.iter()
        .map(|x| format!("{x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Says which constraint eliminated the last offerings for `spec`.
pub(crate) fn explain(
    catalog: &Catalog,
    spec: &ResourceSpec,
    blocklist: &Blocklist,
    now: SystemTime,
) -> String {
    let what = wanted(spec);
    let mut left: Vec<&Offering> = pool(catalog, spec)
        .into_iter()
        .map(|i| catalog.get(i))
        .collect();
    if left.is_empty() {
        return not_in_catalog(catalog, spec);
    }
    let f = Filter::new(spec, catalog, blocklist, now);
    for stage in STAGES {
        let next: Vec<&Offering> = left.iter().copied().filter(|o| f.pass(stage, o)).collect();
        if !next.is_empty() {
            left = next;
            continue;
        }
        let out = Eliminated {
            f: &f,
            what: &what,
            left: &left,
        };
        return out.reason(stage);
    }
    format!("{what}: no feasible placement")
}

/// What `spec` asks for, as the reasons name it.
fn wanted(spec: &ResourceSpec) -> String {
    match (accel_of(spec), &spec.instance_type) {
        (Some((n, c)), _) => format!("{n}:{c}"),
        (None, Some(t)) => format!("instance type {t}"),
        (None, None) => "a CPU-only instance".to_string(),
    }
}

/// Why `spec` has no offering in the catalog at all, with the nearest
/// accelerator name when it looks like a typo.
fn not_in_catalog(catalog: &Catalog, spec: &ResourceSpec) -> String {
    match (accel_of(spec), &spec.instance_type) {
        (Some((n, _)), _) => {
            let names = catalog.accelerator_names();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            match crate::core::spec::closest_name(n, &refs) {
                Some(near) => format!(
                    "no offering of accelerator '{n}' in the catalog; did you mean '{near}'?"
                ),
                None => format!(
                    "no offering of accelerator '{n}' in the catalog (known: {})",
                    list(names)
                ),
            }
        }
        (None, Some(t)) => format!("instance type '{t}' is not in the catalog"),
        (None, None) => "the catalog has no CPU-only instance types".into(),
    }
}

/// The offerings `left` when a stage removed them all, ready to say why.
struct Eliminated<'a> {
    f: &'a Filter<'a>,
    /// What the spec asks for (see [`wanted`]).
    what: &'a str,
    left: &'a [&'a Offering],
}

impl Eliminated<'_> {
    /// The reason `stage` removed every offering left.
    fn reason(&self, stage: Stage) -> String {
        let (spec, what, left) = (self.f.spec, self.what, self.left);
        let clouds = list(left.iter().map(|o| o.cloud.to_string()));
        match stage {
            Stage::Count => format!(
                "{what} is not offered; {} comes with {} per instance",
                accel_of(spec).map(|a| a.0).unwrap_or_default(),
                counts(left)
            ),
            Stage::Cloud => format!(
                "{} is offered only on {clouds}; not on {}",
                accel_of(spec).map_or(what, |a| a.0),
                spec.infra
                    .cloud
                    .as_deref()
                    .unwrap_or("any cloud but local (use infra: local)")
            ),
            Stage::Region => self.region(&clouds),
            Stage::Zone => format!(
                "{what} is not offered in zone {} (zones: {})",
                spec.infra.zone.as_deref().unwrap_or(""),
                list(left.iter().map(|o| o.zone.to_string()))
            ),
            Stage::InstanceType => format!(
                "{what} is not offered as instance type {} (types: {})",
                spec.instance_type.as_deref().unwrap_or(""),
                list(left.iter().map(|o| o.instance_type.to_string()))
            ),
            Stage::Cpus => format!(
                "no {what} offering has cpus {} (offered: {})",
                self.f.cpus.map(|q| q.to_string()).unwrap_or_default(),
                list(left.iter().map(|o| format!("{}", o.vcpus)))
            ),
            Stage::Memory => format!(
                "no {what} offering has memory {} GiB (offered: {})",
                spec.memory.map(|q| q.to_string()).unwrap_or_default(),
                list(left.iter().map(|o| format!("{}", o.memory_gib)))
            ),
            Stage::Market => format!(
                "{what} has no {} price where the other constraints allow",
                if spec.use_spot.unwrap_or(false) {
                    "spot"
                } else {
                    "on-demand"
                }
            ),
            Stage::MaxCost => self.max_cost(),
            Stage::Blocked => self.blocked(),
        }
    }

    /// No offering in the asked region, on the asked cloud or on `clouds`.
    fn region(&self, clouds: &str) -> String {
        let (spec, what) = (self.f.spec, self.what);
        match spec.infra.cloud.as_deref() {
            Some(cloud) => format!(
                "{what} on {cloud} is not offered in region {} (regions: {})",
                spec.infra.region.as_deref().unwrap_or(""),
                list(self.left.iter().map(|o| o.region.to_string()))
            ),
            None => format!(
                "{what} is offered only on {clouds}; none of them in region {}",
                spec.infra.region.as_deref().unwrap_or("")
            ),
        }
    }

    /// Every offering left costs more than `max_hourly_cost`: the cheapest.
    fn max_cost(&self) -> String {
        let spec = self.f.spec;
        let spot = spec.use_spot.unwrap_or(false);
        let cheapest = self
            .left
            .iter()
            .filter_map(|o| if spot { o.spot_price } else { o.price })
            .fold(f64::INFINITY, f64::min);
        format!(
            "the cheapest {} costs ${cheapest:.2}/h per node, above max_hourly_cost ${:.2}",
            self.what,
            spec.max_hourly_cost.unwrap_or_default()
        )
    }

    /// Every offering left is blocked: how many, and the blocks' reasons.
    fn blocked(&self) -> String {
        let reasons: BTreeSet<String> = self
            .left
            .iter()
            .filter_map(|o| {
                self.f
                    .blocklist
                    .blocks(o, self.f.now)
                    .map(|b| b.reason.clone())
            })
            .collect();
        format!(
            "all {} matching {} offerings are blocked for now ({})",
            self.left.len(),
            self.what,
            reasons.into_iter().collect::<Vec<_>>().join("; ")
        )
    }
}

#[cfg(test)]
mod tests;
