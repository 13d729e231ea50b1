//! Replaying spot-availability traces against a [`Policy`].
//!
//! # Trace format
//!
//! One JSON file per zone, as in the public traces of the "Can't Be Late"
//! paper:
//!
//! ```json
//! {"metadata": {"gap_seconds": 600}, "data": [1, 1, 0, 3], "prices": [0.91, 0.92, 0.92, 0.9]}
//! ```
//!
//! - `metadata.gap_seconds`: the tick length, a positive number; every zone
//!   of a run must have the same one.
//! - `data[i]`: how many spot instances were available (or running) during
//!   tick `i`, a whole number ≥ 0. Spot is available in tick `i` when it is
//!   above 0.
//! - `prices` (optional): the spot price in $/h during tick `i`, one per
//!   value of `data`.
//!
//! Ticks after the end of a zone's trace have no spot.
//!
//! # Model
//!
//! Time runs in ticks of `gap_seconds` from a start tick. At each tick the
//! simulator first notices a preemption (the job was on spot in a zone
//! whose spot is gone this tick: the instance is lost, the job is on
//! nothing), then asks the policy, then applies its choice for the whole
//! tick:
//!
//! - Staying on the same instance (spot in a zone that still has spot, or
//!   on-demand) continues it; any other spot or on-demand choice starts a
//!   new instance, which first pays the restart overhead (billed, no
//!   progress). Checkpoints keep all work done: a preemption costs only the
//!   next restart.
//! - Spot goes to the zone the job is in if it still has spot, otherwise to
//!   the first zone (in the order given) that has spot now: a move between
//!   zones is a restart like any other, as with SkyPilot's managed jobs.
//! - The job ends inside a tick as soon as its work is done; only that
//!   part of the tick is billed.
//!
//! Cost = Σ spot time × spot price + on-demand time × on-demand price, with
//! the restart overhead billed on the instance that pays it.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::policy::{Choice, Policy, State};

/// The on-demand price assumed when none is given: AWS p3.2xlarge (one
/// V100), us-east-1, $/h.
pub(crate) const DEFAULT_ON_DEMAND_PRICE: f64 = 3.06;

/// The spot price assumed when neither the command line nor the trace gives
/// one: a p3.2xlarge spot price, $/h.
pub(crate) const DEFAULT_SPOT_PRICE: f64 = 0.9179;

/// How far past the deadline a finish still counts as on time: float
/// rounding, a microsecond.
pub(crate) const DEADLINE_TOLERANCE: f64 = 1e-6;

/// A trace that could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a trace.
    #[error("trace {path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong, with the index of a bad value.
        message: String,
    },
    /// Two zones tick at different rates.
    #[error(
        "trace {path} has gap_seconds {gap} but {first_path} has {first_gap}: \
         the traces of one run must share one tick length"
    )]
    GapMismatch {
        /// The file that differs.
        path: String,
        /// Its tick length.
        gap: f64,
        /// The first file.
        first_path: String,
        /// The first file's tick length.
        first_gap: f64,
    },
    /// No trace was given.
    #[error("no trace given")]
    Empty,
}

/// One zone's spot availability, tick by tick.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Trace {
    /// Where it came from (a path, or a test's name).
    pub(crate) path: String,
    /// A short name: the file name without `.json`.
    pub(crate) name: String,
    /// Tick length in seconds.
    pub(crate) gap_seconds: f64,
    /// Whether spot is available in each tick.
    pub(crate) available: Vec<bool>,
    /// Spot price in $/h per tick, if the trace has them.
    pub(crate) prices: Option<Vec<f64>>,
}

impl Trace {
    /// A trace from a list of availabilities (for tests and generators).
    #[cfg(test)]
    pub(crate) fn new(name: &str, gap_seconds: f64, available: Vec<bool>) -> Trace {
        Trace {
            path: name.to_string(),
            name: name.to_string(),
            gap_seconds,
            available,
            prices: None,
        }
    }

