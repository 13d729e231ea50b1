//! Keeping a managed-job controller running: started detached when jobs
//! need one; on a controller host, a supervisor that restarts it when it
//! dies and stops the host's machine when idle; stopped for a new binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::controller::{controller_paths, Controller, Until};
use super::submit::needs_controller;
use crate::core::state::{now_ms, OwnerLock, Store};
use crate::services::host::HOSTED_ENV;
use crate::Error;

/// Starts a detached controller unless one runs already.
///
/// On a controller host the supervisor is started instead, which keeps a
/// controller running (restarting it when it dies) while any job needs one.
pub(crate) fn ensure_controller(home: &Path) -> Result<(), Error> {
    let supervised = std::env::var_os(HOSTED_ENV).is_some();
    let (lock, _) = if supervised {
        (supervisor_lock(home), PathBuf::new())
    } else {
        controller_paths(home)
    };
    if OwnerLock::is_held(&lock) {
        return Ok(());
    }
    let what = if supervised {
        "__controller-supervisor"
    } else {
        "__jobs-controller"
    };
    let exe = std::env::current_exe()?;
    crate::core::runtime::detached(&exe, home, &[what]).spawn()?;
    Ok(())
}

/// The detached controller (`gangway __jobs-controller`): runs until no
/// managed job is left.
pub(crate) fn controller_main(home: &Path) -> Result<(), Error> {
    let home = home.to_path_buf();
    let (lock_path, _) = controller_paths(&home);
    let rt = Controller::runtime()?;
    loop {
        let Some(lock) = OwnerLock::try_acquire(&lock_path)? else {
            return Ok(()); // another controller runs
        };
        let mut c = Controller::new(&home)?;
        rt.block_on(c.run(Until::Idle))?;
        drop(lock);
        // A job submitted while we were leaving must not be stranded.
        if Store::open(&home)?.managed_active()?.is_empty() {
            return Ok(());
        }
    }
}

/// The supervisor's lock on a controller host.
fn supervisor_lock(home: &Path) -> PathBuf {
    home.join("locks").join("supervisor.lock")
}

/// A line in the controller's log, as the controller writes them.
fn log_line(home: &Path, line: &str) {
    let (_, log) = controller_paths(home);
    if let Some(d) = log.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    if let Ok(mut f) = std::fs::File::options().create(true).append(true).open(log) {
        let _ = writeln!(f, "{} {line}", now_ms());
    }
}

/// Whether this is a cloud controller host that stops its own machine
/// when idle (the laptop says so, with the provider's name).
fn self_stopping() -> bool {
    std::env::var_os(HOSTED_ENV).is_some()
        && std::env::var(crate::services::host::cloud::SELF_STOP_ENV).is_ok_and(|c| !c.is_empty())
}

/// The file whose modification time is the last command's, on a host.
fn activity_file(home: &Path) -> PathBuf {
    home.join("jobs").join("last-command")
}

/// A `gangway jobs` command came. On a cloud host every command counts as
/// activity, and the supervisor (which stops the machine when idle) runs
/// even when no job was ever submitted.
pub(crate) fn command_came(home: &Path) -> Result<(), Error> {
    if self_stopping() {
        touch_activity(home);
        ensure_controller(home)?;
    }
    Ok(())
}

/// Records that a command came now (a host's idle clock restarts).
fn touch_activity(home: &Path) {
    let f = activity_file(home);
    if let Some(d) = f.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let _ = std::fs::write(&f, now_ms().to_string());
}

/// How long ago the last command came, if one is recorded.
fn since_activity(home: &Path) -> Option<Duration> {
    std::fs::metadata(activity_file(home))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
}

/// The cloud host's machine stops itself: through its provider, with its
/// own identity (the SDK's default chain: the metadata service). A
/// failure is logged; the supervisor ends either way.
fn stop_this_machine(home: &Path) {
    let cloud = std::env::var(crate::services::host::cloud::SELF_STOP_ENV).unwrap_or_default();
    let Some(p) = crate::core::registry::Providers::new(home).get(&cloud) else {
        log_line(
            home,
            &format!("supervisor: no provider '{cloud}' to stop this machine with"),
        );
        return;
    };
    log_line(
        home,
        &format!("supervisor: idle; stopping this machine ({cloud})"),
    );
    let r = crate::core::runtime::runtime().map(|rt| rt.block_on(p.stop_this_machine()));
    match r {
        Ok(Ok(())) => log_line(home, "supervisor: this machine is stopping"),
        Ok(Err(e)) => log_line(
            home,
            &format!("supervisor: stopping this machine failed: {e}"),
        ),
        Err(e) => log_line(
            home,
            &format!("supervisor: stopping this machine failed: {e}"),
        ),
    }
}

