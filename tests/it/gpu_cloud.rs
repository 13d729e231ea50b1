//! What the through-the-binary suites of the GPU clouds with a JSON API
//! (`lambda.rs`, `runpod.rs`, `vast.rs`) share: gangway pointed at the
//! cloud's fake, a catalog of the test's own, the fake's machines behind a
//! real sshd, and the checks that a gang's ranks ran and met.

use std::process::Output;
use std::time::Duration;

use crate::common::{command_in, json_doc, parts, Running, TestHome};
pub use gangway_test::gpu_fake::{GpuCloudFake, KEY, RATE_SCALE};

/// The catalog columns gangway reads.
pub const CSV_HEADER: &str = "instance_type,accelerator,accelerator_count,accelerator_memory_gib,vcpus,memory_gib,region,zone,price,spot_price,placement,efa,estimated";

/// `cloud`'s fake (its suite skips with why when it cannot start).
pub fn start(cloud: &str, boot_seconds: &str) -> Result<GpuCloudFake, String> {
    GpuCloudFake::start(cloud, boot_seconds, &[])
}

/// gangway in `home` talking to `fake` as `cloud` (`lambda`, `runpod`,
/// `vast`): its endpoint, its rate scale, the fake's key.
pub fn command(cloud: &str, fake: &GpuCloudFake, home: &TestHome) -> std::process::Command {
    let upper = cloud.to_ascii_uppercase();
    let mut c = command_in(home.path());
    c.env(format!("GANGWAY_{upper}_ENDPOINT"), &fake.url)
        .env(format!("GANGWAY_{upper}_RATE_SCALE"), RATE_SCALE)
        .env(format!("{upper}_API_KEY"), KEY);
    c
}

/// [`command`] with `args`, run to the end.
pub fn run(cloud: &str, fake: &GpuCloudFake, home: &TestHome, args: &[&str]) -> Output {
    let mut c = command(cloud, fake, home);
    c.args(args);
    Running::start(c).wait()
}

/// A catalog directory `name` in `home` holding `cloud.csv` with `rows`
/// (taken on `date`); its path.
pub fn catalog(home: &TestHome, name: &str, cloud: &str, date: &str, rows: &[&str]) -> String {
    let dir = home.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = format!("# taken: {date}\n{CSV_HEADER}\n");
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    std::fs::write(dir.join(format!("{cloud}.csv")), text).unwrap();
    dir.display().to_string()
}

/// Gives the fake `sshd`'s addresses on `port` as its machines.
pub fn machines(fake: &GpuCloudFake, sshd: &crate::sshd::Sshd, port: u16) {
    let slots: Vec<_> = sshd
        .addrs
        .iter()
        .map(|a| serde_json::json!([a, port]))
        .collect();
    fake.control(
        "POST",
        "/_fake/machines",
        serde_json::json!({"slots": slots, "authorized_keys": sshd.authorized_keys()}),
    );
}

/// The run line every rank of the suites' gangs prints.
pub const RANK_LINE: &str = "echo \"rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES master=$MASTER_ADDR:$MASTER_PORT setup=$(cat setup.txt)\"";

/// Each of `n` ranks printed its [`RANK_LINE`] in `all`, after setup, with
/// the head's address one of `private` and a port.
pub fn assert_ranks_met(all: &str, n: usize, private: &[&str]) {
    for rank in 0..n {
        let line = format!("rank={rank} of={n} master=");
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
}

/// After `down`: nothing left at the cloud (`leak_check.py`), no request
/// that broke the published shapes, and no cluster `name` in `home`.
pub fn assert_nothing_left(fake: &GpuCloudFake, home: &TestHome, name: &str) {
    let (code, left) = fake.leak_check();
    assert_eq!(code, 0, "{left}");
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
    assert!(home.cluster_opt(name).is_none());
}

/// A managed job on `cloud`'s spot market survives a preemption from its
/// last kept checkpoint. The task is `resources` (its `resources:` and
/// `config:` lines, spot) and a run that keeps a checkpoint of step 7 in
/// run 0 and then waits; once it is kept, `preempt` gets the fake's state
/// (to check the machine is spot and interrupt it) after the fake's next
/// machine is `after` (another sshd, another home, so a checkpoint found
/// there can only be the one gangway kept). The job must recover on
/// `after`, resume from step 7, succeed with one preemption, and leave
/// nothing at the cloud, no request off the published shapes and no
/// process.
#[allow(clippy::too_many_arguments)]
pub fn a_managed_job_survives_a_preemption(
    cloud: &str,
    fake: &GpuCloudFake,
    home: &TestHome,
    catalog_dir: &str,
    resources: &str,
    after: &crate::sshd::Sshd,
    port: u16,
    preempt: impl FnOnce(&serde_json::Value),
) {
    let ready = home.path().join("ready");
    let task = home.file(
        &format!("{cloud}-spot.yaml"),
        &format!(
            "{resources}\
             checkpoint:\n  sync_interval: 1\nenvs:\n  GW_TEST_MARKER: {marker}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    t=$(date +%s%3N)\n    \
             echo 7 > \"$ck\"\n    \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n    \
             touch {ready}\n    \
             exec sleep 300\n  fi\n  \
             echo \"resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT on $HOME\"\n",
            marker = home.marker,
            ready = ready.display()
        ),
    );
    let mut c = command(cloud, fake, home);
    c.args(["jobs", "launch", &task, "-y", "--wait"])
        .env("GANGWAY_CATALOG_DIR", catalog_dir);
    let job = Running::start(c);
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
    // The next machine the fake hands out is `after`.
    fake.control(
        "POST",
        "/_fake/machines",
        serde_json::json!({"slots": [[after.addrs[0], port]], "authorized_keys": after.authorized_keys()}),
    );
    preempt(&fake.state());
    let (code, out, err) = parts(&job.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains(&format!(
            "resumed at step 7 in run 1 on {}",
            after.home.display()
        )),
        "{out}\n{err}"
    );
    let (_, q, _) = parts(&run(cloud, fake, home, &["jobs", "queue", "-o", "json"]));
    let j = json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "{j}");
    crate::common::wait_for(
        "the job's machines to be gone",
        Duration::from_secs(60),
        || match fake.leak_check() {
            (0, _) => Ok(()),
            (_, left) => Err(left),
        },
    );
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}
