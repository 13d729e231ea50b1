//! `gangway sim`: replaying spot-availability traces against the deadline
//! policies, on the small traces in tests/fixtures/traces (written by
//! generate.py there) and, when the checkout has them, the real ones.

use serde_json::Value;

use crate::common::{gangway, parts, shared, write};

const T: &str = "tests/fixtures/traces";

fn fixture(name: &str) -> String {
    format!("{T}/{name}")
}

/// Runs `gangway sim ARGS -o json`, expecting success.
fn sim_json(args: &[&str]) -> Value {
    let mut all = vec!["sim"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let (code, out, err) = parts(&gangway(&all));
    assert_eq!(code, 0, "gangway {all:?} failed: {err}");
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{out}"))
}

fn result<'a>(doc: &'a Value, policy: &str) -> &'a Value {
    doc["results"]
        .as_array()
        .expect("results is a list")
        .iter()
        .find(|r| r["policy"] == policy)
        .unwrap_or_else(|| panic!("no {policy} in {doc}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Runs `gangway sim ARGS`, expecting exit 2; returns stderr.
fn sim_fails(args: &[&str]) -> String {
    let mut all = vec!["sim"];
    all.extend_from_slice(args);
    let (code, out, err) = parts(&gangway(&all));
    assert_eq!(
        code, 2,
        "gangway {all:?} should fail with 2; stdout: {out}; stderr: {err}"
    );
    assert!(out.is_empty(), "nothing on stdout when it fails: {out}");
    err
}

#[test]
fn table_lists_every_policy() {
    let a = fixture("always.json");
    let (code, out, err) = parts(&gangway([
        "sim",
        &a,
        "--job-hours",
        "10",
        "--deadline-hours",
        "14",
    ]));
    assert_eq!(code, 0, "{err}");
    let header = out
        .lines()
        .find(|l| l.starts_with("policy"))
        .unwrap_or_else(|| panic!("no table header:\n{out}"));
    for col in [
        "cost $",
        "finish h",
        "met deadline",
        "spot h",
        "on-demand h",
        "preemptions",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row = |p: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(p))
            .unwrap_or_else(|| panic!("no {p} row:\n{out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // 10 h of work plus one 0.05 h restart, all on spot at $0.9179/h.
    assert_eq!(row("greedy")[1..4], ["9.22", "10.05", "yes"]);
    assert_eq!(
        row("uniform-progress")[1..6],
        ["9.22", "10.05", "yes", "10.05", "0.00"]
    );
    // The same on on-demand at $3.06/h.
    assert_eq!(
        row("on-demand")[1..6],
        ["30.75", "10.05", "yes", "0.00", "10.05"]
    );
    assert!(out.contains("assumed p3.2xlarge"), "{out}");
}

#[test]
fn json_is_one_document_with_every_policy() {
    let v = sim_json(&[
        &fixture("flaky.json"),
        "--job-hours",
        "10",
        "--deadline-hours",
        "14",
    ]);
    assert_eq!(v["job_hours"], 10.0);
    assert_eq!(v["deadline_hours"], 14.0);
    assert_eq!(v["restart_hours"], 0.05);
    assert_eq!(v["gap_seconds"], 600.0);
    assert_eq!(v["zones"][0]["name"], "flaky");
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["greedy", "uniform-progress", "on-demand"]);
    let od_cost = f(&result(&v, "on-demand")["cost"]);
    for r in results {
        for key in [
            "cost",
            "finish_hours",
            "spot_hours",
            "on_demand_hours",
            "overhead_hours",
        ] {
            assert!(r[key].is_number(), "{key} in {r}");
        }
        for key in ["preemptions", "starts", "zone_moves"] {
            assert!(r[key].is_u64(), "{key} in {r}");
        }
        assert_eq!(r["met_deadline"], true, "{r}");
        assert!(f(&r["finish_hours"]) <= 14.0, "{r}");
        assert!(f(&r["cost"]) <= od_cost + 1e-9, "{r}");
        // Billed hours: the work plus the restart overheads.
        let billed = f(&r["spot_hours"]) + f(&r["on_demand_hours"]);
        assert!(
            (billed - 10.0 - f(&r["overhead_hours"])).abs() < 1e-6,
            "{r}"
        );
    }
    // Spot comes and goes: the spot policies are preempted and still
    // cheaper than on-demand.
    let g = result(&v, "greedy");
    assert!(g["preemptions"].as_u64().unwrap() >= 1, "{g}");
    assert!(f(&g["cost"]) < od_cost, "{g}");
}

#[test]
fn no_spot_means_on_demand_and_still_on_time() {
    let v = sim_json(&[
        &fixture("never.json"),
        "--job-hours",
        "10",
        "--deadline-hours",
        "12",
        "--restart-hours",
        "0.2",
    ]);
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["met_deadline"], true, "{r}");
        assert_eq!(r["spot_hours"], 0.0, "{r}");
        assert!(f(&r["on_demand_hours"]) >= 10.2 - 1e-9, "{r}");
    }
}

#[test]
fn one_policy_and_prices_from_flags_or_the_trace() {
    let p = fixture("priced.json");
    let base = [
        "--job-hours",
        "4",
        "--deadline-hours",
        "6",
        "--restart-hours",
        "0",
    ];
    let mut args = vec![p.as_str()];
    args.extend_from_slice(&base);
    args.extend_from_slice(&["--policy", "greedy"]);
    let v = sim_json(&args);
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    // The trace's $0.50/h.
    assert!((f(&result(&v, "greedy")["cost"]) - 2.0).abs() < 1e-9, "{v}");
    assert_eq!(v["spot_price_from_traces"], true);
    // The flag wins over the trace.
    args.extend_from_slice(&["--spot-price", "0.25", "--on-demand-price", "1"]);
    let v = sim_json(&args);
    assert!((f(&result(&v, "greedy")["cost"]) - 1.0).abs() < 1e-9, "{v}");
    let mut args = vec![p.as_str()];
    args.extend_from_slice(&base);
    args.extend_from_slice(&["--policy", "on-demand", "--on-demand-price", "2"]);
    let v = sim_json(&args);
    assert!(
        (f(&result(&v, "on-demand")["cost"]) - 8.0).abs() < 1e-9,
        "{v}"
    );
}

#[test]
fn several_zones_move_the_job_to_spot_elsewhere() {
    let (a, b) = (fixture("zone-a.json"), fixture("zone-b.json"));
    let job = ["--job-hours", "10", "--deadline-hours", "14"];
    let mut two = vec![a.as_str(), b.as_str()];
    two.extend_from_slice(&job);
    let multi = sim_json(&two);
    assert_eq!(multi["zones"].as_array().unwrap().len(), 2);
    let mut one = vec![a.as_str()];
    one.extend_from_slice(&job);
    let single = sim_json(&one);
    for p in ["greedy", "uniform-progress"] {
        let m = result(&multi, p);
        let s = result(&single, p);
        assert_eq!(m["zone_moves"], 1, "{m}");
        assert_eq!(m["preemptions"], 1, "{m}");
        assert_eq!(m["on_demand_hours"], 0.0, "{m}");
        assert_eq!(m["met_deadline"], true, "{m}");
        // Zone a alone has spot for 5 h only: on-demand makes up the rest.
        assert_eq!(s["met_deadline"], true, "{s}");
        assert!(f(&s["on_demand_hours"]) > 0.0, "{s}");
        assert!(f(&m["cost"]) < f(&s["cost"]), "{m} vs {s}");
    }
}

#[test]
fn a_trace_that_ends_early_is_no_spot_and_says_so() {
    let s = fixture("short.json");
    let args = ["sim", &s, "--job-hours", "10", "--deadline-hours", "14"];
    let (code, out, err) = parts(&gangway(args));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("a trace ends 2.00 h after the start") && out.contains("no spot"),
        "{out}"
    );
    let v = sim_json(&args[1..]);
    let g = result(&v, "greedy");
    assert_eq!(g["ran_past_trace_end"], true);
    assert_eq!(g["met_deadline"], true);
    assert!((f(&g["spot_hours"]) - 2.0).abs() < 1e-9, "{g}");
}

