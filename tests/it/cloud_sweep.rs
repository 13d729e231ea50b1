//! The fault sweep against the clouds' emulators (the local cloud's is in
//! `reliability.rs`): gangway is killed with SIGKILL at every point where
//! it talks to EC2 (the emulator, `tests/emulators/ec2`), Compute Engine
//! (the fake, `tests/emulators/gce`) or Azure Resource Manager (the fake,
//! `tests/emulators/azure`), as each request arrives and as it returns. The emulator itself numbers the requests and kills
//! (`/_gangway/kill`: request k's arrival is kill point 2k-1, its return,
//! the work done but the answer not sent, 2k), so a point is exactly one
//! request of the run. After each kill the test does what a user would do
//! next, `gangway launch` of the same name again and `gangway down --all`,
//! and asks the emulator, not gangway, what is left: nothing, and never
//! more than one cluster's instances for the name.
//!
//! The sweep covers `launch --provision-only` of 2 nodes and its `down`:
//! every kill point with `GANGWAY_FAULT_SWEEP=full` (`bench/fault_sweep.sh`),
//! a subset otherwise. A failing `TerminateInstances` / `instances.delete`
//! / resource group delete (once: retried inside gangway; always: the row
//! stays `TERMINATING` until a `down` succeeds) is tested here too. Each
//! cloud's part is built with its feature.

use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "azure")]
use crate::azure_fake::AzureFake;
#[cfg(feature = "aws")]
use crate::ec2_emulator::Ec2Emulator;
#[cfg(feature = "gcp")]
use crate::gce_fake::GceFake;
use serde_json::Value;

use crate::common::{command_in, json_doc, parts, Running, TestHome};

/// Instances one cluster of the sweep has.
const NODES: usize = 2;

/// One cloud's emulator, as the sweep sees it.
trait Cloud: Sync {
    /// `EC2`, `GCE` or `ARM`, for messages.
    fn name(&self) -> &'static str;
    /// The kill points' scope of a home's gangway (EC2: the access key id
    /// it signs with; GCE: one fake per test, the whole of it).
    fn scope(&self, home: &TestHome) -> String;
    /// gangway in `home`, pointed at the emulator, signing as `scope`.
    fn run(&self, home: &TestHome, scope: &str, args: &[&str]) -> Output;
    /// The sweep's 2-node task, written into `home`.
    fn task(&self, home: &TestHome) -> String;
    fn kill_at(&self, scope: &str, at: u64, marker: &str);
    fn kill_state(&self, scope: &str) -> Value;
    fn kill_off(&self, scope: &str);
    /// Instances of `cluster` that exist (not terminated), counted by the
    /// emulator; `Err` with the emulator's answer when it has none.
    fn count(&self, cluster: &str) -> Result<usize, String>;
    /// The same, failing the test when the emulator cannot say.
    fn instances(&self, cluster: &str) -> usize {
        self.count(cluster)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name()))
    }
    /// What the emulator still holds for `cluster`, whoever's it is.
    fn leftovers(&self, cluster: &str) -> Vec<String>;
}

#[cfg(feature = "aws")]
struct Ec2 {
    emu: &'static Ec2Emulator,
}

/// The sweep's region: its tasks are pinned there.
#[cfg(feature = "aws")]
const EC2_REGION: &str = "us-east-1";

#[cfg(feature = "aws")]
impl Ec2 {
    /// `item`s of the EC2 answer to `action` for resources tagged with the
    /// cluster (instances: in a state that is not `terminated`).
    fn tagged(&self, action: &str, item: &str, cluster: &str) -> Vec<String> {
        self.try_tagged(action, item, cluster)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_tagged(&self, action: &str, item: &str, cluster: &str) -> Result<Vec<String>, String> {
        let mut params = vec![
            ("Action", action),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", cluster),
        ];
        if action == "DescribeInstances" {
            params.extend([
                ("Filter.2.Name", "instance-state-name"),
                ("Filter.2.Value.1", "pending"),
                ("Filter.2.Value.2", "running"),
                ("Filter.2.Value.3", "stopping"),
                ("Filter.2.Value.4", "stopped"),
                ("Filter.2.Value.5", "shutting-down"),
            ]);
        }
        let (status, xml) = self.emu.call(EC2_REGION, &params);
        if status != 200 {
            return Err(format!("{action}: HTTP {status}: {xml}"));
        }
        let open = format!("<{item}>");
        let mut found: Vec<String> = xml
            .split(&open)
            .skip(1)
            .map(|piece| piece.split('<').next().unwrap_or_default().to_string())
            .filter(|v| action != "DescribeInstances" || v.starts_with("i-"))
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }
}

#[cfg(feature = "aws")]
impl Cloud for Ec2 {
    fn name(&self) -> &'static str {
        "EC2"
    }

