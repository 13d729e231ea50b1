//! Gangs on a real Slurm: each test starts its own throwaway cluster
//! (munged, slurmctld, four slurmd on this host, two switches, two fake
//! GPUs per node; tests/emulators/slurm/start.sh) and drives the binary
//! against it through `$GANGWAY_HOME/slurm.yaml`.
//!
//! Needs root and Slurm's packages (`.ci/run` installs them with
//! tests/emulators/slurm/install.sh); each test says `SKIPPED slurm: why`
//! (tests/support/src/skip.rs) and passes where they are missing.

use std::time::{Duration, Instant};

use crate::common::{assert_no_marker_procs, parts, TestHome, DEADLINE};
use gangway_test::slurm::SlurmCluster;

/// A running Slurm cluster of this test (`gangway_test::slurm`); stopped
/// when dropped.
struct Slurm(SlurmCluster);

impl std::ops::Deref for Slurm {
    type Target = SlurmCluster;
    fn deref(&self) -> &SlurmCluster {
        &self.0
    }
}

impl Slurm {
    /// Starts `nodes` nodes (recorded as `ran slurm`), or says
    /// `SKIPPED slurm: why` and returns `None`.
    fn start(nodes: u32) -> Option<Slurm> {
        SlurmCluster::start(nodes).map(Slurm)
    }

