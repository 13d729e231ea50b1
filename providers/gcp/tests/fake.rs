//! The GCP provider through Google's Rust client against the schema-checked
//! Compute Engine fake (tests/emulators/gce): every request body the client
//! sends is checked against the official discovery document there.
//!
//! Needs the fake's venv (`tests/emulators/gce/setup.sh`; `.ci/run` makes
//! one and passes its python in `GANGWAY_TEST_GCE_PYTHON`); without it each
//! test says `SKIPPED gcp: why` (gangway_test::skip) and passes.

use std::path::Path;
use std::sync::OnceLock;

use gangway_gcp::GcpProvider;
use gangway_provider::{
    ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider, TaggedCluster,
};

use gangway_test::gce_fake::GceFake;
use gangway_test::skip;

/// One fake for the whole test binary (the endpoint is process-wide
/// environment); tests keep apart by cluster name, zone and machine type.
/// Each calling test records `ran gcp` or its skip.
fn fake() -> Option<&'static GceFake> {
    static FAKE: OnceLock<Result<GceFake, String>> = OnceLock::new();
    let fake = FAKE.get_or_init(|| {
        let fake = GceFake::try_start()?;
        // Edition 2021: safe. Set once, before any client is built.
        std::env::set_var("GANGWAY_GCP_ENDPOINT", &fake.url);
        std::env::set_var("GOOGLE_CLOUD_PROJECT", "gangway-test");
        std::env::set_var("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
        Ok(fake)
    });
    skip::gate("gcp", fake.as_ref())
}

fn provider(dir: &Path) -> GcpProvider {
    let key = gangway_test::contract::public_key(dir);
    GcpProvider::new(dir.join("gcp"), "tester", key).with_user("Test User")
}

/// The sweep's entry for `cluster` under `owner`, if it found one.
async fn swept(p: &GcpProvider, cluster: &str, owner: &str) -> Option<TaggedCluster> {
    p.clusters()
        .await
        .expect("sweep")
        .into_iter()
        .find(|c| c.name.0 == cluster && c.owner == owner)
}

fn req(cluster: &str, zone: &str, ty: &str, count: u32, spot: bool) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: "tester".into(),
        placement: Placement {
            cloud: "gcp".into(),
            region: zone.rsplit_once('-').unwrap().0.into(),
            zone: zone.into(),
        },
        instance_type: ty.into(),
        count,
        use_spot: spot,
        accelerator: Some(("A100".into(), 1.0)),
        disk_size_gib: Some(100),
        image_id: None,
        client_token: format!("token-{cluster}"),
        provider_config: None,
        network_tier: None,
        max_price: None,
        ports: vec![],
        labels: Default::default(),
    }
}

