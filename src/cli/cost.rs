//! `gangway cost-report`: what clusters and managed jobs cost, from the
//! ledger (src/core/state/ledger.rs): node-hours by market at the plan's price,
//! kept after `down` and across a managed job's recoveries.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::json;

use super::launch::gangway_home;
use super::{print_json, table, Output};
use crate::core::state::{now_ms, LedgerRow, ManagedJob, Store};
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

/// `gangway cost-report`: this machine's ledger, and with a hosted
/// controller its managed jobs' (the host keeps their ledger).
pub(crate) fn cost_report(a: &CostReportArgs, out: Output) -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let store = Store::open(&home)?;
    let mut report = report(&store, a.days)?;
    if let Some(h) = crate::services::host::Hosted::configured(&home)? {
        let args: Vec<String> = ["cost-report", "--days", &a.days.to_string(), "-o", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (code, answer) = h.output(&args, crate::services::host::Input::Nothing)?;
        if code != 0 {
            return Ok(ExitCode::from_code(code));
        }
        let remote: serde_json::Value = serde_json::from_slice(&answer).map_err(|e| {
            Error::usage(
                format!(
                    "the controller at {} answered cost-report with something else than JSON: {e}",
                    h.address()
                ),
                None,
            )
        })?;
        for key in ["clusters", "managed_jobs"] {
            let theirs = remote[key].as_array().cloned().unwrap_or_default();
            if let Some(ours) = report[key].as_array_mut() {
                ours.extend(theirs);
            }
        }
        let total =
            report["total"].as_f64().unwrap_or(0.0) + remote["total"].as_f64().unwrap_or(0.0);
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
    if out == Output::Json {
        print_json(&report)?;
        return Ok(ExitCode::Ok);
    }
    let list = |k: &str| report[k].as_array().cloned().unwrap_or_default();
    let (clusters, jobs) = (list("clusters"), list("managed_jobs"));
    if clusters.is_empty() && jobs.is_empty() {
        println!(
            "Nothing was up in the last {} day(s): no cost recorded.",
            a.days
        );
        return Ok(ExitCode::Ok);
    }
    let cells = |what: String, state: String, v: &serde_json::Value| {
        vec![
            what,
            state,
            v["where"].as_str().unwrap_or("-").to_string(),
            v["runs"].to_string(),
            format!("{:.2}", v["node_hours"].as_f64().unwrap_or(0.0)),
            format!("{:.4}", v["cost"].as_f64().unwrap_or(0.0)),
        ]
    };
    let mut table_rows: Vec<Vec<String>> = Vec::new();
    for c in &clusters {
        let up = if c["up"] == true { "UP" } else { "down" };
        table_rows.push(cells(
            format!("cluster {}", c["name"].as_str().unwrap_or("-")),
            up.into(),
            c,
        ));
    }
    for j in &jobs {
        let name = j["name"]
            .as_str()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        table_rows.push(cells(
            format!("job {}{name}", j["id"]),
            j["state"].as_str().unwrap_or("-").to_string(),
            j,
        ));
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
    let controller = match report["controller"]["host"].as_str() {
        Some("local") | None => {
            "the managed-job controller runs on this machine (no cost of its own)".to_string()
        }
        Some(host) if report["controller"]["cluster"].is_string() => format!(
            "the managed-job controller's cloud host {} ({host}) cost ${:.4} of it",
            report["controller"]["cluster"].as_str().unwrap_or("-"),
            report["controller"]["cost"].as_f64().unwrap_or(0.0)
        ),
        Some(host) => format!(
            "the managed-job controller runs on {host} (an SSH host: no price known, shown as $0)"
        ),
    };
    let reported = report["price_sources"]["provider"].as_u64().unwrap_or(0);
    let prices = match (
        reported,
        report["price_sources"]["plan"].as_u64().unwrap_or(0),
    ) {
        (0, _) => "at the plan's prices".to_string(),
        (_, 0) => "at the prices the providers reported at launch".to_string(),
        (r, p) => format!(
            "at the prices the providers reported at launch for {r} run(s), the plan's for {p}"
        ),
    };
    println!(
        "Total ${:.4} over the last {} day(s), {prices}; {controller}.",
        report["total"].as_f64().unwrap_or(0.0),
        a.days
    );
    Ok(ExitCode::Ok)
}

/// This machine's ledger over the last `days`, as `cost-report -o json`
/// prints it.
fn report(store: &Store, days: u32) -> Result<serde_json::Value, Error> {
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
        .partition(|(name, _)| crate::services::host::cloud::is_controller(name));
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
    let jobs: Vec<serde_json::Value> = jobs
        .iter()
        .map(|(id, s)| {
            let j: Option<ManagedJob> = store.managed(*id).ok().flatten();
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