    /// Reads and parses a trace file.
    pub(crate) fn load(path: &Path) -> Result<Trace, TraceError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut t = Trace::parse(&shown, &text)?;
        if let Some(stem) = path.file_stem() {
            t.name = stem.to_string_lossy().into_owned();
        }
        Ok(t)
    }

    /// Parses a trace document; `path` names it in errors.
    pub(crate) fn parse(path: &str, text: &str) -> Result<Trace, TraceError> {
        let bad = |message: String| TraceError::Format {
            path: path.to_string(),
            message,
        };
        let doc: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Value::Object(doc) = doc else {
            return Err(bad(
                "expected an object with \"metadata\" and \"data\"".into()
            ));
        };
        let gap = doc
            .get("metadata")
            .and_then(|m| m.get("gap_seconds"))
            .ok_or_else(|| bad("missing metadata.gap_seconds".into()))?;
        let gap_seconds = gap
            .as_f64()
            .filter(|g| g.is_finite() && *g > 0.0)
            .ok_or_else(|| {
                bad(format!(
                    "metadata.gap_seconds is {gap}: expected a number > 0"
                ))
            })?;
        let data = doc
            .get("data")
            .ok_or_else(|| bad("missing \"data\"".into()))?
            .as_array()
            .ok_or_else(|| bad("\"data\" is not a list".into()))?;
        if data.is_empty() {
            return Err(bad("\"data\" is empty".into()));
        }
        let mut available = Vec::with_capacity(data.len());
        for (i, v) in data.iter().enumerate() {
            let n = v.as_u64().ok_or_else(|| {
                bad(format!(
                    "data[{i}] is {v}: expected a whole number ≥ 0 (spot instances available)"
                ))
            })?;
            available.push(n > 0);
        }
        let prices = match doc.get("prices") {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => {
                if list.len() != data.len() {
                    return Err(bad(format!(
                        "\"prices\" has {} values but \"data\" has {}: expected one price per tick",
                        list.len(),
                        data.len()
                    )));
                }
                let mut prices = Vec::with_capacity(list.len());
                for (i, v) in list.iter().enumerate() {
                    let p = v
                        .as_f64()
                        .filter(|p| p.is_finite() && *p >= 0.0)
                        .ok_or_else(|| {
                            bad(format!("prices[{i}] is {v}: expected a price ≥ 0 in $/h"))
                        })?;
                    prices.push(p);
                }
                Some(prices)
            }
            Some(_) => return Err(bad("\"prices\" is not a list".into())),
        };
        Ok(Trace {
            path: path.to_string(),
            name: path.to_string(),
            gap_seconds,
            available,
            prices,
        })
    }

    /// Number of ticks.
    pub(crate) fn len(&self) -> usize {
        self.available.len()
    }

    /// Whether spot is available in `tick` (never after the end).
    pub(crate) fn available_at(&self, tick: usize) -> bool {
        self.available.get(tick).copied().unwrap_or(false)
    }

    /// The share of ticks from `from` to the end with spot (0 when none).
    pub(crate) fn spot_fraction(&self, from: usize) -> f64 {
        let rest = self.available.get(from..).unwrap_or(&[]);
        if rest.is_empty() {
            return 0.0;
        }
        rest.iter().filter(|a| **a).count() as f64 / rest.len() as f64
    }
}

/// The zones of one run: one or more traces with the same tick length.
#[derive(Clone, Debug)]
pub(crate) struct Zones {
    traces: Vec<Trace>,
    gap: f64,
}

impl Zones {
    /// Checks that there is at least one trace and that all tick alike.
    pub(crate) fn new(traces: Vec<Trace>) -> Result<Zones, TraceError> {
        let first = traces.first().ok_or(TraceError::Empty)?;
        let gap = first.gap_seconds;
        if let Some(t) = traces.iter().find(|t| t.gap_seconds != gap) {
            return Err(TraceError::GapMismatch {
                path: t.path.clone(),
                gap: t.gap_seconds,
                first_path: first.path.clone(),
                first_gap: gap,
            });
        }
        Ok(Zones { traces, gap })
    }

    /// The traces, in the order given.
    pub(crate) fn traces(&self) -> &[Trace] {
        &self.traces
    }

    /// Tick length in seconds.
    pub(crate) fn gap_seconds(&self) -> f64 {
        self.gap
    }

