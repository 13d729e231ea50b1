//! The local cloud's own state on disk: the lock, one record per instance,
//! one directory per node, and the allocation of ids and addresses.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Whether an instance runs. Preemption is not a stored state: it is read off
/// the clock against [`Record::preempt_at_ms`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RecState {
    /// Running (or preempted, once `preempt_at_ms` has passed).
    Running,
    /// Stopped by the user; its directory is kept.
    Stopped,
}

/// `root/instances/<cluster>/<id>.json`: one directory per cluster, so that
/// describing a cluster reads its own records only (a cloud filters by tag
/// on its side), however many other clusters there are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub id: String,
    pub cluster: String,
    pub owner: String,
    pub client_token: String,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub use_spot: bool,
    pub ip: String,
    pub topology: Vec<String>,
    pub state: RecState,
    pub gpus: u32,
    pub launch_index: u32,
    pub created_ms: u64,
    pub preempt_at_ms: Option<u64>,
    pub notice_at_ms: Option<u64>,
    pub market_pid: Option<u32>,
    /// The first of the node's [`PORTS_PER_NODE`] ports in single-address
    /// mode (every node on 127.0.0.1); `None` for a node with an address
    /// of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<u16>,
}

impl Record {
    /// Whether the market has taken the node back by `now_ms`.
    pub fn preempted(&self, now_ms: u64) -> bool {
        self.state == RecState::Running && self.preempt_at_ms.is_some_and(|t| t <= now_ms)
    }

    /// Whether it holds a slot of its zone's capacity.
    pub fn holds_capacity(&self, now_ms: u64) -> bool {
        self.state == RecState::Running && !self.preempted(now_ms)
    }
}

