//! The CLI's contract: exit codes, JSON shapes, messages.

use serde_json::Value;

use crate::common::{gangway, parts, root, write, TestHome};

const FIXTURE: &str = "tests/fixtures/catalog";

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"))
}

fn task(dir: &tempfile::TempDir, yaml: &str) -> String {
    write(dir.path(), "task.yaml", yaml).display().to_string()
}

#[test]
fn optimize_json_is_the_documented_shape_cheapest_first() {
    let d = tempfile::tempdir().unwrap();
    let t = task(&d, "num_nodes: 4\nresources:\n  any_of:\n    - accelerators: H100:8\n    - accelerators: A100:8\nrun: x\n");
    let (code, out, err) = parts(&gangway(["optimize", &t, "--output", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let plan = v["plan"].as_array().expect("plan is a list");
    assert!(plan.len() >= 4, "{plan:?}");
    let keys = [
        "cloud",
        "region",
        "zone",
        "instance_type",
        "accelerator",
        "accelerator_count",
        "use_spot",
        "nodes",
        "price_per_node_hour",
        "total_per_hour",
        "price_estimated",
        "interruption",
        "expected_cost_per_node_hour",
    ];
    let mut last = 0.0;
    for row in plan {
        let obj = row.as_object().unwrap();
        let mut got: Vec<&str> = obj.keys().map(String::as_str).collect();
        got.sort();
        let mut want = keys.to_vec();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(row["nodes"], 4);
        assert_eq!(row["accelerator_count"], 8.0);
        assert!(["H100", "A100"].contains(&row["accelerator"].as_str().unwrap()));
        let per = row["price_per_node_hour"].as_f64().unwrap();
        let total = row["total_per_hour"].as_f64().unwrap();
        assert!((total - 4.0 * per).abs() < 1e-9);
        assert!(total >= last, "not cheapest first: {total} after {last}");
        last = total;
    }
    // Several clouds and regions stay in the plan for failover.
    let clouds: std::collections::BTreeSet<_> =
        plan.iter().map(|r| r["cloud"].as_str().unwrap()).collect();
    assert!(
        clouds.contains("aws") && clouds.contains("gcp"),
        "{clouds:?}"
    );
}

/// `gangway optimize TASK --catalog FIXTURE -o json EXTRA...`, which must
/// succeed: the plan and stderr.
fn fixture_plan(task: &str, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["optimize", task, "--catalog", FIXTURE, "-o", "json"];
    args.extend_from_slice(extra);
    let (code, out, err) = parts(&gangway(&args));
    assert_eq!(code, 0, "{err}");
    (json(&out)["plan"].clone(), err)
}

#[test]
fn skypilot_catalog_dir_gives_a_golden_plan_and_names_bad_rows() {
    let d = tempfile::tempdir().unwrap();
    let t = task(
        &d,
        "resources:\n  accelerators: H100:8\n  use_spot: true\nrun: x\n",
    );
    let (plan, err) = fixture_plan(&t, &[]);
    let rows: Vec<String> = plan
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {:.5}",
                r["cloud"].as_str().unwrap(),
                r["zone"].as_str().unwrap(),
                r["instance_type"].as_str().unwrap(),
                r["total_per_hour"].as_f64().unwrap()
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            "aws use1-az4 p5.48xlarge 19.75000",
            "aws use1-az2 p5.48xlarge 21.50000",
            "azure eastus Standard_ND96isr_H100_v5 25.00000",
            "gcp us-central1-a a3-highgpu-8g 33.86318",
        ]
    );
    assert!(
        err.contains("tests/fixtures/catalog/aws/vms.csv:7: Price: 'not-a-price' is not a number"),
        "{err}"
    );
    // A V100 attaches to an N1 host; the offering costs host + GPU.
    let t = task(
        &d,
        "resources:\n  accelerators: V100\n  infra: gcp\nrun: x\n",
    );
    let (plan, _) = fixture_plan(&t, &[]);
    assert_eq!(plan[0]["instance_type"], "n1-highmem-8");
    assert!((plan[0]["price_per_node_hour"].as_f64().unwrap() - (0.4736 + 2.48)).abs() < 1e-9);
    // The same directory through the environment variable.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gangway"))
        .args(["optimize", &t, "-o", "json"])
        .env("GANGWAY_CATALOG_DIR", root().join(FIXTURE))
        .output()
        .unwrap();
    assert_eq!(json(&String::from_utf8_lossy(&o.stdout))["plan"], plan);
}

#[test]
fn table_output_lists_the_plan() {
    let d = tempfile::tempdir().unwrap();
    // On AWS alone: the fixture's AWS rows, whatever the embedded
    // catalogs of the other clouds hold.
    let t = task(
        &d,
        "name: t\nresources:\n  accelerators: H100:8\n  infra: aws\nrun: x\n",
    );
    let (code, out, _) = parts(&gangway(["optimize", &t, "--catalog", FIXTURE]));
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(
            "Plan for 't': 1 node, 3 candidates; cheapest aws p5.48xlarge at $55.04/h"
        ),
        "{out}"
    );
    assert!(
        lines[1].starts_with("CLOUD") && lines[1].contains("$/H TOTAL"),
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");
    let (_, out, _) = parts(&gangway([
        "optimize",
        &t,
        "--catalog",
        FIXTURE,
        "--limit",
        "1",
    ]));
    assert!(out.contains("... and 2 more"), "{out}");
}

/// The embedded catalogs know Azure: the cheapest 8 x A100-80GB spot node
/// is Azure's ND96amsr_A100_v4 (in the published catalog, $8.52/h in
/// eastus, against AWS's p4de.24xlarge at $9.73/h).
#[test]
fn optimize_puts_azure_first_for_spot_a100_80gb_on_the_embedded_catalogs() {
    let d = tempfile::tempdir().unwrap();
    let t = task(
        &d,
        "resources:\n  accelerators: A100-80GB:8\n  use_spot: true\nrun: x\n",
    );
    let (code, out, err) = parts(&gangway(["optimize", &t, "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let first = &v["plan"][0];
    assert_eq!(first["cloud"], "azure", "{first}");
    assert_eq!(
        first["instance_type"], "Standard_ND96amsr_A100_v4",
        "{first}"
    );
    assert_eq!(first["use_spot"], true, "{first}");
    let price = first["price_per_node_hour"].as_f64().unwrap();
    assert!((price - 8.5202).abs() < 1e-6, "{first}");
    assert!(["eastus", "eastus2"].contains(&first["region"].as_str().unwrap()));
    // AWS still follows for failover.
    let plan = v["plan"].as_array().unwrap();
    assert!(plan.iter().any(|r| r["cloud"] == "aws"), "{plan:?}");
}

#[test]
fn no_feasible_placement_exits_3_and_says_why() {
    let d = tempfile::tempdir().unwrap();
    let t = task(
        &d,
        "resources:\n  accelerators: H200:8\n  infra: '*/eu-north-1'\nrun: x\n",
    );
    let (code, out, err) = parts(&gangway(["optimize", &t]));
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains(
            "H200:8 is offered only on aws, azure, gcp, vast; none of them in region eu-north-1"
        ),
        "{err}"
    );
    let (code, _, _) = parts(&gangway(["launch", "--dry-run", &t]));
    assert_eq!(code, 3);
}

#[test]
fn show_gpus_lists_cheapest_by_cloud_and_refuses_unknown_names() {
    let (code, out, err) = parts(&gangway(["show-gpus", "h100", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let rows = v["gpus"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["accelerator"] == "H100"));
    for cloud in ["aws", "gcp"] {
        assert!(
            rows.iter()
                .any(|r| r["cloud"] == cloud && r["count"] == 8.0),
            "{cloud} H100:8 missing"
        );
    }
    for r in rows {
        if let (Some(od), Some(spot)) = (
            r["on_demand"]["price"].as_f64(),
            r["spot"]["price"].as_f64(),
        ) {
            assert!(spot < od, "spot above on-demand in {r}");
        }
    }
    let (code, out, _) = parts(&gangway([
        "show-gpus",
        "--catalog",
        FIXTURE,
        "--cloud",
        "aws",
    ]));
    assert_eq!(code, 0);
    assert!(
        out.contains("H100") && out.contains("A100") && !out.contains("V100"),
        "{out}"
    );
    let (code, _, err) = parts(&gangway(["show-gpus", "H10"]));
    assert_eq!(code, 2);
    // H100 and Lambda's A10 are both one edit away.
    assert!(
        err.contains("did you mean 'H100'?") || err.contains("did you mean 'A10'?"),
        "{err}"
    );
}

#[test]
fn check_and_catalog_refresh_refuse_what_they_cannot_do() {
    // The local provider needs no credentials: always usable.
    let (code, out, err) = parts(&gangway(["check", "local"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("local") && out.contains("ok"), "{out}");
    // The rest needs the clouds' price APIs, which a build without their
    // features has none of.
    if cfg!(not(all(feature = "aws", feature = "gcp"))) {
        return;
    }
    // Prices of the local cloud and of clouds without a provider yet
    // cannot be refreshed; both say why.
    let (code, _, err) = parts(&gangway(["catalog", "refresh", "--cloud", "local"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no live price API") && err.contains("aws"),
        "{err}"
    );
    // GCP without a project: says how to name one, writes nothing.
    let home = TestHome::new();
    let mut c = crate::common::command_in(home.path());
    c.args(["catalog", "refresh", "--cloud", "gcp"])
        .env_remove("GOOGLE_CLOUD_PROJECT")
        .env_remove("CLOUDSDK_CORE_PROJECT")
        .env("CLOUDSDK_CONFIG", home.path().join("no-gcloud"));
    let (code, _, err) = parts(&crate::common::Running::start(c).wait());
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("GOOGLE_CLOUD_PROJECT"), "{err}");
    assert!(!home.path().join("catalog/gcp.csv").exists());
    let (code, _, err) = parts(&gangway([
        "catalog",
        "refresh",
        "--cloud",
        "aws",
        "--regions",
        "mars-1",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mars-1") && err.contains("us-east-1"), "{err}");
}

#[test]
fn help_version_completions_and_bad_flags() {
    let (code, out, _) = parts(&gangway(["--help"]));
    assert_eq!(code, 0);
    for cmd in [
        "launch",
        "exec",
        "status",
        "logs",
        "down",
        "stop",
        "start",
        "jobs",
        "check",
        "show-gpus",
        "optimize",
        "catalog",
    ] {
        assert!(out.contains(cmd), "--help lacks {cmd}");
    }
    let (code, out, _) = parts(&gangway(["--version"]));
    assert_eq!(code, 0);
    assert!(out.starts_with("gangway "));
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = parts(&gangway(["completions", shell]));
        assert_eq!(code, 0);
        assert!(
            out.contains("optimize") && out.contains("show-gpus"),
            "{shell}"
        );
    }
    let (code, _, err) = parts(&gangway(["optimize", "--no-such-flag", "x.yaml"]));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = parts(&gangway(["optimize", "x.yaml", "--gpus", "A100:zero"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("--gpus 'A100:zero': expected a GPU count after ':', found 'zero'"),
        "{err}"
    );
    let (code, _, err) = parts(&gangway(["optimize", "x.yaml", "--infra", "awss"]));
    assert_eq!(code, 2);
    assert!(err.contains("did you mean 'aws'?"), "{err}");
}

#[test]
fn overrides_change_the_plan() {
    let d = tempfile::tempdir().unwrap();
    let t = task(&d, "resources:\n  accelerators: A100:8\nrun: x\n");
    let (plan, _) = fixture_plan(
        &t,
        &[
            "--gpus",
            "H100:8",
            "--infra",
            "aws/us-east-1",
            "--use-spot",
            "--num-nodes",
            "2",
        ],
    );
    assert_eq!(plan.as_array().unwrap().len(), 2);
    assert_eq!(plan[0]["zone"], "use1-az4");
    assert_eq!(plan[0]["use_spot"], true);
    assert_eq!(plan[0]["nodes"], 2);
    assert!((plan[0]["total_per_hour"].as_f64().unwrap() - 39.5).abs() < 1e-9);
}

#[test]
fn required_envs_and_secrets_must_be_given_and_secrets_never_show() {
    let d = tempfile::tempdir().unwrap();
    let t = task(
        &d,
        "envs:\n  DATA: null\nsecrets:\n  HF_TOKEN: null\nrun: echo $DATA\n",
    );
    let (code, _, err) = parts(&gangway(["launch", "--dry-run", &t]));
    assert_eq!(code, 2);
    assert!(err.contains("no value for DATA, HF_TOKEN"), "{err}");
    let env_file = write(d.path(), "vals.env", "# comment\nexport DATA=\"/data\"\n");
    let secret = "hf_superSecretValue123";
    let (code, out, err) = parts(&gangway([
        "launch",
        "--dry-run",
        &t,
        "--env-file",
        env_file.to_str().unwrap(),
        "--secret",
        &format!("HF_TOKEN={secret}"),
        "-o",
        "json",
        "-vvv",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains(secret) && !err.contains(secret),
        "secret leaked"
    );
    // A malformed --secret must not echo its value either.
    let (code, _, err) = parts(&gangway([
        "launch",
        "--dry-run",
        &t,
        "--secret",
        &format!("1BAD={secret}"),
    ]));
    assert_eq!(code, 2);
    assert!(!err.contains(secret), "{err}");
    // optimize plans without the values but notes them.
    let (code, _, err) = parts(&gangway(["optimize", &t]));
    assert_eq!(code, 0);
    assert!(err.contains("DATA, HF_TOKEN must be given"), "{err}");
}

#[test]
fn verbose_logs_go_to_stderr_only() {
    let (code, out, err) = parts(&gangway([
        "-v",
        "optimize",
        "examples/train.yaml",
        "-o",
        "json",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("catalog loaded") && err.contains("optimized"),
        "{err}"
    );
    json(&out);
    let (_, _, quiet) = parts(&gangway(["optimize", "examples/train.yaml", "-o", "json"]));
    assert!(!quiet.contains("catalog loaded"), "{quiet}");
}

#[test]
fn stale_prices_and_bad_catalog_dirs_are_reported() {
    let d = tempfile::tempdir().unwrap();
    let home = TestHome::new();
    let t = task(
        &d,
        "resources:\n  accelerators: A10G\n  infra: aws\nrun: x\n",
    );
    let stale = ["optimize", &t, "--catalog", "tests/fixtures/stale"];
    let (code, _, err) = parts(&home.run(stale));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("aws prices from tests/fixtures/stale/aws.csv were taken on 2020-01-15"),
        "{err}"
    );
    assert!(err.contains("days ago"), "{err}");
    // Once a day per home: the next command is quiet about it ...
    let (code, _, err) = parts(&home.run(stale));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("prices from"), "warned twice: {err}");
    // ... another home is told again.
    let (_, _, err) = parts(&TestHome::new().run(stale));
    assert!(err.contains("aws prices from"), "{err}");
    let (code, _, err) = parts(&gangway([
        "optimize",
        &t,
        "--catalog",
        "/nonexistent/catalog",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/catalog"), "{err}");
    assert!(
        !err.contains("Caused by"),
        "the cause repeats the message: {err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = parts(&gangway([
        "optimize",
        &t,
        "--catalog",
        empty.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("no catalog files found"), "{err}");
}

#[test]
fn stale_warnings_only_name_clouds_the_command_touches_and_never_reach_stdout() {
    let d = tempfile::tempdir().unwrap();
    let local = task(&d, "resources:\n  infra: local\nrun: x\n");
    // The fixture's AWS prices are years old: a task pinned to local and a
    // listing of GCP's GPUs do not hear about them.
    let home = TestHome::new();
    let (code, _, err) =
        parts(&home.run(["optimize", &local, "--catalog", "tests/fixtures/stale"]));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("prices from"), "{err}");
    let (code, _, err) = parts(&home.run([
        "show-gpus",
        "--cloud",
        "gcp",
        "--catalog",
        "tests/fixtures/stale",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("prices from"), "{err}");
    // With -o json the warning stays on stderr; stdout is one document.
    let (code, out, err) = parts(&home.run([
        "show-gpus",
        "--cloud",
        "aws",
        "--catalog",
        "tests/fixtures/stale",
        "-o",
        "json",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("aws prices from"), "{err}");
    json(&out);
}

#[test]
fn a_new_user_sees_no_stale_price_warning_with_the_shipped_catalog() {
    let home = TestHome::new();
    for args in [
        &["optimize", "examples/train.yaml"][..],
        &["show-gpus"][..],
        &["optimize", "examples/train-any-of.yaml", "-o", "json"][..],
    ] {
        let (code, _, err) = parts(&home.run(args));
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!err.contains("warning"), "{args:?}: {err}");
    }
}

#[test]
fn estimated_prices_are_marked_in_tables_and_json() {
    let home = TestHome::new();
    // The shipped p5en spot prices are estimates (SOURCES.md); p4d's are
    // published.
    let (code, out, err) = parts(&home.run(["show-gpus", "H200", "--cloud", "aws", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let row = &v["gpus"][0];
    assert_eq!(row["spot"]["instance_type"], "p5en.48xlarge", "{v}");
    assert_eq!(row["spot"]["estimated"], true, "{v}");
    assert_eq!(row["on_demand"]["estimated"], false, "{v}");
    let (code, out, err) = parts(&home.run(["show-gpus", "H200", "--cloud", "aws"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(" est. (p5en.48xlarge"), "{out}");
    assert!(out.contains("est. = an estimate"), "{out}");
    let d = tempfile::tempdir().unwrap();
    let t = task(
        &d,
        "resources:\n  accelerators: A100:8\n  infra: aws\n  use_spot: true\nrun: x\n",
    );
    let (code, out, err) = parts(&home.run(["optimize", &t, "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let plan = v["plan"].as_array().unwrap();
    assert!(plan.iter().all(|c| c["price_estimated"] == false), "{v}");
    let (code, out, err) = parts(&home.run(["optimize", &t]));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("est."), "{out}");
}

#[test]
fn catalog_show_reports_sources_and_dates() {
    let (code, out, err) = parts(&gangway(["catalog", "show", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let clouds: Vec<&str> = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cloud"].as_str().unwrap())
        .collect();
    assert_eq!(
        clouds,
        vec!["aws", "azure", "gcp", "lambda", "runpod", "vast", "local"]
    );
    assert!(v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["taken"].is_string() && s["rows"].as_u64().unwrap() > 0));
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0);
}

#[test]
fn every_example_plans() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("examples")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            n += 1;
            let (code, out, err) = parts(&gangway([
                "optimize".as_ref(),
                p.as_os_str(),
                "-o".as_ref(),
                "json".as_ref(),
            ]));
            assert_eq!(code, 0, "{}: {err}", p.display());
            assert!(!json(&out)["plan"].as_array().unwrap().is_empty());
        }
    }
    assert!(n >= 3);
}

/// A new `$GANGWAY_HOME` is the owner's alone whatever the umask: the
/// home 0700, the state database 0600 (others could read every cluster,
/// job and address in it).
#[test]
fn a_new_home_is_owner_only_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("a/new/home");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" status")
        .arg(env!("CARGO_BIN_EXE_gangway"))
        .env("GANGWAY_HOME", &home)
        .env_remove("GANGWAY_CATALOG_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("state.db")), 0o600);
    for f in std::fs::read_dir(&home).unwrap() {
        let p = f.unwrap().path();
        let m = mode(&p);
        assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
    }
}

/// On the embedded catalogs, the GPU clouds win where their published
/// prices are lowest: `H100:8` on demand is cheaper on Vast.ai and Lambda
/// than on AWS or GCP, and a single RTX 4090 or A100-80GB is cheapest on
/// Vast.ai (RunPod's A100-80GB pod is between it and the hyperscalers).
#[test]
fn the_gpu_clouds_win_the_plans_where_they_are_cheapest() {
    let d = tempfile::tempdir().unwrap();
    let plan_of = |gpu: &str| {
        let t = task(&d, &format!("resources:\n  accelerators: {gpu}\nrun: x\n"));
        let (code, out, err) = parts(&gangway(["optimize", &t, "-o", "json"]));
        assert_eq!(code, 0, "{err}");
        json(&out)["plan"].as_array().unwrap().clone()
    };
    let cheapest_on = |plan: &[serde_json::Value], cloud: &str| {
        plan.iter()
            .filter(|r| r["cloud"] == cloud && r["spot"] != true)
            .filter_map(|r| r["total_per_hour"].as_f64())
            .fold(f64::INFINITY, f64::min)
    };
    let h100 = plan_of("H100:8");
    assert_eq!(h100[0]["cloud"], "vast", "{:?}", h100[0]);
    assert_eq!(h100[0]["instance_type"], "8x_H100_SXM", "{:?}", h100[0]);
    let lambda = cheapest_on(&h100, "lambda");
    assert_eq!(lambda, 31.92);
    for big in ["aws", "gcp"] {
        assert!(lambda < cheapest_on(&h100, big), "{big} under Lambda");
    }
    for gpu in ["RTX4090:1", "A100-80GB:1"] {
        let plan = plan_of(gpu);
        assert_eq!(plan[0]["cloud"], "vast", "{gpu}: {:?}", plan[0]);
    }
    let a100 = plan_of("A100-80GB:1");
    let runpod = cheapest_on(&a100, "runpod");
    assert_eq!(runpod, 1.64);
    for big in ["aws", "gcp"] {
        assert!(runpod < cheapest_on(&a100, big), "{big} under RunPod");
    }
}

/// `show-gpus` lists the consumer and workstation GPUs the GPU clouds sell,
/// from the embedded catalogs, with the clouds that sell them.
#[test]
fn show_gpus_lists_the_consumer_and_workstation_gpus_of_the_gpu_clouds() {
    for (gpu, clouds) in [
        ("RTX4090", &["vast"][..]),
        ("RTX5090", &["vast"]),
        ("A6000", &["lambda", "vast"]),
        ("RTX6000Ada", &["vast"]),
        ("L40S", &["vast"]),
    ] {
        let (code, out, err) = parts(&gangway(["show-gpus", gpu, "-o", "json"]));
        assert_eq!(code, 0, "{gpu}: {err}");
        let v = json(&out);
        let rows = v["gpus"].as_array().unwrap();
        assert!(rows.iter().all(|r| r["accelerator"] == gpu), "{out}");
        for cloud in clouds {
            assert!(
                rows.iter()
                    .any(|r| r["cloud"] == *cloud && r["on_demand"]["price"].as_f64().is_some()),
                "{gpu} on {cloud} missing: {out}"
            );
        }
    }
    // The table names them too.
    let (code, out, _) = parts(&gangway(["show-gpus"]));
    assert_eq!(code, 0);
    for gpu in ["RTX4090", "RTX5090", "A6000", "RTX6000Ada", "L40S"] {
        assert!(out.contains(gpu), "{gpu} missing: {out}");
    }
}