#[test]
fn start_hour_shifts_into_the_trace() {
    // zone-b has no spot for its first 3 h 20 min.
    let b = fixture("zone-b.json");
    let args = [b.as_str(), "--job-hours", "2", "--deadline-hours", "3"];
    let from0 = sim_json(&args);
    let mut later = args.to_vec();
    later.extend_from_slice(&["--start-hour", "4"]);
    let from4 = sim_json(&later);
    assert!(f(&result(&from0, "greedy")["on_demand_hours"]) > 0.0);
    assert_eq!(result(&from4, "greedy")["on_demand_hours"], 0.0);
    assert_eq!(from4["start_hour"], 4.0);
}

#[test]
fn bad_input_exits_2_naming_the_culprit() {
    let job = ["--job-hours", "10", "--deadline-hours", "14"];
    let with = |files: &[&str], extra: &[&str]| -> String {
        let mut v: Vec<&str> = files.to_vec();
        v.extend_from_slice(&job);
        v.extend_from_slice(extra);
        sim_fails(&v)
    };
    let missing = fixture("no-such-trace.json");
    let e = with(&[&missing], &[]);
    assert!(
        e.contains("cannot read trace") && e.contains("no-such-trace.json"),
        "{e}"
    );

    let d = tempfile::tempdir().unwrap();
    let broken = write(
        d.path(),
        "broken.json",
        "{\"metadata\": {\"gap_seconds\": 60},",
    );
    let broken = broken.display().to_string();
    let e = with(&[&broken], &[]);
    assert!(
        e.contains("broken.json") && e.contains("not valid JSON"),
        "{e}"
    );

    let e = with(&[&fixture("bad-count.json")], &[]);
    assert!(
        e.contains("bad-count.json") && e.contains("data[4] is -1"),
        "{e}"
    );

    let e = with(&[&fixture("bad-gap.json")], &[]);
    assert!(
        e.contains("bad-gap.json") && e.contains("gap_seconds"),
        "{e}"
    );

    let e = with(&[&fixture("always.json"), &fixture("gap-300.json")], &[]);
    assert!(
        e.contains("gap-300.json has gap_seconds 300") && e.contains("always.json has 600"),
        "{e}"
    );

    let e = with(&[&fixture("always.json")], &["--start-hour", "25"]);
    assert!(e.contains("--start-hour"), "{e}");

    let e = with(&[&fixture("always.json")], &["--restart-hours=-0.1"]);
    assert!(e.contains("--restart-hours"), "{e}");

    let e = sim_fails(&[
        &fixture("always.json"),
        "--job-hours",
        "48",
        "--deadline-hours",
        "48.01",
    ]);
    assert!(
        e.contains("--deadline-hours 48.01") && e.contains("--job-hours 48"),
        "{e}"
    );

    // Flags clap checks: a required one missing, an unknown policy.
    let e = sim_fails(&[&fixture("always.json"), "--job-hours", "10"]);
    assert!(e.contains("--deadline-hours"), "{e}");
    let e = with(&[&fixture("always.json")], &["--policy", "lucky"]);
    assert!(e.contains("lucky"), "{e}");
}

#[test]
fn real_trace_meets_deadlines_and_saves() {
    let Some(shared) = shared() else {
        crate::skip::skipped(
            "traces",
            "../shared is not beside this checkout (no real spot traces)",
        );
        return;
    };
    let file = shared.join("traces/availability/1-node/aws-02-15-2023/us-east-2a_v100_1.json");
    if !file.is_file() {
        crate::skip::skipped("traces", format_args!("{} is absent", file.display()));
        return;
    }
    crate::skip::ran("traces");
    let file = file.display().to_string();
    for deadline in ["52", "70"] {
        let v = sim_json(&[&file, "--job-hours", "48", "--deadline-hours", deadline]);
        let od = f(&result(&v, "on-demand")["cost"]);
        for r in v["results"].as_array().unwrap() {
            assert_eq!(r["met_deadline"], true, "deadline {deadline}: {r}");
            assert!(f(&r["cost"]) <= od + 1e-9, "deadline {deadline}: {r}");
        }
        let up = result(&v, "uniform-progress");
        assert!(f(&up["spot_hours"]) > 0.0, "{up}");
    }
}