    /// Ticks in the longest trace.
    pub(crate) fn len(&self) -> usize {
        self.traces.iter().map(Trace::len).max().unwrap_or(0)
    }

    fn first_with_spot(&self, tick: usize) -> Option<usize> {
        self.traces.iter().position(|t| t.available_at(tick))
    }
}

/// The job and the prices of one simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Job {
    /// Work the job needs, seconds.
    pub(crate) length: f64,
    /// Seconds from the start by which it must be done.
    pub(crate) deadline: f64,
    /// Seconds lost at every start on a new instance.
    pub(crate) restart_overhead: f64,
    /// Spot $/h: overrides the traces' prices when set; otherwise a
    /// trace's own prices, or [`DEFAULT_SPOT_PRICE`].
    pub(crate) spot_price: Option<f64>,
    /// On-demand $/h.
    pub(crate) on_demand_price: f64,
    /// The trace tick the job starts at.
    pub(crate) start_tick: usize,
}

impl Job {
    /// A job of `length_h` hours due `deadline_h` hours after it starts,
    /// with `restart_h` hours per restart, default prices, from tick 0.
    pub(crate) fn hours(length_h: f64, deadline_h: f64, restart_h: f64) -> Job {
        Job {
            length: length_h * 3600.0,
            deadline: deadline_h * 3600.0,
            restart_overhead: restart_h * 3600.0,
            spot_price: None,
            on_demand_price: DEFAULT_ON_DEMAND_PRICE,
            start_tick: 0,
        }
    }

    /// Whether on-demand alone, from the start, meets the deadline.
    #[cfg(test)]
    pub(crate) fn feasible(&self) -> bool {
        self.length + self.restart_overhead <= self.deadline
    }
}

/// What one policy did over one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Outcome {
    /// The policy.
    pub(crate) policy: String,
    /// Dollars.
    pub(crate) cost: f64,
    /// Hours from the start to the end of the job; `None` if it never
    /// ended (a policy that idles forever).
    pub(crate) finish_hours: Option<f64>,
    /// Whether it ended by the deadline.
    pub(crate) met_deadline: bool,
    /// Hours billed on spot (restart overheads included).
    pub(crate) spot_hours: f64,
    /// Hours billed on on-demand (restart overheads included).
    pub(crate) on_demand_hours: f64,
    /// Hours of restart overhead (billed, no progress).
    pub(crate) overhead_hours: f64,
    /// Spot instances lost under the job.
    pub(crate) preemptions: u32,
    /// Instances started (each paid the restart overhead).
    pub(crate) starts: u32,
    /// Spot starts in another zone than the previous spot instance's.
    pub(crate) zone_moves: u32,
    /// Whether the job was still running after the end of some zone's
    /// trace (the rest was simulated with no spot there).
    pub(crate) ran_past_trace_end: bool,
}

/// One tick of a run, for tests and plots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Step {
    /// Hours from the start.
    pub(crate) at_hours: f64,
    /// What ran.
    pub(crate) choice: Choice,
    /// The zone of a spot instance (index into the traces).
    pub(crate) zone: Option<usize>,
    /// Work done at the end of the tick, hours.
    pub(crate) work_hours: f64,
}

/// Runs `policy` (a fresh one) over `zones` for `job`.
pub(crate) fn simulate(zones: &Zones, job: &Job, policy: &mut dyn Policy) -> Outcome {
    simulate_steps(zones, job, policy, false).0
}

