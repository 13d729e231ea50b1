//! `infra: azure` through the binary, against the Azure Resource Manager
//! fake (tests/emulators/azure), which checks every request against the
//! OpenAPI models of the API versions the provider uses: one fake per test.

use crate::azure_fake::AzureFake;
use crate::common::{json_doc, parts, TestHome};
use crate::spot_job::{trainer, wait_run};

/// Each test its own subscription (the fake scopes machines by it).
const SUB: &str = "8f5a2b4c-1d3e-4f60-9a7b-0c1d2e3f4a5b";

/// The fake's A100-80GB gang size, offered in eastus at the published
/// catalog's prices (a catalog of its own, so the test does not depend on
/// the embedded one).
const CATALOG: &str = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation\n\
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,8.52,eastus,V2\n";

/// gangway in `home`, pointed at the fake.
fn run(az: &AzureFake, home: &TestHome, args: &[&str]) -> std::process::Output {
    crate::common::Running::start(command(az, home, CATALOG, args)).wait()
}

/// gangway in `home`, pointed at the fake, planning with `catalog` (an
/// Azure `vms.csv`).
fn command(az: &AzureFake, home: &TestHome, catalog: &str, args: &[&str]) -> std::process::Command {
    let dir = home.path().join("azure-catalog");
    std::fs::create_dir_all(dir.join("azure")).unwrap();
    std::fs::write(dir.join("azure/vms.csv"), catalog).unwrap();
    let catalog = dir;
    let mut c = crate::common::command_in(home.path());
    c.args(args)
        .env("GANGWAY_AZURE_ENDPOINT", &az.url)
        .env("AZURE_SUBSCRIPTION_ID", SUB)
        .env("AZURE_CONFIG_DIR", home.path().join("no-az"))
        .env("GANGWAY_CATALOG_DIR", &catalog)
        .env("GANGWAY_AZURE_SSH_CIDR", "192.0.2.0/24");
    for v in ["AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"] {
        c.env_remove(v);
    }
    c
}

fn assert_no_violations(az: &AzureFake) {
    let v = az.violations();
    assert_eq!(v["count"], 0, "requests broke the API specification: {v:#}");
}

