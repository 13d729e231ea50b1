//! `gangway jobs ...`: managed jobs that survive preemption.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::launch::gangway_home;
use super::{interrupts, print_json, table, Output, TaskArgs};
use crate::core::state::{now_ms, ManagedJob, ManagedState, OwnerLock, Store};
use crate::services::host::{Hosted, Input, HOSTED_ENV};
use crate::services::jobs::controller::{controller_paths, Controller, Until};
use crate::services::jobs::{signal_number, ManagedTask};
use crate::services::launch::{job_spec, secrets_of};
use crate::{Error, ExitCode};

/// Managed-job commands.
#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Launch a managed job: recovered from preemptions until it ends.
    Launch(Box<JobsLaunchArgs>),
    /// Managed jobs: state, restarts, preemptions, cost, placement.
    Queue,
    /// A managed job's output across all its runs.
    Logs(JobsLogsArgs),
    /// Cancel managed jobs.
    Cancel(JobsCancelArgs),
    /// Every transition of a managed job, with time, placement and reason.
    Events {
        /// Job id.
        id: i64,
    },
    /// Internal, on a controller host: registers the job read from stdin.
    #[command(name = "__submit", hide = true)]
    Submit,
    /// Internal, on a controller host: follows a job as `jobs launch` does.
    #[command(name = "__follow", hide = true)]
    Follow {
        /// Job id.
        id: i64,
    },
}

/// `gangway jobs launch`.
#[derive(Debug, Args)]
pub(crate) struct JobsLaunchArgs {
    /// The task and overrides.
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    /// Job name (default: the task's).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Return once the job is submitted.
    #[arg(short = 'd', long, conflicts_with = "wait")]
    pub(crate) detach: bool,
    /// Run the controller in this process until the job ends (for CI,
    /// where background processes do not outlive the step).
    #[arg(long)]
    pub(crate) wait: bool,
}

/// `gangway jobs logs`.
#[derive(Debug, Args)]
pub(crate) struct JobsLogsArgs {
    /// Job id.
    pub(crate) id: i64,
    /// Keep following across recoveries until the job ends.
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
    /// The controller's log instead of the job's output.
    #[arg(long)]
    pub(crate) controller: bool,
}

/// `gangway jobs cancel`.
#[derive(Debug, Args)]
pub(crate) struct JobsCancelArgs {
    /// Job ids.
    pub(crate) ids: Vec<i64>,
    /// Every live managed job.
    #[arg(long)]
    pub(crate) all: bool,
}

/// Runs a `jobs` subcommand.
pub(crate) fn run(
    cmd: JobsCommand,
    catalog: Option<&Path>,
    out: Output,
) -> Result<ExitCode, Error> {
    if !matches!(cmd, JobsCommand::Launch(_)) {
        if let Some(h) = Hosted::configured(&gangway_home()?)? {
            return hosted(&h, &cmd, out);
        }
    }
    if self_stopping() {
        // A cloud host: every command counts as activity, and the
        // supervisor (which stops the machine when idle) runs even when
        // no job was ever submitted.
        let home = gangway_home()?;
        touch_activity(&home);
        ensure_controller(&home)?;
    }
    match cmd {
        JobsCommand::Launch(a) => launch(&a, catalog, out),
        JobsCommand::Submit => submit(out),
        JobsCommand::Follow { id } => {
            let (home, store) = open()?;
            managed(&store, id)?;
            ensure_controller(&home)?;
            let state = follow(&store, id, out != Output::Json, false)?;
            finish_output(&store, id, state, out)
        }
        JobsCommand::Queue => queue(out),
        JobsCommand::Logs(a) => logs(&a),
        JobsCommand::Cancel(a) => cancel(&a, out),
        JobsCommand::Events { id } => events(id, out),
    }
}

fn open() -> Result<(PathBuf, Store), Error> {
    let home = gangway_home()?;
    let store = Store::open(&home)?;
    Ok((home, store))
}

fn managed(store: &Store, id: i64) -> Result<ManagedJob, Error> {
    store.managed(id)?.ok_or_else(|| Error::NotFound {
        message: format!("no managed job {id}"),
        hint: Some("`gangway jobs queue` lists them".into()),
    })
}

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
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(if supervised {
        "__controller-supervisor"
    } else {
        "__jobs-controller"
    })
    .env("GANGWAY_HOME", home)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()?;
    Ok(())
}

