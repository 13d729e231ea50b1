//! Fan-out of a trivial command over SSH, cold (new master connections)
//! and warm (connections up). Needs a running sshd: `bench/ssh.py` starts
//! one on 64 loopback addresses and runs this with GW_SSH_* set; run
//! directly it says what it needs and exits.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

use gangway::transport::ssh::SshTransport;
use gangway_provider::NodeRow;
use gangway_provider::{NodeCommand, Transport};

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn nodes(addrs: &[String], port: &str, user: &str, key: &str) -> Vec<NodeRow> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut extra = BTreeMap::new();
            extra.insert("ssh.host".to_string(), a.clone());
            extra.insert("ssh.port".to_string(), port.to_string());
            extra.insert("ssh.user".to_string(), user.to_string());
            extra.insert("ssh.key".to_string(), key.to_string());
            NodeRow {
                rank: i as u32,
                instance_id: format!("n{i}"),
                private_ip: a.clone(),
                public_ip: None,
                zone: "z".into(),
                topology: String::new(),
                state: "running".into(),
                extra,
            }
        })
        .collect()
}

async fn run_all(t: &SshTransport, nodes: &[NodeRow]) {
    let mut waits = Vec::new();
    for n in nodes {
        let (mut r, w) = std::io::pipe().unwrap();
        let cmd = NodeCommand {
            script: "true".into(),
            env: Vec::new(),
            cwd: "~".into(),
            task_view: true,
        };
        let child = t.spawn(n, &cmd, w).expect("spawn");
        let drain = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
        });
        waits.push((child, drain));
    }
    for (c, d) in waits {
        let s = c.wait().await.unwrap();
        assert!(s.success());
        d.join().unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let (Some(addrs), Some(port), Some(key)) =
        (env("GW_SSH_ADDRS"), env("GW_SSH_PORT"), env("GW_SSH_KEY"))
    else {
        eprintln!("ssh_fanout: needs GW_SSH_ADDRS, GW_SSH_PORT, GW_SSH_KEY (run bench/ssh.py)");
        return;
    };
    let user = env("GW_SSH_USER").unwrap_or_else(|| "root".into());
    let addrs: Vec<String> = addrs.split(',').map(str::to_string).collect();
    let ns = nodes(&addrs, &port, &user, &key);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rounds = 5;
    let mut warm = Vec::new();
    // Cold with the default bound on handshakes at once, and others.
    let bounds: Vec<usize> = env("GW_SSH_BOUNDS")
        .map(|b| b.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![gangway::transport::ssh::MAX_HANDSHAKES]);
    for &bound in &bounds {
        let mut cold = Vec::new();
        for round in 0..rounds {
            let home = tempfile::tempdir().unwrap();
            let t = SshTransport::new(home.path(), &format!("bench{round}"), true)
                .unwrap()
                .with_max_handshakes(bound);
            let start = Instant::now();
            rt.block_on(async {
                t.connect(&ns).await.unwrap();
                run_all(&t, &ns).await;
            });
            cold.push(start.elapsed());
            if bound == bounds[0] {
                for _ in 0..5 {
                    let start = Instant::now();
                    rt.block_on(run_all(&t, &ns));
                    warm.push(start.elapsed());
                }
            }
        }
        println!(
            "gangway cold (connect {} nodes, {bound:>2} handshakes at once, + run):  median {:7.1} ms",
            ns.len(),
            median(cold).as_secs_f64() * 1000.0
        );
    }
    println!(
        "gangway warm (masters up, run only):   median {:7.1} ms",
        median(warm).as_secs_f64() * 1000.0
    );
}
