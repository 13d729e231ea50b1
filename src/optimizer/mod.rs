//! From a task and a catalog to a ranked failover plan.
//!
//! Every feasible (cloud, region, zone, instance type, market) for the
//! task's node count becomes a [`Candidate`]. Preference groups (from
//! `ordered` and accelerator lists) keep the user's order; inside a group
//! candidates compete on total hourly cost. The plan keeps the N cheapest
//! instance types per cloud and region, with all their zones, so failover
//! has somewhere to go.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use serde::Serialize;

use crate::catalog::{Catalog, Offering, ANY_ACCELERATOR};
use crate::spec::{Accelerators, Quantity, ResourceSpec, Task};

/// How many instance types to keep per (group, cloud, region).
pub const DEFAULT_TYPES_PER_REGION: usize = 3;

/// One place the task could run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Candidate {
    /// Cloud.
    pub cloud: String,
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Instance type.
    pub instance_type: String,
    /// GPU name (the task's spelling for the local provider's fake GPUs).
    pub accelerator: Option<String>,
    /// GPUs per node.
    pub accelerator_count: f32,
    /// Spot market.
    pub use_spot: bool,
    /// Nodes.
    pub nodes: u32,
    /// USD per node-hour.
    pub price_per_node_hour: f64,
    /// USD per hour for all nodes.
    pub total_per_hour: f64,
    /// vCPUs per node.
    #[serde(skip)]
    pub vcpus: f32,
    /// Memory per node, GiB.
    #[serde(skip)]
    pub memory_gib: f32,
    /// Preference group (0 = most preferred).
    #[serde(skip)]
    pub group: usize,
    /// The resolved resources this candidate satisfies.
    #[serde(skip)]
    pub spec: ResourceSpec,
}

/// One blocked place, until `until`. `None` fields match everything.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Cloud.
    pub cloud: String,
    /// Region.
    pub region: Option<String>,
    /// Zone.
    pub zone: Option<String>,
    /// Instance type.
    pub instance_type: Option<String>,
    /// Expiry.
    pub until: SystemTime,
    /// Why (shown when everything is blocked).
    pub reason: String,
}

/// Places not to try for a while (capacity errors, preemptions).
#[derive(Clone, Debug, Default)]
pub struct Blocklist {
    /// Entries, expired ones included until pruned.
    pub entries: Vec<Block>,
}

impl Blocklist {
    /// Whether `o` is blocked at `now`.
    pub fn blocks(&self, o: &Offering, now: SystemTime) -> Option<&Block> {
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
    pub types_per_region: usize,
    /// Time used for blocklist expiry.
    pub now: SystemTime,
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
    pub reasons: Vec<String>,
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

/// The offerings that could serve `spec` before any filter but the accelerator.
fn pool<'c>(catalog: &'c Catalog, spec: &ResourceSpec) -> Vec<&'c Offering> {
    let local_pinned = spec.infra.cloud.as_deref() == Some("local");
    let mut out: Vec<&Offering> = match (accel_of(spec), &spec.instance_type) {
        (Some((name, _)), _) => catalog.with_accelerator(name).collect(),
        (None, Some(t)) => catalog
            .offerings()
            .iter()
            .filter(|o| &o.instance_type == t)
            .collect(),
        (None, None) => catalog.with_accelerator("").collect(),
    };
    if local_pinned && accel_of(spec).is_some() {
        out.extend(catalog.wildcard());
    }
    out
}

/// A CPU-only task that names no size gets at least 4 vCPUs, as SkyPilot
/// does, rather than the smallest burstable machine in the catalog.
pub const DEFAULT_CPUS: Quantity = Quantity {
    value: 4.0,
    at_least: true,
};

fn default_cpus(spec: &ResourceSpec) -> Option<Quantity> {
    (spec.accelerators.is_none() && spec.instance_type.is_none() && spec.memory.is_none())
        .then_some(DEFAULT_CPUS)
}

type Stage<'a> = (&'a str, Box<dyn Fn(&Offering) -> bool + 'a>);

