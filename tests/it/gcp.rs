//! `infra: gcp` through the binary, against the schema-checked Compute
//! Engine fake (tests/emulators/gce), one fake per test.

use std::time::Duration;

use crate::common::{json_doc, parts, TestHome};

use crate::gce_fake::GceFake;

/// Names of whatever gangway made that the fake still holds.
pub(crate) fn leftovers(gce: &GceFake) -> Vec<String> {
    let mut names: Vec<String> = ["instances", "resourcePolicies", "firewalls"]
        .iter()
        .flat_map(|kind| {
            gce.named(kind, "gw-")
                .into_iter()
                .map(move |v| format!("{kind}/{}", v["name"].as_str().unwrap_or_default()))
        })
        .collect();
    names.sort();
    names
}

/// Waits (a minute at most) until the fake holds nothing gangway made:
/// a managed job's clusters go after the job has ended.
fn wait_nothing_left(gce: &GceFake) {
    crate::common::wait_for(
        "the job's clusters to be gone",
        Duration::from_secs(60),
        || {
            let left = leftovers(gce);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
}

/// gangway in `home`, pointed at the fake.
fn run(gce: &GceFake, home: &TestHome, args: &[&str]) -> std::process::Output {
    let mut c = crate::common::command_in(home.path());
    c.args(args)
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
        .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
    crate::common::Running::start(c).wait()
}

#[test]
fn a_gcp_stockout_fails_over_to_the_next_zone_and_down_leaves_nothing() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    let task = home.file(
        "gcp.yaml",
        "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  accelerators: A100:1\n  use_spot: true\nrun: \"true\"\n",
    );
    // The plan's first zone has no a2-highgpu-1g left.
    let (_, plan, _) = parts(&run(&gce, &home, &["optimize", &task, "-o", "json"]));
    let first = json_doc(&plan)["plan"][0].clone();
    let zone = first["zone"].as_str().expect("a zone").to_string();
    let ty = first["instance_type"].as_str().expect("a type").to_string();
    gce.call(
        "POST",
        "/_gangway/capacity",
        &serde_json::json!({"zone": zone, "machineType": ty, "available": 0}).to_string(),
    );
    let (code, out, err) = parts(&run(
        &gce,
        &home,
        &["launch", &task, "--provision-only", "-c", "gg", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("ZONE_RESOURCE_POOL_EXHAUSTED") && all.contains(&zone),
        "the failed attempt is not shown: {all}"
    );
    let (_, st, _) = parts(&run(&gce, &home, &["status", "gg", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "gcp", "{c}");
    assert_ne!(c["zone"].as_str(), Some(zone.as_str()), "{c}");
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(2), "{c}");
    let left = leftovers(&gce);
    assert_eq!(
        left.iter().filter(|l| l.starts_with("instances/")).count(),
        2,
        "no leftovers of the failed attempt: {left:?}"
    );
    let (code, out, err) = parts(&run(&gce, &home, &["down", "-y", "gg"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

#[test]
fn gcp_check_names_the_project_or_what_is_missing() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    let (code, out, err) = parts(&run(&gce, &home, &["check", "gcp", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("gangway-test"),
        "{out}\n{err}"
    );
    // The regions where the project sees GPUs: the fake's four.
    let doc = json_doc(&out);
    let gcp = doc["clouds"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["cloud"] == "gcp"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        gcp["regions"],
        serde_json::json!(["asia-northeast1", "europe-west4", "us-central1", "us-east1"]),
        "{out}"
    );
    // Without a project it says how to set one.
    let mut c = crate::common::command_in(home.path());
    c.args(["check", "gcp"])
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env_remove("GOOGLE_CLOUD_PROJECT")
        .env_remove("CLOUDSDK_CORE_PROJECT")
        .env("CLOUDSDK_CONFIG", home.path().join("no-gcloud"));
    let (code, out, err) = parts(&crate::common::Running::start(c).wait());
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("GOOGLE_CLOUD_PROJECT"),
        "{out}\n{err}"
    );
}

#[test]
fn gcp_check_names_the_credentials_it_would_use_and_never_their_secret() {
    // No fake needed: the endpoint is not loopback, so credentials are
    // used, and nothing here can reach it.
    let home = TestHome::new();
    let check = |creds: &str| {
        let mut c = crate::common::command_in(home.path());
        c.args(["check", "gcp"])
            .env("GANGWAY_GCP_ENDPOINT", "http://gce.invalid")
            .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
            .env("GOOGLE_APPLICATION_CREDENTIALS", creds)
            .env("CLOUDSDK_CONFIG", home.path().join("no-gcloud"));
        let (code, out, err) = parts(&crate::common::Running::start(c).wait());
        (code, format!("{out}{err}"))
    };
    let missing = home.path().join("nowhere.json");
    let (code, all) = check(&missing.display().to_string());
    assert_ne!(code, 0, "{all}");
    assert!(
        all.contains("nowhere.json") && all.contains("cannot be read"),
        "{all}"
    );
    let key = home.file(
        "sa.json",
        r#"{"type": "service_account", "client_email": "ci@gangway-test.iam.gserviceaccount.com",
            "private_key_id": "k1", "private_key": "-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n"}"#,
    );
    let (code, all) = check(&key);
    // The endpoint cannot be reached (or the key is no key): not ok, but
    // it says whose credentials it tried.
    assert_ne!(code, 0, "{all}");
    assert!(
        all.contains("service account ci@gangway-test.iam.gserviceaccount.com"),
        "{all}"
    );
    assert!(!all.contains("TOPSECRET"), "{all}");
}

/// The fake's unit price for the SKU with exactly this description in
/// this region (read from its billing API, the way a user could check).
fn sku_price(gce: &GceFake, description: &str, region: &str) -> f64 {
    let mut token = String::new();
    loop {
        let page = gce.call(
            "GET",
            &format!("/v1/services/6F81-5844-456A/skus?currencyCode=USD&pageToken={token}"),
            "",
        );
        for s in page["skus"].as_array().expect("a SKU page") {
            if s["description"] == description
                && s["serviceRegions"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == region))
            {
                let p = &s["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"];
                let units: f64 = p["units"].as_str().unwrap_or("0").parse().unwrap();
                return units + p["nanos"].as_f64().unwrap_or(0.0) / 1e9;
            }
        }
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => panic!("no SKU {description:?} in {region}"),
        }
    }
}

/// `(zone, price, spot)` of the overlay's rows for this type, GPU and count.
fn rows(csv: &str, ty: &str, gpu: &str, count: &str) -> Vec<(String, Option<f64>, Option<f64>)> {
    csv.lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() == 13 && f[0] == ty && f[1] == gpu && f[2] == count)
        .map(|f| (f[7].to_string(), f[8].parse().ok(), f[9].parse().ok()))
        .collect()
}

#[test]
fn gcp_catalog_refresh_offers_what_each_zone_has_at_billing_prices() {
    let Some(gce) = GceFake::start() else { return };
    let refresh = |home: &TestHome| {
        let mut c = crate::common::command_in(home.path());
        c.args([
            "catalog",
            "refresh",
            "--cloud",
            "gcp",
            "--regions",
            "us-central1,europe-west4",
        ])
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env("GANGWAY_GCP_BILLING_ENDPOINT", &gce.url)
        .env("GOOGLE_CLOUD_PROJECT", "gangway-test");
        let (code, out, err) = parts(&crate::common::Running::start(c).wait());
        assert_eq!(code, 0, "{out}\n{err}");
        let csv = std::fs::read_to_string(home.path().join("catalog/gcp.csv")).expect("overlay");
        (format!("{out}{err}"), csv)
    };
    let (said, csv) = refresh(&TestHome::new());
    // Two regions, one read of the SKUs (they are global).
    assert_eq!(gce.state()["billing_calls"], 1, "{said}");
    // N1 + T4 is offered where the zone has both (the fake: every
    // us-central1 zone), priced as 4 vCPUs + 15 GiB + one T4.
    let n1 = rows(&csv, "n1-standard-4", "T4", "1");
    let central: Vec<&str> = n1
        .iter()
        .filter(|r| r.0.starts_with("us-central1-"))
        .map(|r| r.0.as_str())
        .collect();
    assert_eq!(
        central,
        [
            "us-central1-a",
            "us-central1-b",
            "us-central1-c",
            "us-central1-f"
        ],
        "{csv}"
    );
    let want =
        4.0 * sku_price(
            &gce,
            "N1 Predefined Instance Core running in Americas",
            "us-central1",
        ) + 15.0
            * sku_price(
                &gce,
                "N1 Predefined Instance Ram running in Americas",
                "us-central1",
            )
            + sku_price(
                &gce,
                "Nvidia Tesla T4 GPU running in Americas",
                "us-central1",
            );
    let spot =
        4.0 * sku_price(
            &gce,
            "Spot Preemptible N1 Predefined Instance Core running in Americas",
            "us-central1",
        ) + 15.0
            * sku_price(
                &gce,
                "Spot Preemptible N1 Predefined Instance Ram running in Americas",
                "us-central1",
            )
            + sku_price(
                &gce,
                "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas",
                "us-central1",
            );
    for r in n1.iter().filter(|r| r.0.starts_with("us-central1-")) {
        let (p, s) = (r.1.expect("on-demand"), r.2.expect("spot"));
        assert!((p - want).abs() < 1e-5, "{r:?} vs {want}");
        assert!((s - spot).abs() < 1e-5, "{r:?} vs {spot}");
        assert_ne!(p, 0.54, "not the shipped price");
    }
    // Hosts with GPUs only where the zone has those GPUs: every row's zone
    // lists the GPU in the fake's world.
    let accels = gce.call(
        "GET",
        "/compute/v1/projects/gangway-test/aggregated/acceleratorTypes",
        "",
    );
    let has = |zone: &str, gce_name: &str| {
        accels["items"][format!("zones/{zone}")]["acceleratorTypes"]
            .as_array()
            .is_some_and(|a| a.iter().any(|t| t["name"] == gce_name))
    };
    for (ty, gpu, n) in [
        ("n1-standard-8", "V100", "1"),
        ("n1-standard-16", "T4", "4"),
        ("a2-ultragpu-1g", "A100-80GB", "1"),
    ] {
        let gce_name = match gpu {
            "V100" => "nvidia-tesla-v100",
            "T4" => "nvidia-tesla-t4",
            _ => "nvidia-a100-80gb",
        };
        let got = rows(&csv, ty, gpu, n);
        assert!(!got.is_empty(), "{ty}: {csv}");
        for (zone, price, _) in got
            .iter()
            .filter(|r| r.0.starts_with("us-central1") || r.0.starts_with("europe-west4"))
        {
            assert!(
                has(zone, gce_name),
                "{ty} {gpu} offered in {zone} without it"
            );
            assert!(price.is_some(), "{ty} in {zone} has no price");
        }
    }
    // A type the fake's zones do not have (H200's a3-ultragpu) is no longer
    // sold in the refreshed regions; other regions keep their rows.
    assert!(rows(&csv, "a3-ultragpu-8g", "H200", "8")
        .iter()
        .all(|r| !r.0.starts_with("us-central1")));
    assert!(rows(&csv, "n1-standard-4", "T4", "1")
        .iter()
        .any(|r| r.0.starts_with("us-east4")));
    assert!(said.contains("on-demand"), "{said}");

    // Billing refused: the zones still come from the API, the prices stay
    // as they were (here, in a fresh home: as shipped), and it says so.
    gce.call("POST", "/_gangway/billing", r#"{"fail": 403}"#);
    let (said, csv) = refresh(&TestHome::new());
    assert!(
        said.contains("Cloud Billing API refused (403") && said.contains("stay as they were"),
        "{said}"
    );
    let n1 = rows(&csv, "n1-standard-4", "T4", "1");
    let a = n1
        .iter()
        .find(|r| r.0 == "us-central1-a")
        .expect("still offered");
    assert_eq!(a.1, Some(0.54), "the shipped price: {csv}");
}

/// A fake whose VMs get the addresses of a real sshd on port 22 (as a GCE
/// VM's would), and a home whose gangway key is the one that sshd takes
/// (a VM takes it from its `ssh-keys` metadata).
pub(crate) fn vms_with_sshd(n: usize) -> Option<(GceFake, crate::sshd::Sshd, TestHome)> {
    use std::os::unix::fs::PermissionsExt;
    let gce = GceFake::start()?;
    let sshd = crate::sshd::Sshd::start_on_port("gcp", n, 22)?;
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
    let block = sshd.addrs[0].rsplit_once('.').unwrap().0.to_string();
    let set = gce.call(
        "POST",
        "/_gangway/settings",
        &serde_json::json!({"nat_ip_prefix": format!("{block}."), "host_keys": sshd.host_keys()})
            .to_string(),
    );
    assert_eq!(set["nat_ip_prefix"], format!("{block}."), "{set}");
    Some((gce, sshd, home))
}

#[test]
fn a_gcp_gang_runs_over_ssh_with_its_ranks_and_down_leaves_nothing() {
    let Some((gce, sshd, home)) = vms_with_sshd(2) else {
        return;
    };
    let task = home.file(
        "gcp-e2e.yaml",
        "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  instance_type: n2-standard-8\n\
         config:\n  gcp:\n    ssh_user: root\n\
         setup: echo setup-done > setup.txt\n\
         run: |\n  echo \"rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES master=$MASTER_ADDR setup=$(cat setup.txt)\"\n",
    );
    let (code, out, err) = parts(&run(&gce, &home, &["launch", &task, "-c", "e2e", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let vms = gce.named("instances", "gw-e2e-");
    assert_eq!(vms.len(), 2, "{vms:#?}");
    let ips: Vec<String> = vms
        .iter()
        .map(|v| {
            v["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        ips.iter().all(|ip| sshd.addrs.contains(ip)),
        "{ips:?} vs {:?}",
        sshd.addrs
    );
    let all = format!("{out}{err}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank={rank} of=2 master=10."))
                && all.contains("setup=setup-done"),
            "rank {rank} did not run over SSH:\n{all}"
        );
    }
    // The cluster's nodes are the VMs, reached at their public address.
    let (_, st, _) = parts(&run(&gce, &home, &["status", "e2e", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "gcp", "{c}");
    let (code, out, err) = parts(&run(&gce, &home, &["down", "-y", "e2e"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

/// A 2-node managed spot job on GCP (recovery `strategy`, or the default)
/// whose run 0 keeps step 7 and then loses one VM to a preemption; the VMs
/// made after it come up on another sshd (another home, so a checkpoint
/// found there can only be the one gangway kept). Returns the job's
/// output, the fake, the home, the sshds before and after, the victim.
fn preempt_one_of_two(
    strategy: Option<&str>,
) -> Option<(
    String,
    GceFake,
    TestHome,
    crate::sshd::Sshd,
    crate::sshd::Sshd,
    String,
)> {
    let (gce, sshd, home) = vms_with_sshd(2)?;
    let after = crate::sshd::Sshd::start_on_port("gcp", 2, 22)?;
    after.authorize(&sshd.client_key.with_extension("pub"));
    let recovery = strategy
        .map(|s| format!("  job_recovery:\n    strategy: {s}\n"))
        .unwrap_or_default();
    // Run 0 checkpoints step 7, waits until gangway kept it, says so and
    // waits to be preempted; run 1 must find step 7 restored.
    let ready = home.path().join("ready");
    let task = home.file(
        "gcp-spot.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  instance_type: n2-standard-8\n  use_spot: true\n{recovery}\
             config:\n  gcp:\n    ssh_user: root\n\
             checkpoint:\n  sync_interval: 1\nenvs:\n  GW_TEST_MARKER: {marker}\n\
             setup: echo \"setup ran on $HOME\"\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    t=$(date +%s%3N)\n    \
             [ \"$NODE_RANK\" = 0 ] && echo 7 > \"$ck\"\n    \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n    \
             [ \"$NODE_RANK\" = 0 ] && touch {ready}\n    \
             exec sleep 300\n  fi\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT on $HOME\"\n",
            marker = home.marker,
            ready = ready.display()
        ),
    );
    let mut c = crate::common::command_in(home.path());
    c.args(["jobs", "launch", &task, "-y", "--wait"])
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
        .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
    let job = crate::common::Running::start(c);
    crate::common::wait_for(
        "run 0 to keep its checkpoint",
        Duration::from_secs(120),
        || {
            if ready.exists() {
                Ok(())
            } else {
                Err("no ready file".into())
            }
        },
    );
    let vms = gce.named("instances", "gw-");
    assert_eq!(vms.len(), 2, "{vms:#?}");
    let victim = vms[0]["name"].as_str().unwrap().to_string();
    let pre = gce.call(
        "POST",
        "/_gangway/preempt",
        &serde_json::json!({"instance": victim}).to_string(),
    );
    assert_eq!(pre["action"], "STOP", "{pre}");
    let block = after.addrs[0].rsplit_once('.').unwrap().0;
    gce.call(
        "POST",
        "/_gangway/settings",
        &serde_json::json!({"nat_ip_prefix": format!("{block}.")}).to_string(),
    );
    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (_, q, _) = parts(&run(&gce, &home, &["jobs", "queue", "-o", "json"]));
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "{j}");
    let (_, ev, _) = parts(&run(&gce, &home, &["jobs", "events", "1"]));
    assert!(
        ev.contains(&victim),
        "the event names the preempted VM:\n{ev}"
    );
    // Nothing left: the preempted cluster and the one it resumed on.
    wait_nothing_left(&gce);
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
    Some((out, gce, home, sshd, after, victim))
}

#[test]
fn a_managed_job_on_gcp_spot_survives_a_preemption_from_its_kept_checkpoint() {
    // The whole gang, as SkyPilot recovers it: both ranks on new VMs.
    let Some((out, _, _, _, after, _)) = preempt_one_of_two(Some("EAGER_NEXT_REGION")) else {
        return;
    };
    for r in 0..2 {
        assert!(
            out.contains(&format!(
                "rank {r} resumed at step 7 in run 1 on {}",
                after.home.display()
            )),
            "{out}"
        );
    }
}

#[test]
fn a_managed_gcp_spot_gang_that_loses_one_vm_replaces_only_it() {
    // The default recovery: the survivor stays on its VM (and its sshd),
    // one new VM joins in the same zone and compact placement policy.
    let Some((out, gce, home, sshd, after, victim)) = preempt_one_of_two(None) else {
        return;
    };
    let (kept, new) = (sshd.home.display(), after.home.display());
    let resumed: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("resumed at step 7 in run 1 on "))
        .collect();
    assert_eq!(resumed.len(), 2, "{out}");
    assert!(
        resumed
            .iter()
            .filter(|l| l.ends_with(&kept.to_string()))
            .count()
            == 1
            && resumed
                .iter()
                .filter(|l| l.ends_with(&new.to_string()))
                .count()
                == 1,
        "one rank on the survivor, one on the replacement:\n{out}"
    );
    // Setup ran twice at the launch, then once, on the new VM only.
    let (_, log, _) = parts(&run(&gce, &home, &["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on").count(), 3, "{log}");
    assert_eq!(
        log.matches(&format!("setup ran on {new}")).count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("setup kept on rank").count(), 1, "{log}");
    let (_, ev, _) = parts(&run(&gce, &home, &["jobs", "events", "1"]));
    assert!(
        ev.contains("replaced rank") && ev.contains(&victim),
        "the replacement names the lost VM:\n{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
}

#[test]
fn a_managed_gcp_spot_gang_told_of_one_preemption_replaces_that_vm_at_the_noticed_step() {
    // GCE marks a VM preempted in its metadata (`instance/preempted:
    // TRUE`) and stops it after a grace period: the gang checkpoints on
    // the notice, the noticed VM alone is replaced, and both ranks resume
    // exactly at the noticed step.
    let Some((gce, sshd, home)) = vms_with_sshd(2) else {
        return;
    };
    let Some(after) = crate::sshd::Sshd::start_on_port("gcp", 1, 22) else {
        return;
    };
    after.authorize(&sshd.client_key.with_extension("pub"));
    let progress = tempfile::tempdir().expect("tempdir");
    let task = home.file(
        "train.yaml",
        &crate::spot_job::trainer(
            &home.marker,
            progress.path(),
            40,
            "  infra: gcp/us-central1\n  instance_type: n2-standard-8\n",
            "  gcp:\n    ssh_user: root\n",
        )
        .replace("run: |\n", "setup: echo \"setup ran on $HOME\"\nrun: |\n"),
    );
    let mut c = crate::common::command_in(home.path());
    c.args(["jobs", "launch", &task, "-y", "--wait"])
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
        .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24")
        .stdin(std::process::Stdio::null());
    let mut job = crate::common::Running::start(c);
    crate::spot_job::wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to pass a checkpoint",
        |_, now| now > 6,
    );
    // Each VM's sessions find its own metadata server (by the address
    // they came to), as a VM's processes find GCE's.
    let vms = gce.named("instances", "gw-");
    assert_eq!(vms.len(), 2, "{vms:#?}");
    let mut profile = String::from("set -- $SSH_CONNECTION\ncase \"$3\" in\n");
    for vm in &vms {
        let md = gce.call(
            "POST",
            "/_gangway/metadata-server",
            &serde_json::json!({ "instance": vm["name"] }).to_string(),
        );
        let ip = vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
            .as_str()
            .expect("natIP");
        profile.push_str(&format!(
            "  {ip}) export GCE_METADATA_HOST={} ;;\n",
            md["host"].as_str().expect("metadata host")
        ));
    }
    profile.push_str("esac\nset --\n");
    sshd.session_profile(&profile);
    let victim = vms[1]["name"].as_str().unwrap().to_string();
    // The replacement comes up on the other sshd.
    let block = after.addrs[0].rsplit_once('.').unwrap().0;
    gce.call(
        "POST",
        "/_gangway/settings",
        &serde_json::json!({"nat_ip_prefix": format!("{block}.")}).to_string(),
    );
    let pre = gce.call(
        "POST",
        "/_gangway/preempt",
        &serde_json::json!({"instance": victim, "grace_s": 60}).to_string(),
    );
    assert_eq!(pre["action"], "STOP", "{pre}");
    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} run 1 resumes at step {noticed}")),
            "rank {rank} did not resume at the noticed step {noticed}:\n{out}"
        );
        assert!(
            out.contains(&format!("rank {rank} done at step 40")),
            "{out}"
        );
    }
    // Setup ran twice at the launch, then once, on the new VM only.
    let (_, log, _) = parts(&run(&gce, &home, &["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on").count(), 3, "{log}");
    assert_eq!(
        log.matches(&format!("setup ran on {}", after.home.display()))
            .count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("setup kept on rank").count(), 1, "{log}");
    let (_, ev, _) = parts(&run(&gce, &home, &["jobs", "events", "1"]));
    assert!(ev.contains("NOTICE"), "{ev}");
    assert!(
        ev.contains("replaced rank") && ev.contains(&victim),
        "the replacement names the noticed VM:\n{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    let (_, q, _) = parts(&run(&gce, &home, &["jobs", "queue", "-o", "json"]));
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["nodes_replaced"], 1, "{j}");
    wait_nothing_left(&gce);
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// gangway in `home` as user `user`, pointed at the fake.
fn run_as(gce: &GceFake, home: &TestHome, user: &str, args: &[&str]) -> std::process::Output {
    let mut c = crate::common::command_in(home.path());
    c.args(args)
        .env("USER", user)
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
        .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
    crate::common::Running::start(c).wait()
}

/// The owner id a home's gangway made.
fn owner_id(home: &TestHome) -> String {
    std::fs::read_to_string(home.path().join("owner"))
        .expect("the owner id file")
        .trim()
        .to_string()
}

#[test]
fn down_orphans_on_gcp_sweeps_only_this_installations_clusters() {
    let Some(gce) = GceFake::start() else { return };
    let (a, b) = (TestHome::new(), TestHome::new());
    let user = "Shared.User";
    let task = a.file(
        "one.yaml",
        "resources:\n  infra: gcp/us-central1\n  accelerators: A100:1\n  use_spot: true\nrun: \"true\"\n",
    );
    let launch = |home: &TestHome, name: &str| {
        let (code, out, err) = parts(&run_as(
            &gce,
            home,
            user,
            &["launch", &task, "--provision-only", "-c", name, "-y"],
        ));
        assert_eq!(code, 0, "{out}\n{err}");
    };
    launch(&a, "ga");
    launch(&b, "gb");
    let (ida, idb) = (owner_id(&a), owner_id(&b));
    assert_ne!(ida, idb);
    let va = gce.named("instances", &gangway_gcp::Names::new("ga", &ida).base);
    assert_eq!(va.len(), 1, "{:#}", gce.state());
    assert_eq!(va[0]["labels"]["gangway-owner"], ida.as_str(), "{}", va[0]);
    assert_eq!(va[0]["labels"]["gangway-user"], "shared-user", "{}", va[0]);
    let rules = gce.named("firewalls", &gangway_gcp::Names::new("ga", &ida).base);
    assert!(
        rules.iter().all(|r| r["description"]
            == format!("gangway cluster ga; owner {ida}; user shared-user").as_str()),
        "{rules:?}"
    );
    // What an earlier version left: a rule whose description names a user
    // as owner (its VMs are gone).
    let old = gangway_gcp::Names::new("old-one", "olduser");
    let made = gce.call(
        "POST",
        "/compute/v1/projects/gangway-test/global/firewalls",
        &serde_json::json!({"name": old.firewall_ssh(), "network": "global/networks/default",
            "direction": "INGRESS", "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
            "sourceRanges": ["192.0.2.0/24"], "targetTags": [old.tag],
            "description": "gangway cluster old-one; owner olduser"})
        .to_string(),
    );
    assert!(made.get("error").is_none(), "{made}");
    // The rule exists once its operation is done (each GET moves it on).
    let op = format!(
        "/compute/v1/projects/gangway-test/global/operations/{}",
        made["name"].as_str().unwrap_or_default()
    );
    while gce.call("GET", &op, "")["status"] != "DONE" {}
    // A loses its state and sweeps.
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(a.path().join(f));
    }
    let (code, out, err) = parts(&run_as(&gce, &a, user, &["down", "--orphans", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Terminated orphaned cluster 'ga'"), "{out}");
    assert!(!out.contains("'gb'"), "{out}");
    assert!(
        out.contains("1 cluster(s) of other gangway installations seen, not touched"),
        "{out}"
    );
    assert!(
        out.contains("old-one (gcp)") && out.contains("gangway down --orphans --owner olduser"),
        "{out}"
    );
    let left = leftovers(&gce);
    assert!(
        !left.iter().any(|l| l.contains("gw-ga-")),
        "A's cluster: {left:?}"
    );
    assert!(
        left.iter().any(|l| l.starts_with("instances/gw-gb-")),
        "{left:?}"
    );
    assert!(
        left.contains(&format!("firewalls/{}", old.firewall_ssh())),
        "the earlier version's rule is not A's to delete: {left:?}"
    );
    // Adopted explicitly: the earlier version's, and A's from B.
    let (code, out, err) = parts(&run_as(
        &gce,
        &a,
        user,
        &["down", "--orphans", "--owner", "olduser", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!leftovers(&gce).contains(&format!("firewalls/{}", old.firewall_ssh())));
    launch(&a, "ga2");
    let (code, out, err) = parts(&run_as(
        &gce,
        &b,
        user,
        &["down", "--orphans", "--owner", &ida, "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Terminated orphaned cluster 'ga2'"), "{out}");
    let left = leftovers(&gce);
    assert!(!left.iter().any(|l| l.contains("gw-ga2-")), "{left:?}");
    assert!(
        left.iter().any(|l| l.starts_with("instances/gw-gb-")),
        "{left:?}"
    );
    let (code, out, err) = parts(&run_as(&gce, &b, user, &["down", "-y", "gb"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, _, err) = parts(&run_as(&gce, &a, user, &["down", "-y", "ga2"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

#[test]
fn a_t4_gang_on_n1_hosts_launches_without_compact_placement() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    let task = home.file(
        "t4.yaml",
        "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  accelerators: T4:1\nrun: \"true\"\n",
    );
    let (code, out, err) = parts(&run(
        &gce,
        &home,
        &["launch", &task, "--provision-only", "-c", "t4", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let c = json_doc(&parts(&run(&gce, &home, &["status", "t4", "-o", "json"])).1)["clusters"][0]
        .clone();
    assert!(
        c["instance_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("n1-")),
        "{c}"
    );
    let left = leftovers(&gce);
    assert_eq!(
        left.iter().filter(|l| l.starts_with("instances/")).count(),
        2,
        "{left:?}"
    );
    assert!(
        !left.iter().any(|l| l.starts_with("resourcePolicies/")),
        "{left:?}"
    );
    let (code, _, err) = parts(&run(&gce, &home, &["down", "-y", "t4"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

#[test]
fn a_refused_placement_policy_never_ends_a_gcp_launch() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    // Every gang asked for with a policy is refused as invalid, whatever
    // the zone: the launch asks again without one.
    gce.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "instances.bulkInsert", "contains": "resourcePolicies",
            "http_status": 400, "times": -1,
            "message": "Invalid resource usage: 'Placement policy is not applicable.'"})
        .to_string(),
    );
    let task = home.file(
        "a100.yaml",
        "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  accelerators: A100:1\n  use_spot: true\nrun: \"true\"\n",
    );
    let (code, out, err) = parts(&run(
        &gce,
        &home,
        &["launch", &task, "--provision-only", "-c", "pol", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let left = leftovers(&gce);
    assert_eq!(
        left.iter().filter(|l| l.starts_with("instances/")).count(),
        2,
        "{left:?}"
    );
    for vm in gce.named("instances", "gw-pol-") {
        assert!(vm.get("resourcePolicies").is_none(), "{vm}");
    }
    let (code, _, err) = parts(&run(&gce, &home, &["down", "-y", "pol"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

/// `docs/gcp.md`'s first command, on the example file as shipped: two
/// Spot a2-highgpu-8g VMs that are deleted when reclaimed, in one compact
/// placement policy, and `down` removes all of it.
#[test]
fn the_documented_gcp_example_provisions_as_shipped_and_down_leaves_nothing() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    let example = crate::common::root().join("examples/gcp-a100.yaml");
    // What docs/gcp.md runs, less the run itself (no machines here).
    let (code, out, err) = parts(&run(
        &gce,
        &home,
        &[
            "launch",
            example.to_str().unwrap(),
            "--provision-only",
            "-c",
            "ex",
            "-y",
        ],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let vms = gce.named("instances", "gw-");
    assert_eq!(vms.len(), 2, "{vms:?}");
    for vm in &vms {
        let ty = vm["machineType"].as_str().unwrap_or_default();
        assert!(ty.ends_with("/a2-highgpu-8g"), "{vm}");
        assert_eq!(vm["scheduling"]["provisioningModel"], "SPOT", "{vm}");
        assert_eq!(
            vm["scheduling"]["instanceTerminationAction"], "DELETE",
            "{vm}"
        );
        assert_eq!(
            vm["disks"][0]["diskSizeGb"].to_string().trim_matches('"'),
            "256",
            "{vm}"
        );
    }
    assert_eq!(
        gce.named("resourcePolicies", "gw-").len(),
        1,
        "{:?}",
        leftovers(&gce)
    );
    let (code, out, err) = parts(&run(&gce, &home, &["down", "-y", "ex"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

/// `gcp.remote_identity` (the user's config.yaml, SkyPilot's key): every
/// VM is inserted running as that service account with the Cloud Storage
/// read_write scope only, and a gs:// COPY and MOUNT on it reach the store
/// with the token of its metadata server (the GCS front logs which token:
/// the one the node's metadata served, and no other); nothing is renewed.
/// The fake's metadata server stands in for GCE's, reached through
/// `GCE_METADATA_HOST` as Google's libraries (rclone's) read it.
#[test]
fn a_gcp_cluster_with_remote_identity_reaches_gcs_with_its_service_accounts_token() {
    let Some(gcs) = gangway_test::storage::StoreEmulator::gcs() else {
        return;
    };
    let Some((gce, sshd, home)) = vms_with_sshd(1) else {
        return;
    };
    let email = "gangway-nodes@gangway-test.iam.gserviceaccount.com";
    let set = gce.call(
        "POST",
        "/_gangway/settings",
        &serde_json::json!({ "service_accounts": [email] }).to_string(),
    );
    assert_eq!(set["service_accounts"][0], email, "{set}");
    std::fs::write(
        home.path().join("config.yaml"),
        format!("gcp:\n  remote_identity: {email}\n"),
    )
    .expect("config.yaml");
    let bucket = format!("gw-{}-ident", home.marker.to_ascii_lowercase());
    gcs.create_bucket(&bucket);
    gcs.put_object(&bucket, "x.txt", b"v1");
    let with_gcs = |args: &[&str]| {
        let mut c = crate::common::command_in(home.path());
        c.args(args)
            .env("GANGWAY_GCP_ENDPOINT", &gce.url)
            .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
            .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24")
            .env("GANGWAY_GCS_ENDPOINT", &gcs.endpoint)
            .env(
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                gangway_test::storage::GCS_NO_AUTH_KEY,
            );
        parts(&crate::common::Running::start(c).wait())
    };
    let up = home.file(
        "up.yaml",
        &format!(
            "resources:\n  infra: gcp/us-central1\n  instance_type: n2-standard-8\n\
             envs:\n  GW_TEST_MARKER: {}\n\
             config:\n  gcp:\n    ssh_user: root\nrun: echo up\n",
            home.marker
        ),
    );
    let (code, out, err) = with_gcs(&["launch", &up, "-c", "ident", "-y"]);
    assert_eq!(code, 0, "{out}\n{err}");
    // The insert carried the account, with the storage scope only.
    let vms = gce.named("instances", "gw-ident-");
    assert_eq!(vms.len(), 1, "{vms:#?}");
    assert_eq!(
        vms[0]["serviceAccounts"],
        serde_json::json!([{
            "email": email,
            "scopes": ["https://www.googleapis.com/auth/devstorage.read_write"]
        }]),
        "{:#}",
        vms[0]
    );
    // The node's metadata server, where its sessions find it.
    let name = vms[0]["name"].as_str().expect("name");
    let md = gce.call(
        "POST",
        "/_gangway/metadata-server",
        &serde_json::json!({ "instance": name }).to_string(),
    );
    let host = md["host"].as_str().expect("metadata host").to_string();
    sshd.session_profile(&format!("export GCE_METADATA_HOST={host}\n"));

    let task = home.file(
        "ident.yaml",
        &format!(
            "envs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/c: gs://{bucket}\n  ~/m:\n    source: gs://{bucket}\n    mode: MOUNT\n\
             run: |\n\
             \x20 t=$(curl -s -H 'Metadata-Flavor: Google' http://$GCE_METADATA_HOST/computeMetadata/v1/instance/service-accounts/default/token | sed -n 's/.*\"access_token\": *\"\\([^\"]*\\)\".*/\\1/p')\n\
             \x20 echo \"token=bearer-sha256:$(printf %s \"$t\" | sha256sum | cut -c1-16)\"\n\
             \x20 echo \"copy=$(cat ~/c/x.txt) mount=$(cat ~/m/x.txt)\"\n\
             \x20 echo \"kept=$(ls ~/.gangway/creds/*/ | tr '\\n' ' ')\"\n",
            m = home.marker
        ),
    );
    let before = gcs.last_request_id();
    let (code, out, err) = with_gcs(&["exec", "ident", &task]);
    let all = format!("{out}\n{err}");
    assert_eq!(code, 0, "{all}");
    assert!(all.contains("copy=v1 mount=v1"), "{all}");
    let token = all
        .lines()
        .find_map(|l| l.split("token=").nth(1))
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    assert!(token.len() == "bearer-sha256:".len() + 16, "{all}");
    let seen = gcs.requests_since(before);
    let used: std::collections::BTreeSet<Option<String>> = seen
        .iter()
        // The node's rclone: Debian's build says `google-api-go-client` or
        // `Go-http-client` to GCS, not `rclone/`; object_store is gangway's
        // own preflight on this machine.
        .filter(|r| {
            !r.user_agent
                .as_deref()
                .is_some_and(|u| u.starts_with("object_store"))
        })
        .map(|r| r.key_id.clone())
        .collect();
    assert_eq!(
        used,
        [Some(token)].into_iter().collect(),
        "every rclone request carried the metadata server's token: {seen:#?}"
    );
    let kept = all
        .lines()
        .find_map(|l| l.split("kept=").nth(1))
        .unwrap_or_default();
    assert!(
        kept.contains("gw1.conf") && !kept.contains(".json"),
        "{kept}"
    );
    assert!(!all.contains("renewed the bucket mounts"), "{all}");

    // A VM goes with its mount; the test's machine stays (the mount is in
    // its sshd's mount namespace).
    let args: Vec<String> = sshd
        .ssh_args()
        .into_iter()
        .map(|a| match a.as_str() {
            "StrictHostKeyChecking=yes" => "StrictHostKeyChecking=no".to_string(),
            a if a.starts_with("UserKnownHostsFile=") => "UserKnownHostsFile=/dev/null".into(),
            _ => a,
        })
        .collect();
    let unmount = std::process::Command::new("ssh")
        .args(&args)
        .arg(&sshd.addrs[0])
        .arg("fusermount3 -uz ~/m || fusermount -uz ~/m")
        .output()
        .expect("ssh");
    assert!(unmount.status.success(), "{unmount:?}");
    let (code, out, err) = with_gcs(&["down", "-y", "ident"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}

/// A `remote_identity` GCE refuses (an account that does not exist, or
/// that the user may not act as) stops the launch with GCE's words, the
/// key to fix, and leaves nothing.
#[test]
fn a_gcp_remote_identity_gce_refuses_fails_clearly_and_leaves_nothing() {
    let Some(gce) = GceFake::start() else { return };
    let home = TestHome::new();
    let email = "missing@gangway-test.iam.gserviceaccount.com";
    let task = home.file(
        "missing.yaml",
        &format!(
            "resources:\n  infra: gcp/us-central1\n  instance_type: n2-standard-8\n\
             config:\n  gcp:\n    remote_identity: {email}\nrun: echo never\n"
        ),
    );
    let (code, out, err) = parts(&run(&gce, &home, &["launch", &task, "-c", "nosa", "-y"]));
    let all = format!("{out}\n{err}");
    assert_ne!(code, 0, "{all}");
    assert!(
        all.contains("us-central1")
            && all.contains(&format!(
                "The user does not have access to service account '{email}'"
            ))
            && all.contains("config.gcp.remote_identity"),
        "{all}"
    );
    assert_eq!(leftovers(&gce), Vec::<String>::new());
}
