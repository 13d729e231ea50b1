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
        Ok(rows) => cost_of(&rows, j, now),
        _ => j.cost_now(now),
    }
}

fn cost_of(rows: &[LedgerRow], j: &ManagedJob, now: i64) -> f64 {
    if rows.is_empty() {
        return j.cost_now(now);
    }
    rows.iter().map(|r| r.cost_within(0, now)).sum()
}

/// What one stretch of survivors waiting for replacements (a
/// `survivors-waiting` ledger row) was, with the rows around it.
struct Waited<'a> {
    row: &'a LedgerRow,
    /// The gang's nodes before the loss (the row this one closed).
    nodes: Option<u32>,
    /// The ranks replaced: the closed row's less the survivors'.
    replaced_ranks: Option<Vec<u32>>,
    /// The replacement came up: a run row of the same cluster opened
    /// the instant this one closed. Else it failed (the whole gang was
    /// recovered after it) or it is still going.
    completed: bool,
    /// From the loss handled (the job's `PREEMPTED` event) to the
    /// replacement recorded up, in ms, when both are known.
    bring_up_ms: Option<i64>,
    /// From the loss handled to every rank running again (the next
    /// `RUNNING` event), in ms: how long the survivors sat idle, setup on
    /// the new nodes included, when both are known.
    idle_ms: Option<i64>,
}

/// The job's waiting stretches, each with what tells it apart.
fn waits<'a>(rows: &'a [LedgerRow], events: &[(i64, String)]) -> Vec<Waited<'a>> {
    let mut out = Vec::new();
    for (i, w) in rows.iter().enumerate().filter(|(_, r)| r.is_waiting()) {
        let before = rows[..i]
            .iter()
            .rev()
            .find(|r| r.cluster == w.cluster && r.ended_at == Some(w.started_at));
        let after = rows[i + 1..].iter().find(|r| {
            r.cluster == w.cluster && !r.is_waiting() && Some(r.started_at) == w.ended_at
        });
        let replaced_ranks = match (before.and_then(|b| b.ranks.as_ref()), &w.ranks) {
            (Some(all), Some(kept)) => {
                Some(all.iter().filter(|r| !kept.contains(r)).copied().collect())
            }
            _ => None,
        };
        let since = before.map_or(i64::MIN, |b| b.started_at);
        let handled = events
            .iter()
            .filter(|(at, state)| state == "PREEMPTED" && *at > since && *at <= w.started_at)
            .map(|(at, _)| *at)
            .min();
        let resumed = after.and_then(|a| {
            events
                .iter()
                .find(|(at, state)| state == "RUNNING" && *at >= a.started_at)
                .map(|(at, _)| *at)
        });
        out.push(Waited {
            row: w,
            nodes: before.or(after).map(|r| r.num_nodes),
            replaced_ranks,
            completed: after.is_some(),
            bring_up_ms: match (handled, after) {
                (Some(t), Some(a)) => Some(a.started_at - t),
                _ => None,
            },
            idle_ms: match (handled, resumed) {
                (Some(t), Some(r)) => Some(r - t),
                _ => None,
            },
        });
    }
    out
}

/// How long this job's whole-gang launches took, on average, from the
/// job setting out (`PROVISIONING` for the first, `PREEMPTED` for a
/// recovery) to the nodes recorded up (a `run` row that does not follow
/// a waiting stretch), in ms; `None` when none is known.
fn whole_gang_bring_up_ms(rows: &[LedgerRow], events: &[(i64, String)]) -> Option<i64> {
    let mut took = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if r.is_waiting()
            || rows[..i].iter().any(|w| {
                w.is_waiting() && w.cluster == r.cluster && w.ended_at == Some(r.started_at)
            })
        {
            continue;
        }
        // Since the run before (a recovery's loss is handled after it
        // started, and a replacement that failed comes in between).
        let since = rows[..i]
            .iter()
            .rev()
            .find(|p| !p.is_waiting())
            .map_or(i64::MIN, |p| p.started_at);
        let began = events
            .iter()
            .filter(|(at, state)| {
                (state == "PROVISIONING" || state == "PREEMPTED")
                    && *at > since
                    && *at <= r.started_at
            })
            .map(|(at, _)| *at)
            .min();
        if let Some(b) = began {
            took.push(r.started_at - b);
        }
    }
    (!took.is_empty()).then(|| took.iter().sum::<i64>() / took.len() as i64)
}

