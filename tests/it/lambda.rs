//! `infra: lambda` end to end through the real binary, against the Lambda
//! fake (tests/emulators/lambda): its instances are a real sshd's loopback
//! addresses on port 22 (what the API says of a Lambda VM: an `ip`, no
//! port), and it checks every request against Lambda's published shapes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use crate::common::{command_in, json_doc, parts, root, Running, TestHome};
use crate::skip;

/// The fake's accepted key (its default).
const KEY: &str = "test-key";

/// A running fake, killed on drop.
struct LambdaFake {
    child: Child,
    url: String,
}

impl Drop for LambdaFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LambdaFake {
    /// The fake at a hundredth of Lambda's rate limits, or why not.
    fn start() -> Result<LambdaFake, String> {
        let server = root().join("tests/emulators/lambda/server.py");
        let mut child = Command::new("python3")
            .arg(&server)
            .args([
                "--port",
                "0",
                "--rate-scale",
                "0.01",
                "--boot-seconds",
                "0.5",
            ])
            .args(["--watch-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("python3 (for {}): {e}", server.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        match line.trim().strip_prefix("READY ") {
            Some(url) => Ok(LambdaFake {
                url: url.to_string(),
                child,
            }),
            None => {
                let _ = child.kill();
                Err(format!("the Lambda fake did not start: {line:?}"))
            }
        }
    }

    /// A control call (`/_fake/...`), its JSON answer.
    fn control(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import sys,urllib.request as u\n\
                 d=None if sys.argv[2]=='GET' else sys.argv[3].encode()\n\
                 r=u.Request(sys.argv[1],data=d,method=sys.argv[2],headers={'Content-Type':'application/json'})\n\
                 print(u.urlopen(r,timeout=20).read().decode())",
            )
            .args([format!("{}{path}", self.url), method.into(), body.to_string()])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    fn violations(&self) -> serde_json::Value {
        self.control("GET", "/_fake/violations", serde_json::json!({}))
    }

    /// `leak_check.py --keys`: (exit code, what it printed).
    fn leak_check(&self) -> (i32, String) {
        let out = Command::new("python3")
            .arg(root().join("tests/emulators/gpucloud/leak_check.py"))
            .args(["--endpoint", &self.url, "--keys"])
            .output()
            .expect("python3");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// gangway in `home` talking to `fake`.
fn run(fake: &LambdaFake, home: &TestHome, args: &[&str]) -> Output {
    let mut c = command_in(home.path());
    c.env("GANGWAY_LAMBDA_ENDPOINT", &fake.url)
        .env("GANGWAY_LAMBDA_RATE_SCALE", "0.01")
        .env("LAMBDA_API_KEY", KEY)
        .args(args);
    Running::start(c).wait()
}

/// A catalog of two regions with `H100:8` on Lambda, us-south-2 the
/// cheaper (as the fake's types and capacity have them).
fn catalog(home: &TestHome) -> String {
    let dir = home.path().join("test-catalog");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("lambda.csv"),
        "# taken: 2026-12-05\n\
         instance_type,accelerator,accelerator_count,accelerator_memory_gib,vcpus,memory_gib,region,zone,price,spot_price,placement,efa,estimated\n\
         gpu_8x_h100_sxm5,H100,8,80,208,1800,us-south-2,us-south-2,31.92,,false,false,\n\
         gpu_8x_h100_sxm5,H100,8,80,208,1800,us-west-3,us-west-3,32.50,,false,false,\n",
    )
    .unwrap();
    dir.display().to_string()
}

#[test]
fn a_lambda_gang_fails_over_a_stockout_runs_over_ssh_and_down_leaves_nothing() {
    let fake = match LambdaFake::start() {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    let Some(sshd) = crate::sshd::Sshd::start_on_port("lambda", 2, 22) else {
        return;
    };
    skip::ran("lambda");
    let home = TestHome::new();
    let slots: Vec<_> = sshd
        .addrs
        .iter()
        .map(|a| serde_json::json!([a, 22]))
        .collect();
    fake.control(
        "POST",
        "/_fake/machines",
        serde_json::json!({"slots": slots, "authorized_keys": sshd.authorized_keys()}),
    );
    // The cheaper region has no H100s: the launch fails over.
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"instance_type": "gpu_8x_h100_sxm5", "region": "us-south-2", "available": null}),
    );
    let cat = catalog(&home);
    let task = home.file(
        "lambda-e2e.yaml",
        "num_nodes: 2\nresources:\n  infra: lambda\n  accelerators: H100:8\n\
         config:\n  lambda:\n    ssh_user: root\n    poll_ms: 100\n\
         setup: echo setup-done > setup.txt\n\
         run: |\n  echo \"rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES master=$MASTER_ADDR:$MASTER_PORT setup=$(cat setup.txt)\"\n",
    );
    let (code, plan, err) = parts(&run(
        &fake,
        &home,
        &["optimize", &task, "--catalog", &cat, "-o", "json"],
    ));
    assert_eq!(code, 0, "{plan}\n{err}");
    assert_eq!(json_doc(&plan)["plan"][0]["region"], "us-south-2", "{plan}");

    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["launch", &task, "--catalog", &cat, "-c", "lam", "-y"],
    ));
    let all = format!("{out}{err}");
    assert_eq!(code, 0, "{all}");
    assert!(
        all.contains("insufficient-capacity"),
        "the stockout is shown: {all}"
    );

    let (_, st, _) = parts(&run(&fake, &home, &["status", "lam", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "lambda", "{c}");
    assert_eq!(c["region"], "us-west-3", "{c}");
    let state = fake.control("GET", "/_fake/state", serde_json::json!({}));
    let instances = state["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2, "{state}");
    let private: Vec<&str> = instances
        .iter()
        .map(|i| i["private_ip"].as_str().unwrap_or_default())
        .collect();
    for i in instances {
        let tags = i["tags"].to_string();
        assert!(
            tags.contains("gangway-cluster") && tags.contains("\"lam\""),
            "{i}"
        );
        assert!(sshd.addrs.iter().any(|a| i["ip"] == *a), "{i}");
    }
    for rank in 0..2 {
        let line = format!("rank={rank} of=2 master=");
        let at = all
            .find(&line)
            .unwrap_or_else(|| panic!("rank {rank} did not run:\n{all}"));
        let rest = &all[at + line.len()..];
        let master = rest.split_whitespace().next().unwrap_or_default();
        let (addr, port) = master.rsplit_once(':').unwrap_or_default();
        assert!(
            private.contains(&addr),
            "MASTER_ADDR {addr} is a node's private address {private:?}"
        );
        assert!(
            port.parse::<u16>().is_ok_and(|p| p > 0),
            "MASTER_PORT {port}"
        );
        assert!(rest.contains("setup=setup-done"), "{all}");
    }
    // The gang's key was registered for the cluster and is all gangway
    // put on the account besides the instances.
    let keys = state["ssh_keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{state}");
    assert!(
        keys[0]["name"].as_str().unwrap().ends_with("--lam"),
        "{state}"
    );

    let (code, out, err) = parts(&run(&fake, &home, &["down", "-y", "lam"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, left) = fake.leak_check();
    assert_eq!(code, 0, "{left}");
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
    assert!(home.cluster_opt("lam").is_none());
}

#[test]
fn lambda_check_names_where_the_key_came_from_and_never_the_key() {
    let fake = match LambdaFake::start() {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    skip::ran("lambda");
    let home = TestHome::new();
    let (code, out, err) = parts(&run(&fake, &home, &["check", "lambda", "-o", "json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("LAMBDA_API_KEY") && !out.contains(KEY),
        "{out}"
    );

    // A refused key: not usable, the fake's words, not the key.
    let mut c = command_in(home.path());
    c.env("GANGWAY_LAMBDA_ENDPOINT", &fake.url)
        .env("LAMBDA_API_KEY", "secret_refused_key")
        .args(["check", "lambda"]);
    let (_, out, err) = parts(&Running::start(c).wait());
    let all = format!("{out}{err}");
    assert!(all.contains("invalid-api-key"), "{all}");
    assert!(!all.contains("secret_refused_key"), "{all}");

    // No key anywhere: what to set.
    let mut c = command_in(home.path());
    c.env("GANGWAY_LAMBDA_ENDPOINT", &fake.url)
        .env_remove("LAMBDA_API_KEY")
        .env("HOME", home.path())
        .args(["check", "lambda"]);
    let (_, out, err) = parts(&Running::start(c).wait());
    let all = format!("{out}{err}");
    assert!(
        all.contains("LAMBDA_API_KEY") && all.contains("lambda_keys"),
        "{all}"
    );
}

#[test]
fn lambda_catalog_refresh_reads_prices_from_the_instance_types_listing() {
    let fake = match LambdaFake::start() {
        Ok(f) => f,
        Err(why) => return skip::skipped("lambda", why),
    };
    skip::ran("lambda");
    let home = TestHome::new();
    // A stale price in the catalog; the fake lists Lambda's $31.92.
    let dir = home.path().join("stale");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("lambda.csv"),
        "# taken: 2026-01-01\n\
         instance_type,accelerator,accelerator_count,accelerator_memory_gib,vcpus,memory_gib,region,zone,price,spot_price,placement,efa,estimated\n\
         gpu_8x_h100_sxm5,H100,8,80,208,1800,us-south-2,us-south-2,30.00,,false,false,\n",
    )
    .unwrap();
    let dir = dir.display().to_string();
    let (code, out, err) = parts(&run(
        &fake,
        &home,
        &["catalog", "refresh", "--cloud", "lambda", "--catalog", &dir],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let csv = std::fs::read_to_string(home.path().join("catalog/lambda.csv")).expect("overlay");
    assert!(csv.contains("from the lambda API"), "{csv}");
    let row = csv
        .lines()
        .find(|l| l.starts_with("gpu_8x_h100_sxm5,") && l.contains("us-south-2"))
        .unwrap_or_else(|| panic!("{csv}"));
    assert_eq!(row.split(',').nth(8), Some("31.92"), "{row}");
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}
