//! `infra: lambda` end to end through the real binary, against the Lambda
//! fake (tests/emulators/lambda): its instances are a real sshd's loopback
//! addresses on port 22 (what the API says of a Lambda VM: an `ip`, no
//! port), and it checks every request against Lambda's published shapes.

use std::process::Output;

use crate::common::{json_doc, parts, Running, TestHome};
use crate::gpu_cloud::{self, GpuCloudFake, KEY};
use crate::skip;

/// gangway in `home` talking to `fake`.
fn run(fake: &GpuCloudFake, home: &TestHome, args: &[&str]) -> Output {
    gpu_cloud::run("lambda", fake, home, args)
}

/// A catalog of two regions with `H100:8` on Lambda, us-south-2 the
/// cheaper (as the fake's types and capacity have them).
fn catalog(home: &TestHome) -> String {
    gpu_cloud::catalog(
        home,
        "test-catalog",
        "lambda",
        "2026-12-05",
        &[
            "gpu_8x_h100_sxm5,H100,8,80,208,1800,us-south-2,us-south-2,31.92,,false,false,",
            "gpu_8x_h100_sxm5,H100,8,80,208,1800,us-west-3,us-west-3,32.50,,false,false,",
        ],
    )
}

#[test]
fn a_lambda_gang_fails_over_a_stockout_runs_over_ssh_and_down_leaves_nothing() {
    let fake = match gpu_cloud::start("lambda", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    let Some(sshd) = crate::sshd::Sshd::start_on_port("lambda", 2, 22) else {
        return;
    };
    skip::ran("lambda");
    let home = TestHome::new();
    gpu_cloud::machines(&fake, &sshd, 22);
    // The cheaper region has no H100s: the launch fails over.
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"instance_type": "gpu_8x_h100_sxm5", "region": "us-south-2", "available": null}),
    );
    let cat = catalog(&home);
    let task = home.file(
        "lambda-e2e.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: lambda\n  accelerators: H100:8\n\
             config:\n  lambda:\n    ssh_user: root\n    poll_ms: 100\n\
             setup: echo setup-done > setup.txt\n\
             run: |\n  {}\n",
            gpu_cloud::RANK_LINE
        ),
    );
    let (code, plan, err) = parts(&run(
        &fake,
        &home,
        &["optimize", &task, "--catalog", &cat, "-o", "json"],
    ));
    assert_eq!(code, 0, "{plan}\n{err}");
    assert_eq!(json_doc(&plan)["plan"][0]["region"], "us-south-2", "{plan}");

    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["launch", &task, "--catalog", &cat, "-c", "lam", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_eq!(code, 0, "{all}");
    assert!(
        all.contains("insufficient-capacity"),
        "the stockout is shown: {all}"
    );

    let (_, st, _) = parts(&run(&fake, &home, &["status", "lam", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "lambda", "{c}");
    assert_eq!(c["region"], "us-west-3", "{c}");
    let state = fake.control("GET", "/_fake/state", serde_json::json!({}));
    let instances = state["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2, "{state}");
    let private: Vec<&str> = instances
        .iter()
        .map(|i| i["private_ip"].as_str().unwrap_or_default())
        .collect();
    for i in instances {
        let tags = i["tags"].to_string();
        assert!(
            tags.contains("gangway-cluster") && tags.contains("\"lam\""),
            "{i}"
        );
        assert!(sshd.addrs.iter().any(|a| i["ip"] == *a), "{i}");
    }
    gpu_cloud::assert_ranks_met(&all, 2, &private);
    // The gang's key was registered for the cluster and is all gangway
    // put on the account besides the instances.
    let keys = state["ssh_keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{state}");
    assert!(
        keys[0]["name"].as_str().unwrap().ends_with("--lam"),
        "{state}"
    );

    let (code, out, err) = parts(&run(&fake, &home, &["down", "-y", "lam"]));
    assert_eq!(code, 0, "{out}\n{err}");
    gpu_cloud::assert_nothing_left(&fake, &home, "lam");
}

#[test]
fn lambda_check_names_where_the_key_came_from_and_never_the_key() {
    let fake = match gpu_cloud::start("lambda", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    skip::ran("lambda");
    let home = TestHome::new();
    let (code, out, err) = parts(&run(&fake, &home, &["check", "lambda", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("LAMBDA_API_KEY") && !out.contains(KEY),
        "{out}"
    );

    // A refused key: not usable, the fake's words, not the key.
    let mut c = gpu_cloud::command("lambda", &fake, &home);
    c.env("GANGWAY_LAMBDA_ENDPOINT", &fake.url)
        .env("LAMBDA_API_KEY", "secret_refused_key")
        .args(["check", "lambda"]);
    let (_, out, err) = parts(&Running::start(c).wait());
    let all = format!("{out}{err}");
    assert!(all.contains("invalid-api-key"), "{all}");
    assert!(!all.contains("secret_refused_key"), "{all}");

    // No key anywhere: what to set.
    let mut c = gpu_cloud::command("lambda", &fake, &home);
    c.env("GANGWAY_LAMBDA_ENDPOINT", &fake.url)
        .env_remove("LAMBDA_API_KEY")
        .env("HOME", home.path())
        .args(["check", "lambda"]);
    let (_, out, err) = parts(&Running::start(c).wait());
    let all = format!("{out}{err}");
    assert!(
        all.contains("LAMBDA_API_KEY") && all.contains("lambda_keys"),
        "{all}"
    );
}

#[test]
fn lambda_catalog_refresh_reads_prices_and_keeps_only_regions_with_capacity() {
    let fake = match gpu_cloud::start("lambda", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    skip::ran("lambda");
    let home = TestHome::new();
    // A stale price in the catalog; the fake lists Lambda's $31.92. The
    // type has no capacity in us-east-1 (the fake's table), and none left
    // in us-west-3 once the test says so: neither is kept.
    let dir = gpu_cloud::catalog(
        &home,
        "stale",
        "lambda",
        "2026-01-01",
        &[
            "gpu_8x_h100_sxm5,H100,8,80,208,1800,us-south-2,us-south-2,30.00,,false,false,",
            "gpu_8x_h100_sxm5,H100,8,80,208,1800,us-east-1,us-east-1,30.00,,false,false,",
            "gpu_8x_h100_sxm5,H100,8,80,208,1800,us-west-3,us-west-3,30.00,,false,false,",
        ],
    );
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"instance_type": "gpu_8x_h100_sxm5", "region": "us-west-3", "available": null}),
    );
    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["catalog", "refresh", "--cloud", "lambda", "--catalog", &dir],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let csv = std::fs::read_to_string(home.path().join("catalog/lambda.csv")).expect("overlay");
    assert!(csv.contains("from the lambda API"), "{csv}");
    let row = csv
        .lines()
        .find(|l| l.starts_with("gpu_8x_h100_sxm5,") && l.contains("us-south-2"))
        .unwrap_or_else(|| panic!("{csv}"));
    assert_eq!(row.split(',').nth(8), Some("31.92"), "{row}");
    for gone in ["us-east-1", "us-west-3"] {
        assert!(
            !csv.lines()
                .any(|l| l.starts_with("gpu_") && l.contains(gone)),
            "{gone} has no capacity: {csv}"
        );
    }
    assert!(out.contains("no capacity in us-east-1"), "{out}\n{err}");
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}
