//! `infra: runpod` end to end through the real binary, against the RunPod
//! fake's REST v2 face (tests/emulators/runpod): its pods are a real
//! sshd's loopback addresses on a port that is not 22 (what v2 says of a
//! pod: `ssh.direct` {host, port}, as root), and it checks every request
//! against RunPod's published v2 shapes; spot pods come from its GraphQL
//! face (`podRentInterruptable`), checked against the published input.

use std::process::Output;

use crate::common::{json_doc, parts, Running, TestHome};
use crate::gpu_cloud::{self, GpuCloudFake, KEY};
use crate::skip;

/// The pods' mapped SSH port: any but 22.
const SSH_PORT: u16 = 31022;

/// gangway in `home` talking to `fake`.
fn run(fake: &GpuCloudFake, home: &TestHome, args: &[&str]) -> Output {
    gpu_cloud::run("runpod", fake, home, args)
}

/// A catalog of two data centers with one A100-80GB a pod, US-KS-2 the
/// cheaper (the fake's price there).
fn catalog(home: &TestHome) -> String {
    gpu_cloud::catalog(
        home,
        "test-catalog",
        "runpod",
        "2026-12-05",
        &[
            "1x_A100-80GB_SECURE,A100-80GB,1,80,8,117,US-KS-2,US-KS-2,1.39,,false,false,",
            "1x_A100-80GB_SECURE,A100-80GB,1,80,8,117,EU-RO-1,EU-RO-1,1.49,,false,false,",
        ],
    )
}