    fn scope(&self, home: &TestHome) -> String {
        format!("AKSWEEP{}", home.marker.to_ascii_uppercase())
    }

    fn run(&self, home: &TestHome, scope: &str, args: &[&str]) -> Output {
        let mut c = command_in(home.path());
        c.envs(self.emu.env_as(scope))
            .env("USER", format!("it-{}", home.marker))
            .env("GANGWAY_AWS_SSH_CIDR", "198.51.100.0/24")
            .args(args);
        Running::start(c).wait()
    }

    fn task(&self, home: &TestHome) -> String {
        home.file(
            "sweep-ec2.yaml",
            &format!(
                "num_nodes: {NODES}\nresources:\n  infra: aws/{EC2_REGION}\n  accelerators: A100:8\n  use_spot: true\n\
                 run: echo hi\nconfig:\n  aws:\n    ami_name: 'Deep Learning AMI Ubuntu*'\n    ami_owner: '898082745236'\n    poll_ms: 20\n    boot_timeout_s: 30\n"
            ),
        )
    }

    fn kill_at(&self, scope: &str, at: u64, marker: &str) {
        self.emu.kill_at(scope, at, marker);
    }

    fn kill_state(&self, scope: &str) -> Value {
        self.emu.kill_state(scope)
    }

    fn kill_off(&self, scope: &str) {
        self.emu.kill_off(scope);
    }

    fn count(&self, cluster: &str) -> Result<usize, String> {
        self.try_tagged("DescribeInstances", "instanceId", cluster)
            .map(|i| i.len())
    }

    fn leftovers(&self, cluster: &str) -> Vec<String> {
        [
            ("DescribeInstances", "instanceId"),
            ("DescribeSecurityGroups", "groupId"),
            ("DescribePlacementGroups", "groupName"),
            ("DescribeKeyPairs", "keyName"),
        ]
        .iter()
        .flat_map(|(action, item)| {
            self.tagged(action, item, cluster)
                .into_iter()
                .map(move |v| format!("{action} {v}"))
        })
        .collect()
    }
}

#[cfg(feature = "gcp")]
struct Gce {
    fake: GceFake,
}

#[cfg(feature = "gcp")]
impl Gce {
    /// Names of what the fake holds of `kind` for the cluster (names start
    /// `gw-<cluster>-`, whoever's it is).
    fn named(&self, kind: &str, cluster: &str) -> Vec<Value> {
        self.fake.named(kind, &format!("gw-{cluster}-"))
    }
}

#[cfg(feature = "gcp")]
impl Cloud for Gce {
    fn name(&self) -> &'static str {
        "GCE"
    }

    fn scope(&self, _home: &TestHome) -> String {
        String::new()
    }

    fn run(&self, home: &TestHome, _scope: &str, args: &[&str]) -> Output {
        let mut c = command_in(home.path());
        c.args(args)
            .env("GANGWAY_GCP_ENDPOINT", &self.fake.url)
            .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
            .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
        Running::start(c).wait()
    }

    fn task(&self, home: &TestHome) -> String {
        // A100s on a2 hosts: a compact placement policy, two firewall
        // rules and a bulkInsert of the gang.
        home.file(
            "sweep-gce.yaml",
            &format!(
                "num_nodes: {NODES}\nresources:\n  infra: gcp/us-central1\n  accelerators: A100:1\n  use_spot: true\nrun: \"true\"\n"
            ),
        )
    }

    fn kill_at(&self, _scope: &str, at: u64, marker: &str) {
        self.fake.kill_at(at, marker);
    }

    fn kill_state(&self, _scope: &str) -> Value {
        self.fake.kill_state()
    }

    fn kill_off(&self, _scope: &str) {
        self.fake.kill_off();
    }

    fn count(&self, cluster: &str) -> Result<usize, String> {
        // A VM exists until its delete is done; a stopped one still counts.
        Ok(self.named("instances", cluster).len())
    }

    fn leftovers(&self, cluster: &str) -> Vec<String> {
        let mut names: Vec<String> = ["instances", "resourcePolicies", "firewalls"]
            .iter()
            .flat_map(|kind| {
                self.named(kind, cluster)
                    .into_iter()
                    .map(move |v| format!("{kind}/{}", v["name"].as_str().unwrap_or_default()))
            })
            .collect();
        names.sort();
        names
    }
}

