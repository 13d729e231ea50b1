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
    for j in &jobs {
        if let Some(line) = replacement_line(j) {
            println!("{line}");
        }
    }
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

/// One line for a managed job whose lost nodes were replaced in place:
/// which, what the survivors' wait cost, and the estimate of what a
/// whole-gang recovery would have cost instead (`None` for any other job).
fn replacement_line(j: &serde_json::Value) -> Option<String> {
    let r = &j["replacements"];
    let stretches = r["stretches"].as_array().filter(|s| !s.is_empty())?;
    let name = j["name"]
        .as_str()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    let mut ranks: Vec<u64> = stretches
        .iter()
        .flat_map(|s| s["replaced_ranks"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_u64())
        .collect();
    ranks.sort_unstable();
    let ranks = if ranks.is_empty() {
        String::new()
    } else {
        format!(
            " (rank {})",
            ranks
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let failed = stretches.iter().filter(|s| s["completed"] == false).count();
    let failed = if failed > 0 {
        format!(", {failed} of them failed and fell back to the whole gang")
    } else {
        String::new()
    };
    let estimate = match r["whole_gang_extra_usd"].as_f64() {
        Some(e) if e > 0.0 => format!(
            "a whole-gang recovery would have cost about ${} more (estimate from its bring-up, \
             {:.2} s in this job; see docs/managed-jobs.md)",
            usd(e),
            f("whole_gang_bring_up_s")
        ),
        Some(e) => format!(
            "a whole-gang recovery would have cost about ${} less (estimate from its bring-up, \
             {:.2} s in this job; see docs/managed-jobs.md)",
            usd(-e),
            f("whole_gang_bring_up_s")
        ),
        None => {
            "no estimate against a whole-gang recovery (its bring-up time is not known)".to_string()
        }
    };
    let idle = match (
        r["survivors_idle_s"].as_f64(),
        r["survivors_idle_usd"].as_f64(),
    ) {
        (Some(s), Some(c)) => format!(
            ", idle {s:.2} s from the loss to the run going again (${})",
            usd(c)
        ),
        _ => String::new(),
    };
    Some(format!(
        "job {}{name}: {} node(s) replaced{ranks} in {} replacement(s){failed}; the survivors \
         waited {:.2} s alone ({} node-hours, ${}){idle}; {estimate}.",
        j["id"],
        r["nodes_replaced"],
        stretches.len(),
        f("survivors_waiting_s"),
        usd(f("survivors_waiting_node_hours")),
        usd(f("survivors_waiting_usd")),
    ))
}

/// An amount with 4 decimals, or 6 where it is under a cent (a wait of
/// seconds), so it does not read as zero.
fn usd(x: f64) -> String {
    if x.abs() < 0.01 {
        format!("{x:.6}")
    } else {
        format!("{x:.4}")
    }
}