/// `gangway __jobs-controller`: runs until no managed job is left.
pub(crate) fn controller_main() -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let (lock_path, _) = controller_paths(&home);
    let rt = Controller::runtime()?;
    loop {
        let Some(lock) = OwnerLock::try_acquire(&lock_path)? else {
            return Ok(ExitCode::Ok); // another controller runs
        };
        let mut c = Controller::new(&home)?;
        rt.block_on(c.run(Until::Idle))?;
        drop(lock);
        // A job submitted while we were leaving must not be stranded.
        if Store::open(&home)?.managed_active()?.is_empty() {
            return Ok(ExitCode::Ok);
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

/// `gangway __controller-supervisor`, on a controller host: keeps one
/// controller running while any job needs one, starting it again when it
/// dies (killed, crashed, the host's OOM killer) within a second, without
/// waiting for anyone's command; ends after [`supervisor_idle`] with none.
/// One per `$GANGWAY_HOME` (a lock).
pub(crate) fn supervisor_main() -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let Some(_lock) = OwnerLock::try_acquire(&supervisor_lock(&home))? else {
        return Ok(ExitCode::Ok);
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
                return Ok(ExitCode::Ok);
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
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("__jobs-controller")
            .env("GANGWAY_HOME", &home)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
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

/// `gangway __controller-stop`, on a controller host, by a binary replacing
/// another: stops the supervisor, then the controller, whatever version
/// runs them (by their locks' holders, checked to be gangway's processes
/// of this home), and waits until both locks are free.
pub(crate) fn controller_stop_main() -> Result<ExitCode, Error> {
    let home = gangway_home()?;
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
    Ok(ExitCode::Ok)
}

/// `gangway jobs __submit`, on a controller host: registers the job the
/// laptop sends on stdin and starts the controller; prints `{"job_id": N}`.
fn submit(out: Output) -> Result<ExitCode, Error> {
    let _ = out;
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body)?;
    let sub: Submission = serde_json::from_slice(&body)
        .map_err(|e| Error::usage(format!("the job sent to this controller host is not readable: {e}"), Some("the laptop's and the host's gangway must be the same version; run the command again")))?;
    let (home, store) = open()?;
    let id = register(&store, sub, None)?;
    ensure_controller(&home)?;
    print_json(&json!({ "job_id": id }))?;
    Ok(ExitCode::Ok)
}

/// Whether our stdout is a pipe or socket whose reader has gone (the
/// laptop that followed a job over SSH disconnected).
fn stdout_gone() -> bool {
    let mut p = libc::pollfd {
        fd: 1,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// `jobs queue|logs|events|cancel` with a hosted controller: the same
/// command, run there.
fn hosted(h: &Hosted, cmd: &JobsCommand, out: Output) -> Result<ExitCode, Error> {
    let mut args: Vec<String> = vec!["jobs".into()];
    let follows = match cmd {
        JobsCommand::Launch(_) => unreachable!("launch is handled apart"),
        JobsCommand::Queue => {
            args.push("queue".into());
            false
        }
        JobsCommand::Logs(a) => {
            args.extend(["logs".into(), a.id.to_string()]);
            if a.follow {
                args.push("--follow".into());
            }
            if a.controller {
                args.push("--controller".into());
            }
            a.follow
        }
        JobsCommand::Cancel(a) => {
            args.push("cancel".into());
            args.extend(a.ids.iter().map(i64::to_string));
            if a.all {
                args.push("--all".into());
            }
            false
        }
        JobsCommand::Events { id } => {
            args.extend(["events".into(), id.to_string()]);
            false
        }
        JobsCommand::Submit | JobsCommand::Follow { .. } => {
            return Err(Error::usage(
                "this command is for a controller host, not for a machine that uses one",
                None,
            ))
        }
    };
    if out == Output::Json {
        args.extend(["-o".into(), "json".into()]);
    }
    run_following(h, &args, follows, None)
}

/// Runs `args` on the controller host; when `follows`, Ctrl-C stops the
/// following (the job goes on) instead of failing.
fn run_following(
    h: &Hosted,
    args: &[String],
    follows: bool,
    id: Option<i64>,
) -> Result<ExitCode, Error> {
    if follows {
        interrupts::install();
    }
    let start = interrupts::count();
    let result = h.run(args, Input::Nothing);
    if follows && interrupts::count() > start {
        eprintln!(
            "gangway: stopped following; {} keeps running on the controller at {}",
            id.map_or("the managed job".to_string(), |i| format!(
                "managed job {i}"
            )),
            h.address()
        );
        return Ok(ExitCode::Ok);
    }
    Ok(ExitCode::from_code(result?))
}

/// `jobs launch` with a hosted controller: the task is read, checked and
/// staged here (the workdir into jobs.bucket), handed to the host over the
/// connection's stdin, and followed there unless `--detach`.
fn launch_hosted(
    h: &Hosted,
    a: &JobsLaunchArgs,
    catalog: Option<&Path>,
    store: &Store,
    out: Output,
) -> Result<ExitCode, Error> {
    if let Some(dir) = catalog {
        return Err(Error::usage(
            format!(
                "--catalog {} is a directory on this machine; the controller at {} plans with its own catalog",
                dir.display(),
                h.address()
            ),
            Some("run `gangway catalog refresh` on the controller host, or unset GANGWAY_CATALOG_DIR"),
        ));
    }
    let pending = pending_owner();
    let sub = prepare(a, None, store, &pending, Some(&h.address()))?;
    let job_files = sub.task.job_files.clone();
    let undo = || {
        crate::core::storage::remove_buckets_now(store, &pending);
        if let Some(url) = &job_files {
            if let Ok(rt) = crate::core::runtime::runtime() {
                let _ = rt.block_on(crate::core::storage::remove_job_files(url));
            }
        }
    };
    let body = serde_json::to_vec(&sub).map_err(std::io::Error::from)?;
    let (code, answer) = match h.output(&["jobs".into(), "__submit".into()], Input::Bytes(&body)) {
        Ok(r) => r,
        Err(e) => {
            undo();
            return Err(e);
        }
    };
    let id = (code == 0)
        .then(|| serde_json::from_slice::<serde_json::Value>(&answer).ok())
        .flatten()
        .and_then(|v| v["job_id"].as_i64());
    let Some(id) = id else {
        undo();
        // The host said why on stderr.
        return Ok(if code == 0 {
            ExitCode::Internal
        } else {
            ExitCode::from_code(code)
        });
    };
    // The buckets are the host's to delete now.
    for b in store.buckets_of(&pending)? {
        store.forget_bucket(&b.url)?;
    }
    if a.detach {
        if out == Output::Json {
            print_json(&json!({ "job_id": id, "state": "PENDING", "controller": h.address() }))?;
        } else {
            eprintln!(
                "Managed job {id} submitted to the controller at {}; `gangway jobs logs {id} --follow` follows it",
                h.address()
            );
        }
        return Ok(ExitCode::Ok);
    }
    eprintln!(
        "Managed job {id} submitted to the controller at {} (Ctrl-C stops following, not the job)",
        h.address()
    );
    let mut args = vec!["jobs".into(), "__follow".into(), id.to_string()];
    if out == Output::Json {
        args.extend(["-o".into(), "json".into()]);
    }
    run_following(h, &args, true, Some(id))
}

/// `checkpoint.storage`: a local directory (default: the job's own), or a
/// bucket, checked now (it exists, these credentials may list it), before
/// anything is provisioned.
fn checkpoint_storage(
    task: &crate::core::spec::Task,
    file: &Path,
    default: PathBuf,
    own: &crate::core::storage::OwnIdentity,
) -> Result<(PathBuf, Option<String>), Error> {
    let Some(ck) = task.checkpoint.as_ref() else {
        return Ok((default, None));
    };
    match ck.storage.clone() {
        None => Ok((default, None)),
        Some(s) if s.contains("://") => {
            let url = crate::core::storage::check_checkpoint_bucket(&s, file, ck.storage_at, own)?;
            Ok((default, Some(url)))
        }
        Some(s) => {
            let p = PathBuf::from(&s);
            Ok((std::path::absolute(&p).unwrap_or(p), None))
        }
    }
}

/// A managed job ready for a controller: everything but its id, as the
/// laptop sends it to a hosted controller (over the SSH connection's
/// stdin: secrets included, never on a command line).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Submission {
    /// `--name`, or the task's.
    name: Option<String>,
    /// The task file with literal secret values taken out.
    task_text: String,
    /// The job; `task_file`, and `storage` where `own_storage`, are placed
    /// by the side that registers it.
    task: ManagedTask,
    /// Whether the checkpoints go to the job's own directory.
    own_storage: bool,
    /// The task's secrets, for its recoveries.
    secrets: Vec<(String, String)>,
    /// Buckets made for the job (URL, persistent): the job's end deletes
    /// the others.
    buckets: Vec<(String, bool)>,
}

/// Reads, checks and stages a task for `jobs launch`: buckets it makes are
/// recorded in `store` under `pending` until the job is registered.
fn prepare(
    a: &JobsLaunchArgs,
    catalog: Option<&Path>,
    store: &Store,
    pending: &str,
    hosted: Option<&str>,
) -> Result<Submission, Error> {
    let task = a.task.load()?;
    super::plan::require_values(&task, &a.task.task)?;
    let mut spec = job_spec(&task, &a.task.task, true, false)?;
    // Nodes with an identity of their own need no credentials from here:
    // those are checked (and made) at each run's storage step instead.
    let own = {
        let home = gangway_home()?;
        let config = crate::core::config::launch_config(&task, &home)?;
        crate::core::storage::OwnIdentity::configured(
            config.as_ref(),
            &crate::core::registry::Providers::new(&home),
        )
    };
    crate::core::storage::preflight_now(&task, &a.task.task, &spec.bucket_mounts, &own)?;
    // With jobs.bucket, the workdir and local file mounts go to the store
    // once, now: recoveries fetch them from there, not from this machine.
    let local_files = spec.workdir.is_some() || !spec.file_mounts.is_empty();
    let job_files = match crate::core::config::jobs_bucket(&task, store.home())? {
        Some(b) if local_files => {
            let tag = format!("{}-{}", crate::core::state::now_ms(), std::process::id());
            Some(crate::core::runtime::runtime()?.block_on(
                crate::core::storage::stage_job_files(
                    &b,
                    spec.take_local_files(),
                    &mut spec.bucket_mounts,
                    &tag,
                ),
            )?)
        }
        None if local_files && hosted.is_some() => {
            return Err(Error::usage(
                format!(
                    "{}: the job has a workdir or local file mounts, and its controller runs on {} where this machine's files are not",
                    a.task.task.display(),
                    hosted.unwrap_or_default()
                ),
                Some("set jobs.bucket (config.yaml or the task's config:) to a bucket: the files go there once and every recovery fetches them from it"),
            ));
        }
        _ => None,
    };
    let secrets = secrets_of(&task);
    // The copy recoveries plan from, with literal secret values taken out
    // (they are in secrets.json, owner-only, until the job ends).
    let text = std::fs::read_to_string(&a.task.task)?;
    let redacted = crate::core::spec::redact_secrets(&text, &a.task.task.display().to_string())
        .map_err(|e| Error::usage(e.to_string(), None))?;
    // Buckets the task names and lacks are made now, once: recoveries
    // reuse them. Held under a placeholder owner until the job has an id.
    if let Err(e) = crate::core::storage::make_buckets_now(
        &task,
        &a.task.task,
        &spec.bucket_mounts,
        store,
        pending,
    ) {
        crate::core::storage::remove_buckets_now(store, pending);
        return Err(e);
    }
    let ck = task.checkpoint.clone().unwrap_or_default();
    let (storage, storage_url) = checkpoint_storage(&task, &a.task.task, PathBuf::new(), &own)?;
    let own_storage = storage.as_os_str().is_empty();
    if own_storage && storage_url.is_none() && task.checkpoint.is_some() {
        if let Some(host) = hosted {
            eprintln!(
                "gangway: the checkpoints are kept on the controller host {host}; \
                 checkpoint.storage: s3://... or gs://... keeps them in a bucket the nodes write themselves"
            );
        }
    }
    let recovery = task.resources.job_recovery.clone();
    let buckets = store
        .buckets_of(pending)?
        .into_iter()
        .map(|b| (b.url, b.persistent))
        .collect();
    Ok(Submission {
        name: a.name.clone().or_else(|| task.name.clone()),
        task_text: redacted,
        own_storage,
        secrets,
        buckets,
        task: ManagedTask {
            task_file: PathBuf::new(),
            task_path: a.task.task.display().to_string(),
            overrides: a.task.overrides(),
            // Absolute: the controller runs elsewhere in the file system.
            catalog_dir: catalog
                .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf())),
            spec,
            storage,
            storage_url,
            job_files,
            keep: ck.keep,
            sync_interval_s: ck.sync_interval_s as f64,
            signal: signal_number(&ck.signal),
            grace_s: ck.grace_s as f64,
            strategy: recovery
                .as_ref()
                .and_then(|r| r.strategy.clone())
                .unwrap_or_else(|| "EAGER_NEXT_REGION".into()),
            max_restarts_on_errors: recovery.as_ref().map_or(0, |r| r.max_restarts_on_errors),
            recover_on_exit_codes: recovery
                .as_ref()
                .map(|r| r.recover_on_exit_codes.clone())
                .unwrap_or_default(),
            deadline_s: task.deadline_s.map(|d| d as f64),
            work_s: task.deadline_work_s.map(|w| w as f64),
            policy: task.deadline_policy.clone(),
        },
    })
}

/// Gives a prepared job an id in `store`: its directory, the redacted task,
/// its secrets (owner-only) and its buckets (those under `pending` in this
/// store, or the submission's list).
fn register(store: &Store, sub: Submission, pending: Option<&str>) -> Result<i64, Error> {
    let placeholder = "{}";
    let job = store.add_managed(sub.name.as_deref(), placeholder)?;
    let owner = format!("job:{}", job.id);
    match pending {
        Some(p) => store.move_buckets(p, &owner)?,
        None => {
            for (url, persistent) in &sub.buckets {
                // Made by the submitting side for this job: its own.
                let _ = store.add_bucket(url, &owner, *persistent)?;
            }
        }
    }
    let dir = store.managed_dir(job.id);
    std::fs::create_dir_all(&dir)?;
    let task_file = dir.join("task.yaml");
    std::fs::write(&task_file, &sub.task_text)?;
    if !sub.secrets.is_empty() {
        // Kept only so a recovery can hand them to the new nodes; owner-only,
        // removed when the job ends.
        let mut f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(dir.join("secrets.json"))?;
        f.write_all(
            serde_json::to_string(&sub.secrets)
                .map_err(std::io::Error::from)?
                .as_bytes(),
        )?;
    }
    let mut mt = sub.task;
    mt.task_file = task_file;
    if sub.own_storage {
        mt.storage = dir.join("checkpoint");
    }
    let text = serde_json::to_string(&mt).map_err(std::io::Error::from)?;
    store.set_managed_task(job.id, &text)?;
    Ok(job.id)
}

fn pending_owner() -> String {
    format!(
        "job:pending-{}-{}",
        std::process::id(),
        crate::core::state::now_ms()
    )
}

fn launch(a: &JobsLaunchArgs, catalog: Option<&Path>, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    // The task may name its own controller (`config.jobs.controller`).
    let task_config = a.task.load()?.config;
    if let Some(h) = Hosted::configured_for(&home, task_config.as_ref())? {
        return launch_hosted(&h, a, catalog, &store, out);
    }
    let pending = pending_owner();
    let sub = prepare(a, catalog, &store, &pending, None)?;
    let id = register(&store, sub, Some(&pending))?;
    if a.wait {
        // The controller in this process, the follower beside it.
        let home2 = home.clone();
        let worker = std::thread::spawn(move || -> Result<(), Error> {
            let (lock_path, _) = controller_paths(&home2);
            let rt = Controller::runtime()?;
            loop {
                if let Some(_lock) = OwnerLock::try_acquire(&lock_path)? {
                    let mut c = Controller::new(&home2)?;
                    return rt.block_on(c.run(Until::Job(id)));
                }
                // A detached controller has it; follow until the job ends.
                let s = Store::open(&home2)?;
                if s.managed(id)
                    .ok()
                    .flatten()
                    .is_none_or(|j| j.state.is_terminal())
                {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let state = follow(&store, id, out != Output::Json, true)?;
        if let Ok(Err(e)) = worker.join() {
            eprintln!("gangway: controller: {e}");
        }
        // Jobs this process's controller leaves behind, and clusters whose
        // teardown failed, get a detached one.
        if needs_controller(&store)? {
            ensure_controller(&home)?;
        }
        return finish_output(&store, id, state, out);
    }
    ensure_controller(&home)?;
    if a.detach {
        if out == Output::Json {
            print_json(&json!({ "job_id": id, "state": "PENDING" }))?;
        } else {
            eprintln!("Managed job {id} submitted; `gangway jobs logs {id} --follow` follows it");
        }
        return Ok(ExitCode::Ok);
    }
    eprintln!("Managed job {id} submitted (Ctrl-C stops following, not the job)");
    let state = follow(&store, id, out != Output::Json, false)?;
    finish_output(&store, id, state, out)
}

fn finish_output(
    store: &Store,
    id: i64,
    state: ManagedState,
    out: Output,
) -> Result<ExitCode, Error> {
    let job = managed(store, id)?;
    if out == Output::Json {
        print_json(&json_of(store, &job))?;
    } else {
        eprintln!(
            "Managed job {id} {state}: {} restart(s), {} preemption(s), ${:.4}{}",
            job.restart_count,
            job.preemptions,
            super::cost::job_cost(store, &job, now_ms()),
            job.detail
                .as_deref()
                .map(|d| format!("; {d}"))
                .unwrap_or_default()
        );
    }
    if state.is_terminal() {
        cluster_gone(store, &job.cluster)?;
    }
    Ok(exit_for(state))
}

/// Whether a controller has work: live jobs, or ended ones whose cluster
/// is still there (it was killed before the teardown, or the teardown
/// failed and is retried).
/// The same query the controller watches.
fn needs_controller(store: &Store) -> Result<bool, Error> {
    Ok(!store.managed_watch()?.is_empty())
}

/// After a managed job ended: waits (a minute at most) for its controller
/// to remove the cluster. A teardown that failed is an error (exit 6): the
/// cluster may still be running, kept as `TERMINATING` and retried.
fn cluster_gone(store: &Store, cluster: &str) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match store.cluster(cluster)? {
            None => return Ok(()),
            Some(row) if row.teardown_failures > 0 => {
                let why = row
                    .last_error
                    .unwrap_or_else(|| "the teardown failed".into());
                return Err(Error::leftover(store, cluster, why));
            }
            Some(_) if std::time::Instant::now() > deadline => return Ok(()),
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn exit_for(s: ManagedState) -> ExitCode {
    match s {
        ManagedState::Succeeded => ExitCode::Ok,
        ManagedState::Cancelled => ExitCode::Interrupted,
        ManagedState::FailedNoResource => ExitCode::NoResources,
        _ if s.is_terminal() => ExitCode::JobFailed,
        // Following stopped before the end (Ctrl-C): the job goes on.
        _ => ExitCode::Ok,
    }
}

fn runs_of(store: &Store, id: i64) -> Vec<i64> {
    std::fs::read_to_string(store.managed_dir(id).join("runs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Prints the job's runs' logs as they grow, across recoveries, and its
/// transitions; returns its state when it ends (or when Ctrl-C stops the
/// following, unless `wait`).
fn follow(store: &Store, id: i64, print: bool, wait: bool) -> Result<ManagedState, Error> {
    interrupts::install();
    let start = interrupts::count();
    let mut offsets: HashMap<i64, u64> = HashMap::new();
    let mut seen_events = 0usize;
    let mut stdout = super::term::NodeOutput::stdout();
    let mut checked = std::time::Instant::now();
    loop {
        let job = managed(store, id)?;
        // A controller that died (or was killed) is started again.
        if !wait && !job.state.is_terminal() && checked.elapsed() > Duration::from_secs(1) {
            checked = std::time::Instant::now();
            if let Some(home) = store.home().to_str() {
                ensure_controller(Path::new(home))?;
            }
        }
        if print {
            let evs = store.managed_events(id)?;
            for e in evs.iter().skip(seen_events) {
                if !e.reason.is_empty() {
                    eprintln!("gangway jobs: {} {}: {}", id, e.state, e.reason);
                }
            }
            seen_events = evs.len();
            for run in runs_of(store, id) {
                let path = store.job_log_dir(run).join("job.log");
                let pos = offsets.entry(run).or_insert(0);
                if let Ok(mut f) = std::fs::File::open(&path) {
                    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                    if len > *pos {
                        f.seek(SeekFrom::Start(*pos))?;
                        let mut buf = Vec::new();
                        Read::by_ref(&mut f)
                            .take(len - *pos)
                            .read_to_end(&mut buf)?;
                        *pos += buf.len() as u64;
                        stdout.write_all(&buf)?;
                        stdout.flush()?;
                    }
                }
            }
        }
        if job.state.is_terminal() {
            return Ok(job.state);
        }
        if std::env::var_os(HOSTED_ENV).is_some() && stdout_gone() {
            // Followed over SSH by a laptop that has gone: the job goes on.
            return Ok(job.state);
        }
        if !wait && interrupts::count() > start {
            eprintln!("gangway: stopped following; managed job {id} keeps running");
            return Ok(job.state);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn json_of(store: &Store, j: &ManagedJob) -> serde_json::Value {
    let mut v = serde_json::to_value(j).unwrap_or_default();
    v["cost"] = json!(super::cost::job_cost(store, j, now_ms()));
    v
}

fn queue(out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    if needs_controller(&store)? {
        ensure_controller(&home)?;
    }
    let jobs = store.managed_all()?;
    if out == Output::Json {
        print_json(
            &json!({ "jobs": jobs.iter().map(|j| json_of(&store, j)).collect::<Vec<_>>() }),
        )?;
        return Ok(ExitCode::Ok);
    }
    if jobs.is_empty() {
        println!("No managed jobs. Launch one with `gangway jobs launch TASK.yaml`.");
        return Ok(ExitCode::Ok);
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.id.to_string(),
                j.name.clone().unwrap_or_else(|| "-".into()),
                j.state.to_string(),
                j.restart_count.to_string(),
                j.preemptions.to_string(),
                format!("{:.4}", super::cost::job_cost(&store, j, now)),
                j.placement.clone().unwrap_or_else(|| "-".into()),
                j.detail
                    .as_deref()
                    .and_then(|d| d.lines().next())
                    .unwrap_or("")
                    .to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "ID",
            "NAME",
            "STATE",
            "RESTARTS",
            "PREEMPTIONS",
            "COST $",
            "PLACEMENT",
            "DETAIL",
        ],
        &rows,
    )?;
    Ok(ExitCode::Ok)
}

fn logs(a: &JobsLogsArgs) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let job = managed(&store, a.id)?;
    if a.controller {
        let (_, log) = controller_paths(&home);
        if let Ok(mut f) = std::fs::File::open(log) {
            std::io::copy(&mut f, &mut std::io::stdout().lock())?;
        }
        return Ok(ExitCode::Ok);
    }
    if a.follow && !job.state.is_terminal() {
        ensure_controller(&home)?;
        let state = follow(&store, a.id, true, false)?;
        return Ok(exit_for(state));
    }
    let mut stdout = super::term::NodeOutput::stdout();
    for run in runs_of(&store, a.id) {
        if let Ok(mut f) = std::fs::File::open(store.job_log_dir(run).join("job.log")) {
            std::io::copy(&mut f, &mut stdout)?;
        }
    }
    Ok(ExitCode::Ok)
}

fn cancel(a: &JobsCancelArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let ids: Vec<i64> = if a.all {
        store.managed_active()?.iter().map(|j| j.id).collect()
    } else if a.ids.is_empty() {
        return Err(Error::usage(
            "name the managed jobs to cancel, or pass --all",
            None,
        ));
    } else {
        for id in &a.ids {
            managed(&store, *id)?;
        }
        a.ids.clone()
    };
    for id in &ids {
        store.cancel_managed(*id)?;
    }
    if !ids.is_empty() {
        ensure_controller(&home)?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut ended = Vec::new();
    for id in &ids {
        loop {
            let j = managed(&store, *id)?;
            if j.state.is_terminal() || std::time::Instant::now() > deadline {
                ended.push(j);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if out == Output::Json {
        print_json(
            &json!({ "jobs": ended.iter().map(|j| json_of(&store, j)).collect::<Vec<_>>() }),
        )?;
    } else if ended.is_empty() {
        println!("No live managed jobs.");
    } else {
        for j in &ended {
            println!("Managed job {} {}", j.id, j.state);
        }
    }
    for j in ended.iter().filter(|j| j.state.is_terminal()) {
        cluster_gone(&store, &j.cluster)?;
    }
    Ok(ExitCode::Ok)
}

fn events(id: i64, out: Output) -> Result<ExitCode, Error> {
    let (_, store) = open()?;
    managed(&store, id)?;
    let evs = store.managed_events(id)?;
    if out == Output::Json {
        print_json(&json!({ "job_id": id, "events": evs }))?;
        return Ok(ExitCode::Ok);
    }
    let first = evs.first().map_or(0, |e| e.at);
    let rows: Vec<Vec<String>> = evs
        .iter()
        .map(|e| {
            vec![
                format!("+{:.1}s", (e.at - first) as f64 / 1000.0),
                e.state.clone(),
                e.placement.clone().unwrap_or_else(|| "-".into()),
                e.reason.clone(),
            ]
        })
        .collect();
    table::print(&["AT", "STATE", "PLACEMENT", "REASON"], &rows)?;
    Ok(ExitCode::Ok)
}