/// The Azure sweep's subscription (one fake per test).
#[cfg(feature = "azure")]
const ARM_SUBSCRIPTION: &str = "5e1ec7ed-0000-4000-8000-00000000a2e0";

#[cfg(feature = "azure")]
struct Arm {
    fake: AzureFake,
}

#[cfg(feature = "azure")]
impl Arm {
    /// What the fake holds in the cluster's resource groups (named
    /// `gw-<cluster>-<location>-<owner hash>`, whoever's it is): the groups
    /// themselves (`resourceGroups/NAME`) and `KIND/NAME` of what is in
    /// them, or only their VMs.
    fn held(&self, cluster: &str, vms_only: bool) -> Result<Vec<String>, String> {
        let state = self.fake.call("GET", "/_fake/state", "");
        let (Some(groups), Some(resources)) = (
            state["resource_groups"].as_array(),
            state["resources"].as_array(),
        ) else {
            return Err(format!("no state: {state}"));
        };
        let prefix = format!("gw-{cluster}-");
        let ours = |id: &str| {
            id.to_ascii_lowercase()
                .contains(&format!("/resourcegroups/{prefix}"))
        };
        let mut out: Vec<String> = resources
            .iter()
            .filter(|r| !vms_only || r["kind"] == "vm")
            .filter(|r| ours(r["id"].as_str().unwrap_or_default()))
            .map(|r| {
                let id = r["id"].as_str().unwrap_or_default();
                format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or_default(),
                    id.rsplit('/').next().unwrap_or(id)
                )
            })
            .collect();
        if !vms_only {
            out.extend(
                groups
                    .iter()
                    .filter_map(|g| g["name"].as_str())
                    .filter(|n| n.to_ascii_lowercase().starts_with(&prefix))
                    .map(|n| format!("resourceGroups/{n}")),
            );
        }
        out.sort();
        Ok(out)
    }

    /// A fault rule; its id.
    fn fault(&self, rule: Value) -> u64 {
        let added = self.fake.call("POST", "/_fake/faults", &rule.to_string());
        added["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("fault rule {rule}: {added}"))
    }
}

#[cfg(feature = "azure")]
impl Cloud for Arm {
    fn name(&self) -> &'static str {
        "ARM"
    }

    fn scope(&self, _home: &TestHome) -> String {
        String::new()
    }

    fn run(&self, home: &TestHome, _scope: &str, args: &[&str]) -> Output {
        let mut c = command_in(home.path());
        c.args(args)
            .env("GANGWAY_AZURE_ENDPOINT", &self.fake.url)
            .env("AZURE_SUBSCRIPTION_ID", ARM_SUBSCRIPTION)
            .env("AZURE_CONFIG_DIR", home.path().join("no-az"))
            .env("GANGWAY_AZURE_SSH_CIDR", "192.0.2.0/24");
        for v in ["AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"] {
            c.env_remove(v);
        }
        Running::start(c).wait()
    }

    fn task(&self, home: &TestHome) -> String {
        // A spot gang: resource group, security group, network, placement
        // group, then per VM a public address, a NIC and the VM.
        home.file(
            "sweep-arm.yaml",
            &format!(
                "num_nodes: {NODES}\nresources:\n  infra: azure/eastus\n  accelerators: A100-80GB:8\n  use_spot: true\nrun: \"true\"\n"
            ),
        )
    }

    fn kill_at(&self, _scope: &str, at: u64, marker: &str) {
        self.fake.kill_at(at, marker);
    }

    fn kill_state(&self, _scope: &str) -> Value {
        self.fake.kill_state()
    }

    fn kill_off(&self, _scope: &str) {
        self.fake.kill_off();
    }

    fn count(&self, cluster: &str) -> Result<usize, String> {
        // A VM exists until its delete (or its group's) is done.
        self.held(cluster, true).map(|v| v.len())
    }

    fn leftovers(&self, cluster: &str) -> Vec<String> {
        self.held(cluster, false)
            .unwrap_or_else(|e| panic!("ARM: {e}"))
    }
}

