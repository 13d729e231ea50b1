//! A throwaway Slurm cluster for a test (munged, slurmctld and N slurmd on
//! this host, everything under one directory; `tests/emulators/slurm/`).
//! Needs root and Debian's `slurm-wlm` and `munge`
//! (`tests/emulators/slurm/install.sh`); without them
//! [`SlurmCluster::start`] says `SKIPPED slurm: why` and returns `None`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A running cluster; stopped (and its directory removed) when dropped.
pub struct SlurmCluster {
    dir: PathBuf,
    root: PathBuf,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The workspace root: the first directory above this crate's that holds
/// the emulator.
fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/slurm/start.sh").is_file())
        .map(Path::to_path_buf)
}

impl SlurmCluster {
    /// Starts `nodes` nodes (n1..nN; recorded as `ran slurm`), or says
    /// `SKIPPED slurm: why` and returns `None`. Panics when Slurm is there
    /// but the cluster does not come up.
    pub fn start(nodes: u32) -> Option<SlurmCluster> {
        let have = |p: &str| Path::new(p).exists();
        if !have("/usr/sbin/slurmctld") || !have("/usr/sbin/slurmd") || !have("/usr/sbin/munged") {
            return crate::skip::skip(
                "slurm",
                "Slurm is not installed (tests/emulators/slurm/install.sh installs it, as root)",
            );
        }
        let Some(root) = workspace_root() else {
            return crate::skip::skip("slurm", "tests/emulators/slurm is not above this crate");
        };
        // Socket paths under the directory must stay short: one in /tmp.
        let dir = PathBuf::from(format!(
            "/tmp/gwsl-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir_all(&dir);
        let out = Command::new(root.join("tests/emulators/slurm/start.sh"))
            .arg(&dir)
            .arg(nodes.to_string())
            .output()
            .expect("start.sh runs");
        match out.status.code() {
            Some(0) => {
                crate::skip::ran("slurm");
                Some(SlurmCluster { dir, root })
            }
            Some(3) => {
                // start.sh's own `SKIPPED: why` line.
                let said = String::from_utf8_lossy(&out.stdout);
                let why = said.trim();
                let why = why.strip_prefix("SKIPPED:").unwrap_or(why).trim();
                let _ = std::fs::remove_dir_all(&dir);
                crate::skip::skip("slurm", format_args!("start.sh: {why}"))
            }
            _ => panic!(
                "start.sh {} failed:\n{}\n{}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// Its `slurm.conf` (`SLURM_CONF` for the client commands).
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// Runs one of Slurm's commands against this cluster; its stdout.
    /// Panics when it fails.
    pub fn cmd(&self, prog: &str, args: &[&str]) -> String {
        let out = Command::new(prog)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{prog}: {e}"));
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Jobs Slurm still holds (pending, running, completing): `id name state`.
    pub fn queue(&self) -> Vec<String> {
        self.cmd("squeue", &["-h", "-o", "%i %j %T"])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = Command::new(self.root.join("tests/emulators/slurm/stop.sh"))
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