/// How long a controller host's supervisor waits with no job before it
/// ends (`GANGWAY_CONTROLLER_IDLE_SECONDS`, default 10 minutes); the next
/// `gangway jobs` command starts it again.
fn supervisor_idle() -> Duration {
    Duration::from_secs(
        std::env::var("GANGWAY_CONTROLLER_IDLE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    )
}

/// The supervisor (`gangway __controller-supervisor`), on a controller host: keeps one
/// controller running while any job needs one, starting it again when it
/// dies (killed, crashed, the host's OOM killer) within a second, without
/// waiting for anyone's command; ends after [`supervisor_idle`] with none.
/// One per `$GANGWAY_HOME` (a lock).
pub(crate) fn supervisor_main(home: &Path) -> Result<(), Error> {
    let home = home.to_path_buf();
    let Some(_lock) = OwnerLock::try_acquire(&supervisor_lock(&home))? else {
        return Ok(());
    };
    let (controller_lock, _) = controller_paths(&home);
    let store = Store::open(&home)?;
    let exe = std::env::current_exe()?;
    log_line(&home, &format!("supervisor {} started", std::process::id()));
    let mut idle_since = std::time::Instant::now();
    let mut quick_deaths = 0u32;
    loop {
        if !needs_controller(&store)? {
            let idle =
                since_activity(&home).map_or(idle_since.elapsed(), |d| d.min(idle_since.elapsed()));
            if idle >= supervisor_idle() {
                log_line(
                    &home,
                    "supervisor: no managed job needs a controller; ending",
                );
                if self_stopping() {
                    stop_this_machine(&home);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        idle_since = std::time::Instant::now();
        if OwnerLock::is_held(&controller_lock) {
            // One started before this supervisor: watched until it ends.
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let started = std::time::Instant::now();
        let mut cmd = crate::core::runtime::detached(&exe, &home, &["__jobs-controller"]);
        let status = cmd.spawn()?.wait()?;
        if status.success() {
            quick_deaths = 0;
            continue;
        }
        // Killed or failed: again at once, then backing off to 30 s when it
        // keeps dying young (a broken host should not spin).
        quick_deaths = if started.elapsed() < Duration::from_secs(10) {
            quick_deaths + 1
        } else {
            0
        };
        let wait =
            Duration::from_millis(500 * 2u64.pow(quick_deaths.min(6))).min(Duration::from_secs(30));
        log_line(
            &home,
            &format!("supervisor: the controller ended ({status}); starting it again in {wait:?}"),
        );
        std::thread::sleep(wait);
    }
}

/// Stops the controller (`gangway __controller-stop`) on a controller host, by a binary replacing
/// another: stops the supervisor, then the controller, whatever version
/// runs them (by their locks' holders, checked to be gangway's processes
/// of this home), and waits until both locks are free.
pub(crate) fn controller_stop_main(home: &Path) -> Result<(), Error> {
    let home = home.to_path_buf();
    let (controller_lock, _) = controller_paths(&home);
    for (lock, what) in [
        (supervisor_lock(&home), "__controller-supervisor"),
        (controller_lock, "__jobs-controller"),
    ] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while OwnerLock::is_held(&lock) {
            let pid = OwnerLock::holder(&lock).filter(|p| {
                // `ps`, not /proc: the same binary runs on macOS.
                std::process::Command::new("ps")
                    .args(["-o", "command=", "-p", &p.to_string()])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(what))
            });
            if let Some(pid) = pid {
                let sig = if deadline.saturating_duration_since(std::time::Instant::now())
                    < Duration::from_secs(10)
                {
                    libc::SIGKILL
                } else {
                    libc::SIGTERM
                };
                // SAFETY: a plain kill(2) of a process this user runs.
                unsafe { libc::kill(pid as libc::pid_t, sig) };
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::usage(
                    format!("{} is still held after 20 s", lock.display()),
                    Some("stop the old gangway controller on this host by hand"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    log_line(&home, "controller stopped for a new gangway binary");
    Ok(())
}

/// Runs a controller in this thread until job `id` ends (`jobs launch
/// --wait`); when a detached controller has the lock, waits for the job
/// to end instead.
pub(crate) fn run_for_job(home: &Path, id: i64) -> Result<(), Error> {
    let (lock_path, _) = controller_paths(home);
    let rt = Controller::runtime()?;
    loop {
        if let Some(_lock) = OwnerLock::try_acquire(&lock_path)? {
            let mut c = Controller::new(home)?;
            return rt.block_on(c.run(Until::Job(id)));
        }
        // A detached controller has it; follow until the job ends.
        let s = Store::open(home)?;
        if s.managed(id)
            .ok()
            .flatten()
            .is_none_or(|j| j.state.is_terminal())
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