/// Kill points to sweep out of `total`: all of them with
/// `GANGWAY_FAULT_SWEEP=full` (bench/fault_sweep.sh), else the first
/// `first`, every `stride`-th and the last two, to keep the suite quick.
fn kill_points(total: u64, first: u64, stride: u64) -> Vec<u64> {
    let full = std::env::var("GANGWAY_FAULT_SWEEP").is_ok_and(|v| v == "full");
    (1..=total)
        .filter(|n| full || *n <= first || n % stride == 0 || *n + 2 > total)
        .collect()
}

/// Sets its flag when dropped, also while a panic unwinds.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The most instances of `cluster` the emulator held at once while `f`
/// ran (sampled every 100 ms), and what `f` returned.
fn watching<T>(cloud: &dyn Cloud, cluster: &str, f: impl FnOnce() -> T) -> (usize, T) {
    let done = AtomicBool::new(false);
    let most = AtomicUsize::new(0);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                // moto answers a rare 500 to a read racing a write: that
                // sample is skipped (gangway retries such an answer too).
                if let Ok(n) = cloud.count(cluster) {
                    most.fetch_max(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let _done = SetOnDrop(&done);
        f()
    });
    most.fetch_max(cloud.instances(cluster), Ordering::Relaxed);
    (most.into_inner(), out)
}

/// The kill that fired in `scope` (null when none did), once the emulator
/// recorded whom it killed (the client dies before that).
fn kill_fired(cloud: &dyn Cloud, scope: &str) -> Value {
    crate::common::wait_for("the kill to be recorded", Duration::from_secs(20), || {
        let fired = cloud.kill_state(scope)["fired"].clone();
        if fired.is_null() || fired["killed"].is_array() {
            Ok(fired)
        } else {
            Err(fired.to_string())
        }
    })
}

/// The kill points of one `launch --provision-only` of 2 nodes (the first
/// figure) and of it and its `down` (the second), counted by the emulator.
fn baseline(cloud: &dyn Cloud, cluster: &str) -> (u64, u64) {
    let home = TestHome::new();
    let scope = cloud.scope(&home);
    let task = cloud.task(&home);
    cloud.kill_at(&scope, 0, "");
    let (code, out, err) = parts(&cloud.run(
        &home,
        &scope,
        &["launch", "--provision-only", "-y", "-c", cluster, &task],
    ));
    assert_eq!(code, 0, "{} baseline launch:\n{out}\n{err}", cloud.name());
    let launched = cloud.kill_state(&scope)["points"].as_u64().unwrap();
    let made = cloud.leftovers(cluster);
    assert_eq!(
        cloud.instances(cluster),
        NODES,
        "{} baseline: {made:?}",
        cloud.name()
    );
    let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
    assert_eq!(code, 0, "{} baseline down:\n{out}\n{err}", cloud.name());
    let total = cloud.kill_state(&scope)["points"].as_u64().unwrap();
    cloud.kill_off(&scope);
    assert_eq!(
        cloud.leftovers(cluster),
        Vec::<String>::new(),
        "{} baseline",
        cloud.name()
    );
    eprintln!(
        "fault sweep ({}): baseline: launch {launched} kill points, with down {total}; it made {made:?}",
        cloud.name()
    );
    (launched, total)
}

