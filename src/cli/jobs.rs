//! `gangway jobs ...`: managed jobs that survive preemption.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::launch::{gangway_home, job_spec, secrets_of};
use super::{interrupts, print_json, table, Output, TaskArgs};
use crate::jobs::controller::{controller_paths, Controller, Until};
use crate::jobs::{signal_number, ManagedTask};
use crate::state::{now_ms, ManagedJob, ManagedState, OwnerLock, Store};
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
    match cmd {
        JobsCommand::Launch(a) => launch(&a, catalog, out),
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
pub(crate) fn ensure_controller(home: &Path) -> Result<(), Error> {
    let (lock, _) = controller_paths(home);
    if OwnerLock::is_held(&lock) {
        return Ok(());
    }
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("__jobs-controller")
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

/// `checkpoint.storage`: a local directory (default: the job's own), or a
/// bucket, checked now (it exists, these credentials may list it), before
/// anything is provisioned.
fn checkpoint_storage(
    task: &crate::spec::Task,
    file: &Path,
    default: PathBuf,
    own: &crate::storage::OwnIdentity,
) -> Result<(PathBuf, Option<String>), Error> {
    let Some(ck) = task.checkpoint.as_ref() else {
        return Ok((default, None));
    };
    match ck.storage.clone() {
        None => Ok((default, None)),
        Some(s) if s.contains("://") => {
            let url = crate::storage::check_checkpoint_bucket(&s, file, ck.storage_at, own)?;
            Ok((default, Some(url)))
        }
        Some(s) => {
            let p = PathBuf::from(&s);
            Ok((std::path::absolute(&p).unwrap_or(p), None))
        }
    }
}

fn launch(a: &JobsLaunchArgs, catalog: Option<&Path>, out: Output) -> Result<ExitCode, Error> {
    let task = a.task.load()?;
    super::plan::require_values(&task, &a.task.task)?;
    let mut spec = job_spec(&task, &a.task.task, true, false)?;
    // Nodes with an identity of their own need no credentials from here:
    // those are checked (and made) at each run's storage step instead.
    let own = {
        let home = gangway_home()?;
        let config = crate::config::launch_config(&task, &home)?;
        crate::storage::OwnIdentity::configured(
            config.as_ref(),
            &crate::provision::Providers::new(&home),
        )
    };
    crate::storage::preflight_now(&task, &a.task.task, &spec.bucket_mounts, &own)?;
    // With jobs.bucket, the workdir and local file mounts go to the store
    // once, now: recoveries fetch them from there, not from this machine.
    let job_files = match crate::config::jobs_bucket(&task, &gangway_home()?)? {
        Some(b) if spec.workdir.is_some() || !spec.file_mounts.is_empty() => {
            let tag = format!("{}-{}", crate::state::now_ms(), std::process::id());
            Some(
                crate::cli::launch::runtime()?
                    .block_on(crate::storage::stage_job_files(&b, &mut spec, &tag))?,
            )
        }
        _ => None,
    };
    let secrets = secrets_of(&task);
    // The copy recoveries plan from, with literal secret values taken out
    // (they are in secrets.json below, owner-only, until the job ends).
    let text = std::fs::read_to_string(&a.task.task)?;
    let redacted = crate::spec::redact_secrets(&text, &a.task.task.display().to_string())
        .map_err(|e| Error::usage(e.to_string(), None))?;
    let (home, store) = open()?;
    // Buckets the task names and lacks are made now, once: recoveries
    // reuse them. Held under a placeholder owner until the job has an id.
    let pending = format!(
        "job:pending-{}-{}",
        std::process::id(),
        crate::state::now_ms()
    );
    if let Err(e) =
        crate::storage::make_buckets_now(&task, &a.task.task, &spec.bucket_mounts, &store, &pending)
    {
        crate::storage::remove_buckets_now(&store, &pending);
        return Err(e);
    }
    let name = a.name.clone().or_else(|| task.name.clone());
    let placeholder = "{}";
    let job = store.add_managed(name.as_deref(), placeholder)?;
    store.move_buckets(&pending, &format!("job:{}", job.id))?;
    let dir = store.managed_dir(job.id);
    std::fs::create_dir_all(&dir)?;
    let task_file = dir.join("task.yaml");
    std::fs::write(&task_file, redacted)?;
    if !secrets.is_empty() {
        // Kept only so a recovery can hand them to the new nodes; owner-only,
        // removed when the job ends.
        let mut f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(dir.join("secrets.json"))?;
        f.write_all(
            serde_json::to_string(&secrets)
                .map_err(std::io::Error::from)?
                .as_bytes(),
        )?;
    }
    let ck = task.checkpoint.clone().unwrap_or_default();
    let (storage, storage_url) =
        checkpoint_storage(&task, &a.task.task, dir.join("checkpoint"), &own)?;
    let recovery = task.resources.job_recovery.clone();
    let mt = ManagedTask {
        task_file,
        task_path: a.task.task.display().to_string(),
        overrides: a.task.overrides(),
        // Absolute: the controller runs elsewhere in the file system.
        catalog_dir: catalog.map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf())),
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
    };
    let text = serde_json::to_string(&mt).map_err(std::io::Error::from)?;
    store.set_managed_task(job.id, &text)?;
    let id = job.id;
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
    let mut stdout = std::io::stdout();
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
    let mut stdout = std::io::stdout().lock();
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
