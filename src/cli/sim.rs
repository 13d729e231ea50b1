//! `gangway sim`: replay spot-availability traces against the deadline
//! policies and compare cost and finish time.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{print_json, table, Output};
use crate::services::jobs::policy::PolicyKind;
use crate::services::jobs::sim::{
    simulate, Job, Outcome, Trace, Zones, DEFAULT_ON_DEMAND_PRICE, DEFAULT_SPOT_PRICE,
};
use crate::{Error, ExitCode};

/// `gangway sim TRACE.json [TRACE.json ...]`.
#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Spot-availability traces, one per zone, all with the same
    /// gap_seconds: `{"metadata": {"gap_seconds": N}, "data": [count per
    /// tick], "prices": [optional spot $/h per tick]}`. With several, the
    /// job may move to another zone's spot when its own is gone.
    #[arg(required = true, value_name = "TRACE.json")]
    pub(crate) traces: Vec<PathBuf>,
    /// Work the job needs, hours.
    #[arg(long, value_name = "HOURS")]
    pub(crate) job_hours: f64,
    /// Hours after the start by which the job must be done.
    #[arg(long, value_name = "HOURS")]
    pub(crate) deadline_hours: f64,
    /// Hours lost (billed, no progress) at every start on a new instance.
    #[arg(long, value_name = "HOURS", default_value_t = 0.05)]
    pub(crate) restart_hours: f64,
    /// Which policy to run.
    #[arg(long, value_enum, default_value_t = PolicyArg::All)]
    pub(crate) policy: PolicyArg,
    /// Spot $/h [default: the trace's prices where it has them, else
    /// 0.9179, an assumed p3.2xlarge spot price].
    #[arg(long, value_name = "USD")]
    pub(crate) spot_price: Option<f64>,
    /// On-demand $/h (default: AWS p3.2xlarge, an assumption).
    #[arg(long, value_name = "USD", default_value_t = DEFAULT_ON_DEMAND_PRICE)]
    pub(crate) on_demand_price: f64,
    /// Start the job this many hours into the traces.
    #[arg(long, value_name = "HOURS", default_value_t = 0.0)]
    pub(crate) start_hour: f64,
}

/// `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// Every policy.
    All,
    /// Spot when available, otherwise wait until waiting is no longer safe.
    Greedy,
    /// Keep up with the uniform-progress line; on-demand only to catch up.
    UniformProgress,
    /// On-demand only.
    OnDemand,
}

impl PolicyArg {
    fn kinds(self) -> Vec<PolicyKind> {
        match self {
            PolicyArg::All => PolicyKind::ALL.to_vec(),
            PolicyArg::Greedy => vec![PolicyKind::Greedy],
            PolicyArg::UniformProgress => vec![PolicyKind::UniformProgress],
            PolicyArg::OnDemand => vec![PolicyKind::AlwaysOnDemand],
        }
    }
}

fn usage(message: String, hint: Option<&str>) -> Error {
    Error::Usage {
        message,
        hint: hint.map(str::to_string),
    }
}

/// A flag that must be a finite number above (or, with `zero_ok`, at) 0.
fn check_flag(flag: &str, v: f64, zero_ok: bool) -> Result<(), Error> {
    let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0));
    if ok {
        return Ok(());
    }
    let want = if zero_ok { "≥ 0" } else { "> 0" };
    Err(usage(
        format!("{flag} is {v}: expected a number {want}"),
        None,
    ))
}