/// Filters in the order they are explained when nothing survives.
fn stages<'a>(spec: &'a ResourceSpec, blocklist: &'a Blocklist, now: SystemTime) -> Vec<Stage<'a>> {
    let spot = spec.use_spot.unwrap_or(false);
    let mut v: Vec<Stage<'a>> = Vec::new();
    v.push((
        "cloud",
        Box::new(move |o| match spec.infra.cloud.as_deref() {
            Some(c) => o.cloud == c,
            // The local provider runs on this machine: only when asked for.
            None => o.cloud != "local",
        }),
    ));
    if let Some((_, count)) = accel_of(spec) {
        v.push((
            "count",
            Box::new(move |o| same_count(o.accelerator_count, count)),
        ));
    }
    v.push((
        "region",
        Box::new(move |o| spec.infra.region.as_deref().is_none_or(|r| o.region == r)),
    ));
    v.push((
        "zone",
        Box::new(move |o| spec.infra.zone.as_deref().is_none_or(|z| o.zone == z)),
    ));
    v.push((
        "instance_type",
        Box::new(move |o| {
            spec.instance_type
                .as_deref()
                .is_none_or(|t| o.instance_type == t)
        }),
    ));
    let cpus = spec.cpus.or_else(|| default_cpus(spec));
    v.push((
        "cpus",
        Box::new(move |o| cpus.is_none_or(|q| q.admits(o.vcpus as f64))),
    ));
    v.push((
        "memory",
        Box::new(move |o| spec.memory.is_none_or(|q| q.admits(o.memory_gib as f64))),
    ));
    v.push((
        "market",
        Box::new(move |o| {
            if spot {
                o.spot_price.is_some()
            } else {
                o.price.is_some()
            }
        }),
    ));
    v.push((
        "max_hourly_cost",
        Box::new(move |o| {
            let p = if spot { o.spot_price } else { o.price };
            match (spec.max_hourly_cost, p) {
                (Some(max), Some(p)) => p <= max + 1e-9,
                _ => true,
            }
        }),
    ));
    v.push((
        "blocklist",
        Box::new(move |o| blocklist.blocks(o, now).is_none()),
    ));
    v
}

/// Ranks every feasible placement of `task`.
pub fn optimize(
    task: &Task,
    catalog: &Catalog,
    blocklist: &Blocklist,
    opts: &Options,
) -> Result<Vec<Candidate>, Infeasible> {
    let groups = task.resources.preference_groups();
    let mut plan: Vec<Candidate> = Vec::new();
    let mut reasons = Vec::new();
    for (gi, group) in groups.iter().enumerate() {
        let mut in_group: Vec<Candidate> = Vec::new();
        for spec in group {
            let found = candidates_for(task, catalog, blocklist, opts, spec, gi);
            if found.is_empty() {
                reasons.push(explain(catalog, spec, blocklist, opts.now));
            }
            in_group.extend(found);
        }
        rank(&mut in_group);
        plan.extend(keep_best_per_region(in_group, opts.types_per_region));
    }
    dedup(&mut plan);
    if plan.is_empty() {
        reasons.dedup();
        return Err(Infeasible { reasons });
    }
    Ok(plan)
}

fn candidates_for(
    task: &Task,
    catalog: &Catalog,
    blocklist: &Blocklist,
    opts: &Options,
    spec: &ResourceSpec,
    group: usize,
) -> Vec<Candidate> {
    let spot = spec.use_spot.unwrap_or(false);
    let filters = stages(spec, blocklist, opts.now);
    let accel = accel_of(spec);
    pool(catalog, spec)
        .into_iter()
        .filter(|o| filters.iter().all(|(_, f)| f(o)))
        .filter_map(|o| {
            let price = if spot { o.spot_price } else { o.price }?;
            let accelerator = match (&o.accelerator, accel) {
                (Some(a), Some((asked, _))) if a == ANY_ACCELERATOR => Some(asked.to_string()),
                (a, _) => a.clone(),
            };
            Some(Candidate {
                cloud: o.cloud.clone(),
                region: o.region.clone(),
                zone: o.zone.clone(),
                instance_type: o.instance_type.clone(),
                accelerator,
                accelerator_count: o.accelerator_count,
                use_spot: spot,
                nodes: task.num_nodes,
                price_per_node_hour: price,
                total_per_hour: price * task.num_nodes as f64,
                vcpus: o.vcpus,
                memory_gib: o.memory_gib,
                group,
                spec: spec.clone(),
            })
        })
        .collect()
}

fn rank(v: &mut [Candidate]) {
    v.sort_by(|a, b| {
        a.total_per_hour
            .total_cmp(&b.total_per_hour)
            .then_with(|| a.use_spot.cmp(&b.use_spot).reverse())
            .then_with(|| a.cloud.cmp(&b.cloud))
            .then_with(|| a.region.cmp(&b.region))
            .then_with(|| a.zone.cmp(&b.zone))
            .then_with(|| a.instance_type.cmp(&b.instance_type))
    });
}

/// Keeps, per (cloud, region), the cheapest `n` instance types with every
/// zone they are offered in. Input must be ranked; order is preserved.
fn keep_best_per_region(ranked: Vec<Candidate>, n: usize) -> Vec<Candidate> {
    let mut types: HashMap<(String, String), BTreeSet<(String, bool)>> = HashMap::new();
    ranked
        .into_iter()
        .filter(|c| {
            let kept = types
                .entry((c.cloud.clone(), c.region.clone()))
                .or_default();
            let key = (c.instance_type.clone(), c.use_spot);
            if kept.contains(&key) {
                return true;
            }
            if kept.len() < n {
                kept.insert(key);
                return true;
            }
            false
        })
        .collect()
}