/// What a managed job's replacements of lost nodes cost and saved, within
/// `[from, to]`: each waiting stretch (the survivors alone, from the lost
/// nodes confirmed removed to the replacements recorded up) and the sums.
///
/// `survivors_waiting_*` are those stretches, as billed. `survivors_idle_*`
/// are longer: from the loss handled to the run going again, setup on the
/// new nodes included (what the job's events call the survivors' wait),
/// at the survivors' price; `null` when an event is missing (a
/// replacement still going, or one that failed).
///
/// `whole_gang_extra_usd` is an estimate of what recovering the whole
/// gang instead would have cost on top of what the replacement cost:
/// for a replacement that came up, N x p x (B - R) / 3600, with N the
/// gang's nodes, p the price per node-hour, R the seconds from the loss
/// handled (`PREEMPTED`) to the replacement recorded up, and B the
/// seconds this job's own whole-gang launches took from setting out to
/// their nodes up (their mean). It assumes that every node is paid from
/// its launch (clouds bill a booting instance; the ledger's rows open
/// only when nodes answer), so both ways pay about N nodes over their
/// bring-up; that a whole-gang recovery would bring the gang up as fast
/// as this job's whole-gang launches did; and that setup and the run's
/// start take as long either way (setup runs on every node at once). A
/// replacement that failed (the whole gang was recovered after it)
/// counts its survivors' wait as paid for nothing. Zero or less means
/// the replacement saved no money: its gain was then in launches and
/// setup runs not repeated and capacity kept, not in node-hours.
fn replacements(
    rows: &[LedgerRow],
    events: &[(i64, String)],
    nodes_replaced: u32,
    from: i64,
    to: i64,
) -> serde_json::Value {
    let waits = waits(rows, events);
    let whole = whole_gang_bring_up_ms(rows, events);
    let mut stretches = Vec::new();
    let (mut waited_s, mut node_hours, mut usd) = (0.0, 0.0, 0.0);
    let (mut idle_s, mut idle_usd) = (Some(0.0), Some(0.0));
    let mut extra: Option<f64> = if waits.is_empty() { None } else { Some(0.0) };
    for w in &waits {
        let hours = w.row.hours_within(from, to);
        let cost = w.row.cost_within(from, to);
        waited_s += hours * 3600.0;
        node_hours += hours * f64::from(w.row.num_nodes);
        usd += cost;
        let per_node = w.row.price_per_hour / f64::from(w.row.num_nodes.max(1));
        let this = if !w.completed {
            w.row.ended_at.map(|_| -cost)
        } else {
            match (whole, w.bring_up_ms, w.nodes) {
                (Some(b), Some(r), Some(n)) => {
                    Some(f64::from(n) * per_node * (b - r) as f64 / 3_600_000.0)
                }
                _ => None,
            }
        };
        extra = match (extra, this) {
            (Some(e), Some(t)) => Some(e + t),
            _ => None,
        };
        let idle = w.idle_ms.map(|ms| ms as f64 / 1000.0);
        let idle_cost = idle.map(|s| f64::from(w.row.num_nodes) * per_node * s / 3600.0);
        idle_s = idle_s.zip(idle).map(|(a, b)| a + b);
        idle_usd = idle_usd.zip(idle_cost).map(|(a, b)| a + b);
        stretches.push(json!({
            "cluster": w.row.cluster,
            "started_at": w.row.started_at,
            "ended_at": w.row.ended_at,
            "nodes": w.nodes,
            "survivors": w.row.num_nodes,
            "replaced_ranks": w.replaced_ranks,
            "completed": w.completed,
            "waited_s": hours * 3600.0,
            "node_hours": hours * f64::from(w.row.num_nodes),
            "cost": cost,
            "price_per_node_hour": per_node,
            "bring_up_s": w.bring_up_ms.map(|ms| ms as f64 / 1000.0),
            "idle_s": idle,
            "idle_usd": idle_cost,
            "whole_gang_extra_usd": this,
        }));
    }
    json!({
        "nodes_replaced": nodes_replaced,
        "count": waits.len(),
        "survivors_waiting_s": waited_s,
        "survivors_waiting_node_hours": node_hours,
        "survivors_waiting_usd": usd,
        "survivors_idle_s": idle_s,
        "survivors_idle_usd": idle_usd,
        "whole_gang_bring_up_s": whole.map(|ms| ms as f64 / 1000.0),
        "whole_gang_extra_usd": extra,
        "stretches": stretches,
    })
}

