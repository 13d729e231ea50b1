//! Child processes a long-lived process started and waits for without a
//! thread each: job drivers (the controller starts one per run), the local
//! cloud's spot markets (one per spot cluster). A thousand jobs must not
//! hold a thousand threads, nor leave a thousand zombies.

use std::process::Child;
use std::sync::Mutex;

/// Children started and not yet seen to exit. A `static` of its own in
/// each place that starts them.
pub struct Children(Mutex<Vec<Child>>);

impl Children {
    /// None yet.
    pub const fn new() -> Children {
        Children(Mutex::new(Vec::new()))
    }

    /// Keeps `child` to be waited for, and waits for those that exited.
    pub fn adopt(&self, child: Child) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        kept.push(child);
    }

    /// Waits for the children that exited (never blocks). A long-lived
    /// caller calls it now and then; [`Children::adopt`] does too.
    pub fn reap(&self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    }

    /// How many are still running (as last seen).
    pub fn running(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Default for Children {
    fn default() -> Self {
        Children::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exited child is waited for (no zombie is kept); a running one is
    /// kept until it exits.
    #[test]
    fn exited_children_are_reaped_and_running_ones_kept() {
        let kids = Children::new();
        let quick = std::process::Command::new("true").spawn().unwrap();
        let quick_pid = quick.id();
        let slow = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let slow_pid = slow.id();
        kids.adopt(quick);
        kids.adopt(slow);
        let t = std::time::Instant::now();
        while kids.running() > 1 && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            kids.reap();
        }
        assert_eq!(kids.running(), 1, "the exited child is still kept");
        // Waited for: no zombie left under its pid.
        let stat = std::fs::read_to_string(format!("/proc/{quick_pid}/stat")).unwrap_or_default();
        assert!(!stat.contains(") Z "), "{stat}");
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(slow_pid as i32, libc::SIGKILL) };
        let t = std::time::Instant::now();
        while kids.running() > 0 && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            kids.reap();
        }
        assert_eq!(kids.running(), 0);
    }
}
