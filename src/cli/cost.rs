//! `gangway cost-report`: what clusters and managed jobs cost, from the
//! ledger (src/core/state/ledger.rs): node-hours by market at the plan's price,
//! kept after `down` and across a managed job's recoveries.

use clap::Args;

use super::launch::gangway_home;
use super::{print_json, table, Output};
use crate::core::state::Store;
use crate::services::cost;
use crate::{Error, ExitCode};

/// `gangway cost-report`.
#[derive(Debug, Args)]
pub(crate) struct CostReportArgs {
    /// The last N days (what was up in them, counted within them).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub(crate) days: u32,
}

/// `gangway cost-report`: this machine's ledger, and with a hosted
/// controller its managed jobs' (the host keeps their ledger).
pub(crate) fn cost_report(a: &CostReportArgs, out: Output) -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let store = Store::open(&home)?;
    let mut report = cost::report(&store, a.days)?;
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
        cost::merge_hosted(&mut report, &remote, &h);
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
