//! `infra: vast` end to end through the real binary, against the Vast.ai
//! fake (tests/emulators/vast): its instances are a real sshd's loopback
//! addresses on a port that is not 22 (what the API says of a Vast
//! machine: `ssh_host`, `ssh_port`, as root), and it checks every request
//! against Vast.ai's published shapes. A gang needs its machines in one
//! location (Vast has no network between machines but the public one).

use std::process::Output;

use crate::common::{json_doc, parts, TestHome};
use crate::gpu_cloud::{self, GpuCloudFake, KEY};
use crate::skip;

/// The machines' mapped SSH port: any but 22.
const SSH_PORT: u16 = 32022;

/// gangway in `home` talking to `fake`.
fn run(fake: &GpuCloudFake, home: &TestHome, args: &[&str]) -> Output {
    gpu_cloud::run("vast", fake, home, args)
}

/// A catalog with one RTX 4090 a machine in the US (the fake's price).
fn catalog(home: &TestHome) -> String {
    gpu_cloud::catalog(
        home,
        "test-catalog",
        "vast",
        "2026-12-05",
        &["1x_RTX_4090,RTX4090,1,24,32,64,US,US,0.40,,false,false,"],
    )
}

#[test]
fn a_vast_gang_rents_machines_in_one_location_meets_over_their_addresses_and_down_leaves_nothing() {
    let fake = match gpu_cloud::start("vast", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("vast", why),
    };
    let Some(sshd) = crate::sshd::Sshd::start_on_port("vast", 2, SSH_PORT) else {
        return;
    };
    skip::ran("vast");
    let home = TestHome::new();
    gpu_cloud::machines(&fake, &sshd, SSH_PORT);
    // A second machine like the fake's one-GPU 4090 in Washington: a gang
    // of two fits there, and only there.
    fake.control(
        "POST",
        "/_fake/offers",
        serde_json::json!({"like": 41001, "id": 51001, "machine_id": 19001}),
    );
    let cat = catalog(&home);
    let task = home.file(
        "vast-e2e.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: vast\n  accelerators: RTX4090:1\n\
             config:\n  vast:\n    poll_ms: 100\n\
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
    assert_eq!(json_doc(&plan)["plan"][0]["cloud"], "vast", "{plan}");

    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["launch", &task, "--catalog", &cat, "-c", "va", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_eq!(code, 0, "{all}");

    let (_, st, _) = parts(&run(&fake, &home, &["status", "va", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "vast", "{c}");
    assert_eq!(c["region"], "US", "{c}");
    let state = fake.state();
    let instances = state["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2, "{state}");
    let mut addrs = Vec::new();
    for i in instances {
        assert_eq!(i["geolocation"], "Washington, US", "{i}");
        assert_eq!(i["ssh_port"], SSH_PORT, "{i}");
        assert!(
            i["label"].as_str().unwrap_or_default().contains("--va--"),
            "{i}"
        );
        let a = i["public_ipaddr"].as_str().unwrap_or_default();
        assert!(sshd.addrs.iter().any(|s| s == a), "{i}");
        addrs.push(a);
    }
    // No private network on Vast: the ranks meet on the public addresses.
    gpu_cloud::assert_ranks_met(&all, 2, &addrs);
    // The key went to the instances, not the account.
    assert_eq!(state["ssh_keys"], serde_json::json!([]), "{state}");

    let (code, out, err) = parts(&run(&fake, &home, &["down", "-y", "va"]));
    assert_eq!(code, 0, "{out}\n{err}");
    gpu_cloud::assert_nothing_left(&fake, &home, "va");
}

#[test]
fn a_vast_gang_larger_than_any_location_is_refused_saying_why_and_leaves_nothing() {
    let fake = match gpu_cloud::start("vast", "0.2") {
        Ok(f) => f,
        Err(why) => return skip::skipped("vast", why),
    };
    skip::ran("vast");
    let home = TestHome::new();
    let cat = catalog(&home);
    // The fake's market has one one-GPU 4090 machine (in Washington): a
    // gang of two has no location to be placed in.
    let task = home.file(
        "vast-two.yaml",
        "num_nodes: 2\nresources:\n  infra: vast\n  accelerators: RTX4090:1\nrun: 'true'\n",
    );
    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["launch", &task, "--catalog", &cat, "-c", "big", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_ne!(code, 0, "{all}");
    assert!(
        all.contains("no location in US has 2 on-demand offers of 1x_RTX_4090"),
        "{all}"
    );
    assert!(!all.contains(KEY), "{all}");
    assert_eq!(fake.state()["instances"], serde_json::json!([]));
    gpu_cloud::assert_nothing_left(&fake, &home, "big");
}

/// A managed job on a Vast.ai interruptible (bid) instance: run 0 keeps a
/// checkpoint of step 7, then the instance is outbid; the job recovers on a
/// new rental on another machine (another sshd, another home, so a
/// checkpoint found there can only be the one gangway kept) and resumes
/// from step 7.
#[test]
fn a_managed_job_on_a_vast_bid_survives_an_outbid_from_its_kept_checkpoint() {
    let fake = match gpu_cloud::start("vast", "0.5") {
        Ok(f) => f,
        Err(why) => return skip::skipped("vast", why),
    };
    let Some(before) = crate::sshd::Sshd::start_on_port("vast", 1, SSH_PORT) else {
        return;
    };
    let Some(after) = crate::sshd::Sshd::start_on_port("vast", 1, SSH_PORT) else {
        return;
    };
    after.authorize(&before.client_key.with_extension("pub"));
    skip::ran("vast");
    let home = TestHome::new();
    gpu_cloud::machines(&fake, &before, SSH_PORT);
    // A second 4090 machine for the recovery to rent.
    fake.control(
        "POST",
        "/_fake/offers",
        serde_json::json!({"like": 41001, "id": 51001, "machine_id": 19001}),
    );
    let cat = gpu_cloud::catalog(
        &home,
        "spot-catalog",
        "vast",
        "2026-12-05",
        &["1x_RTX_4090,RTX4090,1,24,32,64,US,US,0.40,0.18,false,false,"],
    );
    gpu_cloud::a_managed_job_survives_a_preemption(
        "vast",
        &fake,
        &home,
        &cat,
        "resources:\n  infra: vast\n  accelerators: RTX4090:1\n  use_spot: true\n\
         config:\n  vast:\n    poll_ms: 100\n",
        &after,
        SSH_PORT,
        |state| {
            let victim = &state["instances"][0];
            assert_eq!(victim["is_bid"], true, "{victim}");
            fake.control(
                "POST",
                "/_fake/outbid",
                serde_json::json!({"id": victim["id"]}),
            );
        },
    );
}
