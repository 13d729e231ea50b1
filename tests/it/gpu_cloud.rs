//! What the through-the-binary suites of the GPU clouds with a JSON API
//! (`lambda.rs`, `runpod.rs`, `vast.rs`) share: gangway pointed at the
//! cloud's fake, a catalog of the test's own, the fake's machines behind a
//! real sshd, and the checks that a gang's ranks ran and met.

use std::process::Output;

use crate::common::{command_in, Running, TestHome};
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