/// The same placement can come from two alternatives; keep the first.
fn dedup(plan: &mut Vec<Candidate>) {
    let mut seen = std::collections::HashSet::new();
    plan.retain(|c| {
        seen.insert((
            c.cloud.clone(),
            c.zone.clone(),
            c.instance_type.clone(),
            c.use_spot,
            c.accelerator.clone(),
        ))
    });
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
pub fn explain(
    catalog: &Catalog,
    spec: &ResourceSpec,
    blocklist: &Blocklist,
    now: SystemTime,
) -> String {
    let what = match (accel_of(spec), &spec.instance_type) {
        (Some((n, c)), _) => format!("{n}:{c}"),
        (None, Some(t)) => format!("instance type {t}"),
        (None, None) => "a CPU-only instance".to_string(),
    };
    let mut left = pool(catalog, spec);
    if left.is_empty() {
        return match (accel_of(spec), &spec.instance_type) {
            (Some((n, _)), _) => {
                let names = catalog.accelerator_names();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                match crate::spec::closest_name(n, &refs) {
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
        };
    }
    for (name, f) in stages(spec, blocklist, now) {
        let next: Vec<&Offering> = left.iter().copied().filter(|o| f(o)).collect();
        if !next.is_empty() {
            left = next;
            continue;
        }
        let clouds = list(left.iter().map(|o| o.cloud.clone()));
        return match name {
            "count" => format!(
                "{what} is not offered; {} comes with {} per instance",
                accel_of(spec).map(|a| a.0).unwrap_or_default(),
                counts(&left)
            ),
            "cloud" => format!(
                "{} is offered only on {clouds}; not on {}",
                accel_of(spec).map_or(what.as_str(), |a| a.0),
                spec.infra
                    .cloud
                    .as_deref()
                    .unwrap_or("any cloud but local (use infra: local)")
            ),
            "region" => match spec.infra.cloud.as_deref() {
                Some(cloud) => format!(
                    "{what} on {cloud} is not offered in region {} (regions: {})",
                    spec.infra.region.as_deref().unwrap_or(""),
                    list(left.iter().map(|o| o.region.clone()))
                ),
                None => format!(
                    "{what} is offered only on {clouds}; none of them in region {}",
                    spec.infra.region.as_deref().unwrap_or("")
                ),
            },
            "zone" => format!(
                "{what} is not offered in zone {} (zones: {})",
                spec.infra.zone.as_deref().unwrap_or(""),
                list(left.iter().map(|o| o.zone.clone()))
            ),
            "instance_type" => format!(
                "{what} is not offered as instance type {} (types: {})",
                spec.instance_type.as_deref().unwrap_or(""),
                list(left.iter().map(|o| o.instance_type.clone()))
            ),
            "cpus" => format!(
                "no {what} offering has cpus {} (offered: {})",
                spec.cpus
                    .or_else(|| default_cpus(spec))
                    .map(|q| q.to_string())
                    .unwrap_or_default(),
                list(left.iter().map(|o| format!("{}", o.vcpus)))
            ),
            "memory" => format!(
                "no {what} offering has memory {} GiB (offered: {})",
                spec.memory.map(|q| q.to_string()).unwrap_or_default(),
                list(left.iter().map(|o| format!("{}", o.memory_gib)))
            ),
            "market" => format!(
                "{what} has no {} price where the other constraints allow",
                if spec.use_spot.unwrap_or(false) {
                    "spot"
                } else {
                    "on-demand"
                }
            ),
            "max_hourly_cost" => {
                let spot = spec.use_spot.unwrap_or(false);
                let cheapest = left
                    .iter()
                    .filter_map(|o| if spot { o.spot_price } else { o.price })
                    .fold(f64::INFINITY, f64::min);
                format!(
                    "the cheapest {what} costs ${cheapest:.2}/h per node, above max_hourly_cost ${:.2}",
                    spec.max_hourly_cost.unwrap_or_default()
                )
            }
            _ => {
                let reasons: BTreeSet<String> = left
                    .iter()
                    .filter_map(|o| blocklist.blocks(o, now).map(|b| b.reason.clone()))
                    .collect();
                format!(
                    "all {} matching {what} offerings are blocked for now ({})",
                    left.len(),
                    reasons.into_iter().collect::<Vec<_>>().join("; ")
                )
            }
        };
    }
    format!("{what}: no feasible placement")
}

#[cfg(test)]
mod tests;
