//! `infra: aws` end to end through the binary: the EC2 emulator's
//! instances run on a real sshd (their public addresses are its loopback
//! addresses, their private ones another loopback block the ranks bind),
//! the key pair gangway imported is what that sshd lets in, and each
//! instance has an IMDSv2-shaped metadata service on its address
//! (tests/emulators/ec2/machines.py) that the sshd's sessions are pointed
//! at, as a node's are at 169.254.169.254. Provisioning, first contact,
//! setup, the gang, spot notices, checkpoints, recovery and teardown run as
//! one piece.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::aws::tagged_resources;
use crate::common::{command_in, json_doc, parts, wait_for, Running, TestHome};
use crate::ec2_emulator::Ec2Emulator;
use crate::spot_job::{trainer, wait_run};
use crate::sshd::Sshd;

/// The trainer's `config` section here: root logins, quick polls.
const AWS_CONFIG: &str = "  aws:\n    ssh_user: root\n    poll_ms: 50\n";

/// The region every test here launches in.
pub(crate) const REGION: &str = "us-east-1";

/// A test's gangway home, its access key (the emulator's scope for its
/// machines), and the sshds its instances run on.
pub(crate) struct Cloud {
    pub(crate) emu: &'static Ec2Emulator,
    pub(crate) home: TestHome,
    pub(crate) scope: String,
    imds_port: u16,
    /// More of the sessions' profile (e.g. a PATH with the node's tools).
    pub(crate) profile: String,
}

impl Cloud {
    /// A home whose launches run on `first`'s addresses.
    pub(crate) fn new(first: &Sshd) -> Option<Cloud> {
        let emu = Ec2Emulator::shared()?;
        let home = TestHome::new();
        let scope = format!("AK{}", home.marker.to_uppercase());
        let mut cloud = Cloud {
            emu,
            home,
            scope,
            imds_port: 0,
            profile: String::new(),
        };
        cloud.run_on(first);
        Some(cloud)
    }

    /// From now on new instances run on `sshd` (its addresses as public
    /// ones, `127.1.X.k` as private ones); running ones stay where they
    /// are. Its sessions find their instance's metadata service.
    pub(crate) fn run_on(&mut self, sshd: &Sshd) {
        let pairs: Vec<(String, String)> = sshd
            .addrs
            .iter()
            .map(|a| (a.clone(), private_of(a)))
            .collect();
        let port = self
            .emu
            .machines(&self.scope, &pairs, &sshd.authorized_keys());
        assert!(
            self.imds_port == 0 || self.imds_port == port,
            "one metadata port per scope"
        );
        self.imds_port = port;
        // Its console output shows the sshd's host keys, as cloud-init
        // prints an instance's.
        self.emu.publish_host_keys(&self.scope, &sshd.host_keys());
        // Where a node finds its metadata service: on the address its
        // session came to, as an instance does at 169.254.169.254.
        // The AWS SDKs (rclone's) find it the same way, through their own
        // variable: instance profile credentials come from there.
        sshd.session_profile(&format!(
            "set -- $SSH_CONNECTION; export GANGWAY_IMDS_ENDPOINT=\"http://$3:{port}\" \
             AWS_EC2_METADATA_SERVICE_ENDPOINT=\"http://$3:{port}/\"; set --\n{}",
            self.profile
        ));
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = command_in(self.home.path());
        c.envs(self.emu.env_as(&self.scope))
            .env("USER", "e2e")
            .env("GANGWAY_AWS_SSH_CIDR", "127.0.0.0/8")
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        parts(&Running::start(self.command(args)).wait())
    }

    fn owner(&self) -> String {
        std::fs::read_to_string(self.home.path().join("owner"))
            .expect("the owner id file")
            .trim()
            .to_string()
    }

    /// The cluster's instances as EC2 describes them, any state.
    fn instances(&self, cluster: &str) -> Vec<Instance> {
        let owner = self.owner();
        let (status, xml) = self.emu.call(
            REGION,
            &[
                ("Action", "DescribeInstances"),
                ("Filter.1.Name", "tag:gangway-cluster"),
                ("Filter.1.Value.1", cluster),
                ("Filter.2.Name", "tag:gangway-owner"),
                ("Filter.2.Value.1", &owner),
            ],
        );
        assert_eq!(status, 200, "{xml}");
        let mut ids: Vec<String> = xml
            .split("<instanceId>")
            .skip(1)
            .map(|chunk| chunk.split('<').next().unwrap_or_default().to_string())
            .collect();
        ids.dedup();
        // One instance per answer: an item's fields come before and after
        // its id, so they are read from a document with no other.
        ids.into_iter()
            .map(|id| {
                let (status, xml) = self.emu.call(
                    REGION,
                    &[("Action", "DescribeInstances"), ("InstanceId.1", &id)],
                );
                assert_eq!(status, 200, "{xml}");
                let after =
                    |open: &str, name: &str| tag(xml.split(open).nth(1).unwrap_or_default(), name);
                Instance {
                    zone: after("<placement>", "availabilityZone"),
                    public_ip: tag(&xml, "ipAddress"),
                    private_ip: tag(&xml, "privateIpAddress"),
                    state: after("<instanceState>", "name"),
                    reason: after("<stateReason>", "code"),
                    group: after("<placement>", "groupName"),
                    id,
                }
            })
            .collect()
    }

