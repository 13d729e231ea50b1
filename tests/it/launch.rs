//! `gangway launch` end to end on the embedded local cloud: provisioning,
//! failover, gang startup, the nodes' environment, failures, secrets.
//!
//! Every test has its own `GANGWAY_HOME` ([`TestHome`]), which tears its
//! clusters down when the test ends, pass or fail. Node processes carry the
//! test's marker env value, so a test can tell that none are left.

use std::collections::BTreeMap;

use gangway::ranks::ring_hops;

use crate::common::{
    assert_no_marker_procs, command_in, json_doc, parts, root, single_address, wait_for, Running,
    TestHome, DEADLINE,
};

/// Runs `gangway launch TASK -c NAME ARGS...`; (exit code, stdout, stderr).
fn launch(home: &TestHome, task: &str, name: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["launch", task, "-c", name];
    all.extend_from_slice(args);
    parts(&home.run(&all))
}

/// A task on the local cloud with the test's marker env.
fn task(home: &TestHome, nodes: u32, body: &str) -> String {
    home.file(
        "task.yaml",
        &format!(
            "num_nodes: {nodes}\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n{body}",
            home.marker
        ),
    )
}

/// Parses a `KEY=VALUE\0...` file written by `env -0`.
fn env0(path: &std::path::Path) -> BTreeMap<String, String> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    String::from_utf8_lossy(&bytes)
        .split('\0')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (k, v) = e.split_once('=').unwrap_or((e, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn hello_runs_on_two_nodes_and_down_removes_everything() {
    let home = TestHome::new();
    let hello = std::fs::read_to_string(root().join("examples/hello.yaml")).unwrap();
    let t = home.file(
        "hello.yaml",
        &format!("{hello}\nenvs:\n  GW_TEST_MARKER: {}\n", home.marker),
    );
    let (code, out, err) = launch(&home, &t, "hello", &[]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");

    let c = home.cluster("hello");
    assert_eq!(c["status"], "UP", "{c}");
    assert_eq!(c["num_nodes"], 2, "{c}");
    let nodes = home.nodes("hello");
    assert_eq!(nodes.len(), 2, "{c}");
    assert_eq!(nodes.iter().map(|n| n.rank).collect::<Vec<_>>(), vec![0, 1]);
    let (ip0, ip1) = (&nodes[0].ip, &nodes[1].ip);
    // Each node its own address, or (single-address mode) its own ports.
    assert_ne!(nodes[0].key(), nodes[1].key(), "{c}");
    assert_eq!(ip0 == ip1, single_address(), "{c}");
    for n in &nodes {
        assert!(
            n.ip.starts_with("127.") && n.ip.parse::<std::net::Ipv4Addr>().is_ok(),
            "{c}"
        );
        assert!(home.node_home(&n.id).is_dir(), "node dir of {}", n.id);
    }
    for (rank, ip) in [(0, ip0), (1, ip1)] {
        let want = format!("(rank {rank}, {ip}) rank {rank} of 2 at {ip}, head {ip0}, GPUs 0");
        assert!(out.contains(&want), "missing {want:?} in:\n{out}");
        let peers = format!("(rank {rank}, {ip}) peers: {ip0} {ip1}");
        assert!(out.contains(&peers), "missing {peers:?} in:\n{out}");
    }
    assert!(out.contains("gangway: job 1 SUCCEEDED"), "{out}");
    assert_eq!(home.instance_records().len(), 2);

    let (code, out, err) = parts(&home.run(["down", "hello", "-y"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Terminated cluster 'hello'"), "{out}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
    let (code, _, err) = parts(&home.run(["status", "hello"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no cluster named 'hello'"), "{err}");
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert!(home.node_dirs().is_empty(), "{:?}", home.node_dirs());
    assert_no_marker_procs(&home.marker, "down");
}

#[test]
fn every_rank_gets_the_gang_environment_and_nothing_else() {
    let home = TestHome::new();
    let workdir = home.path().join("wd");
    std::fs::create_dir_all(&workdir).unwrap();
    std::fs::write(workdir.join("synced.txt"), "from the workdir\n").unwrap();
    let t = home.file(
        "task.yaml",
        &format!(
            "num_nodes: 3\nworkdir: {}\nresources:\n  infra: local\n  accelerators: A100:2\n  ports: [8080, 9000-9001]\n\
             envs:\n  GW_TEST_MARKER: {}\n  MY_SETTING: forty-two\n\
             setup: env -0 > ~/env-setup\n\
             run: |\n  env -0 > ~/env-run\n  pwd > ~/pwd-run\n  cat synced.txt > ~/synced-run\n",
            workdir.display(),
            home.marker
        ),
    );

    let o = Running::start({
        let mut c = command_in(home.path());
        c.args(["launch", &t, "-c", "envs"])
            .env("AWS_SECRET_ACCESS_KEY", "leak")
            .env("GW_UNRELATED_LAUNCHER_VAR", "leak");
        c
    })
    .wait();
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");

    let nodes = home.nodes("envs");
    assert_eq!(nodes.len(), 3);
    let ips: Vec<&str> = nodes.iter().map(|n| n.ip.as_str()).collect();
    let job_id = home.last_job("envs")["id"].as_i64().unwrap();
    for n in &nodes {
        let node_home = home.node_home(&n.id);
        let r = n.rank.to_string();
        let env = env0(&node_home.join("env-run"));
        let get = |k: &str| env.get(k).map(String::as_str);
        let ctx = format!("rank {r}: {env:#?}");
        for k in ["NODE_RANK", "GANGWAY_NODE_RANK", "SKYPILOT_NODE_RANK"] {
            assert_eq!(get(k), Some(r.as_str()), "{k} of {ctx}");
        }
        for k in ["NNODES", "GANGWAY_NUM_NODES", "SKYPILOT_NUM_NODES"] {
            assert_eq!(get(k), Some("3"), "{k} of {ctx}");
        }
        for k in ["GANGWAY_NODE_IPS", "SKYPILOT_NODE_IPS"] {
            let got: Vec<&str> = get(k).unwrap_or("").lines().collect();
            assert_eq!(got, ips, "{k} of {ctx}");
        }
        assert_eq!(get("MASTER_ADDR"), Some(ips[0]), "{ctx}");
        assert_eq!(get("GANGWAY_HEAD_IP"), Some(ips[0]), "{ctx}");
        if single_address() {
            // Told apart by port: rank 0 listens on its first one.
            let firsts: Vec<String> = nodes
                .iter()
                .map(|n| n.first_port().expect("a port range").to_string())
                .collect();
            assert_eq!(get("MASTER_PORT"), Some(firsts[0].as_str()), "{ctx}");
            assert_eq!(get("GANGWAY_PORT_RANGE"), n.ports.as_deref(), "{ctx}");
            // The task's ports, moved into the node's own range.
            let first = n.first_port().expect("a port range");
            for (i, p) in [8080, 9000, 9001].iter().enumerate() {
                let want = (first + 1 + i as u16).to_string();
                assert_eq!(
                    get(&format!("GANGWAY_PORT_{p}")),
                    Some(want.as_str()),
                    "{ctx}"
                );
            }
            assert_eq!(
                get("GANGWAY_NODE_PORTS").map(|p| p.lines().collect::<Vec<_>>()),
                Some(firsts.iter().map(String::as_str).collect()),
                "{ctx}"
            );
        } else {
            assert_eq!(get("MASTER_PORT"), Some("29500"), "{ctx}");
            assert_eq!(get("GANGWAY_PORT_RANGE"), None, "{ctx}");
            for p in ["8080", "9000", "9001"] {
                assert_eq!(get(&format!("GANGWAY_PORT_{p}")), Some(p), "{ctx}");
            }
        }
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("0,1"), "{ctx}");
        assert_eq!(get("GANGWAY_NUM_GPUS_PER_NODE"), Some("2"), "{ctx}");
        assert_eq!(get("SKYPILOT_NUM_GPUS_PER_NODE"), Some("2"), "{ctx}");
        assert_eq!(get("GANGWAY_CLUSTER"), Some("envs"), "{ctx}");
        assert_eq!(
            get("GANGWAY_JOB_ID"),
            Some(job_id.to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(get("GANGWAY_RESTART_COUNT"), Some("0"), "{ctx}");
        assert!(
            get("SKYPILOT_TASK_ID").is_some_and(|v| v.contains("envs")),
            "{ctx}"
        );
        assert!(get("GANGWAY_CHECKPOINT_DIR").is_some(), "{ctx}");
        assert_eq!(get("MY_SETTING"), Some("forty-two"), "{ctx}");
        assert_eq!(get("GW_TEST_MARKER"), Some(home.marker.as_str()), "{ctx}");
        assert_eq!(
            get("HOME"),
            Some(node_home.display().to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(
            get("AWS_SECRET_ACCESS_KEY"),
            None,
            "launcher env leaked: {ctx}"
        );
        assert_eq!(
            get("GW_UNRELATED_LAUNCHER_VAR"),
            None,
            "launcher env leaked: {ctx}"
        );
        assert_eq!(get("GANGWAY_HOME"), None, "launcher env leaked: {ctx}");
        assert!(
            !env.values().any(|v| v == "leak"),
            "launcher env leaked: {ctx}"
        );
        // The workdir was synced and the run started in it.
        let pwd = std::fs::read_to_string(node_home.join("pwd-run")).unwrap();
        assert_eq!(
            pwd.trim(),
            node_home.join("sky_workdir").display().to_string()
        );
        assert_eq!(
            std::fs::read_to_string(node_home.join("synced-run")).unwrap(),
            "from the workdir\n"
        );

        let setup = env0(&node_home.join("env-setup"));
        let sget = |k: &str| setup.get(k).map(String::as_str);
        let sctx = format!("setup of rank {r}: {setup:#?}");
        assert_eq!(sget("SKYPILOT_SETUP_NODE_RANK"), Some(r.as_str()), "{sctx}");
        assert_eq!(sget("GANGWAY_SETUP_NODE_RANK"), Some(r.as_str()), "{sctx}");
        for k in ["SKYPILOT_SETUP_NODE_IPS", "GANGWAY_SETUP_NODE_IPS"] {
            let got: Vec<&str> = sget(k).unwrap_or("").lines().collect();
            assert_eq!(got, ips, "{k} of {sctx}");
        }
        for k in [
            "NODE_RANK",
            "GANGWAY_NODE_RANK",
            "SKYPILOT_NODE_RANK",
            "MASTER_ADDR",
        ] {
            assert_eq!(sget(k), None, "{k} in {sctx}");
        }
        assert_eq!(sget("MY_SETTING"), Some("forty-two"), "{sctx}");
        assert_eq!(sget("AWS_SECRET_ACCESS_KEY"), None, "{sctx}");
    }
}

#[test]
fn checkpoint_dir_is_on_each_ranks_own_node() {
    // Every node has its own directory on the local cloud; a rank's
    // GANGWAY_CHECKPOINT_DIR must be on its own node, not on rank 0's.
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "run: |\n  echo \"$GANGWAY_CHECKPOINT_DIR\" > ~/ckpt\n  test -d \"$GANGWAY_CHECKPOINT_DIR\"\n",
    );
    let (code, out, err) = launch(&home, &t, "ckpt", &[]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for n in home.nodes("ckpt") {
        let node_home = home.node_home(&n.id);
        let got = std::fs::read_to_string(node_home.join("ckpt")).unwrap();
        assert_eq!(
            got.trim(),
            node_home.join("gangway_checkpoints").display().to_string(),
            "rank {}'s checkpoint dir",
            n.rank
        );
    }
}

#[test]
fn ddp_rendezvous_example_adds_up() {
    let home = TestHome::new();
    let m = home.marker_env();
    let (code, out, err) = launch(&home, "examples/ddp-rendezvous.yaml", "ddp", &["--env", &m]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("sum of ranks 6, expected 6: ok"),
        "stdout:\n{out}"
    );
    let nodes = home.nodes("ddp");
    assert_eq!(nodes.len(), 4);
    let head = format!("(rank 0, {}) sum of ranks 6", nodes[0].ip);
    assert!(out.contains(&head), "{head:?} not in:\n{out}");
    for n in &nodes {
        let want = format!("rank {} at {}: rank 0 says the sum is 6", n.rank, n.ip);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    // Rank 0 heard every rank: from its address, or (one address for all)
    // from the last port of its own range.
    let heard = out
        .lines()
        .find(|l| l.contains("rank 0 heard from"))
        .unwrap_or_else(|| panic!("no 'heard from' line in:\n{out}"));
    for n in &nodes {
        let from = match &n.ports {
            Some(range) => format!("'{}:{}'", n.ip, range.split('-').nth(1).unwrap()),
            None => format!("'{}'", n.ip),
        };
        assert!(heard.contains(&from), "{from} not in {heard}");
    }
}

#[test]
fn topology_example_ranks_by_switch_path() {
    let home = TestHome::new();
    let m = home.marker_env();
    let (code, out, err) = launch(&home, "examples/topology.yaml", "topo", &["--env", &m]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");

    // `(rank R, IP) rank R at IP under PATH`
    let mut ranks: Vec<(u32, String, String)> = out
        .lines()
        .filter(|l| l.starts_with("(rank ") && l.contains(" under "))
        .map(|l| {
            let (prefix, text) = l.split_once(") ").unwrap();
            let rest = text.strip_prefix("rank ").unwrap();
            let (r, rest) = rest.split_once(" at ").unwrap();
            let (ip, path) = rest.split_once(" under ").unwrap();
            assert_eq!(prefix, format!("(rank {r}, {ip}"), "{l}");
            (r.parse().unwrap(), ip.to_string(), path.to_string())
        })
        .collect();
    ranks.sort();
    assert_eq!(
        ranks.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..8).collect::<Vec<u32>>(),
        "stdout:\n{out}"
    );
    // The same as status says.
    let nodes = home.nodes("topo");
    for (n, (r, ip, path)) in nodes.iter().zip(&ranks) {
        assert_eq!((n.rank, &n.ip, &n.topology), (*r, ip, path));
    }
    // Sorted by (path, address as a number, then first port where the
    // nodes share an address).
    let key = |r: u32| nodes[r as usize].key();
    let keys: Vec<(String, (u32, u16))> = ranks
        .iter()
        .map(|(r, _, path)| (path.clone(), key(*r)))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        keys, sorted,
        "ranks are not in (path, address) order: {ranks:?}"
    );
    // Each leaf's two nodes have neighbouring ranks.
    for leaf in [
        "spine1/leaf1",
        "spine1/leaf2",
        "spine2/leaf1",
        "spine2/leaf2",
    ] {
        let on: Vec<u32> = ranks.iter().filter(|r| r.2 == leaf).map(|r| r.0).collect();
        assert_eq!(on.len(), 2, "{leaf}: {ranks:?}");
        assert_eq!(on[1], on[0] + 1, "{leaf}: {ranks:?}");
    }
    // The seeded shuffle means address order is not rank order.
    let mut by_ip = ranks.clone();
    by_ip.sort_by_key(|r| key(r.0));
    assert_ne!(
        by_ip.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..8).collect::<Vec<u32>>(),
        "ranks follow the addresses; the topology did not matter: {ranks:?}"
    );
    // A ring in rank order crosses fewer switches than one in address order.
    let split = |p: &str| p.split('/').map(str::to_string).collect::<Vec<String>>();
    let rank_paths: Vec<Vec<String>> = ranks.iter().map(|r| split(&r.2)).collect();
    let ip_paths: Vec<Vec<String>> = by_ip.iter().map(|r| split(&r.2)).collect();
    let hops = |p: &[Vec<String>]| ring_hops(&p.iter().map(Vec::as_slice).collect::<Vec<_>>());
    // 4 neighbours under one leaf (1 switch each), 2 steps between leaves of
    // one spine (3 each), 2 between spines (5 each, the ring's closing one
    // included): the least any order can do.
    assert_eq!(hops(&rank_paths), 4 + 2 * 3 + 2 * 5, "{ranks:?}");
    assert!(
        hops(&rank_paths) < hops(&ip_paths),
        "rank order {} hops, address order {}",
        hops(&rank_paths),
        hops(&ip_paths)
    );
}

#[test]
fn full_zone_fails_over_to_the_next() {
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "config:\n  local:\n    capacity: {local-a: 1}\nrun: echo ran-on-$NODE_RANK\n",
    );
    let (code, out, err) = launch(&home, &t, "fo", &[]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("local-a") && l.contains("out of capacity")),
        "stderr:\n{err}"
    );
    assert!(
        out.contains("ran-on-0") && out.contains("ran-on-1"),
        "{out}"
    );
    let c = home.cluster("fo");
    assert_eq!(c["zone"], "local-b", "{c}");
    assert_eq!(c["status"], "UP", "{c}");
    for n in home.nodes("fo") {
        assert_eq!(n.zone, "local-b", "{n:?}");
    }
    // Nothing was left in the zone that failed.
    assert_eq!(home.instance_records().len(), 2);
}

#[test]
fn no_capacity_anywhere_exits_3_and_leaves_nothing() {
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "config:\n  local:\n    capacity: 1\nrun: echo never\n",
    );
    let (code, out, err) = launch(&home, &t, "full", &[]);
    assert_eq!(code, 3, "stdout:\n{out}\nstderr:\n{err}");
    for zone in ["local-a", "local-b", "local-c"] {
        assert!(
            err.lines().any(|l| l.trim_start().starts_with("- ")
                && l.contains(&format!("local/local/{zone}"))
                && l.contains("out of capacity")),
            "no attempt in {zone} listed:\n{err}"
        );
    }
    assert!(!out.contains("never"), "{out}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert!(home.node_dirs().is_empty(), "{:?}", home.node_dirs());
}

#[test]
fn a_failing_rank_stops_the_gang() {
    let home = TestHome::new();
    let t = task(
        &home,
        3,
        "run: |\n  if [ \"$NODE_RANK\" = 1 ]; then echo rank-one-fails; exit 3; fi\n  sleep 300\n",
    );
    let (code, out, err) = launch(&home, &t, "fail", &[]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let nodes = home.nodes("fail");
    let ip1 = &nodes[1].ip;
    let what = format!("rank 1 ({ip1}) exited with code 3");
    assert!(out.contains(&what), "{what:?} not in:\n{out}");
    assert!(
        out.contains(&format!("(rank 1, {ip1}) rank-one-fails")),
        "{out}"
    );
    let job = home.last_job("fail");
    assert_eq!(job["status"], "FAILED", "{job}");
    let detail = job["detail"].as_str().unwrap_or("");
    assert!(detail.contains(&what), "{job}");
    // The sleepers were stopped, and the cluster stays up for the next job.
    assert_no_marker_procs(&home.marker, "rank 1 failed");
    assert_eq!(home.cluster("fail")["status"], "UP");
}

#[test]
fn a_failing_setup_keeps_the_run_from_starting() {
    let home = TestHome::new();
    let t = task(
        &home,
        3,
        "setup: |\n  if [ \"$SKYPILOT_SETUP_NODE_RANK\" = 1 ]; then echo boom-setup; exit 7; fi\n  echo setup-fine\n\
         run: touch ~/run-happened\n",
    );
    let (code, out, err) = launch(&home, &t, "setupfail", &[]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let nodes = home.nodes("setupfail");
    let ip1 = &nodes[1].ip;
    assert!(
        out.contains(&format!("(setup rank 1, {ip1}) boom-setup")),
        "{out}"
    );
    let what = format!("setup on rank 1 ({ip1}) exited with code 7");
    assert!(out.contains(&what), "{what:?} not in:\n{out}");
    let job = home.last_job("setupfail");
    assert_eq!(job["status"], "FAILED_SETUP", "{job}");
    let detail = job["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains(&what) && detail.contains("boom-setup"),
        "{job}"
    );
    for n in &nodes {
        assert!(
            !home.node_home(&n.id).join("run-happened").exists(),
            "the run started on rank {}",
            n.rank
        );
    }
    assert_no_marker_procs(&home.marker, "setup failed");
}

#[test]
fn a_second_launch_of_a_busy_cluster_is_refused() {
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "config:\n  local:\n    boot_s: 5\nrun: echo first-launch-ran\n",
    );
    let a = home.spawn(["launch", &t, "-c", "same"]);
    wait_for("launch A to reserve the cluster", DEADLINE, || {
        match home.cluster_opt("same") {
            Some(c) if c["shown_status"] == "INIT" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (code, out, err) = launch(&home, &t, "same", &[]);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("cluster 'same' is busy") && err.contains("launching"),
        "{err}"
    );
    assert!(!out.contains("first-launch-ran"), "{out}");
    let (code, out, err) = parts(&a.wait());
    assert_eq!(code, 0, "launch A:\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("first-launch-ran"), "{out}");
    assert_eq!(home.jobs("same").len(), 1);
}

#[test]
fn four_launches_at_once_get_distinct_addresses() {
    let home = TestHome::new();
    let t = task(&home, 2, "run: echo up-$NODE_RANK\n");
    let names = ["para", "parb", "parc", "pard"];
    let running: Vec<_> = names
        .iter()
        .map(|n| home.spawn(["launch", t.as_str(), "-c", n]))
        .collect();
    for (n, r) in names.iter().zip(running) {
        let (code, out, err) = parts(&r.wait());
        assert_eq!(code, 0, "{n}:\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.contains("up-0") && out.contains("up-1"), "{n}: {out}");
    }
    let mut ips = Vec::new();
    for n in names {
        let c = home.cluster(n);
        assert_eq!(c["status"], "UP", "{c}");
        // An address each, or (single-address mode) a port range each.
        ips.extend(
            home.nodes(n)
                .into_iter()
                .map(|n| format!("{} {}", n.ip, n.ports.unwrap_or_default())),
        );
    }
    assert_eq!(ips.len(), 8);
    let mut unique = ips.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 8, "addresses handed out twice: {ips:?}");
    assert_eq!(home.instance_records().len(), 8);
}

#[test]
fn secrets_reach_the_nodes_and_nowhere_else() {
    const SECRET: &str = "s3cr3t-XYZ-123";
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "secrets:\n  API_TOKEN: null\nrun: echo \"token length ${#API_TOKEN}\"\n",
    );
    let secret = format!("API_TOKEN={SECRET}");
    let (code, out, err) = launch(&home, &t, "sec", &["--secret", &secret]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let nodes = home.nodes("sec");
    for n in &nodes {
        let want = format!("(rank {}, {}) token length {}", n.rank, n.ip, SECRET.len());
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    assert!(!out.contains(SECRET) && !err.contains(SECRET));
    // Nothing gangway wrote holds it: state.db and its WAL, logs, locks,
    // the local cloud's records and node directories.
    let mut files = Vec::new();
    let mut dirs = vec![home.path().to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                dirs.push(e.path());
            } else if ft.is_file() {
                files.push(e.path());
            }
        }
    }
    assert!(
        files.iter().any(|f| f.ends_with("state.db")),
        "no state.db among {files:?}"
    );
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{} holds the secret",
            f.display()
        );
    }
    // The launch without the secret is refused, naming it but no value.
    let (code, _, err) = launch(&home, &t, "sec", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("API_TOKEN"), "{err}");
}

#[test]
fn launch_down_tears_the_cluster_down_after_the_run() {
    let home = TestHome::new();
    let t = task(&home, 2, "run: echo ran-before-down-$NODE_RANK\n");
    let (code, out, err) = launch(&home, &t, "downafter", &["--down"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("ran-before-down-0") && out.contains("ran-before-down-1"),
        "{out}"
    );
    wait_for("the cluster to be gone", DEADLINE, || {
        match home.cluster_opt("downafter") {
            None => Ok(()),
            Some(c) => Err(c.to_string()),
        }
    });
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert_no_marker_procs(&home.marker, "launch --down");
}

#[test]
fn spot_preemption_fails_the_job_and_says_so() {
    let home = TestHome::new();
    // The market strikes 3 s after the launch; the run would outlive the
    // test's watchdog otherwise, so a missed preemption fails loudly.
    let t = task(
        &home,
        2,
        "config:\n  local:\n    preempt_after_s: 3\nrun: sleep 120\n",
    );
    let (code, out, err) = launch(&home, &t, "spot", &["--use-spot"]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("preempted"), "stdout:\n{out}");
    let job = home.last_job("spot");
    assert_eq!(job["status"], "FAILED", "{job}");
    assert!(
        job["detail"].as_str().unwrap_or("").contains("preempted"),
        "{job}"
    );
    assert_eq!(home.cluster("spot")["use_spot"], true);
    assert_no_marker_procs(&home.marker, "preemption");
}

#[test]
fn launch_json_prints_one_document() {
    let home = TestHome::new();
    let t = task(&home, 2, "run: echo json-run-$NODE_RANK\n");
    let (code, out, err) = launch(&home, &t, "js", &["-o", "json", "-y"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // from_str refuses anything after the document but whitespace.
    let v = json_doc(&out);
    assert_eq!(v["status"], "SUCCEEDED", "{v}");
    assert_eq!(v["cluster"], "js", "{v}");
    assert_eq!(v["job_id"], 1, "{v}");
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2, "{v}");
    let from_status = home.nodes("js");
    for (n, s) in nodes.iter().zip(&from_status) {
        assert_eq!(n["rank"], s.rank, "{v}");
        assert_eq!(n["private_ip"], s.ip.as_str(), "{v}");
    }
    assert!(
        !out.contains("json-run"),
        "job output leaked into stdout:\n{out}"
    );
}

#[test]
fn bad_input_exits_2() {
    let home = TestHome::new();
    let t = task(
        &home,
        2,
        "config:\n  local:\n    capasity: 1\nrun: echo never\n",
    );
    let (code, out, err) = launch(&home, &t, "typo", &[]);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("config.local.capasity"), "{err}");
    assert!(!out.contains("never"), "{out}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
    assert!(home.instance_records().is_empty());

    let (code, _, err) = parts(&home.run(["exec", "nosuch", "echo", "hi"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no cluster named 'nosuch'"), "{err}");

    let good = task(&home, 1, "run: echo never\n");
    let (code, out, err) = launch(&home, &good, "bad/name", &[]);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("'bad/name' is not valid"), "{err}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
}

#[test]
fn config_local_addresses_picks_the_mode_whatever_the_machine_answers() {
    let home = TestHome::new();
    for (mode, name) in [("single", "one"), ("per-node", "many")] {
        let t = task(
            &home,
            2,
            &format!(
                "config:\n  local:\n    addresses: {mode}\n\
                 run: echo \"$NODE_RANK at $MASTER_ADDR:$MASTER_PORT ${{GANGWAY_PORT_RANGE:-own}}\"\n"
            ),
        );
        let (code, out, err) = launch(&home, &t, name, &[]);
        assert_eq!(code, 0, "{mode}: stdout:\n{out}\nstderr:\n{err}");
        let nodes = home.nodes(name);
        let single = mode == "single";
        assert_eq!(nodes[0].ip == "127.0.0.1", single, "{mode}");
        assert_eq!(nodes[1].ip == nodes[0].ip, single, "{mode}");
        assert!(nodes.iter().all(|n| n.ports.is_some() == single), "{mode}");
        let port = nodes[0].first_port().map_or(29500, u32::from);
        for n in &nodes {
            let own = n.ports.as_deref().unwrap_or("own");
            let want = format!("{} at {}:{port} {own}", n.rank, nodes[0].ip);
            assert!(out.contains(&want), "{mode}: {want:?} not in:\n{out}");
        }
        // The table shows the ports where nodes share an address.
        let (_, table, _) = parts(&home.run(["status", name]));
        assert_eq!(table.contains("127.0.0.1 ports "), single, "{table}");
    }
    let (code, _, err) = launch(
        &home,
        &task(
            &home,
            1,
            "config:\n  local:\n    addresses: many\nrun: true\n",
        ),
        "bad",
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("config.local.addresses"), "{err}");
}

/// A rank that prints escape sequences (a window title, a clipboard write
/// through OSC 52, a cursor move over gangway's own lines) reaches the
/// user's terminal as visible text, never as the sequences; piped output
/// and the log keep the bytes.
#[test]
fn escape_sequences_from_a_rank_never_reach_the_terminal() {
    let home = TestHome::new();
    let t = task(
        &home,
        1,
        "run: printf 'step-1 \\033]0;pwned\\007 \\033]52;c;aGk=\\007\\033[1A done\\n'\n",
    );
    // Under a pseudo-terminal, as a user runs it.
    let cmd = format!(
        "{} launch {} -c esc -y --down",
        env!("CARGO_BIN_EXE_gangway"),
        t
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("GANGWAY_HOME", home.path())
        .env_remove("GANGWAY_CATALOG_DIR")
        .current_dir(crate::common::root())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("step-1 ^[]0;pwned^G ^[]52;c;aGk=^G^[[1A done"),
        "{text}"
    );
    // (gangway's own progress display may draw with escapes of its own.)
    for raw in ["\u{1b}]0;pwned", "\u{1b}]52;", "\u{1b}[1A done"] {
        assert!(
            !text.contains(raw),
            "{raw:?} reached the terminal: {text:?}"
        );
    }
    // Piped, the bytes are the node's.
    let (code, piped, _) = launch(&home, &t, "esc2", &["--down"]);
    assert_eq!(code, 0);
    assert!(piped.contains("step-1 \u{1b}]0;pwned\u{7}"), "{piped:?}");
}