/// A managed job's events as `(at, state)`, for [`replacements`].
fn event_times(store: &Store, job: i64) -> Vec<(i64, String)> {
    store
        .managed_events(job)
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.at, e.state))
        .collect()
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
        // A stretch of survivors waiting is part of the run it paused.
        if !r.is_waiting() {
            self.runs += 1;
        }
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
///
/// With what its survivors cost while waiting for replacements of lost
/// nodes, as [`replacements`] counts it over the job's life:
/// `survivors_waiting_s` and `survivors_waiting_usd` (the ledger's
/// `survivors-waiting` stretches: the survivors up alone, summed over the
/// replacements), `survivors_idle_s` and `survivors_idle_usd` (from each
/// loss to the run going again, as the job's events say; `null` while a
/// replacement is under way).
pub(crate) fn job_json(store: &Store, j: &ManagedJob) -> serde_json::Value {
    let mut v = serde_json::to_value(j).unwrap_or_default();
    let now = now_ms();
    let rows = store.ledger_of_job(j.id).unwrap_or_default();
    v["cost"] = json!(cost_of(&rows, j, now));
    // Only a job with a waiting stretch reads its events.
    let events = if rows.iter().any(LedgerRow::is_waiting) {
        event_times(store, j.id)
    } else {
        Vec::new()
    };
    let r = replacements(&rows, &events, j.nodes_replaced, 0, now);
    for k in [
        "survivors_waiting_s",
        "survivors_waiting_usd",
        "survivors_idle_s",
        "survivors_idle_usd",
    ] {
        v[k] = r[k].clone();
    }
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
            // Only a job with a waiting stretch reads its events.
            let events = if s.rows.iter().any(LedgerRow::is_waiting) {
                event_times(store, *id)
            } else {
                Vec::new()
            };
            v["replacements"] = replacements(
                &s.rows,
                &events,
                j.map_or(0, |j| j.nodes_replaced),
                from,
                to,
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, cluster: &str, phase: &str, ranks: &[u32], span: (i64, i64)) -> LedgerRow {
        LedgerRow {
            id,
            cluster: cluster.into(),
            managed_job: Some(1),
            cloud: "local".into(),
            region: None,
            zone: None,
            instance_type: None,
            market: "spot".into(),
            num_nodes: ranks.len() as u32,
            // $2 per node-hour.
            price_per_hour: 2.0 * ranks.len() as f64,
            price_source: "plan".into(),
            started_at: span.0,
            ended_at: Some(span.1),
            phase: phase.into(),
            ranks: Some(ranks.to_vec()),
        }
    }

    fn ev(at: i64, state: &str) -> (i64, String) {
        (at, state.to_string())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn a_replacement_is_priced_and_weighed_against_the_jobs_own_whole_gang_launch() {
        // Launched whole in 10 s; one node of four lost at 100 s, removed
        // at 101 s, replaced by 103 s; running again at 104 s.
        let rows = [
            row(1, "c", "run", &[0, 1, 2, 3], (10_000, 101_000)),
            row(2, "c", "survivors-waiting", &[0, 1, 3], (101_000, 103_000)),
            row(3, "c", "run", &[0, 1, 2, 3], (103_000, 200_000)),
        ];
        let events = [
            ev(0, "PROVISIONING"),
            ev(20_000, "RUNNING"),
            ev(100_000, "PREEMPTED"),
            ev(103_500, "RECOVERING"),
            ev(104_000, "RUNNING"),
        ];
        let r = replacements(&rows, &events, 1, 0, 300_000);
        assert_eq!(r["count"], 1);
        let s = &r["stretches"][0];
        assert_eq!(s["replaced_ranks"], json!([2]), "{r}");
        assert_eq!((&s["nodes"], &s["survivors"]), (&json!(4), &json!(3)));
        assert_eq!(s["completed"], true);
        assert!(close(r["survivors_waiting_s"].as_f64().unwrap(), 2.0));
        assert!(close(
            r["survivors_waiting_node_hours"].as_f64().unwrap(),
            6.0 / 3600.0
        ));
        assert!(close(
            r["survivors_waiting_usd"].as_f64().unwrap(),
            6.0 * 2.0 / 3600.0
        ));
        // Idle from the loss handled (100 s) to running again (104 s).
        assert!(close(r["survivors_idle_s"].as_f64().unwrap(), 4.0));
        assert!(close(
            r["survivors_idle_usd"].as_f64().unwrap(),
            3.0 * 2.0 * 4.0 / 3600.0
        ));
        // Whole gang: 10 s to bring up; this replacement: 3 s.
        assert!(close(r["whole_gang_bring_up_s"].as_f64().unwrap(), 10.0));
        assert!(close(s["bring_up_s"].as_f64().unwrap(), 3.0));
        let extra = 4.0 * 2.0 * (10.0 - 3.0) / 3600.0;
        assert!(
            close(r["whole_gang_extra_usd"].as_f64().unwrap(), extra),
            "{r}"
        );
        // Counted within the report's window only.
        let r = replacements(&rows, &events, 1, 102_000, 300_000);
        assert!(close(r["survivors_waiting_s"].as_f64().unwrap(), 1.0));
    }

    #[test]
    fn a_failed_replacement_counts_its_wait_as_paid_for_nothing() {
        // The replacement never came: torn down at 150 s, the gang
        // recovered whole on another cluster at 170 s.
        let rows = [
            row(1, "c", "run", &[0, 1, 2, 3], (10_000, 101_000)),
            row(2, "c", "survivors-waiting", &[0, 1, 3], (101_000, 150_000)),
            row(3, "d", "run", &[0, 1, 2, 3], (170_000, 200_000)),
        ];
        let events = [ev(0, "PROVISIONING"), ev(100_000, "PREEMPTED")];
        let r = replacements(&rows, &events, 0, 0, 300_000);
        let s = &r["stretches"][0];
        assert_eq!(s["completed"], false, "{r}");
        assert!(s["idle_s"].is_null() && r["survivors_idle_s"].is_null());
        let waited = 6.0 * 49.0 / 3600.0;
        assert!(close(r["survivors_waiting_usd"].as_f64().unwrap(), waited));
        assert!(close(r["whole_gang_extra_usd"].as_f64().unwrap(), -waited));
        // The whole-gang launches: 10 s, then 70 s from the loss.
        assert!(close(r["whole_gang_bring_up_s"].as_f64().unwrap(), 40.0));
    }

    #[test]
    fn no_events_no_estimate_and_no_replacement_no_wait() {
        let rows = [
            row(1, "c", "run", &[0, 1], (0, 1_000)),
            row(2, "c", "survivors-waiting", &[0], (1_000, 2_000)),
            row(3, "c", "run", &[0, 1], (2_000, 3_000)),
        ];
        let r = replacements(&rows, &[], 1, 0, 3_000);
        assert!(r["whole_gang_extra_usd"].is_null(), "{r}");
        assert!(r["whole_gang_bring_up_s"].is_null(), "{r}");
        let r = replacements(&rows[..1], &[], 0, 0, 3_000);
        assert_eq!(r["count"], 0);
        assert_eq!(r["survivors_waiting_usd"], 0.0);
        assert!(r["whole_gang_extra_usd"].is_null(), "{r}");
    }
}
