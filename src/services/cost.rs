//! What clusters and managed jobs cost, from the ledger
//! (src/core/state/ledger.rs): node-hours by market at the plan's price,
//! kept after `down` and across a managed job's recoveries. `cost-report`,
//! `jobs queue` and the dashboard all add it up here.

use std::collections::BTreeMap;

use serde_json::json;

use crate::core::state::{now_ms, LedgerRow, ManagedJob, Store};
use crate::services::host::Hosted;
use crate::Error;

/// A managed job's cost so far: its ledger rows (every run, on every
/// cluster it had), else, for a job from before the ledger, what its
/// record kept.
pub(crate) fn job_cost(store: &Store, j: &ManagedJob, now: i64) -> f64 {
    match store.ledger_of_job(j.id) {
        Ok(rows) if !rows.is_empty() => rows.iter().map(|r| r.cost_within(0, now)).sum(),
        _ => j.cost_now(now),
    }
}

/// What one group of ledger rows (a cluster, or a managed job's runs) adds
/// up to within the report's window.
#[derive(Default)]
struct Sum {
    runs: usize,
    node_hours: f64,
    cost: f64,
    by_market: BTreeMap<String, f64>,
    up: bool,
    rows: Vec<LedgerRow>,
}

impl Sum {
    fn add(&mut self, r: &LedgerRow, from: i64, to: i64) {
        let cost = r.cost_within(from, to);
        self.runs += 1;
        self.node_hours += r.hours_within(from, to) * f64::from(r.num_nodes);
        self.cost += cost;
        *self.by_market.entry(r.market.clone()).or_default() += cost;
        self.up |= r.ended_at.is_none();
        self.rows.push(r.clone());
    }

    fn where_(&self) -> String {
        self.rows.last().map_or_else(
            || "-".into(),
            |r| {
                format!(
                    "{}/{} {}x{} {}",
                    r.cloud,
                    r.region.as_deref().unwrap_or("-"),
                    r.num_nodes,
                    r.instance_type.as_deref().unwrap_or("-"),
                    r.market
                )
            },
        )
    }
}

/// A managed job as `jobs queue -o json` shows it: its row and its cost so
/// far.
pub(crate) fn job_json(store: &Store, j: &ManagedJob) -> serde_json::Value {
    let mut v = serde_json::to_value(j).unwrap_or_default();
    v["cost"] = json!(job_cost(store, j, now_ms()));
    v
}

/// Adds what a hosted controller's `cost-report -o json` answered
/// (`remote`) to this machine's `report`.
pub(crate) fn merge_hosted(report: &mut serde_json::Value, remote: &serde_json::Value, h: &Hosted) {
    for key in ["clusters", "managed_jobs"] {
        let theirs = remote[key].as_array().cloned().unwrap_or_default();
        if let Some(ours) = report[key].as_array_mut() {
            ours.extend(theirs);
        }
    }
    let total = report["total"].as_f64().unwrap_or(0.0) + remote["total"].as_f64().unwrap_or(0.0);
    report["total"] = json!(total);
    if h.cluster.is_some() {
        // A cloud host: its own cluster's ledger (this machine's).
        report["controller"]["host"] = json!(h.address());
        report["controller"]["cluster"] = json!(h.cluster);
    } else {
        // An SSH host is yours already: gangway knows no price for it.
        report["controller"] = json!({ "host": h.address(), "cost": 0.0 });
    }
}

/// This machine's ledger over the last `days`, as `cost-report -o json`
/// prints it.
pub(crate) fn report(store: &Store, days: u32) -> Result<serde_json::Value, Error> {
    let to = now_ms();
    let from = to - i64::from(days) * 86_400_000;
    let rows = store.ledger(from, to)?;
    let mut clusters: BTreeMap<String, Sum> = BTreeMap::new();
    let mut jobs: BTreeMap<i64, Sum> = BTreeMap::new();
    for r in &rows {
        match r.managed_job {
            Some(id) => jobs.entry(id).or_default().add(r, from, to),
            None => clusters
                .entry(r.cluster.clone())
                .or_default()
                .add(r, from, to),
        }
    }
    let total: f64 = clusters.values().chain(jobs.values()).map(|s| s.cost).sum();
    let sum_json = |s: &Sum| {
        json!({
            "runs": s.runs,
            "node_hours": s.node_hours,
            "cost": s.cost,
            "by_market": s.by_market,
            "up": s.up,
            "where": s.where_(),
            // Each stretch of nodes up: one per run of a managed job.
            "rows": s.rows,
        })
    };
    // A cloud controller host is a cluster of this machine's, shown apart.
    let (hosts, clusters): (Vec<_>, Vec<_>) = clusters
        .iter()
        .partition(|(name, _)| super::host::cloud::is_controller(name));
    let clusters: Vec<serde_json::Value> = clusters
        .iter()
        .map(|(name, s)| {
            let mut v = sum_json(s);
            v["name"] = json!(name);
            v
        })
        .collect();
    let controller = match hosts.last() {
        // The managed-job controller runs on this machine: it costs
        // nothing of its own.
        None => json!({ "host": "local", "cost": 0.0 }),
        Some((name, s)) => {
            let mut v = sum_json(s);
            v["host"] = json!(name);
            v["cluster"] = json!(name);
            v["cost"] = json!(hosts.iter().map(|(_, s)| s.cost).sum::<f64>());
            v
        }
    };
    // Every job's name and state in one query, not one per job (1,000
    // jobs: a quarter of the report's time).
    let known: std::collections::HashMap<i64, ManagedJob> = if jobs.is_empty() {
        Default::default()
    } else {
        store
            .managed_all()
            .unwrap_or_default()
            .into_iter()
            .map(|j| (j.id, j))
            .collect()
    };
    let jobs: Vec<serde_json::Value> = jobs
        .iter()
        .map(|(id, s)| {
            let j: Option<&ManagedJob> = known.get(id);
            let mut v = sum_json(s);
            v["id"] = json!(id);
            v["name"] = json!(j.as_ref().and_then(|j| j.name.clone()));
            v["state"] = json!(j.as_ref().map(|j| j.state.to_string()));
            v
        })
        .collect();
    let by_provider = rows.iter().filter(|r| r.price_source == "provider").count();
    Ok(json!({
        "since": from,
        "until": to,
        "days": days,
        // How many stretches were priced by what the provider reported
        // (a spot market price at launch) and how many at the plan's price.
        "price_sources": { "provider": by_provider, "plan": rows.len() - by_provider },
        "clusters": clusters,
        "managed_jobs": jobs,
        "controller": controller,
        "total": total,
    }))
}