/// Deletes these VMs through the API as someone else would, and waits
/// until they are gone (a delete is an operation).
async fn delete_behind_our_back(fake: &GceFake, zone: &str, vms: &[String]) {
    for name in vms {
        fake.call(
            "DELETE",
            &format!("/compute/v1/projects/gangway-test/zones/{zone}/instances/{name}"),
            "",
        );
    }
    for _ in 0..100 {
        if vms.iter().all(|n| fake.named("instances", n).is_empty()) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{vms:?} still there after 5 s");
}

fn prefix(cluster: &str) -> String {
    gangway_gcp::Names::new(cluster, "tester").base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_gang_is_created_compact_relaunched_without_doubles_and_removed() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut r = req("gang", "us-central1-a", "a2-highgpu-1g", 2, true);
    r.provider_config = Some(serde_json::json!({"preemption_notice_s": 60}));
    let nodes = p.launch(&r).await.expect("launch");
    assert_eq!(nodes.len(), 2);
    for n in &nodes {
        assert_eq!(n.state, NodeState::Running, "{n:?}");
        assert!(n.public_ip.is_some() && !n.private_ip.is_empty(), "{n:?}");
        assert_eq!(n.extra.get("ssh.user").map(String::as_str), Some("gangway"));
        assert_eq!(n.extra.get("market").map(String::as_str), Some("spot"));
        // Compact placement: the physical host's block and sub-block.
        assert_eq!(n.topology.len(), 2, "{n:?}");
    }
    let base = prefix("gang");
    let vms = fake.named("instances", &base);
    assert_eq!(vms.len(), 2, "{vms:#?}");
    for vm in &vms {
        assert_eq!(vm["labels"]["gangway-cluster"], base.as_str(), "{vm}");
        assert_eq!(vm["labels"]["gangway-owner"], "tester", "{vm}");
        assert_eq!(vm["scheduling"]["provisioningModel"], "SPOT", "{vm}");
        assert_eq!(vm["scheduling"]["onHostMaintenance"], "TERMINATE", "{vm}");
        assert_eq!(
            vm["scheduling"]["preemptionNoticeDuration"]["seconds"], "60",
            "{vm}"
        );
        assert!(
            vm["resourcePolicies"]
                .to_string()
                .contains(&format!("{base}-compact")),
            "{vm}"
        );
        assert!(vm["tags"]["items"].to_string().contains(&base), "{vm}");
        let keys = vm["metadata"]["items"].to_string();
        assert!(keys.contains("gangway:ssh-ed25519"), "{keys}");
    }
    let pol = fake.named("resourcePolicies", &format!("{base}-compact"));
    assert_eq!(pol.len(), 1, "{:#}", fake.state());
    assert_eq!(pol[0]["groupPlacementPolicy"]["collocation"], "COLLOCATED");
    assert_eq!(pol[0]["groupPlacementPolicy"]["vmCount"], 2);
    let fw = fake.named("firewalls", &base);
    assert_eq!(fw.len(), 2, "{fw:#?}");
    assert!(fw
        .iter()
        .any(|f| f["sourceRanges"].to_string().contains("192.0.2.0/24")));
    // The owner sweep finds it by its exact name, with owner and user.
    assert_eq!(
        swept(&p, "gang", "tester").await,
        Some(TaggedCluster {
            name: r.cluster.clone(),
            owner: "tester".into(),
            user: Some("test-user".into()),
        })
    );
    assert_eq!(vms[0]["labels"]["gangway-user"], "test-user");
    // Relaunch: the same two VMs, nothing new.
    let again = p.launch(&r).await.expect("relaunch");
    let mut a: Vec<_> = nodes.iter().map(|n| n.id.0.clone()).collect();
    let mut b: Vec<_> = again.iter().map(|n| n.id.0.clone()).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert_eq!(fake.named("instances", &base).len(), 2);
    // Teardown leaves nothing of the cluster.
    p.terminate(&r.cluster).await.expect("terminate");
    p.terminate(&r.cluster)
        .await
        .expect("terminate is idempotent");
    assert!(fake.named("instances", &base).is_empty());
    assert!(fake.named("resourcePolicies", &base).is_empty());
    assert!(fake.named("firewalls", &base).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stockout_is_capacity_and_the_next_zone_works() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    fake.call(
        "POST",
        "/_gangway/capacity",
        &serde_json::json!({"zone": "us-central1-b", "machineType": "a2-highgpu-2g", "available": 0}).to_string(),
    );
    let r = req("stock", "us-central1-b", "a2-highgpu-2g", 2, false);
    let e = p.launch(&r).await.expect_err("no capacity");
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"), "{e}");
    assert!(e.location.contains("us-central1-b"), "{e}");
    assert!(fake.named("instances", &prefix("stock")).is_empty());
    let r2 = req("stock", "us-central1-c", "a2-highgpu-2g", 2, false);
    let nodes = p.launch(&r2).await.expect("the next zone");
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n.placement.zone == "us-central1-c"));
    // On-demand VMs stop (disks kept) and start again.
    p.stop(&r2.cluster).await.expect("stop");
    let stopped = p.describe(&r2.cluster).await.unwrap();
    assert!(
        stopped.len() == 2 && stopped.iter().all(|n| n.state == NodeState::Stopped),
        "{stopped:?}"
    );
    let started = p.start(&r2.cluster, None).await.expect("start");
    assert!(
        started.len() == 2 && started.iter().all(|n| n.state == NodeState::Running),
        "{started:?}"
    );
    p.terminate(&r2.cluster).await.unwrap();
    assert!(fake.named("instances", &prefix("stock")).is_empty());
    assert!(fake.named("firewalls", &prefix("stock")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_throttling_are_told_apart() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let base = prefix("quota");
    fake.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "instances.bulkInsert", "contains": base, "operation_error": "QUOTA_EXCEEDED"}).to_string(),
    );
    let r = req("quota", "us-central1-f", "a2-highgpu-1g", 1, false);
    let e = p.launch(&r).await.expect_err("over quota");
    assert_eq!(e.kind, ErrorKind::Quota, "{e}");
    fake.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "instances.bulkInsert", "contains": base, "http_status": 429, "times": 5}).to_string(),
    );
    let e = p.launch(&r).await.expect_err("throttled");
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    fake.call("DELETE", "/_gangway/faults", "");
    // The same placement again is a new request, not a replay of the
    // failed one: it creates the VM.
    let nodes = p.launch(&r).await.expect("launch once the quota is there");
    assert_eq!(nodes.len(), 1);
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &base).is_empty());
    assert!(fake.named("firewalls", &base).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_spot_vm_is_reported_as_preempted() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let r = req("pre", "us-east1-c", "a2-highgpu-1g", 2, true);
    let nodes = p.launch(&r).await.expect("launch");
    let victim = nodes[1].id.0.clone();
    fake.call(
        "POST",
        "/_gangway/preempt",
        &serde_json::json!({"instance": victim}).to_string(),
    );
    let seen = p.describe(&r.cluster).await.unwrap();
    let v = seen
        .iter()
        .find(|n| n.id.0 == victim)
        .expect("still listed (STOP)");
    assert!(matches!(v.state, NodeState::Preempted { .. }), "{v:?}");
    let other = seen.iter().find(|n| n.id.0 != victim).unwrap();
    assert_eq!(other.state, NodeState::Running);
    // A relaunch replaces the preempted VM (a new VM, perhaps under the
    // same name) instead of starting it again.
    let victim_ip = v.private_ip.clone();
    let again = p.launch(&r).await.expect("relaunch");
    assert_eq!(again.len(), 2);
    assert!(
        again
            .iter()
            .all(|n| n.private_ip != victim_ip && n.state == NodeState::Running),
        "{again:?}"
    );
    assert_eq!(fake.named("instances", &prefix("pre")).len(), 2);
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &prefix("pre")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_vm_deleted_on_preemption_is_found_by_its_zone_operation() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut r = req("predel", "europe-west4-b", "a2-highgpu-1g", 2, true);
    r.provider_config = Some(serde_json::json!({"termination_action": "DELETE"}));
    let nodes = p.launch(&r).await.expect("launch");
    let victim = nodes[0].id.0.clone();
    let vm = fake.named("instances", &victim);
    assert_eq!(
        vm[0]["scheduling"]["instanceTerminationAction"], "DELETE",
        "{vm:?}"
    );
    // Nothing missing, nothing preempted: describe lists the two VMs.
    assert!(p
        .describe(&r.cluster)
        .await
        .unwrap()
        .iter()
        .all(|n| n.state == NodeState::Running));
    fake.call(
        "POST",
        "/_gangway/preempt",
        &serde_json::json!({"instance": victim}).to_string(),
    );
    assert!(
        fake.named("instances", &victim).is_empty(),
        "GCE deleted it"
    );
    let seen = p.describe(&r.cluster).await.unwrap();
    let v = seen
        .iter()
        .find(|n| n.id.0 == victim)
        .unwrap_or_else(|| panic!("the deleted VM is reported: {seen:?}"));
    match &v.state {
        NodeState::Preempted { reason } => assert!(reason.contains("deleted"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(v.placement.zone, "europe-west4-b");
    // The relaunch creates a new VM (perhaps under the same name): the old
    // operation names the old VM's id, so nothing is preempted now.
    let again = p.launch(&r).await.expect("relaunch");
    assert_eq!(again.len(), 2);
    let seen = p.describe(&r.cluster).await.unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter().all(|n| n.state == NodeState::Running),
        "{seen:?}"
    );
    // A VM deleted by someone else (no preemption) is simply gone.
    let other = again[1].id.0.clone();
    delete_behind_our_back(fake, "europe-west4-b", std::slice::from_ref(&other)).await;
    let seen = p.describe(&r.cluster).await.unwrap();
    assert!(seen.iter().all(|n| n.id.0 != other), "{seen:?}");
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &prefix("predel")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_ip_vms_are_reached_inside_after_a_stop_and_start_too() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut r = req("inner", "europe-west4-a", "a2-highgpu-1g", 1, false);
    r.provider_config = Some(serde_json::json!({"use_internal_ips": true}));
    let host = |n: &gangway_provider::Node| n.extra.get("ssh.host").cloned();
    let nodes = p.launch(&r).await.expect("launch");
    assert_eq!(nodes[0].public_ip, None, "no external address asked for");
    assert_eq!(host(&nodes[0]).as_ref(), Some(&nodes[0].private_ip));
    p.stop(&r.cluster).await.expect("stop");
    let started = p.start(&r.cluster, None).await.expect("start");
    assert_eq!(started.len(), 1);
    assert_eq!(
        host(&started[0]).as_ref(),
        Some(&started[0].private_ip),
        "described nodes keep the launch's choice: {started:?}"
    );
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &prefix("inner")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sweep_finds_rules_and_a_policy_left_without_vms() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let r = req("husk", "us-central1-b", "a2-highgpu-1g", 2, true);
    p.launch(&r).await.expect("launch");
    let base = prefix("husk");
    assert_eq!(fake.named("resourcePolicies", &base).len(), 1);
    // The VMs go (a teardown killed half-way), and so does this machine's
    // record of the cluster (another machine, or a lost state directory).
    let vms: Vec<String> = fake
        .named("instances", &base)
        .iter()
        .map(|vm| vm["name"].as_str().unwrap().to_string())
        .collect();
    delete_behind_our_back(fake, "us-central1-b", &vms).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let q = provider(elsewhere.path());
    let found = swept(&q, "husk", "tester").await;
    assert_eq!(
        found.as_ref().and_then(|t| t.user.as_deref()),
        Some("test-user"),
        "from the rules' description: {found:?}"
    );
    q.terminate(&r.cluster).await.expect("terminate");
    assert!(fake.named("firewalls", &base).is_empty());
    assert!(
        fake.named("resourcePolicies", &base).is_empty(),
        "found in its region without a record: {:#}",
        fake.state()["resourcePolicies"]
    );
    assert_eq!(swept(&q, "husk", "tester").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_n1_t4_gang_launches_without_a_placement_policy() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut r = req("t4gang", "us-central1-c", "n1-standard-8", 2, false);
    r.accelerator = Some(("T4".into(), 1.0));
    // GCE refuses compact placement for N1 (the fake too, as GCE does):
    // none is asked for, even where the task asks for one.
    r.provider_config = Some(serde_json::json!({"placement_policy": true}));
    let nodes = p.launch(&r).await.expect("launch");
    assert_eq!(nodes.len(), 2);
    let base = prefix("t4gang");
    assert!(fake.named("resourcePolicies", &base).is_empty());
    for vm in fake.named("instances", &base) {
        assert!(vm.get("resourcePolicies").is_none(), "{vm}");
        assert!(
            vm["guestAccelerators"]
                .to_string()
                .contains("nvidia-tesla-t4"),
            "{vm}"
        );
    }
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &base).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_refuses_compact_placement_for_n1_as_gce_does() {
    let Some(fake) = fake() else { return };
    let region = "us-east1";
    fake.call(
        "POST",
        &format!("/compute/v1/projects/gangway-test/regions/{region}/resourcePolicies"),
        &serde_json::json!({"name": "gw-n1-refused-compact",
            "groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": 2}})
        .to_string(),
    );
    let answer = fake.call(
        "POST",
        "/compute/v1/projects/gangway-test/zones/us-east1-c/instances/bulkInsert",
        &serde_json::json!({"count": "2", "minCount": "2", "namePattern": "gw-n1-refused-##",
            "instanceProperties": {"machineType": "n1-standard-8",
                "disks": [{"boot": true, "initializeParams": {"sourceImage": "x"}}],
                "guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}],
                "scheduling": {"onHostMaintenance": "TERMINATE"},
                "resourcePolicies": ["gw-n1-refused-compact"]}})
        .to_string(),
    );
    assert_eq!(answer["error"]["code"], 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("n1-standard-8"),
        "{answer}"
    );
    assert!(fake.named("instances", "gw-n1-refused-").is_empty());
    fake.call(
        "DELETE",
        &format!(
            "/compute/v1/projects/gangway-test/regions/{region}/resourcePolicies/gw-n1-refused-compact"
        ),
        "",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_placement_policy_is_retried_without_it() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    // GCE refuses the gang with its policy (whatever it says why): it is
    // asked for again without one, and the launch goes on.
    let base = prefix("refused");
    fake.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "instances.bulkInsert", "contains": [base.clone(), "resourcePolicies"],
            "http_status": 400, "times": -1,
            "message": "Invalid resource usage: 'Placement policy is not applicable here.'"})
        .to_string(),
    );
    let r = req("refused", "us-central1-f", "a2-highgpu-1g", 2, true);
    let nodes = p.launch(&r).await.expect("launched without the policy");
    assert_eq!(nodes.len(), 2);
    for vm in fake.named("instances", &base) {
        assert!(vm.get("resourcePolicies").is_none(), "{vm}");
    }
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("resourcePolicies", &base).is_empty());
    // A policy GCE will not even create: the same.
    let base = prefix("nopolicy");
    fake.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "resourcePolicies.insert", "contains": base.clone(),
            "http_status": 400, "times": -1})
        .to_string(),
    );
    let r = req("nopolicy", "us-central1-f", "a2-highgpu-1g", 2, true);
    assert_eq!(p.launch(&r).await.expect("launched").len(), 2);
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("instances", &base).is_empty());
    // A stockout with the policy is still capacity: the plan moves on.
    let base = prefix("policystock");
    fake.call(
        "POST",
        "/_gangway/fault",
        &serde_json::json!({"method": "instances.bulkInsert", "contains": [base.clone(), "resourcePolicies"],
            "operation_error": "ZONE_RESOURCE_POOL_EXHAUSTED", "times": 1})
        .to_string(),
    );
    let r = req("policystock", "us-central1-f", "a2-highgpu-1g", 2, true);
    assert_eq!(p.launch(&r).await.unwrap_err().kind, ErrorKind::Capacity);
    p.terminate(&r.cluster).await.unwrap();
    assert!(fake.named("resourcePolicies", &base).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_of_one_cluster_name_never_touch_each_others() {
    let Some(fake) = fake() else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = provider(da.path());
    let key = db.path().join("id.pub");
    std::fs::copy(da.path().join("id.pub"), &key).unwrap();
    let b = GcpProvider::new(db.path().join("gcp"), "gw-00000000000000bb", key);
    let r = req("twin", "us-central1-c", "a2-highgpu-1g", 1, true);
    a.launch(&r).await.expect("launch a");
    b.launch(&r).await.expect("launch b");
    assert!(swept(&a, "twin", "tester").await.is_some());
    let theirs = swept(&a, "twin", "gw-00000000000000bb").await;
    assert_eq!(theirs.map(|t| t.user), Some(None), "no user label given");
    a.terminate(&r.cluster).await.expect("terminate a");
    let b_base = gangway_gcp::Names::new("twin", "gw-00000000000000bb").base;
    assert!(fake.named("instances", &prefix("twin")).is_empty());
    assert_eq!(fake.named("instances", &b_base).len(), 1);
    assert_eq!(fake.named("firewalls", &b_base).len(), 2);
    b.terminate(&r.cluster).await.expect("terminate b");
    assert!(fake.named("instances", &b_base).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_recorded_before_owner_ids_is_still_found_by_its_user_label() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    // An earlier version labelled with the user's name.
    let old = provider(dir.path());
    let r = req("before-ids", "us-east1-c", "a2-highgpu-1g", 1, true);
    old.launch(&r).await.expect("launch");
    let key = dir.path().join("id.pub");
    let id_only = GcpProvider::new(dir.path().join("gcp"), "gw-00000000000000cc", key.clone());
    assert!(id_only.describe(&r.cluster).await.unwrap().is_empty());
    let upgraded = GcpProvider::new(dir.path().join("gcp"), "gw-00000000000000cc", key)
        .with_legacy_owner("tester");
    assert_eq!(upgraded.describe(&r.cluster).await.unwrap().len(), 1);
    upgraded.terminate(&r.cluster).await.expect("terminate");
    assert!(fake.named("instances", &prefix("before-ids")).is_empty());
    assert!(fake.named("firewalls", &prefix("before-ids")).is_empty());
}