    /// What EC2 still holds for the cluster (instances not terminated,
    /// security group, placement group, key pair).
    fn left(&self, cluster: &str) -> Vec<String> {
        tagged_resources(self.emu, cluster, &self.owner())
    }
}

impl Drop for Cloud {
    /// The scope's metadata services go with the test (the emulator may
    /// serve a whole CI run). Not while panicking: the emulator may be the
    /// reason.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.emu.forget_machines(&self.scope);
        }
    }
}

/// One instance, as the test reads it from DescribeInstances.
#[derive(Debug, Clone)]
struct Instance {
    id: String,
    zone: String,
    public_ip: String,
    private_ip: String,
    state: String,
    reason: String,
    group: String,
}

/// The text of the first `<name>` element in `xml`, or "".
pub(crate) fn tag(xml: &str, name: &str) -> String {
    xml.split(&format!("<{name}>"))
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_default()
        .to_string()
}

/// `127.0.X.k` (an sshd's address) → `127.1.X.k`: the instance's private
/// address, bindable on this machine like any of 127/8 and used by no one
/// else (each sshd of the test process has its own X).
fn private_of(public: &str) -> String {
    let rest = public.strip_prefix("127.0.").expect("a 127.0.X.k address");
    format!("127.1.{rest}")
}

/// An sshd on port 22 (where a cloud node's listens) for `n` instances.
pub(crate) fn machines(n: usize) -> Option<Sshd> {
    Sshd::start_on_port("aws", n, 22)
}

/// A p4d.24xlarge's `nvidia-smi` in `dir` (as a node's image has it):
/// `topo -m` prints what a real p4d printed (tests/fixtures/nvidia-smi,
/// SOURCE.md), the `--query-gpu` form gangway asks eight A100-SXM4-40GB
/// lines in that query's format (the model, memory and bus ids of a p4d;
/// the UUIDs made up). Returns the profile line that puts it on PATH.
fn p4d_nvidia_smi(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let topo = crate::common::root().join("tests/fixtures/nvidia-smi/topo-aws-p4d-8xA100-NV12.txt");
    let buses = [
        "10:1C", "10:1D", "20:1C", "20:1D", "90:1C", "90:1D", "A0:1C", "A0:1D",
    ];
    let query: String = buses
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!("{i}, NVIDIA A100-SXM4-40GB, 40960, GPU-0000000{i}-7e57-4a11-9000-00000000000{i}, 00000000:{b}.0\n")
        })
        .collect();
    let script = dir.join("nvidia-smi");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$1\" = topo ]; then cat '{}'; else printf '%s' '{query}'; fi\n",
            topo.display()
        ),
    )
    .expect("write nvidia-smi");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    format!("export PATH=\"{}:$PATH\"\n", dir.display())
}

/// The emulator's topology for one instance: its network nodes, top down.
fn ec2_topology(emu: &Ec2Emulator, id: &str) -> Vec<String> {
    let (status, xml) = emu.call(
        REGION,
        &[("Action", "DescribeInstanceTopology"), ("InstanceId.1", id)],
    );
    assert_eq!(status, 200, "{xml}");
    let set = xml
        .split("<networkNodeSet>")
        .nth(1)
        .and_then(|s| s.split("</networkNodeSet>").next())
        .unwrap_or_default();
    set.split("<item>")
        .skip(1)
        .map(|i| i.split('<').next().unwrap_or_default().to_string())
        .collect()
}

/// The rendezvous of `examples/ddp-rendezvous.yaml`, an allreduce of the
/// ranks over TCP between the private addresses (rank 0 sums what every
/// rank sends and answers the sum), then the gang environment.
const GANG_RUN: &str = r#"run: |
  echo "env rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES node_rank=$GANGWAY_NODE_RANK master=$MASTER_ADDR gpus=$GANGWAY_NUM_GPUS_PER_NODE cuda=$CUDA_VISIBLE_DEVICES ips=$(echo $GANGWAY_NODE_IPS | tr ' ' ,) setup=$(cat setup-done 2>/dev/null) imds=$(sh -c 'T=$(curl -s -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" $GANGWAY_IMDS_ENDPOINT/latest/api/token); curl -s -H "X-aws-ec2-metadata-token: $T" $GANGWAY_IMDS_ENDPOINT/latest/meta-data/local-ipv4')"
  python3 - <<'PY'
  import os, socket, sys, time
  rank, n = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
  addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
  me = os.environ["GANGWAY_NODE_IPS"].split("\n")[rank]
  if rank == 0:
      srv = socket.create_server((addr, port))
      srv.settimeout(60)
  deadline = time.time() + 60
  while True:
      try:
          c = socket.create_connection((addr, port), timeout=5, source_address=(me, 0))
          break
      except OSError:
          if time.time() > deadline:
              sys.exit(f"rank {rank}: no rendezvous at {addr}:{port}")
          time.sleep(0.1)
  c.sendall(f"{rank + 1}\n".encode())
  if rank == 0:
      peers = []
      for _ in range(n):
          conn, (ip, _) = srv.accept()
          peers.append((conn, ip, int(conn.makefile().readline())))
      total = sum(v for _, _, v in peers)
      print(f"allreduce heard from {','.join(sorted(ip for _, ip, _ in peers))}")
      for conn, _, _ in peers:
          conn.sendall(f"{total}\n".encode())
          conn.close()
  answer = c.makefile().readline().strip()
  print(f"allreduce rank {rank} at {me}: sum {answer}")
  PY
