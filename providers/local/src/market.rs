//! The spot market: one detached shell per spot launch that posts the
//! preemption notice into each node's metadata directory and then kills
//! everything registered on the nodes, as a cloud reclaiming capacity would.

use std::fs;
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `$0` of the market shell, so `ps` names it.
const MARKER: &str = "gangway-local-market";

/// The file in each node's directory whose lock the node's market holds
/// while it lives, and which names its pid: how a live market is told from
/// a reused pid, without `/proc`.
const LOCK_FILE: &str = "market.lock";

/// Arguments: notice delay (s), delay from notice to preemption (s),
/// RFC 3339 preemption time, whether to post a notice at all (`1`/`0`: a
/// preemption without notice must not flash notice files the instant
/// before the kill), then the node directories.
///
/// `kill -s KILL -- -PGID` rather than `kill -KILL -- -PGID`: dash, Debian's
/// `sh`, refuses `--` after `-KILL`.
const SCRIPT: &str = r#"n="$1"; k="$2"; t="$3"; post="$4"; shift 4
sleep "$n"
[ "$post" = 1 ] && for d in "$@"; do
  m="$d/metadata"
  [ -d "$m" ] || continue
  printf 'TRUE' > "$m/.preempted.tmp" && mv -f "$m/.preempted.tmp" "$m/preempted"
  printf '{"action":"terminate","time":"%s"}' "$t" > "$m/.spot-instance-action.tmp" && mv -f "$m/.spot-instance-action.tmp" "$m/spot-instance-action"
done
sleep "$k"
for d in "$@"; do
  for f in "$d"/procs/*; do
    [ -e "$f" ] || continue
    p="${f##*/}"
    case "$p" in ''|*[!0-9]*) continue ;; esac
    [ "$p" -gt 1 ] || continue
    kill -s KILL -- "-$p" 2>/dev/null
    rm -f "$f"
  done
done
exit 0
"#;

/// Names of the notice files the market writes into `metadata/`.
pub(crate) const NOTICE_FILES: &[&str] = &["preempted", "spot-instance-action"];

/// Starts the market for nodes in `node_dirs`: notice at `notice_at_ms`,
/// preemption at `preempt_at_ms` (Unix ms). Returns its pid, which is also
/// its process group. A thread reaps it so it never lingers as a zombie of
/// the caller.
pub(crate) fn spawn(
    node_dirs: &[PathBuf],
    notice_at_ms: u64,
    preempt_at_ms: u64,
) -> io::Result<u32> {
    let now_ms = crate::store::now_ms();
    let notice_in = notice_at_ms.saturating_sub(now_ms);
    let kill_after = preempt_at_ms.saturating_sub(notice_at_ms.max(now_ms));
    // The market holds the lock of `market.lock` in every node's directory
    // (one file, hard-linked into each, so one descriptor) while it lives.
    let Some(first) = node_dirs.first() else {
        return Err(io::Error::other("a market needs at least one node"));
    };
    let lock_path = first.join(LOCK_FILE);
    let lock = crate::held::create(&lock_path, b"")?;
    for d in &node_dirs[1..] {
        let link = d.join(LOCK_FILE);
        let _ = fs::remove_file(&link);
        fs::hard_link(&lock_path, &link)?;
    }
    let mut cmd = Command::new("/bin/sh");
    crate::held::inherit(&mut cmd, lock.as_raw_fd());
    let child = cmd
        .arg("-c")
        .arg(SCRIPT)
        .arg(MARKER)
        .arg(secs(notice_in))
        .arg(secs(kill_after))
        .arg(rfc3339_utc(preempt_at_ms))
        .arg(if preempt_at_ms > notice_at_ms {
            "1"
        } else {
            "0"
        })
        .args(node_dirs)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    // Which group the lock's holder is (read back by `kill`).
    let mut lock = lock;
    lock.write_all(pid.to_string().as_bytes())?;
    drop(lock);
    reap_later(child);
    Ok(pid)
}

/// Markets this process started and has not seen end. Each is waited for
/// (so none stays a zombie) at the next start of a market, without a
/// thread per market: a controller with hundreds of spot clusters would
/// otherwise hold hundreds of threads.
static STARTED: gangway_provider::children::Children = gangway_provider::children::Children::new();

fn reap_later(child: std::process::Child) {
    STARTED.adopt(child);
}

/// Kills the market process group `pid` if it is still the market of the
/// node at `node_dir` (so a recycled pid is never killed): the node's
/// `market.lock` names that pid and the market still holds its lock.
pub(crate) fn kill(pid: u32, node_dir: &Path) {
    let lock = node_dir.join(LOCK_FILE);
    let Ok(text) = fs::read_to_string(&lock) else {
        return;
    };
    if text.trim() == pid.to_string() && crate::held::is_held(&lock) {
        crate::kill_group(pid as i64);
    }
}

/// Removes the notice files (a node that is stopped or started again is no
/// longer being preempted).
pub(crate) fn clear_notices(metadata_dir: &Path) {
    for f in NOTICE_FILES {
        let _ = fs::remove_file(metadata_dir.join(f));
    }
}

/// Seconds with millisecond precision, as `sleep` takes them.
fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// `2026-01-02T03:04:05Z`.
pub(crate) fn rfc3339_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_767_323_045_999), "2026-01-02T03:04:05Z");
    }

    #[test]
    fn sleep_arguments() {
        assert_eq!(secs(500), "0.500");
        assert_eq!(secs(12_345), "12.345");
    }
}