    /// Waits until no job named `gangway-*` is queued; fails the test if
    /// one stays.
    fn assert_no_gangway_jobs(&self, after: &str) {
        let started = Instant::now();
        loop {
            let ours: Vec<String> = self
                .queue()
                .into_iter()
                .filter(|l| l.contains(" gangway-"))
                .collect();
            if ours.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "gangway's jobs still in the queue after {after}: {ours:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Writes `slurm.yaml` into `home` for this cluster, named `test`.
    fn configure(&self, home: &TestHome, extra: &str) {
        home.file(
            "slurm.yaml",
            &format!(
                "clusters:\n  test:\n    conf: {}\n    work_dir: {}\n{extra}    partitions:\n      gpu:\n        gpus: A100:2\n        gres: fake\n",
                self.conf().display(),
                home.path().join("slurm-nodes").display()
            ),
        );
    }
}

#[test]
fn ddp_rendezvous_runs_unchanged_on_slurm_ranked_by_its_switches() {
    let Some(slurm) = Slurm::start(4) else { return };
    let home = TestHome::new();
    slurm.configure(&home, "");
    // The example file as it is; only where it runs is given on the
    // command line.
    let o = home.run([
        "launch",
        "examples/ddp-rendezvous.yaml",
        "--infra",
        "slurm/test",
        "-c",
        "rdv",
        "-y",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    assert!(
        out.contains("sum of ranks 6, expected 6: ok"),
        "the rendezvous did not add up:\n{out}\n{err}"
    );
    // The allocation is a job Slurm holds for the cluster.
    assert!(
        slurm
            .queue()
            .iter()
            .any(|l| l.ends_with("gangway-rdv RUNNING")),
        "no running allocation: {:?}",
        slurm.queue()
    );
    // Ranks follow topology.conf: n1, n2 under s1, then n3, n4 under s2;
    // every step has the node's GPUs and the gang's environment.
    let o = home.run([
        "exec",
        "rdv",
        "echo \"R=$NODE_RANK/$NNODES node=$SLURMD_NODENAME topo=$GANGWAY_NODE_TOPOLOGY \
         gpus=$GANGWAY_NUM_GPUS_PER_NODE cvd=$CUDA_VISIBLE_DEVICES\"",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "exec failed:\n{out}\n{err}");
    for (rank, node, topo) in [
        (0, "n1", "s0/s1"),
        (1, "n2", "s0/s1"),
        (2, "n3", "s0/s2"),
        (3, "n4", "s0/s2"),
    ] {
        let want = format!("R={rank}/4 node={node} topo={topo} gpus=1 cvd=0");
        assert!(out.contains(&want), "no '{want}' in:\n{out}");
    }
    // cancel stops a running job's steps on every node; the allocation stays.
    let o = home.run([
        "exec",
        "rdv",
        "-d",
        "--env",
        &home.marker_env(),
        "sleep 300",
    ]);
    assert_eq!(parts(&o).0, 0, "exec -d failed: {}", parts(&o).2);
    crate::common::wait_for("the ranks to run", DEADLINE, || {
        let n = crate::common::procs_with_marker(&home.marker).len();
        if n >= 4 {
            Ok(())
        } else {
            Err(format!("{n} marked processes"))
        }
    });
    let o = home.run(["cancel", "rdv", "--all"]);
    assert_eq!(parts(&o).0, 0, "cancel failed: {}", parts(&o).2);
    assert_no_marker_procs(&home.marker, "cancel");
    assert!(
        slurm
            .queue()
            .iter()
            .any(|l| l.ends_with("gangway-rdv RUNNING")),
        "cancel took the allocation: {:?}",
        slurm.queue()
    );
    let o = home.run(["down", "-y", "rdv"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
    slurm.assert_no_gangway_jobs("down");
}

#[test]
fn a_failing_rank_stops_the_gang_and_down_leaves_nothing_queued() {
    let Some(slurm) = Slurm::start(4) else { return };
    let home = TestHome::new();
    slurm.configure(&home, "");
    let task = home.file(
        "fail.yaml",
        &format!(
            "name: fail\nnum_nodes: 3\nresources:\n  accelerators: A100:2\nenvs:\n  {}: {}\n\
             run: |\n  if [ \"$NODE_RANK\" = 1 ]; then sleep 1; exit 3; fi\n  sleep 300\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run(["launch", &task, "--infra", "slurm/test", "-c", "fl", "-y"]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 1, "a failed rank must fail the launch:\n{out}\n{err}");
    assert!(
        err.contains("rank 1") && err.contains("code 3")
            || out.contains("rank 1") && out.contains("code 3"),
        "the failure does not name rank 1 and its code:\n{out}\n{err}"
    );
    // The other ranks were stopped on their nodes.
    assert_no_marker_procs(&home.marker, "a rank failed");
    let o = home.run(["down", "-y", "fl"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
    slurm.assert_no_gangway_jobs("down");
}

#[test]
fn a_pending_allocation_says_why_and_gives_up_after_max_queue_wait() {
    let Some(slurm) = Slurm::start(2) else { return };
    let home = TestHome::new();
    slurm.configure(&home, "    max_queue_wait: 3s\n");
    // Someone else holds every node.
    let other = slurm.cmd(
        "sbatch",
        &[
            "--parsable",
            "--nodes=2",
            "--job-name=someone-else",
            "--exclusive",
            "--output=/dev/null",
            "--wrap=exec sleep 600",
        ],
    );
    let o = home.run([
        "launch",
        "examples/hello.yaml",
        "--infra",
        "slurm/test",
        "--num-nodes",
        "2",
        "-c",
        "wait",
        "-y",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(
        code, 3,
        "a queue that does not move is no resources:\n{out}\n{err}"
    );
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("PENDING (") && all.contains("waiting"),
        "the wait is not reported:\n{all}"
    );
    assert!(
        all.contains("still pending after") && all.contains("max_queue_wait"),
        "the give-up does not say why:\n{all}"
    );
    // Its own job was cancelled; the other user's is untouched.
    slurm.assert_no_gangway_jobs("giving up");
    assert!(
        slurm
            .queue()
            .iter()
            .any(|l| l.starts_with(other.trim()) && l.contains("RUNNING")),
        "the other job was touched: {:?}",
        slurm.queue()
    );
}

#[test]
fn a_managed_job_survives_a_node_going_down_from_its_kept_checkpoint() {
    let Some(slurm) = Slurm::start(4) else { return };
    let home = TestHome::new();
    slurm.configure(&home, "");
    let flags = home.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    // Run 0 checkpoints step 7, says so once gangway kept it (and which
    // node rank 1 is on), then trains on; the test takes rank 1's node
    // away. Run 1 must find step 7 restored on its (other) nodes.
    let t = home.file(
        "managed.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: slurm/test\n  accelerators: A100:1\n\
             checkpoint:\n  sync_interval: 1\nenvs:\n  GW_TEST_MARKER: {}\n  FLAGS: {}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    t=$(date +%s%3N)\n    \
             [ \"$NODE_RANK\" = 0 ] && echo 7 > \"$ck\"\n    \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n    \
             echo \"$SLURMD_NODENAME\" > \"$FLAGS/rank$NODE_RANK\"\n    sleep 300\n  fi\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT on $SLURMD_NODENAME\"\n",
            home.marker,
            flags.display()
        ),
    );
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    crate::common::wait_for("run 0 to checkpoint", DEADLINE, || {
        std::fs::read_to_string(flags.join("rank1"))
            .map_err(|e| format!("{e}; launch says: {}", launch.stdout_now()))
    });
    let lost = std::fs::read_to_string(flags.join("rank1"))
        .unwrap()
        .trim()
        .to_string();
    slurm.cmd(
        "scontrol",
        &[
            "update",
            &format!("nodename={lost}"),
            "state=down",
            "reason=gangway test: node lost",
        ],
    );
    let o = launch.wait();
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("rank {r} resumed at step 7 in run 1")))
            .unwrap_or_else(|| panic!("rank {r} did not resume from step 7:\n{out}\n{err}"));
        assert!(
            !line.ends_with(&format!(" on {lost}")),
            "rank {r} ran again on the node that went down: {line}"
        );
    }
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "a lost node is a preemption: {j}");
    // The default strategy replaces lost nodes where it can; Slurm cannot,
    // and the events say so.
    assert_eq!(j["nodes_replaced"], 0, "{j}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains("whole-gang recovery: a Slurm allocation cannot grow in place"),
        "{ev}"
    );
    slurm.assert_no_gangway_jobs("the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn slurm_preemption_with_grace_time_checkpoints_and_resumes_in_another_partition() {
    let Some(slurm) = Slurm::start(4) else { return };
    let home = TestHome::new();
    // `debug` (n1, n2; GraceTime=5) first, `gpu` (every node) as the
    // fallback; a launch waits 3 s for either before moving on.
    home.file(
        "slurm.yaml",
        &format!(
            "clusters:\n  test:\n    conf: {}\n    work_dir: {}\n    max_queue_wait: 3s\n    partitions:\n      \
             debug:\n        gpus: A100:2\n        gres: fake\n      gpu:\n        gpus: A100:2\n        gres: fake\n",
            slurm.conf().display(),
            home.path().join("slurm-nodes").display()
        ),
    );
    let flags = home.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    // Run 0 checkpoints step 9 when Slurm's SIGTERM comes and exits 0.
    let t = home.file(
        "managed.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: slurm/test\n  accelerators: A100:1\n\
             envs:\n  GW_TEST_MARKER: {}\n  FLAGS: {}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    \
             trap '[ \"$NODE_RANK\" = 0 ] && echo 9 > \"$ck\"; echo \"rank $NODE_RANK checkpointed\"; exit 0' TERM\n    \
             echo \"$SLURM_JOB_PARTITION\" > \"$FLAGS/rank$NODE_RANK\"\n    \
             while true; do sleep 0.2; done\n  fi\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT in $SLURM_JOB_PARTITION\"\n",
            home.marker,
            flags.display()
        ),
    );
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    crate::common::wait_for("run 0 to start in debug", DEADLINE, || {
        match (
            std::fs::read_to_string(flags.join("rank0")),
            std::fs::read_to_string(flags.join("rank1")),
        ) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            _ => Err(format!("launch says: {}", launch.stdout_now())),
        }
    });
    assert_eq!(
        std::fs::read_to_string(flags.join("rank0")).unwrap().trim(),
        "debug",
        "the first partition listed was not tried first"
    );
    // A higher-priority job wants debug's nodes.
    slurm.cmd(
        "sbatch",
        &[
            "--partition=urgent",
            "--nodelist=n1,n2",
            "--exclusive",
            "--job-name=urgent",
            "--output=/dev/null",
            "--wrap=exec sleep 600",
        ],
    );
    let o = launch.wait();
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("rank 0 checkpointed"),
        "no checkpoint on SIGTERM:\n{out}"
    );
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} resumed at step 9 in run 1 in gpu")),
            "rank {r} did not resume from step 9 in the gpu partition:\n{out}\n{err}"
        );
    }
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(
        j["preemptions"], 1,
        "Slurm's preemption is a preemption: {j}"
    );
    slurm.assert_no_gangway_jobs("the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn a_cluster_behind_a_login_node_is_driven_over_ssh() {
    let Some(slurm) = Slurm::start(2) else { return };
    let Some(sshd) = crate::sshd::Sshd::start(1) else {
        return;
    };
    let home = TestHome::new();
    // Slurm's commands run on the "login node" (this host, behind the test
    // sshd, whose sessions have their own HOME); `~` there is its home.
    home.file(
        "slurm.yaml",
        &format!(
            "clusters:\n  test:\n    login: {}@{}:{}\n    login_key: {}\n    conf: {}\n    partitions:\n      gpu:\n        gpus: A100:2\n        gres: fake\n",
            sshd.user,
            sshd.addrs[0],
            sshd.port,
            sshd.client_key.display(),
            slurm.conf().display()
        ),
    );
    let task = home.file(
        "login.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  accelerators: A100:1\nenvs:\n  {}: {}\n\
             run: |\n  echo \"R=$NODE_RANK node=$SLURMD_NODENAME pwd=$PWD secret=${{#GW_SECRET}}\"\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run([
        "launch",
        &task,
        "--infra",
        "slurm/test",
        "-c",
        "lg",
        "-y",
        "--secret",
        "GW_SECRET=hunter2-not-in-logs",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    let remote_home = sshd.home.join(".gangway/slurm/gangway-lg");
    for (rank, node) in [(0, "n1"), (1, "n2")] {
        let want = format!(
            "R={rank} node={node} pwd={}/{node} secret=19",
            remote_home.display()
        );
        assert!(out.contains(&want), "no '{want}' in:\n{out}\n{err}");
    }
    assert!(
        !out.contains("hunter2") && !err.contains("hunter2"),
        "the secret was printed"
    );
    // Nothing gangway wrote (state, logs) holds it.
    let mut stack = vec![home.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                assert!(
                    !String::from_utf8_lossy(&bytes).contains("hunter2"),
                    "the secret is in {}",
                    p.display()
                );
            }
        }
    }
    let o = home.run(["down", "-y", "lg"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
    slurm.assert_no_gangway_jobs("down");
}

#[test]
fn a_queue_that_does_not_move_falls_back_to_the_next_provider_in_order() {
    let Some(slurm) = Slurm::start(2) else { return };
    let home = TestHome::new();
    slurm.configure(&home, "    max_queue_wait: 2s\n");
    slurm.cmd(
        "sbatch",
        &[
            "--nodes=2",
            "--exclusive",
            "--job-name=someone-else",
            "--output=/dev/null",
            "--wrap=exec sleep 600",
        ],
    );
    // The in-house cluster first, then (here) the local cloud.
    let task = home.file(
        "ordered.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  accelerators: A100:1\n  ordered:\n    - infra: slurm/test\n    - infra: local\n\
             envs:\n  {}: {}\nrun: echo \"ran on $GANGWAY_CLUSTER rank $NODE_RANK slurm=${{SLURM_JOB_ID:-none}}\"\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run(["launch", &task, "-c", "ord", "-y"]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("slurm/test/gpu") && all.contains("still pending after"),
        "Slurm was not tried first or its wait not reported:\n{all}"
    );
    assert!(
        out.contains("ran on ord rank 0 slurm=none")
            && out.contains("ran on ord rank 1 slurm=none"),
        "the run did not land on the next provider:\n{all}"
    );
    assert_eq!(
        home.cluster("ord")["cloud"],
        "local",
        "{}",
        home.cluster("ord")
    );
    slurm.assert_no_gangway_jobs("falling back");
}