/// The sweep: for each kill point, a fresh home, the kill armed, `launch`
/// (and `down` when the point is in the teardown); then what a user does
/// next, `launch` of the same name again and `down --all`; nothing may be
/// left, and at no time more than one cluster's instances.
fn sweep(cloud: &dyn Cloud, cluster: &str, first: u64, stride: u64) {
    let started = Instant::now();
    let (_, total) = baseline(cloud, cluster);
    assert!(total >= 8, "{}: {total} kill points", cloud.name());
    let points = kill_points(total, first, stride);
    let mut swept = 0;
    let mut missed = Vec::new();
    // Relaunches that were told to finish a killed teardown first.
    let finished = std::cell::Cell::new(0);
    for n in points {
        let home = TestHome::new();
        let scope = cloud.scope(&home);
        let task = cloud.task(&home);
        let marker = format!("GANGWAY_HOME={}", home.path().display());
        let launch = [
            "launch",
            "--provision-only",
            "-y",
            "-c",
            cluster,
            task.as_str(),
        ];
        cloud.kill_at(&scope, n, &marker);
        let (most, (what, fired)) = watching(cloud, cluster, || {
            let (code, out, err) = parts(&cloud.run(&home, &scope, &launch));
            let mut what = format!("launch exit {code}\n{out}\n{err}");
            let mut fired = kill_fired(cloud, &scope);
            let mut killed_code = code;
            if fired.is_null() {
                assert_eq!(code, 0, "{} kill point {n}: {what}", cloud.name());
                let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
                what.push_str(&format!("\ndown exit {code}\n{out}\n{err}"));
                fired = kill_fired(cloud, &scope);
                killed_code = code;
                if fired.is_null() {
                    assert_eq!(code, 0, "{} kill point {n}: {what}", cloud.name());
                }
            }
            cloud.kill_off(&scope);
            if !fired.is_null() {
                // Killed by the signal: no exit code.
                assert_eq!(killed_code, -1, "{} kill point {n}: {what}", cloud.name());
                assert!(
                    fired["killed"].as_array().is_some_and(|k| !k.is_empty()),
                    "{} kill point {n} killed nothing: {fired}",
                    cloud.name()
                );
            }
            let what = format!(
                "{} kill point {n} of {total} ({fired}): {what}",
                cloud.name()
            );
            // What a user does next: the same launch again. It reuses or
            // replaces what the killed one left, never adds to it.
            let (mut code, mut out, mut err) = parts(&cloud.run(&home, &scope, &launch));
            if code == 2
                && err.contains(&format!("cluster '{cluster}' is being torn down"))
                && err.contains(&format!("run `gangway down {cluster}` to finish"))
            {
                // A killed `down` left its row TERMINATING, and launch says
                // to finish that first (exit 2): the user does as told.
                let (c, o, e) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
                assert_eq!(
                    c, 0,
                    "{what}\nrelaunch:\n{out}\n{err}\ndown as told:\n{o}\n{e}"
                );
                finished.set(finished.get() + 1);
                (code, out, err) = parts(&cloud.run(&home, &scope, &launch));
            }
            assert_eq!(code, 0, "{what}\nrelaunch:\n{out}\n{err}");
            assert_eq!(
                cloud.instances(cluster),
                NODES,
                "{what}\nafter the relaunch: {:?}",
                cloud.leftovers(cluster)
            );
            (what, fired)
        });
        assert!(
            most <= NODES,
            "{what}\n{most} instances of '{cluster}' at once: two clusters for one name"
        );
        let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", "--all", "-y"]));
        assert_eq!(code, 0, "{what}\ndown --all:\n{out}\n{err}");
        assert_eq!(
            cloud.leftovers(cluster),
            Vec::<String>::new(),
            "{what}\nleft in the emulator after down --all"
        );
        let (code, out, err) = parts(&cloud.run(&home, &scope, &["status", "-o", "json"]));
        assert_eq!(code, 0, "{what}\n{err}");
        assert_eq!(
            json_doc(&out)["clusters"],
            serde_json::json!([]),
            "{what}\nrows left"
        );
        if fired.is_null() {
            missed.push(n);
        } else {
            swept += 1;
        }
    }
    // A run may make a request or two fewer than the baseline (a poll that
    // found its answer sooner): those points were not reached.
    assert!(
        missed.iter().all(|n| n + 4 > total),
        "{}: kill points {missed:?} of {total} were never reached",
        cloud.name()
    );
    eprintln!(
        "fault sweep ({}): kill points swept: {swept} of {total}; resources leaked: 0 \
         ({} relaunch(es) told to finish a killed down first; {} s)",
        cloud.name(),
        finished.get(),
        started.elapsed().as_secs()
    );
}

