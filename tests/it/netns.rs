//! Nodes in network namespaces of their own: each with its own sshd on
//! port 22, its own hostname (a UTS namespace) and its own link, reached
//! over a veth pair from the host, or only from inside another node (a
//! jump host). `cut()` drops a node's link without a word, as a dead node
//! or a broken switch does.
//!
//! Needs root, `ip`, `unshare` and sshd; [`NetnsKeys::new`] says
//! `SKIPPED netns: why` (tests/support/src/skip.rs) and returns `None`
//! otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gangway_provider::NodeRow;

/// Each node of a test process gets its own /24 and interface names.
static NEXT: AtomicU32 = AtomicU32::new(0);

fn sh(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The keys every namespaced node of a test shares: one host key, one
/// client key (authorized everywhere).
pub struct NetnsKeys {
    dir: tempfile::TempDir,
}

impl NetnsKeys {
    /// Keys for a test (recorded as `ran netns`), or `None` (after
    /// `SKIPPED netns: why`) where namespaces cannot be made here.
    pub fn new() -> Option<NetnsKeys> {
        let root = unsafe { libc::geteuid() } == 0;
        let have = |p: &str| Path::new(p).exists();
        if !root
            || !have("/usr/sbin/sshd")
            || !(have("/usr/sbin/ip") || have("/sbin/ip") || have("/bin/ip"))
            || !(have("/usr/bin/unshare") || have("/bin/unshare"))
        {
            return crate::skip::skip(
                "netns",
                "the network-namespace tests need root, sshd (openssh-server), ip (iproute2) and unshare (util-linux)",
            );
        }
        let probe = format!("gwprobe{}", std::process::id());
        if !sh(&format!("ip netns add {probe} && ip netns del {probe}")) {
            return crate::skip::skip(
                "netns",
                "cannot create a network namespace here (ip netns add failed)",
            );
        }
        crate::skip::ran("netns");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for k in ["host", "client"] {
            assert!(sh(&format!(
                "ssh-keygen -q -t ed25519 -N '' -f {}/{k}",
                d.display()
            )));
        }
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
        Some(NetnsKeys { dir })
    }

    /// The client's private key.
    pub fn client(&self) -> PathBuf {
        self.dir.path().join("client")
    }
}

/// How a node is wired.
pub enum Link<'a> {
    /// A veth pair to the host: reachable from here.
    Host,
    /// A veth pair into another node's namespace: reachable only from
    /// there.
    Behind(&'a NetnsNode),
}

/// One node.
pub struct NetnsNode {
    ns: String,
    /// The end of the node's link outside its namespace.
    outer_if: String,
    /// The namespace `outer_if` lives in; `None`: the host's.
    outer_ns: Option<String>,
    /// The node's address.
    pub addr: String,
    /// Its hostname.
    pub hostname: String,
    sshd: Option<Child>,
    dir: tempfile::TempDir,
    client_key: PathBuf,
}

impl NetnsNode {
    /// A node called `hostname`, wired as `link`, with sshd up.
    pub fn start(hostname: &str, link: Link<'_>, keys: &NetnsKeys) -> NetnsNode {
        let id = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ns = format!("gwn{id}x{n}");
        let outer_if = format!("gwh{id}x{n}");
        let inner_if = format!("gwp{id}x{n}");
        let subnet = format!("10.{}.{}", 200 + n % 50, id % 250);
        let addr = format!("{subnet}.2");
        assert!(sh(&format!("ip netns add {ns}")), "ip netns add {ns}");
        let outer_ns = match link {
            Link::Host => None,
            Link::Behind(j) => Some(j.ns.clone()),
        };
        let outer = |cmd: &str| match &outer_ns {
            None => cmd.to_string(),
            Some(o) => format!("ip netns exec {o} {cmd}"),
        };
        let move_outer = match &outer_ns {
            None => String::new(),
            Some(o) => format!("ip link set {outer_if} netns {o} && "),
        };
        let node = NetnsNode {
            ns: ns.clone(),
            outer_if: outer_if.clone(),
            outer_ns: outer_ns.clone(),
            addr: addr.clone(),
            hostname: hostname.to_string(),
            sshd: None,
            dir: tempfile::tempdir().unwrap(),
            client_key: keys.client(),
        };
        assert!(
            sh(&format!(
                "ip link add {outer_if} type veth peer name {inner_if} && \
                 {move_outer}ip link set {inner_if} netns {ns} && \
                 {} && {} && \
                 ip netns exec {ns} ip addr add {addr}/24 dev {inner_if} && \
                 ip netns exec {ns} ip link set {inner_if} up && \
                 ip netns exec {ns} ip link set lo up",
                outer(&format!("ip addr add {subnet}.1/24 dev {outer_if}")),
                outer(&format!("ip link set {outer_if} up")),
            )),
            "cannot wire {ns}"
        );
        node.start_sshd(keys)
    }

    fn start_sshd(mut self, keys: &NetnsKeys) -> NetnsNode {
        let d = self.dir.path().to_path_buf();
        let k = keys.dir.path();
        std::fs::create_dir_all(d.join("home")).unwrap();
        let _ = std::fs::create_dir_all("/run/sshd");
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress {addr}:22\nHostKey {k}/host\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {k}/authorized_keys\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 StrictModes no\nUseDNS no\nLogLevel ERROR\nSetEnv HOME={d}/home\n\
                 ClientAliveInterval 60\nMaxSessions 100\nMaxStartups 100:30:200\n\
                 ForceCommand cd \"$HOME\" || exit 1; eval \"$SSH_ORIGINAL_COMMAND\"\n",
                addr = self.addr,
                k = k.display(),
                d = d.display()
            ),
        )
        .unwrap();
        // `ip netns exec` and `unshare` both exec: the child is sshd.
        self.sshd = Some(
            Command::new("ip")
                .args(["netns", "exec", &self.ns, "unshare", "--uts", "sh", "-c"])
                .arg(format!(
                    "hostname {} && exec /usr/sbin/sshd -D -e -f {}/sshd_config",
                    self.hostname,
                    d.display()
                ))
                .stderr(std::fs::File::create(d.join("sshd.log")).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let probe = format!(
            "{}bash -c 'exec 3<>/dev/tcp/{}/22' 2>/dev/null",
            self.outer_ns
                .as_ref()
                .map(|o| format!("ip netns exec {o} "))
                .unwrap_or_default(),
            self.addr
        );
        while !sh(&probe) {
            assert!(
                Instant::now() < deadline,
                "sshd in {} never listened: {}",
                self.ns,
                std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }

    /// The namespace's name.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// The node as the transport sees it.
    pub fn row(&self, rank: u32) -> NodeRow {
        let mut extra = BTreeMap::new();
        extra.insert("ssh.host".to_string(), self.addr.clone());
        extra.insert("ssh.user".to_string(), "root".to_string());
        extra.insert("ssh.key".to_string(), self.client_key.display().to_string());
        NodeRow {
            rank,
            instance_id: format!("netns-{rank}"),
            private_ip: self.addr.clone(),
            public_ip: None,
            zone: "ns".into(),
            topology: String::new(),
            state: "running".into(),
            extra,
        }
    }

    /// The link goes down: packets vanish, nothing answers.
    pub fn cut(&self) {
        let cmd = match &self.outer_ns {
            None => format!("ip link set {} down", self.outer_if),
            Some(o) => format!("ip netns exec {o} ip link set {} down", self.outer_if),
        };
        assert!(sh(&cmd), "{cmd}");
    }

    /// Of `pids`, those running in this node's namespace.
    pub fn inside(&self, pids: &[u32]) -> Vec<u32> {
        use std::os::unix::fs::MetadataExt;
        let Ok(me) = std::fs::metadata(format!("/run/netns/{}", self.ns)) else {
            return Vec::new();
        };
        pids.iter()
            .copied()
            .filter(|p| {
                std::fs::metadata(format!("/proc/{p}/ns/net"))
                    .is_ok_and(|m| m.ino() == me.ino() && m.dev() == me.dev())
            })
            .collect()
    }

    /// Kills every process in the namespace.
    pub fn kill_all(&self) {
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
            .map(|o| {
                for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = p.parse::<i32>() {
                        // SAFETY: kill(2) on processes in this test's own
                        // namespace.
                        unsafe {
                            libc::kill(p, libc::SIGKILL);
                        }
                    }
                }
            });
    }
}

impl Drop for NetnsNode {
    fn drop(&mut self) {
        self.kill_all();
        if let Some(mut s) = self.sshd.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        if self.outer_ns.is_none() {
            let _ = Command::new("ip")
                .args(["link", "del", &self.outer_if])
                .status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}