/// Runs `gangway sim`.
pub(crate) fn sim(a: &SimArgs, out: Output) -> Result<ExitCode, Error> {
    check_flag("--job-hours", a.job_hours, false)?;
    check_flag("--deadline-hours", a.deadline_hours, false)?;
    check_flag("--restart-hours", a.restart_hours, true)?;
    check_flag("--on-demand-price", a.on_demand_price, true)?;
    check_flag("--start-hour", a.start_hour, true)?;
    if let Some(p) = a.spot_price {
        check_flag("--spot-price", p, true)?;
    }
    if a.deadline_hours < a.job_hours + a.restart_hours {
        return Err(usage(
            format!(
                "--deadline-hours {} is less than --job-hours {} plus --restart-hours {}: \
                 the job cannot make it even on on-demand from the start",
                a.deadline_hours, a.job_hours, a.restart_hours
            ),
            Some("give a later deadline or a shorter job"),
        ));
    }
    let mut traces = Vec::with_capacity(a.traces.len());
    for path in &a.traces {
        traces.push(Trace::load(path).map_err(|e| usage(e.to_string(), None))?);
    }
    let zones = Zones::new(traces).map_err(|e| usage(e.to_string(), None))?;
    let gap = zones.gap_seconds();
    let start_tick = (a.start_hour * 3600.0 / gap).floor() as usize;
    if start_tick >= zones.len() {
        return Err(usage(
            format!(
                "--start-hour {} is past the end of the traces ({:.1} h long)",
                a.start_hour,
                zones.len() as f64 * gap / 3600.0
            ),
            None,
        ));
    }
    let mut job = Job::hours(a.job_hours, a.deadline_hours, a.restart_hours);
    job.spot_price = a.spot_price;
    job.on_demand_price = a.on_demand_price;
    job.start_tick = start_tick;
    let outcomes: Vec<Outcome> = a
        .policy
        .kinds()
        .into_iter()
        .map(|k| simulate(&zones, &job, k.build().as_mut()))
        .collect();
    let trace_prices = a.spot_price.is_none() && zones.traces().iter().any(|t| t.prices.is_some());
    let spot_price = a.spot_price.unwrap_or(DEFAULT_SPOT_PRICE);
    // Hours from the start to the end of each zone's trace.
    let ends: Vec<f64> = zones
        .traces()
        .iter()
        .map(|t| t.len().saturating_sub(start_tick) as f64 * gap / 3600.0)
        .collect();
    match out {
        Output::Json => {
            let zone_docs: Vec<_> = zones
                .traces()
                .iter()
                .zip(&ends)
                .map(|(t, end)| {
                    json!({
                        "file": t.path,
                        "name": t.name,
                        "ticks": t.len(),
                        "spot_fraction": t.spot_fraction(start_tick),
                        "hours_after_start": end,
                        "has_prices": t.prices.is_some(),
                    })
                })
                .collect();
            print_json(&json!({
                "job_hours": a.job_hours,
                "deadline_hours": a.deadline_hours,
                "restart_hours": a.restart_hours,
                "start_hour": a.start_hour,
                "gap_seconds": gap,
                "spot_price": spot_price,
                "spot_price_from_traces": trace_prices,
                "on_demand_price": a.on_demand_price,
                "zones": zone_docs,
                "results": outcomes,
            }))?;
        }
        Output::Table => {
            let zone_list: Vec<String> = zones
                .traces()
                .iter()
                .map(|t| {
                    format!(
                        "{} ({:.0}% spot)",
                        t.name,
                        100.0 * t.spot_fraction(start_tick)
                    )
                })
                .collect();
            println!(
                "{} zone(s), {} s ticks: {}",
                zone_list.len(),
                gap,
                zone_list.join(", ")
            );
            println!(
                "{} h job, deadline {} h, restart overhead {} h, starting {} h into the trace",
                a.job_hours, a.deadline_hours, a.restart_hours, a.start_hour
            );
            let spot_desc = if trace_prices {
                format!("spot from the traces' prices (${spot_price}/h where a trace has none)")
            } else if a.spot_price.is_some() {
                format!("spot ${spot_price}/h")
            } else {
                format!("spot ${spot_price}/h (assumed p3.2xlarge)")
            };
            let od_desc = if a.on_demand_price == DEFAULT_ON_DEMAND_PRICE {
                format!("on-demand ${}/h (assumed p3.2xlarge)", a.on_demand_price)
            } else {
                format!("on-demand ${}/h", a.on_demand_price)
            };
            println!("prices: {spot_desc}, {od_desc}");
            println!();
            let rows: Vec<Vec<String>> = outcomes
                .iter()
                .map(|o| {
                    vec![
                        o.policy.clone(),
                        format!("{:.2}", o.cost),
                        o.finish_hours
                            .map_or_else(|| "never".into(), |f| format!("{f:.2}")),
                        if o.met_deadline { "yes" } else { "NO" }.into(),
                        format!("{:.2}", o.spot_hours),
                        format!("{:.2}", o.on_demand_hours),
                        o.preemptions.to_string(),
                        o.starts.to_string(),
                    ]
                })
                .collect();
            table::print(
                &[
                    "policy",
                    "cost $",
                    "finish h",
                    "met deadline",
                    "spot h",
                    "on-demand h",
                    "preemptions",
                    "starts",
                ],
                &rows,
            )?;
            let past: Vec<&str> = outcomes
                .iter()
                .filter(|o| o.ran_past_trace_end)
                .map(|o| o.policy.as_str())
                .collect();
            if !past.is_empty() {
                let shortest = ends.iter().copied().fold(f64::INFINITY, f64::min);
                println!();
                println!(
                    "note: a trace ends {shortest:.2} h after the start, before {} finished; \
                     the rest was simulated with no spot there",
                    past.join(", ")
                );
            }
        }
    }
    Ok(ExitCode::Ok)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<SimArgs, clap::Error> {
        let mut all = vec!["gangway", "sim"];
        all.extend_from_slice(args);
        let c = Cli::try_parse_from(all)?;
        let Command::Sim(a) = c.command else {
            panic!("not sim")
        };
        Ok(a)
    }

    #[test]
    fn flags_parse_with_defaults() {
        let a = parse(&["a.json", "--job-hours", "48", "--deadline-hours", "52"]).unwrap();
        assert_eq!(a.traces, vec![PathBuf::from("a.json")]);
        assert_eq!((a.job_hours, a.deadline_hours), (48.0, 52.0));
        assert_eq!(a.restart_hours, 0.05);
        assert_eq!(a.policy, PolicyArg::All);
        assert_eq!(a.spot_price, None);
        assert_eq!(a.on_demand_price, DEFAULT_ON_DEMAND_PRICE);
        assert_eq!(a.start_hour, 0.0);
        assert_eq!(a.policy.kinds(), PolicyKind::ALL.to_vec());
    }

    #[test]
    fn every_flag_parses() {
        let a = parse(&[
            "a.json",
            "b.json",
            "--job-hours",
            "10",
            "--deadline-hours",
            "20",
            "--restart-hours",
            "0.2",
            "--policy",
            "uniform-progress",
            "--spot-price",
            "1.5",
            "--on-demand-price",
            "4",
            "--start-hour",
            "24",
        ])
        .unwrap();
        assert_eq!(a.traces.len(), 2);
        assert_eq!(a.restart_hours, 0.2);
        assert_eq!(a.policy.kinds(), vec![PolicyKind::UniformProgress]);
        assert_eq!(a.spot_price, Some(1.5));
        assert_eq!(a.on_demand_price, 4.0);
        assert_eq!(a.start_hour, 24.0);
        for (flag, kind) in [
            ("greedy", PolicyKind::Greedy),
            ("on-demand", PolicyKind::AlwaysOnDemand),
        ] {
            let a = parse(&[
                "a.json",
                "--job-hours",
                "1",
                "--deadline-hours",
                "2",
                "--policy",
                flag,
            ])
            .unwrap();
            assert_eq!(a.policy.kinds(), vec![kind]);
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse(&["--job-hours", "1", "--deadline-hours", "2"]).is_err());
        assert!(parse(&["a.json", "--job-hours", "1"]).is_err());
        assert!(parse(&["a.json", "--job-hours", "x", "--deadline-hours", "2"]).is_err());
        let args = ["a.json", "--job-hours", "1", "--deadline-hours", "2"];
        let mut with_policy = args.to_vec();
        with_policy.extend_from_slice(&["--policy", "lucky"]);
        assert!(parse(&with_policy).is_err());
        assert!(check_flag("--job-hours", 0.0, false).is_err());
        assert!(check_flag("--restart-hours", 0.0, true).is_ok());
        assert!(check_flag("--restart-hours", -1.0, true).is_err());
        assert!(check_flag("--spot-price", f64::INFINITY, true).is_err());
    }
}