#[cfg(feature = "aws")]
#[test]
fn the_fault_sweep_on_ec2_kills_at_every_request_and_nothing_leaks() {
    let Some(emu) = Ec2Emulator::shared() else {
        return;
    };
    sweep(&Ec2 { emu }, "sweep-ec2", 4, 6);
}

#[cfg(feature = "gcp")]
#[test]
fn the_fault_sweep_on_gce_kills_at_every_request_and_nothing_leaks() {
    let Some(fake) = GceFake::start() else { return };
    sweep(&Gce { fake }, "sweep-gce", 4, 8);
}

#[cfg(feature = "azure")]
#[test]
fn the_fault_sweep_on_arm_kills_at_every_request_and_nothing_leaks() {
    let Some(fake) = AzureFake::start() else {
        return;
    };
    let arm = Arm { fake };
    sweep(&arm, "sweep-arm", 4, 9);
    let v = arm.fake.violations();
    assert_eq!(v["count"], 0, "requests broke the API specification: {v:#}");
    if let Err(left) = arm.fake.leak_check(ARM_SUBSCRIPTION) {
        panic!("the sweep left something behind:\n{left}");
    }
}

/// `status NAME -o json`'s cluster.
fn status_of(cloud: &dyn Cloud, home: &TestHome, cluster: &str) -> Value {
    let (code, out, err) = parts(&cloud.run(home, &cloud.scope(home), &["status", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    json_doc(&out)["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == cluster).cloned())
        .unwrap_or(Value::Null)
}

/// A failing terminate: `fail_once` makes the next one fail with a
/// throttling error (gangway retries it at once and removes everything),
/// `fail_always` makes every one fail with a permission error until
/// `heal`: `down` exits 6 and the row stays `TERMINATING` with the reason,
/// the instances stay; once healed `down` removes everything.
fn failing_terminate(
    cloud: &dyn Cloud,
    cluster: &str,
    fail_once: &dyn Fn(),
    fail_always: &dyn Fn(),
    heal: &dyn Fn(),
    reason: &str,
) {
    let home = TestHome::new();
    let scope = cloud.scope(&home);
    let task = cloud.task(&home);
    let launch = [
        "launch",
        "--provision-only",
        "-y",
        "-c",
        cluster,
        task.as_str(),
    ];
    let (code, out, err) = parts(&cloud.run(&home, &scope, &launch));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(cloud.instances(cluster), NODES);

    fail_once();
    let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
    assert_eq!(code, 0, "retried inside gangway:\n{out}\n{err}");
    assert_eq!(cloud.leftovers(cluster), Vec::<String>::new());
    assert!(status_of(cloud, &home, cluster).is_null(), "no row left");

    let (code, out, err) = parts(&cloud.run(&home, &scope, &launch));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(cloud.instances(cluster), NODES);
    fail_always();
    let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
    assert_eq!(code, 6, "{out}\n{err}");
    assert!(
        err.contains(&format!("cluster '{cluster}' may still be running"))
            && err.contains(&format!("gangway down {cluster}")),
        "{err}"
    );
    let c = status_of(cloud, &home, cluster);
    assert_eq!(c["status"], "TERMINATING", "the row is kept: {c}");
    assert!(
        c["last_error"].as_str().is_some_and(|e| e.contains(reason)),
        "with the reason: {c}"
    );
    assert_eq!(cloud.instances(cluster), NODES, "still there, and known");
    heal();
    let (code, out, err) = parts(&cloud.run(&home, &scope, &["down", cluster, "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(cloud.leftovers(cluster), Vec::<String>::new());
    assert!(status_of(cloud, &home, cluster).is_null(), "no row left");
}

#[cfg(feature = "aws")]
#[test]
fn a_failing_terminate_instances_keeps_the_row_until_a_retry_removes_everything() {
    let Some(emu) = Ec2Emulator::shared() else {
        return;
    };
    let ec2 = Ec2 { emu };
    let cluster = "tfail-ec2";
    // Rules scoped to this cluster's instances: the emulator is shared.
    let ids = || ec2.tagged("DescribeInstances", "instanceId", cluster);
    let rule = std::cell::Cell::new(None);
    let fail_once = || {
        let id = emu.inject(
            "TerminateInstances",
            &[&ids()[0]],
            "RequestLimitExceeded",
            "",
            1,
        );
        rule.set(Some(id));
    };
    let fail_always = || {
        let fired = emu
            .fault_rules()
            .iter()
            .find(|r| Some(r["id"].as_u64().unwrap()) == rule.get())
            .map(|r| r["fired"].clone());
        assert_eq!(fired, Some(Value::from(1)), "the throttled call");
        let id = emu.inject(
            "TerminateInstances",
            &[&ids()[0]],
            "UnauthorizedOperation",
            "You are not authorized to perform this operation.",
            -1,
        );
        rule.set(Some(id));
    };
    let heal = || emu.remove_fault(rule.get().unwrap());
    failing_terminate(
        &ec2,
        cluster,
        &fail_once,
        &fail_always,
        &heal,
        "UnauthorizedOperation",
    );
}

#[cfg(feature = "gcp")]
#[test]
fn a_failing_instances_delete_keeps_the_row_until_a_retry_removes_everything() {
    let Some(fake) = GceFake::start() else { return };
    let gce = Gce { fake };
    let fault = |rule: Value| {
        let added = gce.fake.call("POST", "/_gangway/fault", &rule.to_string());
        assert!(added["id"].is_u64(), "{added}");
    };
    let fail_once = || {
        fault(
            serde_json::json!({"method": "instances.delete", "http_status": 429,
            "message": "Rate Limit Exceeded", "times": 1}),
        )
    };
    let fail_always = || {
        let fired = gce
            .fake
            .call("GET", "/_gangway/fired?method=instances.delete", "");
        assert_eq!(
            fired["fired"].as_array().map(Vec::len),
            Some(1),
            "the throttled call: {fired}"
        );
        fault(
            serde_json::json!({"method": "instances.delete", "http_status": 403,
            "reason": "forbidden", "times": -1,
            "message": "Required 'compute.instances.delete' permission for the instance"}),
        )
    };
    let heal = || {
        gce.fake.call("DELETE", "/_gangway/faults", "");
    };
    failing_terminate(
        &gce,
        "tfail-gce",
        &fail_once,
        &fail_always,
        &heal,
        "compute.instances.delete",
    );
}

#[cfg(feature = "azure")]
#[test]
fn a_failing_resource_group_delete_keeps_the_row_until_a_retry_removes_everything() {
    let Some(fake) = AzureFake::start() else {
        return;
    };
    let arm = Arm { fake };
    let rule = std::cell::Cell::new(0);
    let fail_once = || {
        rule.set(
            arm.fault(serde_json::json!({"error": "throttle", "method": "DELETE",
            "type": "resourceGroups", "times": 1, "retry_after": 0})),
        );
    };
    let fail_always = || {
        let fired = arm
            .fake
            .call("GET", "/_fake/fired?code=TooManyRequests", "");
        assert_eq!(
            fired["fired"].as_array().map(Vec::len),
            Some(1),
            "the throttled delete: {fired}"
        );
        arm.fake
            .call("DELETE", &format!("/_fake/faults?id={}", rule.get()), "");
        rule.set(arm.fault(serde_json::json!({"error": "AuthorizationFailed",
            "method": "DELETE", "type": "resourceGroups", "times": -1})));
    };
    let heal = || {
        arm.fake
            .call("DELETE", &format!("/_fake/faults?id={}", rule.get()), "");
    };
    failing_terminate(
        &arm,
        "tfail-arm",
        &fail_once,
        &fail_always,
        &heal,
        "AuthorizationFailed",
    );
    let v = arm.fake.violations();
    assert_eq!(v["count"], 0, "requests broke the API specification: {v:#}");
}