/// Like [`simulate`], also returning every tick when `record` is set.
pub(crate) fn simulate_steps(
    zones: &Zones,
    job: &Job,
    policy: &mut dyn Policy,
    record: bool,
) -> (Outcome, Vec<Step>) {
    let g = zones.gap;
    let length = job.length.max(0.0);
    // A policy that never finishes the job is stopped here.
    let give_up = 2.0 * (job.deadline.max(0.0) + length + job.restart_overhead) + 2.0 * g;
    let mut steps = Vec::new();
    let mut work = 0.0_f64;
    let mut running = Choice::Idle;
    let mut zone: Option<usize> = None;
    let mut last_spot_zone: Option<usize> = None;
    let mut overhead_left = 0.0_f64;
    let (mut cost, mut spot_s, mut od_s, mut overhead_s) = (0.0, 0.0, 0.0, 0.0);
    let (mut preemptions, mut starts, mut zone_moves) = (0u32, 0u32, 0u32);
    let mut past_end = false;
    let mut finish: Option<f64> = None;
    let mut i = 0usize;
    while work < length {
        let t = i as f64 * g;
        if t > give_up {
            break;
        }
        let tick = job.start_tick + i;
        if zones.traces.iter().any(|tr| tick >= tr.len()) {
            past_end = true;
        }
        if running == Choice::Spot {
            let z = zone.expect("a spot instance has a zone");
            if !zones.traces[z].available_at(tick) {
                preemptions += 1;
                running = Choice::Idle;
                zone = None;
                overhead_left = 0.0;
            }
        }
        let any_spot = zones.first_with_spot(tick).is_some();
        let state = State {
            elapsed: t,
            work_done: work,
            job_length: length,
            deadline: job.deadline,
            restart_overhead: job.restart_overhead,
            tick: g,
            spot_available: any_spot,
            running,
            overhead_left,
        };
        let mut choice = policy.decide(&state);
        if choice == Choice::Spot && !any_spot {
            // Not a choice there is: nothing runs.
            choice = Choice::Idle;
        }
        if choice != running {
            if choice != Choice::Idle {
                starts += 1;
            }
            overhead_left = if choice == Choice::Idle {
                0.0
            } else {
                job.restart_overhead
            };
            zone = None;
            if choice == Choice::Spot {
                let z = zones.first_with_spot(tick).expect("spot is available");
                if last_spot_zone.is_some_and(|l| l != z) {
                    zone_moves += 1;
                }
                last_spot_zone = Some(z);
                zone = Some(z);
            }
        }
        running = choice;
        if choice != Choice::Idle {
            let paid = overhead_left.min(g);
            let remaining = length - work;
            let ends = g - paid >= remaining;
            let billed = if ends { paid + remaining } else { g };
            overhead_left -= paid;
            work = if ends { length } else { work + (g - paid) };
            overhead_s += paid;
            if choice == Choice::Spot {
                let z = zone.expect("a spot instance has a zone");
                let price = job
                    .spot_price
                    .or_else(|| {
                        zones.traces[z]
                            .prices
                            .as_ref()
                            .and_then(|p| p.get(tick).copied())
                    })
                    .unwrap_or(DEFAULT_SPOT_PRICE);
                cost += price * billed / 3600.0;
                spot_s += billed;
            } else {
                cost += job.on_demand_price * billed / 3600.0;
                od_s += billed;
            }
            if ends {
                finish = Some(t + billed);
            }
        }
        if record {
            steps.push(Step {
                at_hours: t / 3600.0,
                choice,
                zone,
                work_hours: work / 3600.0,
            });
        }
        i += 1;
    }
    if length <= 0.0 {
        finish = Some(0.0);
    }
    let outcome = Outcome {
        policy: policy.name().to_string(),
        cost,
        finish_hours: finish.map(|f| f / 3600.0),
        met_deadline: finish.is_some_and(|f| f <= job.deadline + DEADLINE_TOLERANCE),
        spot_hours: spot_s / 3600.0,
        on_demand_hours: od_s / 3600.0,
        overhead_hours: overhead_s / 3600.0,
        preemptions,
        starts,
        zone_moves,
        ran_past_trace_end: past_end,
    };
    (outcome, steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::jobs::policy::{AlwaysOnDemand, Greedy, PolicyKind, UniformProgress};

    const H: f64 = 3600.0;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn zones(traces: Vec<Trace>) -> Zones {
        Zones::new(traces).unwrap()
    }

    /// An hourly trace from a string of `1`/`0`.
    fn hourly(name: &str, pattern: &str) -> Trace {
        Trace::new(name, H, pattern.chars().map(|c| c == '1').collect())
    }

    fn run(z: &Zones, job: &Job, kind: PolicyKind) -> (Outcome, Vec<Step>) {
        simulate_steps(z, job, kind.build().as_mut(), true)
    }

    fn choices(steps: &[Step]) -> String {
        steps
            .iter()
            .map(|s| match s.choice {
                Choice::Spot => 'S',
                Choice::OnDemand => 'D',
                Choice::Idle => '.',
            })
            .collect()
    }

    #[test]
    fn parses_the_documented_format() {
        let t = Trace::parse(
            "t.json",
            r#"{"metadata": {"gap_seconds": 600}, "data": [1, 0, 3], "prices": [0.9, 1, 0.8]}"#,
        )
        .unwrap();
        assert_eq!(t.gap_seconds, 600.0);
        assert_eq!(t.available, vec![true, false, true]);
        assert_eq!(t.prices, Some(vec![0.9, 1.0, 0.8]));
        assert!(close(t.spot_fraction(0), 2.0 / 3.0));
        assert!(!t.available_at(3));
    }

    #[test]
    fn parse_errors_name_the_file_and_the_index() {
        let err = |text: &str| Trace::parse("z.json", text).unwrap_err().to_string();
        let e = err(r#"{"metadata": {"gap_seconds": 60}, "data": [1, 0, -1]}"#);
        assert!(e.contains("z.json") && e.contains("data[2]"), "{e}");
        let e = err(r#"{"metadata": {"gap_seconds": 60}, "data": [1, 0.5]}"#);
        assert!(e.contains("data[1]"), "{e}");
        let e = err(r#"{"metadata": {"gap_seconds": 0}, "data": [1]}"#);
        assert!(e.contains("gap_seconds"), "{e}");
        let e = err(r#"{"data": [1]}"#);
        assert!(e.contains("missing metadata.gap_seconds"), "{e}");
        let e = err(r#"{"metadata": {"gap_seconds": 60}, "data": []}"#);
        assert!(e.contains("empty"), "{e}");
        let e = err(r#"{"metadata": {"gap_seconds": 60}, "data": [1, 1], "prices": [1]}"#);
        assert!(e.contains("one price per tick"), "{e}");
        let e = err(r#"{"metadata": {"gap_seconds": 60}, "data": [1, 1], "prices": [1, "x"]}"#);
        assert!(e.contains("prices[1]"), "{e}");
        let e = err("{\"metadata\": ");
        assert!(e.contains("z.json") && e.contains("not valid JSON"), "{e}");
        let e = err("[1, 2]");
        assert!(e.contains("expected an object"), "{e}");
    }

    #[test]
    fn zones_must_share_the_tick() {
        let e = Zones::new(vec![
            Trace::new("a", 60.0, vec![true]),
            Trace::new("b", 120.0, vec![true]),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("b has gap_seconds 120") && e.contains("a has 60"),
            "{e}"
        );
        assert!(matches!(Zones::new(vec![]), Err(TraceError::Empty)));
    }

    #[test]
    fn all_spot_costs_the_spot_price_times_the_hours() {
        let z = zones(vec![hourly("a", &"1".repeat(30))]);
        let job = Job::hours(10.0, 15.0, 0.5);
        for kind in [PolicyKind::Greedy, PolicyKind::UniformProgress] {
            let (o, steps) = run(&z, &job, kind);
            assert_eq!(choices(&steps), "S".repeat(11), "{kind:?}");
            assert!(close(o.spot_hours, 10.5), "{o:?}");
            assert_eq!(o.on_demand_hours, 0.0);
            assert!(close(o.cost, 10.5 * DEFAULT_SPOT_PRICE), "{o:?}");
            assert!(close(o.finish_hours.unwrap(), 10.5));
            assert!(o.met_deadline);
            assert_eq!((o.starts, o.preemptions), (1, 0));
        }
        let o = simulate(&z, &job, &mut AlwaysOnDemand);
        assert!(close(o.cost, 10.5 * DEFAULT_ON_DEMAND_PRICE), "{o:?}");
    }

    #[test]
    fn spot_price_comes_from_the_flag_then_the_trace_then_the_default() {
        let mut t = hourly("a", "1111");
        t.prices = Some(vec![1.0, 2.0, 3.0, 4.0]);
        let z = zones(vec![t]);
        let mut job = Job::hours(2.0, 4.0, 0.0);
        let o = simulate(&z, &job, &mut Greedy::default());
        assert!(close(o.cost, 3.0), "{o:?}");
        job.spot_price = Some(0.5);
        let o = simulate(&z, &job, &mut Greedy::default());
        assert!(close(o.cost, 1.0), "{o:?}");
    }

    #[test]
    fn no_spot_runs_on_demand_and_meets_the_deadline() {
        let z = zones(vec![hourly("a", &"0".repeat(30))]);
        let job = Job::hours(10.0, 15.0, 0.5);
        // Greedy waits while waiting is safe (t + 1 + 10 + 0.5 <= 15, so
        // at 0..=3 h), then goes on-demand at 4 h: done at 14.5 h.
        let (g, steps) = run(&z, &job, PolicyKind::Greedy);
        assert_eq!(choices(&steps), format!("....{}", "D".repeat(11)));
        assert!(close(g.finish_hours.unwrap(), 14.5), "{g:?}");
        assert!(close(g.on_demand_hours, 10.5) && g.spot_hours == 0.0);
        assert!(g.met_deadline);
        // Uniform progress: on the line at 0 h, behind it from 1 h, then on
        // on-demand to the end (it leaves on-demand only for spot): done
        // at 11.5 h.
        let (u, steps) = run(&z, &job, PolicyKind::UniformProgress);
        assert_eq!(choices(&steps), format!(".{}", "D".repeat(11)));
        assert!(close(u.finish_hours.unwrap(), 11.5), "{u:?}");
        assert!(close(u.on_demand_hours, 10.5), "{u:?}");
        assert_eq!(u.starts, 1);
        assert!(u.met_deadline);
        let o = simulate(&z, &job, &mut AlwaysOnDemand);
        assert!(close(o.finish_hours.unwrap(), 10.5) && o.met_deadline);
    }

    #[test]
    fn greedy_waits_out_a_gap_then_is_forced_to_on_demand() {
        // 3 h of spot, then none.
        let z = zones(vec![hourly("a", &format!("111{}", "0".repeat(20)))]);
        let job = Job::hours(10.0, 15.0, 0.5);
        let (o, steps) = run(&z, &job, PolicyKind::Greedy);
        // 2.5 h done at 3 h; waiting is safe while t + 1 + 7.5 + 0.5 <= 15,
        // i.e. at 3..=6 h; on-demand from 7 h, done at 15 h sharp.
        assert_eq!(choices(&steps), format!("SSS....{}", "D".repeat(8)));
        assert_eq!(o.preemptions, 1);
        assert!(close(o.finish_hours.unwrap(), 15.0), "{o:?}");
        assert!(o.met_deadline);
        assert!(close(o.spot_hours, 3.0) && close(o.on_demand_hours, 8.0));
    }

    #[test]
    fn greedy_takes_spot_back_before_it_is_forced() {
        let z = zones(vec![hourly("a", "1100111111111111")]);
        let job = Job::hours(10.0, 15.0, 0.5);
        let (o, steps) = run(&z, &job, PolicyKind::Greedy);
        assert_eq!(choices(&steps), "SS..SSSSSSSSS");
        assert_eq!((o.preemptions, o.starts), (1, 2));
        assert!(close(o.finish_hours.unwrap(), 13.0) && o.on_demand_hours == 0.0);
    }

    #[test]
    fn uniform_progress_catches_up_and_does_not_flap() {
        // Spot for 2 h, then a 7 h outage, then spot again.
        let pattern = format!("11{}{}", "0".repeat(7), "1".repeat(20));
        let z = zones(vec![hourly("a", &pattern)]);
        let job = Job::hours(10.0, 20.0, 0.5);
        let (u, steps) = run(&z, &job, PolicyKind::UniformProgress);
        let c = choices(&steps);
        // 1.5 h done at 2 h (C(2 h) = 1 h): ahead, so it waits; behind at
        // 4 h (C = 2 h), on-demand; kept through the outage (not dropped
        // when it gets ahead of the line), left for spot when spot is back.
        assert_eq!(c, "SS..DDDDDSSSSS", "{c}");
        let od_runs: Vec<usize> = c
            .split(|ch| ch != 'D')
            .filter(|r| !r.is_empty())
            .map(str::len)
            .collect();
        assert!(
            !od_runs.is_empty() && od_runs.iter().all(|n| *n >= 3),
            "{c}"
        );
        for (k, s) in steps.iter().enumerate() {
            // Every on-demand start happens behind the line.
            let starts_od =
                s.choice == Choice::OnDemand && (k == 0 || steps[k - 1].choice != Choice::OnDemand);
            if starts_od {
                let before = if k == 0 { 0.0 } else { steps[k - 1].work_hours };
                assert!(before < 10.0 * s.at_hours / 20.0, "{c}");
            }
        }
        assert!(u.met_deadline && u.starts == 3, "{u:?} {c}");
        // Greedy rides the outage out idle and pays no on-demand at all.
        let (g, _) = run(&z, &job, PolicyKind::Greedy);
        assert!(g.met_deadline && g.on_demand_hours == 0.0, "{g:?}");
    }

    #[test]
    fn multi_zone_moves_to_the_zone_with_spot() {
        let a = hourly("a", &format!("11111{}", "0".repeat(20)));
        let b = hourly("b", &"1".repeat(25));
        let job = Job::hours(10.0, 12.0, 0.5);
        let one = zones(vec![a.clone()]);
        let two = zones(vec![a, b]);
        for kind in [PolicyKind::Greedy, PolicyKind::UniformProgress] {
            let (o, steps) = run(&two, &job, kind);
            assert_eq!(choices(&steps), "S".repeat(11), "{kind:?}");
            let zs: Vec<Option<usize>> = steps.iter().map(|s| s.zone).collect();
            assert_eq!(zs[4], Some(0));
            assert_eq!(zs[5], Some(1));
            assert_eq!((o.preemptions, o.starts, o.zone_moves), (1, 2, 1), "{o:?}");
            assert!(close(o.finish_hours.unwrap(), 11.0) && o.on_demand_hours == 0.0);
            // On zone a alone the job needs on-demand to make 12 h.
            let (single, _) = run(&one, &job, kind);
            assert!(single.met_deadline && single.on_demand_hours > 0.0);
            assert!(single.cost > o.cost);
        }
    }

    #[test]
    fn the_end_of_the_trace_means_no_spot() {
        let z = zones(vec![hourly("a", "1111")]);
        let job = Job::hours(10.0, 15.0, 0.5);
        let (o, steps) = run(&z, &job, PolicyKind::Greedy);
        assert!(o.ran_past_trace_end && o.met_deadline, "{o:?}");
        assert_eq!(&choices(&steps)[..4], "SSSS");
        assert!(
            !simulate(
                &zones(vec![hourly("a", &"1".repeat(11))]),
                &job,
                &mut Greedy::default()
            )
            .ran_past_trace_end
        );
    }

    #[test]
    fn the_start_tick_shifts_the_trace() {
        let z = zones(vec![hourly(
            "a",
            &format!("{}{}", "0".repeat(5), "1".repeat(20)),
        )]);
        let mut job = Job::hours(4.0, 6.0, 0.0);
        job.start_tick = 5;
        let o = simulate(&z, &job, &mut Greedy::default());
        assert!(close(o.cost, 4.0 * DEFAULT_SPOT_PRICE) && close(o.finish_hours.unwrap(), 4.0));
    }

    #[test]
    fn a_policy_that_never_runs_is_stopped() {
        struct Lazy;
        impl Policy for Lazy {
            fn name(&self) -> &'static str {
                "lazy"
            }
            fn decide(&mut self, _: &State) -> Choice {
                Choice::Idle
            }
        }
        let z = zones(vec![hourly("a", "1")]);
        let o = simulate(&z, &Job::hours(1.0, 2.0, 0.0), &mut Lazy);
        assert_eq!(o.finish_hours, None);
        assert!(!o.met_deadline);
    }

    /// splitmix64: a small, seeded generator for the property tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        fn range(&mut self, lo: f64, hi: f64) -> f64 {
            lo + (hi - lo) * self.unit()
        }

        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    /// Availability as a two-state Markov chain: mean run lengths of spot
    /// and of no spot drawn per trace.
    fn random_trace(rng: &mut Rng, name: &str, gap: f64, ticks: usize) -> Trace {
        let mean_up = rng.range(1.0, 60.0);
        let mean_down = rng.range(1.0, 60.0);
        let mut up = rng.unit() < 0.5;
        let available = (0..ticks)
            .map(|_| {
                let flip = if up { 1.0 / mean_up } else { 1.0 / mean_down };
                if rng.unit() < flip {
                    up = !up;
                }
                up
            })
            .collect();
        Trace::new(name, gap, available)
    }

    fn random_case(rng: &mut Rng) -> (Zones, Job) {
        let gap = rng.pick(&[32.0, 60.0, 195.0, 600.0, 1800.0, 3600.0, 7000.0]);
        let length = rng.range(0.2, 60.0) * H;
        let restart = rng.pick(&[0.0, 30.0, 180.0, 720.0, 0.5 * gap, gap, 2.5 * gap]);
        let slack = match rng.next() % 4 {
            0 => 0.0,
            1 => rng.range(0.0, 2.0 * gap),
            _ => rng.range(0.0, length),
        };
        let deadline = length + restart + slack;
        let n_zones = 1 + (rng.next() % 3) as usize;
        // Sometimes shorter than the job: the end of a trace is no spot.
        let ticks = (rng.range(0.3, 3.0) * deadline / gap) as usize + 1;
        let traces = (0..n_zones)
            .map(|k| random_trace(rng, &format!("z{k}"), gap, ticks))
            .collect();
        let job = Job {
            length,
            deadline,
            restart_overhead: restart,
            spot_price: None,
            on_demand_price: DEFAULT_ON_DEMAND_PRICE,
            start_tick: (rng.next() % 5) as usize,
        };
        (zones(traces), job)
    }

    #[test]
    fn never_misses_a_feasible_deadline() {
        let mut rng = Rng(0x5eed_cafe);
        for case in 0..600 {
            let (z, job) = random_case(&mut rng);
            assert!(job.feasible());
            let od = simulate(&z, &job, &mut AlwaysOnDemand);
            assert!(od.met_deadline, "case {case}: {od:?}");
            for kind in [PolicyKind::Greedy, PolicyKind::UniformProgress] {
                let o = simulate(&z, &job, kind.build().as_mut());
                let what = format!(
                    "case {case} {kind:?}: {o:?}; gap {} s, job {} s, deadline {} s, \
                     restart {} s, {} zone(s)",
                    z.gap_seconds(),
                    job.length,
                    job.deadline,
                    job.restart_overhead,
                    z.traces().len()
                );
                assert!(o.met_deadline, "{what}");
                // Billed time = work + overheads; nothing cheaper than
                // all-spot, nothing dearer than all-on-demand per hour.
                let billed = o.spot_hours + o.on_demand_hours;
                let work = billed * H - o.overhead_hours * H;
                assert!((work - job.length).abs() < 1e-3, "{what}");
                assert!(
                    o.overhead_hours * H <= o.starts as f64 * job.restart_overhead + 1e-3,
                    "{what}"
                );
                assert!(o.cost <= billed * DEFAULT_ON_DEMAND_PRICE + 1e-9, "{what}");
                assert!(o.preemptions <= o.starts, "{what}");
            }
        }
    }

    #[test]
    fn never_misses_with_whole_tick_policies_on_a_razor_edge() {
        // Deadline exactly job + restart, restart a whole number of ticks:
        // any idle tick at all would miss.
        let mut rng = Rng(7);
        for _ in 0..200 {
            let gap = 600.0;
            let z = zones(vec![random_trace(&mut rng, "a", gap, 400)]);
            let job = Job::hours(20.0, 20.0 + 1.0 / 6.0, 1.0 / 6.0);
            for mut p in [
                Box::new(Greedy::default()) as Box<dyn Policy>,
                Box::new(UniformProgress::default()),
            ] {
                let o = simulate(&z, &job, p.as_mut());
                assert!(o.met_deadline, "{o:?}");
            }
        }
    }
}
