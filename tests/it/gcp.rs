//! `infra: gcp` through the binary, against the schema-checked Compute
//! Engine fake (tests/emulators/gce), one fake per test.

use crate::common::{json_doc, parts, TestHome};

#[path = "../support/gce_fake.rs"]
mod gce_fake;
use gce_fake::GceFake;

/// Names of whatever gangway made that the fake still holds.
fn leftovers(gce: &GceFake) -> Vec<String> {
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
    let (code, out, err) = parts(&run(&gce, &home, &["check", "gcp"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("gangway-test"),
        "{out}\n{err}"
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