/// Paths under the provider's root.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// Which launch that creates nodes of `cluster` the one with client
    /// token `token` is: 0 for the first token seen, 1 for the next... A
    /// launch tried again with its token (a controller killed mid-launch
    /// and restarted) is the same launch, so it takes the same entry of a
    /// `preemptions` schedule. Called under the lock. A record that cannot
    /// be read or written counts as the first launch. (Records of older
    /// versions held a count: those launches stay counted.)
    pub fn launch_number(&self, cluster: &str, token: &str) -> u64 {
        let dir = self.root.join("launches");
        let path = dir.join(cluster);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut tokens: Vec<String> = match text.trim().parse::<u64>() {
            Ok(n) => (0..n).map(|i| format!("#{i}")).collect(),
            Err(_) => text.lines().map(str::to_string).collect(),
        };
        if let Some(i) = tokens.iter().position(|t| t == token) {
            return i as u64;
        }
        tokens.push(token.to_string());
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(&path, tokens.join("\n") + "\n");
        tokens.len() as u64 - 1
    }

    pub fn lock_path(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn instances(&self) -> PathBuf {
        self.root.join("instances")
    }
    pub fn nodes(&self) -> PathBuf {
        self.root.join("nodes")
    }
    /// Where a cluster's records are. Cluster names are checked by the
    /// caller (letters, digits, `-`, `_`, `.`); anything else is escaped so a
    /// name can never leave `instances/`.
    pub fn cluster_dir(&self, cluster: &str) -> PathBuf {
        let safe: String = cluster
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                    c.to_string()
                } else {
                    format!("%{:02x}", c as u32)
                }
            })
            .collect();
        self.instances().join(safe)
    }
    pub fn record_path(&self, cluster: &str, id: &str) -> PathBuf {
        self.cluster_dir(cluster).join(format!("{id}.json"))
    }
    pub fn node_dir(&self, id: &str) -> PathBuf {
        self.nodes().join(id)
    }

    /// Takes the exclusive lock every mutation holds, creating the root on
    /// first use. Blocks until the lock is free; released on drop.
    pub fn lock(&self) -> io::Result<LockGuard> {
        let guard = self.lock_only()?;
        self.migrate_flat_records()?;
        Ok(guard)
    }

    fn lock_only(&self) -> io::Result<LockGuard> {
        fs::create_dir_all(self.instances())?;
        fs::create_dir_all(self.nodes())?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.lock_path())?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(LockGuard { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Records of versions before the per-cluster layout sit directly in
    /// `instances/`: each moves into its cluster's directory. Under the lock.
    fn migrate_flat_records(&self) -> io::Result<()> {
        let flag = self.root.join("layout");
        if flag.exists() {
            return Ok(());
        }
        for entry in fs::read_dir(self.instances())?.flatten() {
            let path = entry.path();
            if !path.is_file() {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let rec: Record = serde_json::from_slice(&fs::read(&path)?).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            self.write_record(&rec)?;
            fs::remove_file(&path)?;
        }
        sync_dir(&self.instances());
        fs::write(&flag, "per-cluster records\n")
    }

    /// Every record, in no particular order. A missing root is an empty
    /// cloud; a record deleted while being listed is skipped.
    pub fn read_records(&self) -> io::Result<Vec<Record>> {
        let entries = match fs::read_dir(self.instances()) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                read_dir_records(&entry.path(), &mut out)?;
            }
        }
        Ok(out)
    }

    /// One cluster's records: only its own directory is read. Before the
    /// first lock of a root laid out by an earlier version, the lock is
    /// taken to move its records first.
    pub fn read_cluster(&self, cluster: &str) -> io::Result<Vec<Record>> {
        if !self.root.join("layout").exists() && self.instances().exists() {
            drop(self.lock()?);
        }
        let mut out = Vec::new();
        read_dir_records(&self.cluster_dir(cluster), &mut out)?;
        Ok(out)
    }

    /// Writes a record atomically: temporary file, fsync, rename, fsync of
    /// the directory.
    pub fn write_record(&self, rec: &Record) -> io::Result<()> {
        let dir = self.cluster_dir(&rec.cluster);
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{}.json.tmp", rec.id));
        let mut bytes = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        bytes.push(b'\n');
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, self.record_path(&rec.cluster, &rec.id))?;
        sync_dir(&dir);
        Ok(())
    }

    /// Deletes a record (and its cluster's directory once empty); a missing
    /// one is fine.
    pub fn remove_record(&self, cluster: &str, id: &str) -> io::Result<()> {
        match fs::remove_file(self.record_path(cluster, id)) {
            Ok(()) => {
                let dir = self.cluster_dir(cluster);
                sync_dir(&dir);
                // Fails while other records remain: that is the test.
                if fs::remove_dir(&dir).is_ok() {
                    sync_dir(&self.instances());
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates the node's directory tree (idempotent).
    pub fn make_node_dirs(&self, id: &str) -> io::Result<()> {
        let dir = self.node_dir(id);
        for sub in ["home", "procs", "metadata"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        Ok(())
    }

    /// Removes the node's directory tree; a missing one is fine. Bucket
    /// mounts in it (listed in `home/.gangway-mounts` by the storage step)
    /// are unmounted first: deleting through a mount would delete the
    /// bucket's objects. One that stays mounted stops the removal.
    pub fn remove_node_dir(&self, id: &str) -> io::Result<()> {
        let dir = self.node_dir(id);
        unmount_listed(&dir.join("home/.gangway-mounts"))?;
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes what a killed process can leave behind: temporary record
    /// files and node directories without a record. Only under the lock,
    /// where nothing is being created.
    pub fn sweep_leftovers(&self, records: &[Record]) -> io::Result<()> {
        if let Ok(clusters) = fs::read_dir(self.instances()) {
            for dir in clusters.flatten().filter(|e| e.path().is_dir()) {
                let mut left = 0;
                for entry in fs::read_dir(dir.path())?.flatten() {
                    let name = entry.file_name();
                    if name
                        .to_str()
                        .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"))
                    {
                        let _ = fs::remove_file(entry.path());
                    } else {
                        left += 1;
                    }
                }
                if left == 0 {
                    let _ = fs::remove_dir(dir.path());
                }
            }
        }
        let known: HashSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
        if let Ok(entries) = fs::read_dir(self.nodes()) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if !known.contains(name) {
                    crate::kill_registered(&entry.path().join("procs"));
                    self.remove_node_dir(name)?;
                }
            }
        }
        Ok(())
    }

    /// A fresh instance id, `local-` and 12 hex digits, used by no record
    /// and no directory and not in `taken`.
    pub fn new_id(&self, taken: &HashSet<String>) -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let pid = u64::from(std::process::id());
            let x = splitmix64(nanos ^ (pid << 40) ^ n.wrapping_mul(0xA24B_AED4_963E_E407));
            let id = format!("local-{:012x}", x & 0xffff_ffff_ffff);
            // A node's directory is made before its record and removed
            // after it: a free directory name is a free id.
            if !taken.contains(&id) && !self.node_dir(&id).exists() {
                return id;
            }
        }
    }
}

/// Appends the records in `dir` (a cluster's directory) to `out`; a
/// missing directory holds none, a record deleted meanwhile is skipped.
fn read_dir_records(dir: &Path, out: &mut Vec<Record>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let bytes = match fs::read(entry.path()) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let rec: Record = serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", entry.path().display()),
            )
        })?;
        out.push(rec);
    }
    Ok(())
}

/// Holds the provider's exclusive lock until dropped.
pub(crate) struct LockGuard {
    _file: File,
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// First address handed out.
const FIRST_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 10, 1);
/// Last address of 127.0.0.0/8 a node may get.
const LAST_ADDR: Ipv4Addr = Ipv4Addr::new(127, 255, 255, 254);