#[test]
fn a_runpod_gang_fails_over_a_stockout_runs_over_ssh_on_mapped_ports_and_down_leaves_nothing() {
    let fake = match gpu_cloud::start("runpod", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("runpod", why),
    };
    let Some(sshd) = crate::sshd::Sshd::start_on_port("runpod", 2, SSH_PORT) else {
        return;
    };
    skip::ran("runpod");
    let home = TestHome::new();
    gpu_cloud::machines(&fake, &sshd, SSH_PORT);
    // The cheaper data center has no A100s; the other has room.
    for (dc, gpus) in [
        ("US-KS-2", serde_json::Value::Null),
        ("EU-RO-1", serde_json::json!(8)),
    ] {
        fake.control(
            "POST",
            "/_fake/capacity",
            serde_json::json!({"gpuTypeId": "NVIDIA A100 80GB PCIe", "dataCenterId": dc, "cloudType": "SECURE", "gpus": gpus}),
        );
    }
    let cat = catalog(&home);
    let task = home.file(
        "runpod-e2e.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: runpod\n  accelerators: A100-80GB:1\n\
             config:\n  runpod:\n    poll_ms: 100\n\
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
    assert_eq!(json_doc(&plan)["plan"][0]["region"], "US-KS-2", "{plan}");

    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["launch", &task, "--catalog", &cat, "-c", "rp", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_eq!(code, 0, "{all}");
    assert!(
        all.contains("no longer any instances available"),
        "the stockout is shown: {all}"
    );

    let (_, st, _) = parts(&run(&fake, &home, &["status", "rp", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "runpod", "{c}");
    assert_eq!(c["region"], "EU-RO-1", "{c}");
    let state = fake.control("GET", "/_fake/state", serde_json::json!({}));
    let pods = state["pods"].as_array().expect("pods");
    assert_eq!(pods.len(), 2, "{state}");
    let private: Vec<&str> = pods
        .iter()
        .map(|p| {
            p["_v2"]["globalNetworking"]["ip"]
                .as_str()
                .unwrap_or_default()
        })
        .collect();
    for p in pods {
        let v2 = &p["_v2"];
        assert_eq!(v2["env"]["GANGWAY_TAG_CLUSTER"], "rp", "{p}");
        assert_eq!(v2["dataCenterId"], "EU-RO-1", "{p}");
        assert_eq!(v2["ssh"]["direct"]["port"], SSH_PORT, "{p}");
        assert!(
            sshd.addrs.iter().any(|a| v2["ssh"]["direct"]["host"] == *a),
            "{p}"
        );
    }
    gpu_cloud::assert_ranks_met(&all, 2, &private);
    // The key went in the pods' environment: the account's keys are
    // untouched.
    assert_eq!(state["ssh_keys"], serde_json::json!([]), "{state}");

    let (code, out, err) = parts(&run(&fake, &home, &["down", "-y", "rp"]));
    assert_eq!(code, 0, "{out}\n{err}");
    gpu_cloud::assert_nothing_left(&fake, &home, "rp");
}

#[test]
fn runpod_check_names_where_the_key_came_from() {
    let fake = match gpu_cloud::start("runpod", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("runpod", why),
    };
    skip::ran("runpod");
    let home = TestHome::new();
    let (code, out, err) = parts(&run(&fake, &home, &["check", "runpod", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("RUNPOD_API_KEY") && !out.contains(KEY),
        "{out}"
    );

    // No key anywhere: what to set.
    let mut c = gpu_cloud::command("runpod", &fake, &home);
    c.env("GANGWAY_RUNPOD_ENDPOINT", &fake.url)
        .env_remove("RUNPOD_API_KEY")
        .env("HOME", home.path())
        .args(["check", "runpod"]);
    let (_, out, err) = parts(&Running::start(c).wait());
    let all = format!("{out}{err}");
    assert!(
        all.contains("RUNPOD_API_KEY") && all.contains(".runpod/config.toml"),
        "{all}"
    );

    // runpodctl's config file.
    std::fs::create_dir_all(home.path().join(".runpod")).unwrap();
    std::fs::write(
        home.path().join(".runpod/config.toml"),
        format!("apiKey = \"{KEY}\"\napiUrl = \"https://api.runpod.io/graphql\"\n"),
    )
    .unwrap();
    let mut c = gpu_cloud::command("runpod", &fake, &home);
    c.env("GANGWAY_RUNPOD_ENDPOINT", &fake.url)
        .env("GANGWAY_RUNPOD_RATE_SCALE", "0.01")
        .env_remove("RUNPOD_API_KEY")
        .env("HOME", home.path())
        .args(["check", "runpod", "-o", "json"]);
    let (code, out, err) = parts(&Running::start(c).wait());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(".runpod/config.toml") && !out.contains(KEY),
        "{out}"
    );

    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[test]
fn runpod_catalog_refresh_reads_prices_and_spot_prices_and_keeps_only_data_centers_with_stock() {
    let fake = match gpu_cloud::start("runpod", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("runpod", why),
    };
    skip::ran("runpod");
    let home = TestHome::new();
    // Stale prices in the catalog; the fake lists $1.39 and $0.34 a GPU.
    // EU-RO-1 has no Secure Cloud A100s (the fake's stock), and US-TX-3's
    // community 4090s are taken once the test says so: neither is kept.
    let dir = gpu_cloud::catalog(
        &home,
        "stale",
        "runpod",
        "2026-01-01",
        &[
            "1x_A100-80GB_SECURE,A100-80GB,1,80,8,117,US-KS-2,US-KS-2,1.99,,false,false,",
            "1x_A100-80GB_SECURE,A100-80GB,1,80,8,117,EU-RO-1,EU-RO-1,1.99,,false,false,",
            "2x_RTX4090_COMMUNITY,RTX4090,2,24,16,62,US-TX-3,US-TX-3,0.99,,false,false,",
            "2x_RTX4090_SECURE,RTX4090,2,24,16,62,EU-RO-1,EU-RO-1,0.99,,false,false,",
        ],
    );
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"gpuTypeId": "NVIDIA GeForce RTX 4090", "dataCenterId": "US-TX-3", "cloudType": "COMMUNITY", "gpus": null}),
    );
    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["catalog", "refresh", "--cloud", "runpod", "--catalog", &dir],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let csv = std::fs::read_to_string(home.path().join("catalog/runpod.csv")).expect("overlay");
    assert!(csv.contains("from the runpod API"), "{csv}");
    let rows: Vec<&str> = csv
        .lines()
        .filter(|l| l.contains("_SECURE,") || l.contains("_COMMUNITY,"))
        .collect();
    assert_eq!(rows.len(), 2, "{csv}");
    // Spot prices come from GraphQL (v2 has none): GPUs times the spot
    // price per GPU of the cloud ($0.70 an A100, $0.35 a 4090).
    for (ty, dc, price, spot) in [
        ("1x_A100-80GB_SECURE", "US-KS-2", "1.39", "0.7"),
        ("2x_RTX4090_SECURE", "EU-RO-1", "1.38", "0.7"),
    ] {
        let row = rows
            .iter()
            .find(|l| l.starts_with(&format!("{ty},")) && l.contains(dc))
            .unwrap_or_else(|| panic!("{ty}: {csv}"));
        assert_eq!(row.split(',').nth(8), Some(price), "{row}");
        assert_eq!(row.split(',').nth(9), Some(spot), "{row}");
    }
    assert!(out.contains("none free in US-TX-3"), "{out}\n{err}");
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

/// A managed job on RunPod spot: run 0 keeps a checkpoint of step 7, then
/// RunPod interrupts its spot pod (v2 shows it EXITED); the job recovers on
/// a new spot pod on another machine and resumes from step 7. The plan is
/// RunPod's spot price from the catalog (which the old refusal never let
/// a spot task reach), and the pods are rented at the live spot price.
#[test]
fn a_managed_job_on_runpod_spot_survives_a_preemption_from_its_kept_checkpoint() {
    let fake = match gpu_cloud::start("runpod", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("runpod", why),
    };
    let Some(before) = crate::sshd::Sshd::start_on_port("runpod", 1, SSH_PORT) else {
        return;
    };
    let Some(after) = crate::sshd::Sshd::start_on_port("runpod", 1, SSH_PORT) else {
        return;
    };
    after.authorize(&before.client_key.with_extension("pub"));
    skip::ran("runpod");
    let home = TestHome::new();
    gpu_cloud::machines(&fake, &before, SSH_PORT);
    let cat = gpu_cloud::catalog(
        &home,
        "spot-catalog",
        "runpod",
        "2026-12-05",
        &["1x_A100-80GB_SECURE,A100-80GB,1,80,8,117,US-KS-2,US-KS-2,1.39,0.70,false,false,"],
    );
    let resources = "resources:\n  infra: runpod\n  accelerators: A100-80GB:1\n  use_spot: true\n\
                     config:\n  runpod:\n    poll_ms: 100\n";
    // The catalog's RunPod spot price is planned.
    let plan_task = home.file("runpod-plan.yaml", &format!("{resources}run: 'true'\n"));
    let (code, plan, err) = parts(&run(
        &fake,
        &home,
        &["optimize", &plan_task, "--catalog", &cat, "-o", "json"],
    ));
    assert_eq!(code, 0, "{plan}\n{err}");
    let first = json_doc(&plan)["plan"][0].clone();
    assert_eq!(first["cloud"], "runpod", "{first}");
    assert_eq!(first["use_spot"], true, "{first}");
    assert_eq!(first["price_per_node_hour"], 0.7, "{first}");

    gpu_cloud::a_managed_job_survives_a_preemption(
        "runpod",
        &fake,
        &home,
        &cat,
        resources,
        &after,
        SSH_PORT,
        |state| {
            let victim = &state["pods"][0];
            assert_eq!(victim["interruptible"], true, "{victim}");
            assert_eq!(victim["_bid"], 0.7, "{victim}");
            assert_eq!(
                victim["_v2"]["env"]["GANGWAY_TAG_MARKET"], "spot",
                "{victim}"
            );
            assert!(!victim.to_string().contains(KEY), "{victim}");
            fake.control(
                "POST",
                "/_fake/preempt",
                serde_json::json!({"id": victim["id"]}),
            );
        },
    );
    // Both pods were rented through GraphQL, none through v2's createPod.
    let calls = &fake.state()["calls"];
    assert!(calls["graphql"].as_u64().unwrap_or(0) >= 2, "{calls}");
    assert_eq!(calls["createPod"].as_u64().unwrap_or(0), 0, "{calls}");
}
