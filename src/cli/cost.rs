//! `gangway cost-report`: what clusters and managed jobs cost, from the
//! ledger (src/state/ledger.rs): node-hours by market at the plan's price,
//! kept after `down` and across a managed job's recoveries.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::json;

use super::launch::gangway_home;
use super::{print_json, table, Output};
use crate::state::{now_ms, LedgerRow, ManagedJob, Store};
use crate::{Error, ExitCode};

/// `gangway cost-report`.
#[derive(Debug, Args)]
pub(crate) struct CostReportArgs {
    /// The last N days (what was up in them, counted within them).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub(crate) days: u32,
}

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

/// `gangway cost-report`.
pub(crate) fn cost_report(a: &CostReportArgs, out: Output) -> Result<ExitCode, Error> {
    let store = Store::open(&gangway_home()?)?;
    let to = now_ms();
    let from = to - i64::from(a.days) * 86_400_000;
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
    let job_rows: Vec<(i64, Option<ManagedJob>, &Sum)> = jobs
        .iter()
        .map(|(id, s)| (*id, store.managed(*id).ok().flatten(), s))
        .collect();
    let total: f64 = clusters.values().chain(jobs.values()).map(|s| s.cost).sum();
    if out == Output::Json {
        let sum_json = |s: &Sum| {
            json!({
                "runs": s.runs,
                "node_hours": s.node_hours,
                "cost": s.cost,
                "by_market": s.by_market,
                "up": s.up,
                // Each stretch of nodes up: one per run of a managed job.
                "rows": s.rows,
            })
        };
        let clusters: Vec<serde_json::Value> = clusters
            .iter()
            .map(|(name, s)| {
                let mut v = sum_json(s);
                v["name"] = json!(name);
                v
            })
            .collect();
        let jobs: Vec<serde_json::Value> = job_rows
            .iter()
            .map(|(id, j, s)| {
                let mut v = sum_json(s);
                v["id"] = json!(id);
                v["name"] = json!(j.as_ref().and_then(|j| j.name.clone()));
                v["state"] = json!(j.as_ref().map(|j| j.state.to_string()));
                v
            })
            .collect();
        print_json(&json!({
            "since": from,
            "until": to,
            "days": a.days,
            "clusters": clusters,
            "managed_jobs": jobs,
            // The managed-job controller runs on this machine: it costs
            // nothing of its own.
            "controller": { "host": "local", "cost": 0.0 },
            "total": total,
        }))?;
        return Ok(ExitCode::Ok);
    }
    if rows.is_empty() {
        println!(
            "Nothing was up in the last {} day(s): no cost recorded.",
            a.days
        );
        return Ok(ExitCode::Ok);
    }
    let mut table_rows: Vec<Vec<String>> = Vec::new();
    for (name, s) in &clusters {
        table_rows.push(vec![
            format!("cluster {name}"),
            if s.up { "UP" } else { "down" }.into(),
            s.where_(),
            s.runs.to_string(),
            format!("{:.2}", s.node_hours),
            format!("{:.4}", s.cost),
        ]);
    }
    for (id, j, s) in &job_rows {
        let name = j
            .as_ref()
            .and_then(|j| j.name.clone())
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        table_rows.push(vec![
            format!("job {id}{name}"),
            j.as_ref().map_or("-".into(), |j| j.state.to_string()),
            s.where_(),
            s.runs.to_string(),
            format!("{:.2}", s.node_hours),
            format!("{:.4}", s.cost),
        ]);
    }
    table::print(
        &[
            "WHAT",
            "STATE",
            "LAST PLACEMENT",
            "RUNS",
            "NODE-HOURS",
            "COST ($)",
        ],
        &table_rows,
    )?;
    println!(
        "Total ${total:.4} over the last {} day(s), at the plan's prices; the managed-job controller runs on this machine (no cost of its own).",
        a.days
    );
    Ok(ExitCode::Ok)
}