/// `n` loopback addresses not in `used`, ascending from 127.0.10.1, never
/// ending in .0 or .255; `None` when 127.0.0.0/8 is full.
///
/// Linux answers on every address of 127.0.0.0/8, so each node gets its own.
/// macOS only has 127.0.0.1 on its loopback interface; there every node is
/// on 127.0.0.1 with a port range of its own ([`allocate_ports_from`]).
#[cfg(test)]
pub(crate) fn allocate_addresses(used: &HashSet<Ipv4Addr>, n: usize) -> Option<Vec<Ipv4Addr>> {
    allocate_addresses_from(FIRST_ADDR, used, n)
}

/// The first address of the /24 this root's nodes start in. Each gangway
/// home gets its own block (picked by a hash of its path), so two homes on
/// one machine (two users, parallel tests) do not hand out the same
/// address and collide on ports.
pub(crate) fn first_address(root: &Path) -> Ipv4Addr {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in root.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    let h = splitmix64(h);
    Ipv4Addr::new(127, 1 + (h % 254) as u8, (h >> 8) as u8, 1)
}

/// The address every node has in single-address mode.
pub(crate) const SINGLE_ADDR: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Ports each node owns in single-address mode: the first is where its
/// `MASTER_PORT` is when it is the head, the next ones the task's `ports`.
pub(crate) const PORTS_PER_NODE: u16 = 50;
/// The ports node ranges are carved from: below both Linux's
/// (32768-60999) and macOS's (49152-65535) ephemeral ranges, so no
/// outgoing connection takes one, and above the well-known services.
pub(crate) const PORT_RANGES: std::ops::Range<u16> = 10_000..32_750;

/// Whether this machine answers on `addr` (a probe with a UDP socket bound
/// there): true for all of 127.0.0.0/8 on Linux, false beyond 127.0.0.1
/// on macOS unless aliases were added.
pub(crate) fn answers_on(addr: Ipv4Addr) -> bool {
    std::net::UdpSocket::bind((addr, 0)).is_ok()
}

/// The first port of this root's first range: each gangway home starts at
/// its own place (a hash of its path), as [`first_address`] does.
pub(crate) fn first_port(root: &Path) -> u16 {
    let mut h: u64 = 0x84_2225_cbf2_9ce4;
    for b in root.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    let blocks = (PORT_RANGES.end - PORT_RANGES.start) / PORTS_PER_NODE;
    PORT_RANGES.start + (splitmix64(h) % u64::from(blocks)) as u16 * PORTS_PER_NODE
}

/// `n` port ranges (their first ports) not in `used`, ascending from
/// `first` and wrapping around [`PORT_RANGES`], skipping any whose first
/// port `free` says is taken on 127.0.0.1 (another program, another
/// gangway home); `None` when too few are left.
pub(crate) fn allocate_ports_from(
    first: u16,
    used: &HashSet<u16>,
    n: usize,
    free: impl Fn(u16) -> bool,
) -> Option<Vec<u16>> {
    let starts: Vec<u16> = PORT_RANGES.step_by(PORTS_PER_NODE as usize).collect();
    let at = starts.iter().position(|p| *p >= first).unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for p in starts[at..].iter().chain(&starts[..at]) {
        if out.len() == n {
            break;
        }
        if !used.contains(p) && free(*p) {
            out.push(*p);
        }
    }
    (out.len() == n).then_some(out)
}

/// Whether a TCP listener can take `port` on 127.0.0.1 now.
pub(crate) fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind((SINGLE_ADDR, port)).is_ok()
}

/// Like [`allocate_addresses`], starting at `first` and wrapping around.
pub(crate) fn allocate_addresses_from(
    first: Ipv4Addr,
    used: &HashSet<Ipv4Addr>,
    n: usize,
) -> Option<Vec<Ipv4Addr>> {
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Some(out);
    }
    let start = u32::from(first).max(u32::from(FIRST_ADDR));
    let all = (start..=u32::from(LAST_ADDR)).chain(u32::from(FIRST_ADDR)..start);
    for a in all {
        let last = a & 0xff;
        if last == 0 || last == 255 {
            continue;
        }
        let addr = Ipv4Addr::from(a);
        if !used.contains(&addr) {
            out.push(addr);
            if out.len() == n {
                return Some(out);
            }
        }
    }
    None
}