#[test]
fn azure_check_names_the_identity_and_subscription_or_what_to_run() {
    let Some(az) = AzureFake::start() else { return };
    let home = TestHome::new();
    let (code, out, err) = parts(&run(&az, &home, &["check", "azure", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(SUB), "{out}\n{err}");
    // The locations where the subscription may create GPU sizes: all of
    // the fake's, until every GPU size is restricted in one of them.
    let regions = |out: &str| json_doc(out)["clouds"][0]["regions"].clone();
    assert_eq!(
        regions(&out),
        serde_json::json!([
            "eastus",
            "northcentralus",
            "southcentralus",
            "westeurope",
            "westus2"
        ]),
        "{out}"
    );
    for size in [
        "Standard_NC24ads_A100_v4",
        "Standard_NC6s_v3",
        "Standard_NC4as_T4_v3",
    ] {
        az.call(
            "POST",
            "/_fake/restrictions",
            &format!(r#"{{"location": "northcentralus", "size": "{size}"}}"#),
        );
    }
    let (code, out, err) = parts(&run(&az, &home, &["check", "azure", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        regions(&out),
        serde_json::json!(["eastus", "southcentralus", "westeurope", "westus2"]),
        "{out}"
    );
    let (_, table, _) = parts(&run(&az, &home, &["check", "azure"]));
    assert!(
        table.contains("eastus, southcentralus, westeurope, ... (4)"),
        "{table}"
    );
    // Without a subscription it says how to set one.
    let mut c = crate::common::command_in(home.path());
    c.args(["check", "azure"])
        .env("GANGWAY_AZURE_ENDPOINT", &az.url)
        .env_remove("AZURE_SUBSCRIPTION_ID")
        .env("AZURE_CONFIG_DIR", home.path().join("no-az"));
    let (code, out, err) = parts(&crate::common::Running::start(c).wait());
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("AZURE_SUBSCRIPTION_ID"),
        "{out}\n{err}"
    );
    assert_no_violations(&az);
}

/// A fake whose VMs get the addresses of a real sshd on port 22, and a
/// home whose gangway key is the one that sshd takes.
fn vms_with_sshd(n: usize) -> Option<(AzureFake, crate::sshd::Sshd, TestHome)> {
    use std::os::unix::fs::PermissionsExt;
    let az = AzureFake::start()?;
    let sshd = crate::sshd::Sshd::start_on_port("azure", n, 22)?;
    let home = TestHome::new();
    let dir = home.path().join("ssh");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::copy(&sshd.client_key, dir.join("id_ed25519")).unwrap();
    std::fs::set_permissions(
        dir.join("id_ed25519"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::copy(
        sshd.client_key.with_extension("pub"),
        dir.join("id_ed25519.pub"),
    )
    .unwrap();
    run_on(&az, &sshd);
    Some((az, sshd, home))
}

/// From now on the subscription's new VMs run on `sshd` (its addresses as
/// public and private ones; running VMs stay where they are), and its
/// sessions find their VM's metadata service on the address they came to,
/// as a VM's do at 169.254.169.254.
fn run_on(az: &AzureFake, sshd: &crate::sshd::Sshd) {
    let pairs: Vec<(String, String)> = sshd.addrs.iter().map(|a| (a.clone(), a.clone())).collect();
    let m = az.machines(SUB, &pairs, &sshd.authorized_keys());
    let port = m["imds_port"].as_u64().unwrap_or_else(|| panic!("{m}"));
    sshd.session_profile(&format!(
        "set -- $SSH_CONNECTION; export GANGWAY_AZURE_IMDS_ENDPOINT=\"http://$3:{port}\"; set --\n"
    ));
}

#[test]
fn an_azure_spot_gang_runs_over_ssh_in_one_placement_group_and_down_leaves_nothing() {
    let Some((az, sshd, home)) = vms_with_sshd(2) else {
        return;
    };
    let task = home.file(
        "azure.yaml",
        "num_nodes: 2\nresources:\n  infra: azure/eastus\n  accelerators: A100-80GB:8\n  use_spot: true\n\
         config:\n  azure:\n    ssh_user: root\n\
         setup: echo setup-done > setup.txt\n\
         run: |\n  echo \"rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES master=$MASTER_ADDR setup=$(cat setup.txt)\"\n",
    );
    let (code, out, err) = parts(&run(&az, &home, &["launch", &task, "-c", "e2e", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let all = format!("{out}{err}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank={rank} of=2 master=127."))
                && all.contains("setup=setup-done"),
            "rank {rank} did not run over SSH:\n{all}"
        );
    }
    // Spot VMs, deleted on eviction, in one proximity placement group.
    let state = az.call("GET", "/_fake/state", "");
    let text = state.to_string();
    assert!(
        text.contains("gangway-ppg"),
        "no placement group: {state:#}"
    );
    let (_, st, _) = parts(&run(&az, &home, &["status", "e2e", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "azure", "{c}");
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(2), "{c}");
    let ips: Vec<String> = c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["public_ip"].as_str().map(str::to_string))
        .collect();
    assert!(
        ips.iter().all(|ip| sshd.addrs.contains(ip)),
        "{ips:?} vs {:?}: {c}",
        sshd.addrs
    );
    let (code, out, err) = parts(&run(&az, &home, &["down", "-y", "e2e"]));
    assert_eq!(code, 0, "{out}\n{err}");
    if let Err(left) = az.leak_check(SUB) {
        panic!("down left something behind:\n{left}");
    }
    assert_no_violations(&az);
}

#[test]
fn an_azure_stockout_deletes_what_the_launch_made_and_throttling_is_waited_out() {
    let Some(az) = AzureFake::start() else { return };
    let home = TestHome::new();
    // ARM throttles the security group's PUT twice (429, Retry-After: 0),
    // then every VM's creation fails in its operation, as Azure reports
    // running out of Spot capacity.
    for rule in [
        serde_json::json!({"error": "throttle", "method": "PUT", "type": "networkSecurityGroups",
            "times": 2, "retry_after": 0}),
        serde_json::json!({"error": "ZonalAllocationFailed", "method": "PUT", "type": "virtualMachines",
            "async": true, "times": -1}),
    ] {
        let r = az.call("POST", "/_fake/faults", &rule.to_string());
        assert!(r["id"].is_u64(), "{r}");
    }
    let task = home.file(
        "azure.yaml",
        "num_nodes: 2\nresources:\n  infra: azure/eastus\n  accelerators: A100-80GB:8\n  use_spot: true\nrun: \"true\"\n",
    );
    let (code, out, err) = parts(&run(
        &az,
        &home,
        &["launch", &task, "--provision-only", "-c", "so", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_ne!(code, 0, "{all}");
    assert!(all.contains("ZonalAllocationFailed"), "{all}");
    let fired = az.call("GET", "/_fake/fired?code=TooManyRequests", "");
    assert_eq!(
        fired["fired"].as_array().map(Vec::len),
        Some(2),
        "both throttles answered and waited out: {fired}"
    );
    if let Err(left) = az.leak_check(SUB) {
        panic!("the failed launch left something behind:\n{left}");
    }
    assert_no_violations(&az);
}

#[test]
fn an_azure_preempt_event_is_read_by_the_watcher_on_the_node() {
    let Some((az, sshd, home)) = vms_with_sshd(1) else {
        return;
    };
    let task = home.file(
        "azure.yaml",
        "resources:\n  infra: azure/eastus\n  accelerators: A100-80GB:8\n  use_spot: true\n\
         config:\n  azure:\n    ssh_user: root\nrun: \"true\"\n",
    );
    let (code, out, err) = parts(&run(
        &az,
        &home,
        &["launch", &task, "--provision-only", "-c", "pre", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let vm = running_vms(&az, "pre")
        .pop()
        .unwrap_or_else(|| panic!("no VM running: {}", az.call("GET", "/_fake/state", "")))
        .name;
    let machines = az.call("GET", &format!("/_fake/machines?subscription={SUB}"), "");
    let port = machines["imds_port"].as_u64().expect("an IMDS port");
    let imds = format!("http://{}:{port}", sshd.addrs[0]);
    let watch = || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(gangway_azure::PREEMPT_WATCHER.script())
            .arg("azure-preempt-watch")
            .arg("--once")
            .env("GANGWAY_AZURE_IMDS_ENDPOINT", &imds)
            .output()
            .expect("sh runs")
    };
    let before = watch();
    assert_eq!(before.status.code(), Some(1), "no notice yet: {before:?}");
    let ev = az.call(
        "POST",
        "/_fake/evict",
        &serde_json::json!({"vm": vm, "notice_s": 60}).to_string(),
    );
    let after = watch();
    let notice = String::from_utf8_lossy(&after.stdout);
    assert_eq!(after.status.code(), Some(0), "{ev}\n{after:?}");
    assert!(
        notice.contains("Preempt") && notice.contains(&vm),
        "{notice}"
    );
    let (code, out, err) = parts(&run(&az, &home, &["down", "-y", "pre"]));
    assert_eq!(code, 0, "{out}\n{err}");
    if let Err(left) = az.leak_check(SUB) {
        panic!("down left something behind:\n{left}");
    }
    assert_no_violations(&az);
}

/// `catalog refresh --cloud azure` reads the public Retail Prices API page
/// by page (no credentials: none are set), waits out a throttled page, and
/// takes only Linux pay-as-you-go and Spot meters: the fake prices the
/// Windows, Low Priority, Dev/Test and reservation meters of the same size
/// so that taking any of them shows as a wrong price.
#[test]
fn azure_catalog_refresh_reads_retail_prices_page_by_page() {
    let Some(az) = AzureFake::start() else { return };
    let home = TestHome::new();
    az.call("POST", "/_fake/settings", r#"{"retail_page_size": 5}"#);
    let sheet = serde_json::json!({
        "prices": [
            {"sku": "Standard_ND96amsr_A100_v4", "region": "eastus", "linux": 30.5, "spot": 7.77},
            {"sku": "Standard_NC4as_T4_v3", "region": "eastus", "linux": 0.5, "spot": 0.06},
            {"sku": "Standard_ND96amsr_A100_v4", "region": "westus2", "linux": 99.0, "spot": 1.0},
        ],
        "filler_per_region": 23,
    });
    az.call("POST", "/_fake/retail", &sheet.to_string());
    az.call(
        "POST",
        "/_fake/faults",
        r#"{"type": "retail", "error": "throttle", "times": 1, "retry_after": 0}"#,
    );
    let refresh = |args: &[&str]| {
        let mut c = crate::common::command_in(home.path());
        c.args(args)
            .env("GANGWAY_AZURE_PRICES_ENDPOINT", &az.url)
            .env("AZURE_CONFIG_DIR", home.path().join("no-az"));
        for v in [
            "AZURE_SUBSCRIPTION_ID",
            "AZURE_TENANT_ID",
            "AZURE_CLIENT_ID",
            "AZURE_CLIENT_SECRET",
        ] {
            c.env_remove(v);
        }
        parts(&crate::common::Running::start(c).wait())
    };
    let (code, out, err) = refresh(&[
        "catalog",
        "refresh",
        "--cloud",
        "azure",
        "--regions",
        "eastus",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r = &json_doc(&out)["refreshed"][0];
    assert_eq!(r["cloud"], "azure", "{r}");
    assert_eq!(r["on_demand_prices"], 2, "{r}");
    assert_eq!(r["spot_prices"], 2, "{r}");
    // Sizes the sheet does not price in eastus are said to be not offered.
    assert!(r["notes"].to_string().contains("no Linux price"), "{r}");
    // 2 sizes x 5 pay-as-you-go meters + 16 of the 23 other meters, 5 a
    // page: 6 pages, and the throttled one asked again.
    let retail = az.call("GET", "/_fake/retail", "");
    assert_eq!(retail["requests"], 7, "{retail}");
    assert_eq!(
        az.call("GET", "/_fake/fired", "")["fired"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let csv = std::fs::read_to_string(home.path().join("catalog/azure.csv")).unwrap();
    let row = |ty: &str, region: &str| {
        csv.lines()
            .find(|l| l.starts_with(&format!("{ty},")) && l.contains(&format!(",{region},")))
            .unwrap_or_else(|| panic!("no {ty} in {region}:\n{csv}"))
            .to_string()
    };
    assert!(
        row("Standard_ND96amsr_A100_v4", "eastus").contains(",eastus,eastus,30.5,7.77,"),
        "{csv}"
    );
    assert!(
        row("Standard_NC4as_T4_v3", "eastus").contains(",eastus,eastus,0.5,0.06,"),
        "{csv}"
    );
    // Regions not refreshed keep the shipped prices.
    assert!(
        row("Standard_ND96amsr_A100_v4", "westus2").contains(",32.77,8.5202,"),
        "{csv}"
    );
    // The next plan uses the refreshed price.
    let task = home.file(
        "a100.yaml",
        "resources:\n  infra: azure/eastus\n  accelerators: A100-80GB:8\n  use_spot: true\nrun: x\n",
    );
    let (code, out, err) = refresh(&["optimize", &task, "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let first = &json_doc(&out)["plan"][0];
    assert_eq!(
        first["instance_type"], "Standard_ND96amsr_A100_v4",
        "{first}"
    );
    assert_eq!(first["price_per_node_hour"], 7.77, "{first}");
    assert_no_violations(&az);
}

/// The trainer's `config` section on Azure.
const TRAINER_CONFIG: &str = "  azure:\n    ssh_user: root\n";

/// A VM of the fake's state: its name, resource group, location, zone and
/// public address.
#[derive(Clone, Debug, PartialEq)]
struct Vm {
    name: String,
    group: String,
    location: String,
    zone: String,
    public: String,
}

/// The running VMs of `cluster` in the fake now.
fn running_vms(az: &AzureFake, cluster: &str) -> Vec<Vm> {
    let state = az.call("GET", "/_fake/state", "");
    let mut vms: Vec<Vm> = state["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{state}"))
        .iter()
        .filter(|r| r["kind"] == "vm" && r["power"] == "running")
        .filter(|r| r["tags"]["gangway-cluster"] == cluster)
        .map(|r| Vm {
            name: r["id"]
                .as_str()
                .and_then(|id| id.rsplit('/').next())
                .unwrap_or_default()
                .to_string(),
            group: r["id"]
                .as_str()
                .and_then(|id| id.split('/').nth(4))
                .unwrap_or_default()
                .to_string(),
            location: r["location"].as_str().unwrap_or_default().to_string(),
            zone: r["zone"].as_str().unwrap_or_default().to_string(),
            public: r["public"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    vms.sort_by(|a, b| a.name.cmp(&b.name));
    vms
}

/// The step `rank` resumed at in run `run` (from the trainer's output).
fn resumed_at(out: &str, rank: u32, run: u32) -> Option<u32> {
    out.lines().find_map(|l| {
        l.split(&format!("rank {rank} run {run} resumes at step "))
            .nth(1)
            .and_then(|s| s.trim().parse().ok())
    })
}

/// After the job: it succeeded after one preemption whose event names
/// `victim` and says `why`, the fake holds nothing of it, and no process of
/// the test is left.
fn assert_recovered_once_and_cleaned(az: &AzureFake, home: &TestHome, victim: &str, why: &str) {
    let (code, q, err) = parts(&run(az, home, &["jobs", "queue", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(
        (j["state"].as_str(), j["preemptions"].as_u64()),
        (Some("SUCCEEDED"), Some(1)),
        "{j}"
    );
    let (code, ev, err) = parts(&run(az, home, &["jobs", "events", "1"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        ev.contains(victim) && ev.contains(why),
        "the preemption, naming {victim} and {why:?}:\n{ev}"
    );
    crate::common::wait_for(
        "the job's clusters to be gone",
        std::time::Duration::from_secs(60),
        || az.leak_check(SUB).map(|_| ()),
    );
    assert_no_violations(az);
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// A managed spot job on Azure with `EAGER_NEXT_REGION`: Azure posts a
/// `Preempt` event in one VM's Scheduled Events (60 s ahead); the node's
/// watcher reads it, the job checkpoints on the signal and resumes at
/// exactly that step on VMs in another region.
#[test]
fn a_managed_azure_spot_job_resumes_at_the_noticed_step_in_another_region() {
    let Some((az, a, home)) = vms_with_sshd(2) else {
        return;
    };
    let Some(b) = crate::sshd::Sshd::start_on_port("azure", 2, 22) else {
        return;
    };
    // eastus is cheaper: the job starts there.
    let catalog = format!(
        "{CATALOG}Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,9.10,westus2,V2\n"
    );
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 40;
    let task = home.file(
        "train.yaml",
        &trainer(
            &home.marker,
            progress.path(),
            total,
            "  accelerators: A100-80GB:8\n  infra: azure\n  job_recovery:\n    strategy: EAGER_NEXT_REGION\n",
            TRAINER_CONFIG,
        ),
    );
    let mut job = command(
        &az,
        &home,
        &catalog,
        &["jobs", "launch", &task, "-y", "--wait"],
    );
    job.stdin(std::process::Stdio::null());
    let mut job = crate::common::Running::start(job);
    let cluster = "managed-1";
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to reach step 8",
        |_, b| b >= 8,
    );
    let first = running_vms(&az, cluster);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first
            .iter()
            .all(|v| v.location == "eastus" && a.addrs.contains(&v.public)),
        "{first:?}"
    );
    run_on(&az, &b);
    let ev = az.call(
        "POST",
        "/_fake/evict",
        &serde_json::json!({"vm": first[1].name, "notice_s": 60}).to_string(),
    );
    assert_eq!(ev["outcome"], "scheduled", "{ev}");
    // Run 1 runs on b's VMs, outside eastus.
    wait_run(
        &mut job,
        progress.path(),
        1,
        "run 1 to take a step",
        |first, now| now > first,
    );
    let second = running_vms(&az, cluster);
    assert_eq!(second.len(), 2, "{second:?}");
    assert!(
        second
            .iter()
            .all(|v| v.location == "westus2" && b.addrs.contains(&v.public)),
        "EAGER_NEXT_REGION resumes in the other region: {second:?}"
    );

    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
    assert!(noticed >= 8, "{out}");
    for rank in 0..2 {
        assert_eq!(
            resumed_at(&out, rank, 1),
            Some(noticed),
            "rank {rank}:\n{out}"
        );
        assert!(
            out.contains(&format!("rank {rank} done at step {total}")),
            "{out}"
        );
    }
    assert!(!out.contains("run 2 resumes"), "{out}");
    assert_recovered_once_and_cleaned(&az, &home, &first[1].name, "scheduledevents/Preempt");
}

/// A managed spot job on Azure with `FAILOVER`: one VM is evicted without
/// notice; the job resumes from the last checkpoint gangway kept, on VMs in
/// another zone of the same region, although another region is cheaper.
#[test]
fn a_managed_azure_spot_job_evicted_without_notice_resumes_from_its_kept_checkpoint_in_another_zone(
) {
    let Some((az, a, home)) = vms_with_sshd(2) else {
        return;
    };
    let Some(b) = crate::sshd::Sshd::start_on_port("azure", 2, 22) else {
        return;
    };
    // Zone 1 of eastus first, then westus2, then eastus's zone 2.
    let catalog = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Generation\n\
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,8.52,eastus,eastus-1,V2\n\
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,8.90,westus2,westus2-1,V2\n\
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,9.30,eastus,eastus-2,V2\n";
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 40;
    let task = home.file(
        "train.yaml",
        &trainer(
            &home.marker,
            progress.path(),
            total,
            "  accelerators: A100-80GB:8\n  infra: azure\n  job_recovery:\n    strategy: FAILOVER\n",
            TRAINER_CONFIG,
        ),
    );
    let mut job = command(
        &az,
        &home,
        catalog,
        &["jobs", "launch", &task, "-y", "--wait"],
    );
    job.stdin(std::process::Stdio::null());
    let mut job = crate::common::Running::start(job);
    let cluster = "managed-1";
    // Past the checkpoint at step 5, and before the next.
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to pass a checkpoint",
        |_, now| now > 6,
    );
    let first = running_vms(&az, cluster);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first
            .iter()
            .all(|v| v.location == "eastus" && v.zone == "1" && a.addrs.contains(&v.public)),
        "{first:?}"
    );
    run_on(&az, &b);
    let ev = az.call(
        "POST",
        "/_fake/evict",
        &serde_json::json!({"vm": first[0].name, "notice": false}).to_string(),
    );
    assert_eq!(ev["outcome"], "deleted", "{ev}");
    wait_run(
        &mut job,
        progress.path(),
        1,
        "run 1 to take a step",
        |first, now| now > first,
    );
    let second = running_vms(&az, cluster);
    assert_eq!(second.len(), 2, "{second:?}");
    assert!(
        second
            .iter()
            .all(|v| v.location == "eastus" && v.zone == "2" && b.addrs.contains(&v.public)),
        "FAILOVER resumes in another zone of the region: {second:?}"
    );

    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // No notice came: the job's events say so (the ranks still on the
    // evicted VM's sshd are stopped with SIGTERM, which the trainer answers
    // with a checkpoint of its own that gangway never keeps).
    let (code, ev, err) = parts(&run(&az, &home, &["jobs", "events", "1"]));
    assert_eq!(code, 0, "{err}");
    assert!(!ev.contains("preemption notice"), "{ev}");
    // The last checkpoint kept before the eviction: a multiple of 5.
    let resumed: Vec<Option<u32>> = (0..2).map(|r| resumed_at(&out, r, 1)).collect();
    assert_eq!(resumed[0], resumed[1], "{out}");
    let step = resumed[0].unwrap_or_else(|| panic!("no run 1:\n{out}\n{err}"));
    assert!(
        step >= 5 && step.is_multiple_of(5),
        "run 1 resumed at {step}:\n{out}"
    );
    if let Some(late) = crate::common::noticed_step(&out) {
        assert!(
            step < late,
            "resumed at {step}, not the kept checkpoint:\n{out}"
        );
    }
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} done at step {total}")),
            "{out}"
        );
    }
    assert!(!out.contains("run 2 resumes"), "{out}");
    assert_recovered_once_and_cleaned(&az, &home, &first[0].name, gangway_azure::EVICTED);
}

/// A managed spot gang on Azure with the default strategy
/// (`REPLACE_LOST_NODES`) that loses one VM without notice: the survivor
/// keeps its VM, one new VM joins in the same resource group (and so the
/// same proximity placement group), setup runs on it alone, and every rank
/// resumes from the kept checkpoint.
#[test]
fn a_managed_azure_spot_gang_that_loses_one_vm_replaces_only_it() {
    let Some((az, a, home)) = vms_with_sshd(2) else {
        return;
    };
    let Some(b) = crate::sshd::Sshd::start_on_port("azure", 1, 22) else {
        return;
    };
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 40;
    let task = trainer(
        &home.marker,
        progress.path(),
        total,
        "  accelerators: A100-80GB:8\n  infra: azure/eastus\n",
        TRAINER_CONFIG,
    )
    .replace(
        "run: |\n",
        "setup: |\n  echo \"setup ran on $HOME\"\nrun: |\n",
    );
    let task = home.file("train.yaml", &task);
    let mut job = command(
        &az,
        &home,
        CATALOG,
        &["jobs", "launch", &task, "-y", "--wait"],
    );
    job.stdin(std::process::Stdio::null());
    let mut job = crate::common::Running::start(job);
    let cluster = "managed-1";
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to pass a checkpoint",
        |_, now| now > 6,
    );
    let first = running_vms(&az, cluster);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first.iter().all(|v| a.addrs.contains(&v.public)),
        "{first:?}"
    );
    run_on(&az, &b);
    let victim = first[1].clone();
    let ev = az.call(
        "POST",
        "/_fake/evict",
        &serde_json::json!({"vm": victim.name, "notice": false}).to_string(),
    );
    assert_eq!(ev["outcome"], "deleted", "{ev}");
    wait_run(
        &mut job,
        progress.path(),
        1,
        "run 1 to take a step",
        |first, now| now > first,
    );
    let second = running_vms(&az, cluster);
    assert_eq!(second.len(), 2, "{second:?}");
    assert!(second.contains(&first[0]), "the survivor stays: {second:?}");
    let new: Vec<&Vm> = second.iter().filter(|v| **v != first[0]).collect();
    assert!(
        new.len() == 1
            && b.addrs.contains(&new[0].public)
            && new[0].group == first[0].group
            && new[0].location == first[0].location
            && new[0].zone == first[0].zone,
        "one new VM beside the survivor: {second:?} after {first:?}"
    );

    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let resumed: Vec<Option<u32>> = (0..2).map(|r| resumed_at(&out, r, 1)).collect();
    assert_eq!(resumed[0], resumed[1], "{out}");
    let step = resumed[0].unwrap_or_else(|| panic!("no run 1:\n{out}\n{err}"));
    assert!(
        step >= 5 && step.is_multiple_of(5),
        "run 1 resumed at {step}:\n{out}"
    );
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} done at step {total}")),
            "{out}"
        );
    }
    // Setup ran on both VMs at the launch, then on the new one only.
    let (_, log, _) = parts(&run(&az, &home, &["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on").count(), 3, "{log}");
    assert_eq!(
        log.matches(&format!("setup ran on {}", b.home.display()))
            .count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("setup kept on rank").count(), 1, "{log}");
    let (_, ev, _) = parts(&run(&az, &home, &["jobs", "events", "1"]));
    assert!(
        ev.contains("replaced rank") && !ev.contains("whole-gang recovery"),
        "only the lost VM replaced:\n{ev}"
    );
    assert_recovered_once_and_cleaned(&az, &home, &victim.name, gangway_azure::EVICTED);
}