"#;

#[test]
fn an_aws_spot_gang_runs_over_ssh_through_a_stockout_and_a_throttle_and_down_leaves_nothing() {
    let Some(sshd) = machines(2) else { return };
    let Some(mut cloud) = Cloud::new(&sshd) else {
        return;
    };
    let tools = tempfile::tempdir().expect("tempdir");
    cloud.profile = p4d_nvidia_smi(tools.path());
    cloud.run_on(&sshd);
    let cluster = "e2e-gang";
    // No ami_name: the default Deep Learning AMI lookup, as a user's.
    let task = cloud.home.file(
        "gang.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: aws/{REGION}\n  accelerators: A100:8\n  use_spot: true\n\
             envs:\n  GW_TEST_MARKER: {marker}\n\
             config:\n  aws:\n    ssh_user: root\n    poll_ms: 50\n\
             setup: echo yes > setup-done\n{GANG_RUN}",
            marker = cloud.home.marker
        ),
    );
    // The plan's first zone has no capacity; the next call is throttled.
    let (code, plan, err) = cloud.run(&["optimize", &task, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let first = json_doc(&plan)["plan"][0]["zone"]
        .as_str()
        .expect("a zone")
        .to_string();
    let ice = cloud.emu.inject(
        "RunInstances",
        &[cluster, &first],
        "InsufficientInstanceCapacity",
        "",
        1,
    );
    let throttle = cloud
        .emu
        .inject("RunInstances", &[cluster], "RequestLimitExceeded", "", 1);

    let (code, out, err) = cloud.run(&["launch", &task, "-c", cluster, "-y"]);
    let all = format!("{out}\n{err}");
    assert_eq!(code, 0, "{all}");
    let fired = |id: u64| {
        cloud
            .emu
            .fault_rules()
            .iter()
            .find(|r| r["id"] == id)
            .map(|r| r["fired"].as_u64().unwrap_or(0))
    };
    assert_eq!(fired(ice), Some(1), "{all}");
    assert_eq!(fired(throttle), Some(1), "{all}");
    assert!(
        all.contains("InsufficientInstanceCapacity") && all.contains(&first),
        "the failed zone is shown: {all}"
    );
    // The throttle is retried in place, after a backoff it names.
    let throttled = all
        .lines()
        .find(|l| l.contains("RequestLimitExceeded"))
        .unwrap_or_else(|| panic!("the throttle is not shown: {all}"));
    assert!(
        throttled.contains("retrying in") && !throttled.contains(&first),
        "{throttled}"
    );

    // Two instances on the sshd's addresses, in one placement group, in
    // another zone than the one out of capacity.
    let found: Vec<Instance> = cloud
        .instances(cluster)
        .into_iter()
        .filter(|i| i.state == "running")
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    for i in &found {
        assert!(sshd.addrs.contains(&i.public_ip), "{i:?}");
        assert_eq!(i.private_ip, private_of(&i.public_ip), "{i:?}");
        assert_ne!(i.zone, first, "{i:?}");
        assert!(i.group.starts_with("gangway-e2e-gang-"), "{i:?}");
    }
    // The key gangway imported is what let it in.
    let key = std::fs::read_to_string(cloud.home.path().join("ssh/id_ed25519.pub"))
        .expect("gangway's public key");
    let key = key.split_whitespace().nth(1).expect("key material");
    let authorized = std::fs::read_to_string(sshd.authorized_keys()).unwrap();
    assert!(authorized.contains(key), "{authorized}");

    // Ranks: ordered by DescribeInstanceTopology's path, then address.
    let c = {
        let (code, st, err) = cloud.run(&["status", cluster, "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        json_doc(&st)["clusters"][0].clone()
    };
    let nodes = c["nodes"].as_array().cloned().expect("nodes");
    assert_eq!(nodes.len(), 2, "{c}");
    let mut ips = Vec::new();
    for (rank, n) in nodes.iter().enumerate() {
        assert_eq!(n["rank"], rank, "{c}");
        let id = n["instance_id"].as_str().expect("instance id");
        let path = ec2_topology(cloud.emu, id);
        assert_eq!(path.len(), 3, "{id}: {path:?}");
        assert_eq!(n["topology"], path.join("/"), "{c}");
        ips.push(n["private_ip"].as_str().expect("private ip").to_string());
    }
    let mut sorted = ips.clone();
    sorted.sort();
    assert_eq!(ips, sorted, "same switch: ranks by address");
    // Both nodes share their L3 node (a pair of one cluster placement
    // group), so the whole path is the same.
    assert_eq!(nodes[0]["topology"], nodes[1]["topology"], "{c}");

    // The gang's environment and the allreduce on every rank, over SSH.
    // GPUs per node are what the node's nvidia-smi reports.
    let gpus = 8;
    for (rank, ip) in ips.iter().enumerate() {
        let line = format!(
            "env rank={rank} of=2 node_rank={rank} master={} gpus={gpus} cuda=0,1,2,3,4,5,6,7 ips={} setup=yes imds={ip}",
            ips[0],
            ips.join(",")
        );
        assert!(all.contains(&line), "rank {rank}: no `{line}` in:\n{all}");
        assert!(
            all.contains(&format!("allreduce rank {rank} at {ip}: sum 3")),
            "rank {rank}:\n{all}"
        );
    }
    assert!(
        all.contains(&format!("allreduce heard from {}", ips.join(","))),
        "{all}"
    );

    let (code, out, err) = cloud.run(&["down", "-y", cluster]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(cloud.left(cluster), Vec::<String>::new());
    assert!(cloud
        .instances(cluster)
        .iter()
        .all(|i| i.state == "terminated"));
    crate::common::assert_no_marker_procs(&cloud.home.marker, "down");
}

#[test]
fn a_managed_aws_spot_job_survives_an_interruption_with_notice_and_one_without() {
    let Some(a) = machines(2) else { return };
    let Some(b) = machines(2) else { return };
    let Some(c) = machines(2) else { return };
    let Some(mut cloud) = Cloud::new(&a) else {
        return;
    };
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 60;
    let task = cloud.home.file(
        "train.yaml",
        &trainer(
            &cloud.home.marker,
            progress.path(),
            total,
            &format!("  accelerators: A100:8\n  infra: aws/{REGION}\n  job_recovery:\n    strategy: FAILOVER\n"),
            AWS_CONFIG,
        ),
    );
    let mut job = cloud.command(&["jobs", "launch", &task, "-y", "--wait"]);
    job.stdin(std::process::Stdio::null());
    let mut job = Running::start(job);
    let cluster = "managed-1";

    // Interruption 1, with notice: EC2 posts it in the instance's metadata
    // and would terminate it 60 s later; the job checkpoints on it first.
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to reach step 8",
        |_, b| b >= 8,
    );
    let first: Vec<Instance> = cloud
        .instances(cluster)
        .into_iter()
        .filter(|i| i.state == "running")
        .collect();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first.iter().all(|i| a.addrs.contains(&i.public_ip)),
        "{first:?}"
    );
    cloud.run_on(&b);
    let notice = cloud.emu.interrupt_with_notice(REGION, &first[1].id, 60.0);
    assert_eq!(notice["action"], "terminate", "{notice}");

    // Interruption 2, without notice: the instance is just terminated,
    // once run 1 is past a checkpoint, so the one kept has work in it.
    wait_run(
        &mut job,
        progress.path(),
        1,
        "run 1 to pass a checkpoint",
        |first, now| now > (first / 5 + 1) * 5,
    );
    let second: Vec<Instance> = cloud
        .instances(cluster)
        .into_iter()
        .filter(|i| i.state == "running")
        .collect();
    assert_eq!(second.len(), 2, "{second:?}");
    assert!(
        second.iter().all(|i| b.addrs.contains(&i.public_ip)),
        "{second:?}"
    );
    cloud.run_on(&c);
    cloud.emu.interrupt(REGION, &second[0].id);

    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // Run 0 checkpointed on the notice; run 1 resumed exactly there.
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
    assert!(noticed >= 8, "{out}");
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} run 1 resumes at step {noticed}")),
            "rank {rank} did not resume at step {noticed}:\n{out}"
        );
    }
    // Run 2 resumed from the last kept checkpoint of run 1 (a multiple of
    // 5 past where run 1 began), and the job ends at exactly TOTAL.
    let resumed: Vec<u32> = (0..2)
        .map(|rank| {
            out.lines()
                .find_map(|l| {
                    l.split(&format!("rank {rank} run 2 resumes at step "))
                        .nth(1)
                        .and_then(|s| s.trim().parse().ok())
                })
                .unwrap_or_else(|| panic!("rank {rank} has no run 2:\n{out}"))
        })
        .collect();
    assert_eq!(resumed[0], resumed[1], "{out}");
    assert!(
        resumed[0] > noticed && resumed[0].is_multiple_of(5),
        "run 2 resumed at {resumed:?} after run 1 began at {noticed}:\n{out}"
    );
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} done at step {total}")),
            "{out}"
        );
    }
    assert!(!out.contains("run 3 resumes"), "{out}");

    // Three zones: each interruption blocked the zone it happened in.
    // (Terminated instances lose their public addresses: the third pair
    // is the one neither interruption saw.)
    let third: Vec<Instance> = cloud
        .instances(cluster)
        .into_iter()
        .filter(|i| !first.iter().chain(&second).any(|x| x.id == i.id))
        .collect();
    assert_eq!(third.len(), 2, "{third:?}");
    let placed = cloud.emu.machines_of(&cloud.scope);
    assert_eq!(placed.len(), 6, "{placed:?}");
    for i in &third {
        let at = placed
            .iter()
            .find(|p| p["instance_id"] == i.id.as_str())
            .and_then(|p| p["public"].as_str())
            .unwrap_or_default();
        assert!(c.addrs.iter().any(|a| a == at), "{i:?} ran at {at:?}");
    }
    let zones = [&first[0].zone, &second[0].zone, &third[0].zone];
    assert!(
        zones[0] != zones[1] && zones[1] != zones[2] && zones[0] != zones[2],
        "{zones:?}"
    );
    // EC2 itself reclaimed the second one, with its reason.
    let gone = cloud
        .instances(cluster)
        .into_iter()
        .find(|i| i.id == second[0].id)
        .expect("the reclaimed instance");
    assert_eq!(gone.reason, "Server.SpotInstanceTermination", "{gone:?}");

    let (code, q, err) = cloud.run(&["jobs", "queue", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 2, "{j}");
    let (code, ev, err) = cloud.run(&["jobs", "events", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        ev.contains("spot/instance-action")
            && ev.contains(notice["time"].as_str().expect("the notice's time")),
        "the noticed interruption, with EC2's notice:\n{ev}"
    );
    assert!(
        ev.contains("Server.SpotInstanceTermination") && ev.contains(&second[0].id),
        "the interruption without notice, with EC2's reason:\n{ev}"
    );

    wait_for(
        "the job's clusters to be gone",
        Duration::from_secs(60),
        || {
            let left = cloud.left(cluster);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    crate::common::assert_no_marker_procs(&cloud.home.marker, "the managed job ended");
}

#[test]
fn a_managed_aws_spot_gang_that_loses_one_instance_replaces_only_it() {
    lose_one_of_four(None);
}

#[test]
fn a_managed_aws_spot_gang_told_of_one_interruption_replaces_that_instance_at_the_noticed_step() {
    lose_one_of_four(Some(60.0));
}

/// A 4-instance spot gang under the default strategy (REPLACE_LOST_NODES)
/// loses its rank-2 instance, without notice or with `notice_s` of it:
/// only that instance is replaced, in the survivors' zone and placement
/// group, setup runs on the replacement only, and every rank resumes at
/// the same step (with notice: the step checkpointed on it) and finishes.
fn lose_one_of_four(notice_s: Option<f64>) {
    let Some(a) = machines(4) else { return };
    let Some(b) = machines(1) else { return };
    let Some(mut cloud) = Cloud::new(&a) else {
        return;
    };
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 40;
    // The default strategy (REPLACE_LOST_NODES), a gang of four whose
    // setup says where it ran.
    let task = trainer(
        &cloud.home.marker,
        progress.path(),
        total,
        &format!("  accelerators: A100:8\n  infra: aws/{REGION}\n"),
        AWS_CONFIG,
    )
    .replace("num_nodes: 2\n", "num_nodes: 4\n")
    .replace(
        "run: |\n",
        "setup: |\n  echo \"setup ran on $(hostname -I 2>/dev/null || echo node)\"\nrun: |\n",
    );
    let task = cloud.home.file("train.yaml", &task);
    let mut job = cloud.command(&["jobs", "launch", &task, "-y", "--wait"]);
    job.stdin(std::process::Stdio::null());
    let mut job = Running::start(job);
    let cluster = "managed-1";
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to pass a checkpoint",
        |_, now| now > 6,
    );
    let first: Vec<Instance> = cloud
        .instances(cluster)
        .into_iter()
        .filter(|i| i.state == "running")
        .collect();
    assert_eq!(first.len(), 4, "{first:?}");
    // EC2 takes one instance (posting a notice first, or not); the
    // replacement runs on b.
    cloud.run_on(&b);
    match notice_s {
        Some(s) => {
            let notice = cloud.emu.interrupt_with_notice(REGION, &first[2].id, s);
            assert_eq!(notice["action"], "terminate", "{notice}");
        }
        None => cloud.emu.interrupt(REGION, &first[2].id),
    }
    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..4 {
        assert!(
            out.contains(&format!("rank {rank} done at step {total}")),
            "{out}"
        );
    }
    // One new instance, in the survivors' zone and placement group; the
    // three survivors kept running throughout.
    let all = cloud.instances(cluster);
    let new: Vec<&Instance> = all
        .iter()
        .filter(|i| !first.iter().any(|f| f.id == i.id))
        .collect();
    assert_eq!(new.len(), 1, "one replacement: {all:?}");
    assert_eq!(new[0].zone, first[0].zone, "{all:?}");
    assert_eq!(new[0].group, first[0].group, "{all:?}");
    assert!(!new[0].group.is_empty(), "{all:?}");
    let placed = cloud.emu.machines_of(&cloud.scope);
    assert_eq!(placed.len(), 5, "{placed:?}");
    // Setup ran on the four, then on the replacement only.
    let (code, log, err) = cloud.run(&["jobs", "logs", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(log.matches("setup ran on").count(), 5, "{log}");
    assert_eq!(log.matches("setup kept on rank").count(), 3, "{log}");
    // Every rank of the second run resumed at the same kept checkpoint.
    let resumed: Vec<String> = (0..4)
        .map(|rank| {
            out.lines()
                .find_map(|l| {
                    l.split(&format!("rank {rank} run 1 resumes at step "))
                        .nth(1)
                        .map(|s| s.trim().to_string())
                })
                .unwrap_or_else(|| panic!("rank {rank} has no run 1:\n{out}"))
        })
        .collect();
    assert!(resumed.iter().all(|r| *r == resumed[0]), "{resumed:?}");
    if notice_s.is_some() {
        // The gang checkpointed on the notice and resumed exactly there.
        let noticed = crate::common::noticed_step(&out)
            .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
        assert_eq!(resumed[0], noticed.to_string(), "{out}");
    }
    let (code, ev, err) = cloud.run(&["jobs", "events", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        ev.contains("replaced rank") && ev.contains(&first[2].id),
        "the replacement, naming the lost instance:\n{ev}"
    );
    assert_eq!(
        ev.contains("NOTICE"),
        notice_s.is_some(),
        "a notice event exactly when one was posted:\n{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    wait_for(
        "the job's cluster to be gone",
        Duration::from_secs(60),
        || {
            let left = cloud.left(cluster);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    crate::common::assert_no_marker_procs(&cloud.home.marker, "the managed job ended");
}

#[test]
fn a_managed_aws_spot_job_moves_to_another_region_after_a_notice_with_eager_next_region() {
    let Some(a) = machines(2) else { return };
    let Some(b) = machines(2) else { return };
    let Some(mut cloud) = Cloud::new(&a) else {
        return;
    };
    let progress = tempfile::tempdir().expect("tempdir");
    let total = 30;
    // EAGER_NEXT_REGION (SkyPilot's default) tries other regions first.
    let task = cloud.home.file(
        "train.yaml",
        &trainer(
            &cloud.home.marker,
            progress.path(),
            total,
            "  accelerators: A100:8\n  infra: aws\n  job_recovery:\n    strategy: EAGER_NEXT_REGION\n",
            AWS_CONFIG,
        ),
    );
    let mut job = Running::start(cloud.command(&["jobs", "launch", &task, "-y", "--wait"]));
    wait_run(
        &mut job,
        progress.path(),
        0,
        "run 0 to reach step 5",
        |_, b| b >= 5,
    );
    let live = |on: &Sshd| -> Vec<(String, String)> {
        cloud
            .emu
            .machines_of(&cloud.scope)
            .iter()
            .filter(|m| m["state"] == "running")
            .filter(|m| on.addrs.iter().any(|a| m["public"] == a.as_str()))
            .map(|m| {
                (
                    m["instance_id"].as_str().unwrap_or_default().to_string(),
                    m["region"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    let first = live(&a);
    assert_eq!(first.len(), 2, "{first:?}");
    cloud.run_on(&b);
    let (victim, region) = &first[0];
    cloud.emu.interrupt_with_notice(region, victim, 60.0);

    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} run 1 resumes at step {noticed}"))
                && out.contains(&format!("rank {rank} done at step {total}")),
            "rank {rank}:\n{out}"
        );
    }
    // The second cluster ran on b's addresses, in another region.
    let placed = cloud.emu.machines_of(&cloud.scope);
    let second: Vec<&Value> = placed
        .iter()
        .filter(|m| b.addrs.iter().any(|a| m["public"] == a.as_str()))
        .collect();
    assert_eq!(second.len(), 2, "{placed:?}");
    assert!(
        second.iter().all(|m| m["region"] != region.as_str()),
        "still in {region}: {placed:?}"
    );
    let (code, q, err) = cloud.run(&["jobs", "queue", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(
        (j["state"].as_str(), j["preemptions"].as_u64()),
        (Some("SUCCEEDED"), Some(1)),
        "{j}"
    );
    let mut regions: Vec<String> = placed
        .iter()
        .filter_map(|m| m["region"].as_str().map(str::to_string))
        .collect();
    regions.sort();
    regions.dedup();
    let owner = cloud.owner();
    wait_for(
        "the job's clusters to be gone",
        Duration::from_secs(60),
        || {
            let left = crate::aws::tagged_resources_in(cloud.emu, "managed-1", &owner, &regions);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    crate::common::assert_no_marker_procs(&cloud.home.marker, "the managed job ended");
}

/// The emulator's Deep Learning AMI (in every region): CPU types have no
/// default image there.
pub(crate) const AMI: &str = "ami-0d1a0b1e2c3d4e5f6";

/// An IAM role `name` that EC2 may pass to instances, in an instance
/// profile of the same name, made through IAM's API as a user would.
pub(crate) fn make_instance_profile(emu: &Ec2Emulator, name: &str) -> String {
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    for params in [
        vec![
            ("Action", "CreateRole"),
            ("RoleName", name),
            ("AssumeRolePolicyDocument", trust),
        ],
        vec![
            ("Action", "CreateInstanceProfile"),
            ("InstanceProfileName", name),
        ],
        vec![
            ("Action", "AddRoleToInstanceProfile"),
            ("InstanceProfileName", name),
            ("RoleName", name),
        ],
    ] {
        let (status, xml) = emu.iam(&params);
        assert_eq!(status, 200, "{params:?}: {xml}");
    }
    let (status, xml) = emu.iam(&[
        ("Action", "GetInstanceProfile"),
        ("InstanceProfileName", name),
    ]);
    assert_eq!(status, 200, "{xml}");
    tag(&xml, "Arn")
}

/// What a node's rclone would get from its metadata service: the role's
/// access key id, printed as `imds-key=...` (empty without a profile).
const IMDS_KEY: &str = "  T=$(curl -s -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' $GANGWAY_IMDS_ENDPOINT/latest/api/token)\n\
\x20 R=$(curl -sf -H \"X-aws-ec2-metadata-token: $T\" $GANGWAY_IMDS_ENDPOINT/latest/meta-data/iam/security-credentials/)\n\
\x20 echo \"imds-key=$(curl -sf -H \"X-aws-ec2-metadata-token: $T\" $GANGWAY_IMDS_ENDPOINT/latest/meta-data/iam/security-credentials/$R | sed -n 's/.*\"AccessKeyId\": *\"\\([^\"]*\\)\".*/\\1/p')\"\n";

/// The access key ids the nodes' rclone signed its S3 requests with since
/// request `since` of the store's front.
fn rclone_keys(
    s3: &gangway_test::storage::StoreEmulator,
    since: u64,
) -> std::collections::BTreeSet<String> {
    s3.requests_since(since)
        .into_iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|u| u.starts_with("rclone"))
        })
        .filter_map(|r| r.key_id)
        .collect()
}

/// `aws.remote_identity` (the user's config.yaml, SkyPilot's key): the
/// nodes are launched with that instance profile, their rclone reaches S3
/// as its role through the metadata service (a COPY and a MOUNT on every
/// node, the store's log showing only the keys the nodes' metadata served),
/// gangway makes no STS session for them, and the mount keeps no keys. A
/// task that says LOCAL_CREDENTIALS gets today's STS session keys instead.
#[test]
fn an_aws_cluster_with_remote_identity_reaches_s3_as_its_instance_profile_and_makes_no_sts_session()
{
    let Some(s3) = gangway_test::storage::StoreEmulator::s3() else {
        return;
    };
    let Some(sshd) = machines(2) else { return };
    let Some(cloud) = Cloud::new(&sshd) else {
        return;
    };
    let m = cloud.home.marker.to_ascii_lowercase();
    let profile = format!("gw-{m}-nodes");
    let arn = make_instance_profile(cloud.emu, &profile);
    let bucket = format!("gw-{m}-ident");
    s3.create_bucket(&bucket);
    s3.put_object(&bucket, "x.txt", b"v1");
    std::fs::write(
        cloud.home.path().join("config.yaml"),
        format!("aws:\n  remote_identity: {profile}\n"),
    )
    .expect("config.yaml");
    let task = |name: &str, config: &str, mounts: &str| {
        cloud.home.file(
            name,
            &format!(
                "num_nodes: 2\nresources:\n  infra: aws/{REGION}\n  image_id: {AMI}\n\
                 envs:\n  GW_TEST_MARKER: {marker}\n\
                 config:\n  aws:\n    ssh_user: root\n    poll_ms: 50\n{config}\
                 file_mounts:\n{mounts}\
                 run: |\n{IMDS_KEY}\
                 \x20 echo \"rank=$SKYPILOT_NODE_RANK copy=$(cat ~/c/x.txt) mount=$(cat ~/m/x.txt 2>/dev/null)\"\n\
                 \x20 echo \"kept=$(ls ~/.gangway/creds/*/ 2>/dev/null | tr '\\n' ' ')\"\n",
                marker = cloud.home.marker
            ),
        )
    };
    let mounts =
        format!("  ~/c: s3://{bucket}\n  ~/m:\n    source: s3://{bucket}\n    mode: MOUNT\n");
    let own = task("own.yaml", "", &mounts);
    let with_s3 = |args: &[&str]| {
        let mut c = cloud.command(args);
        c.env("GANGWAY_S3_ENDPOINT", &s3.endpoint)
            .env("AWS_REGION", gangway_test::storage::S3_REGION);
        parts(&Running::start(c).wait())
    };

    let before = s3.last_request_id();
    let (code, out, err) = with_s3(&["launch", &own, "-c", "ident", "-y"]);
    let all = format!("{out}\n{err}");
    assert_eq!(code, 0, "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank={rank} copy=v1 mount=v1")),
            "rank {rank}: {all}"
        );
    }
    let imds_keys: std::collections::BTreeSet<String> = all
        .lines()
        .filter_map(|l| l.split("imds-key=").nth(1))
        .map(|k| k.trim().to_string())
        .collect();
    assert!(
        imds_keys.len() == 2 && imds_keys.iter().all(|k| k.starts_with("ASIAIMDS")),
        "each node's metadata serves its role's keys: {imds_keys:?}\n{all}"
    );
    let used = rclone_keys(s3, before);
    assert!(
        !used.is_empty() && used.is_subset(&imds_keys),
        "the nodes' rclone signed with the keys of their metadata only: {used:?} (served: {imds_keys:?})"
    );
    assert_eq!(
        cloud.emu.sts_sessions(&cloud.scope),
        0,
        "no STS session was made from the user's keys"
    );
    // The mount's credentials directory holds its rclone config only: no
    // keys, no credential_process answer.
    let kept = all
        .lines()
        .find_map(|l| l.split("kept=").nth(1))
        .unwrap_or_default();
    assert!(
        kept.contains("gw1.conf") && !kept.contains(".json") && !kept.contains(".aws"),
        "{kept}"
    );
    assert!(
        !all.contains("renewed the bucket mounts' credentials"),
        "nothing to renew: {all}"
    );
    // Both instances carry the profile.
    let (status, xml) = cloud.emu.call(
        REGION,
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", "ident"),
            ("Filter.2.Name", "instance-state-name"),
            ("Filter.2.Value.1", "running"),
        ],
    );
    assert_eq!(status, 200, "{xml}");
    assert_eq!(xml.matches(&arn).count(), 2, "{arn} on both: {xml}");
    let (code, out, err) = with_s3(&["down", "-y", "ident"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(cloud.left("ident"), Vec::<String>::new());
    // A VM goes with its mount; these machines outlive the cluster (the
    // mount is in their sshd's mount namespace).
    // (Its known_hosts names no port-22 entries: no host key check.)
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

    // LOCAL_CREDENTIALS in the task wins over the user's file: today's
    // way, an STS session of the user's keys, no profile on the nodes.
    let local = task(
        "local.yaml",
        "    remote_identity: LOCAL_CREDENTIALS\n",
        &format!("  ~/c: s3://{bucket}\n"),
    );
    let before = s3.last_request_id();
    let (code, out, err) = with_s3(&["launch", &local, "-c", "ident-local", "-y", "--down"]);
    let all = format!("{out}\n{err}");
    assert_eq!(code, 0, "{all}");
    assert!(all.contains("rank=1 copy=v1"), "{all}");
    assert!(
        all.contains("imds-key=\n") || all.contains("imds-key=\r"),
        "no profile: {all}"
    );
    let used = rclone_keys(s3, before);
    assert!(
        !used.is_empty() && used.iter().all(|k| k.starts_with("ASIAGW")),
        "STS session keys: {used:?}"
    );
    assert!(cloud.emu.sts_sessions(&cloud.scope) > 0);
    assert_eq!(cloud.left("ident-local"), Vec::<String>::new());
    crate::common::assert_no_marker_procs(&cloud.home.marker, "down");
}

/// A `remote_identity` that names no instance profile stops the launch
/// with EC2's words, the region and the key to fix, and leaves nothing.
#[test]
fn an_aws_remote_identity_that_does_not_exist_fails_clearly_and_leaves_nothing() {
    let Some(sshd) = machines(1) else { return };
    let Some(cloud) = Cloud::new(&sshd) else {
        return;
    };
    let missing = format!("gw-{}-missing", cloud.home.marker.to_ascii_lowercase());
    let task = cloud.home.file(
        "missing.yaml",
        &format!(
            "resources:\n  infra: aws/{REGION}\n  image_id: {AMI}\n\
             config:\n  aws:\n    ssh_user: root\n    poll_ms: 50\n    remote_identity: {missing}\n\
             run: echo never\n"
        ),
    );
    let (code, out, err) = cloud.run(&["launch", &task, "-c", "noprofile", "-y"]);
    let all = format!("{out}\n{err}");
    assert_ne!(code, 0, "{all}");
    assert!(!all.contains("never"), "{all}");
    assert!(
        all.contains(REGION)
            && all.contains("InvalidParameterValue")
            && all.contains(&format!(
                "Value ({missing}) for parameter iamInstanceProfile.name is invalid"
            ))
            && all.contains("config.aws.remote_identity"),
        "{all}"
    );
    assert_eq!(cloud.left("noprofile"), Vec::<String>::new());
    assert!(cloud
        .instances("noprofile")
        .iter()
        .all(|i| i.state == "terminated"));
}