/// One step of splitmix64, used as a mixer.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A tiny deterministic generator (splitmix64) for `config.local.seed`.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unmounts every path listed in `list` (one per line) that is still a
/// mount point; fails naming one that stays mounted.
fn unmount_listed(list: &Path) -> io::Result<()> {
    let Ok(text) = fs::read_to_string(list) else {
        return Ok(());
    };
    // Lines are `cluster<TAB>path` (a bare path from older versions).
    for path in text
        .lines()
        .filter_map(|l| l.rsplit('\t').next())
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        let path = Path::new(path);
        if !is_mount_point(path) {
            continue;
        }
        for (tool, args) in [
            ("fusermount3", &["-u", "-z"][..]),
            ("fusermount", &["-u", "-z"][..]),
            ("umount", &[][..]),
        ] {
            let done = std::process::Command::new(tool)
                .args(args)
                .arg(path)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if done {
                break;
            }
        }
        if is_mount_point(path) {
            return Err(io::Error::other(format!(
                "{} is still a bucket mount; unmount it (fusermount -u {0}) before the node's directory can be removed",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Whether `path` is on another filesystem than its parent (a mount
/// point). A mount whose daemon died cannot be stat'ed: that counts too.
pub(crate) fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = path.parent() else {
        return false;
    };
    match (fs::symlink_metadata(path), fs::metadata(parent)) {
        (Ok(p), Ok(q)) => p.dev() != q.dev(),
        (Err(e), Ok(_)) => e.kind() != io::ErrorKind::NotFound,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_skip_network_and_broadcast_and_used() {
        let a = allocate_addresses(&HashSet::new(), 3).unwrap();
        assert_eq!(
            a,
            vec![
                Ipv4Addr::new(127, 0, 10, 1),
                Ipv4Addr::new(127, 0, 10, 2),
                Ipv4Addr::new(127, 0, 10, 3)
            ]
        );
        let used: HashSet<_> = (1..=254).map(|i| Ipv4Addr::new(127, 0, 10, i)).collect();
        let a = allocate_addresses(&used, 2).unwrap();
        assert_eq!(
            a,
            vec![Ipv4Addr::new(127, 0, 11, 1), Ipv4Addr::new(127, 0, 11, 2)]
        );
        let mut used = HashSet::new();
        used.insert(Ipv4Addr::new(127, 0, 10, 1));
        let a = allocate_addresses(&used, 1).unwrap();
        assert_eq!(a, vec![Ipv4Addr::new(127, 0, 10, 2)]);
    }

    #[test]
    fn port_ranges_skip_used_and_taken_and_wrap() {
        let all = |_| true;
        let a = allocate_ports_from(10_100, &HashSet::new(), 3, all).unwrap();
        assert_eq!(a, vec![10_100, 10_150, 10_200]);
        let used: HashSet<u16> = [10_100, 10_200].into();
        let a = allocate_ports_from(10_100, &used, 2, |p| p != 10_150).unwrap();
        assert_eq!(a, vec![10_250, 10_300]);
        let last = PORT_RANGES.end - PORTS_PER_NODE;
        let a = allocate_ports_from(last, &HashSet::new(), 2, all).unwrap();
        assert_eq!(a, vec![last, PORT_RANGES.start]);
        let blocks = usize::from((PORT_RANGES.end - PORT_RANGES.start) / PORTS_PER_NODE);
        assert!(allocate_ports_from(10_000, &HashSet::new(), blocks + 1, all).is_none());
        let p = first_port(Path::new("/home/a/.gangway/local"));
        assert!(PORT_RANGES.contains(&p) && (p - PORT_RANGES.start).is_multiple_of(PORTS_PER_NODE));
        assert!(p + PORTS_PER_NODE <= PORT_RANGES.end);
    }

    #[test]
    fn shuffle_is_deterministic_and_a_permutation() {
        let mut a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        Rng::new(42).shuffle(&mut a);
        Rng::new(42).shuffle(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..10).collect::<Vec<_>>());
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        let mut c: Vec<u32> = (0..10).collect();
        Rng::new(43).shuffle(&mut c);
        assert_ne!(a, c);
    }

    #[test]
    fn record_state_is_lowercase_on_disk() {
        let r = Record {
            id: "local-000000000001".into(),
            cluster: "c".into(),
            owner: "o".into(),
            client_token: "t".into(),
            region: "local".into(),
            zone: "local-a".into(),
            instance_type: "local.cpu".into(),
            use_spot: false,
            ip: "127.0.10.1".into(),
            topology: vec![],
            state: RecState::Stopped,
            gpus: 0,
            launch_index: 0,
            created_ms: 1,
            preempt_at_ms: None,
            notice_at_ms: None,
            market_pid: None,
            ports: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        // A record of a version before single-address mode reads the same.
        assert!(v.get("ports").is_none());
        assert_eq!(v["state"], "stopped");
        assert_eq!(serde_json::from_value::<Record>(v).unwrap(), r);
    }
}
