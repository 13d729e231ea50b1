//! `gangway jobs ...`: managed jobs that survive preemption.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::launch::gangway_home;
use super::{interrupts, print_json, table, Output, TaskArgs};
use crate::core::state::{now_ms, ManagedJob, ManagedState, Store};
use crate::services::host::{Hosted, Input, HOSTED_ENV};
use crate::services::jobs::controller::controller_paths;
use crate::services::jobs::submit::{self, needs_controller, pending_owner, register, Submission};
use crate::services::jobs::supervisor::ensure_controller;
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
/// `gangway __jobs-controller`.
pub(crate) fn controller_main() -> Result<ExitCode, Error> {
    crate::services::jobs::supervisor::controller_main(&gangway_home()?)?;
    Ok(ExitCode::Ok)
}

/// `gangway __controller-supervisor`.
pub(crate) fn supervisor_main() -> Result<ExitCode, Error> {
    crate::services::jobs::supervisor::supervisor_main(&gangway_home()?)?;
    Ok(ExitCode::Ok)
}

/// `gangway __controller-stop`.
pub(crate) fn controller_stop_main() -> Result<ExitCode, Error> {
    crate::services::jobs::supervisor::controller_stop_main(&gangway_home()?)?;
    Ok(ExitCode::Ok)
}

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
    crate::services::jobs::supervisor::command_came(&gangway_home()?)?;
    match cmd {
        JobsCommand::Launch(a) => launch(&a, catalog, out),
        JobsCommand::Submit => submit_here(out),
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

/// `gangway jobs __submit`, on a controller host: registers the job the
/// laptop sends on stdin and starts the controller; prints `{"job_id": N}`.
fn submit_here(out: Output) -> Result<ExitCode, Error> {
    let _ = out;
    // The job's JSON (one line), then the tar stream of its local files
    // when the laptop sent them, unpacked as it arrives.
    let mut stdin = std::io::BufReader::new(std::io::stdin().lock());
    let mut json = Vec::new();
    std::io::BufRead::read_until(&mut stdin, b'\n', &mut json)?;
    let mut sub: Submission = serde_json::from_slice(&json)
        .map_err(|e| Error::usage(format!("the job sent to this controller host is not readable: {e}"), Some("the laptop's and the host's gangway must be the same version; run the command again")))?;
    let (home, store) = open()?;
    let files_follow = !std::io::BufRead::fill_buf(&mut stdin)?.is_empty();
    if files_follow {
        submit::receive_files(&mut sub, &mut stdin, &home).map_err(|e| {
            Error::usage(
                format!("the job's files sent to this controller host could not be kept: {e}"),
                None,
            )
        })?;
    }
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
    let task = a.task.load()?;
    super::plan::require_values(&task, &a.task.task)?;
    let sub = submit::prepare(
        &launch_of(a, &task, None),
        store,
        &pending,
        Some(&h.address()),
    )?;
    let job_files = sub.task.job_files.clone();
    // Without jobs.bucket, the workdir and local file mounts go to the
    // host with the job (after its JSON line), kept there for recoveries.
    let files = if job_files.is_none() {
        submit::local_files_size(&sub.task.spec)
    } else {
        None
    };
    let undo = || {
        crate::core::storage::remove_buckets_now(store, &pending);
        if let Some(url) = &job_files {
            if let Ok(rt) = crate::core::runtime::runtime() {
                let _ = rt.block_on(crate::core::storage::remove_job_files(url));
            }
        }
    };
    let json = serde_json::to_vec(&sub).map_err(std::io::Error::from)?;
    if let Some((bytes, count)) = files {
        eprintln!(
            "Sending the workdir and local file mounts ({} KiB in {count} file(s)) to the controller at {}, kept there for the job's recoveries",
            bytes.div_ceil(1024),
            h.address()
        );
    }
    // Written into ssh as the host reads: the files are never all in
    // memory here.
    let feed = |w: &mut dyn Write| -> std::io::Result<()> {
        w.write_all(&json)?;
        if files.is_some() {
            w.write_all(b"\n")?;
            submit::write_local_files(&sub.task.spec, w)?;
        }
        Ok(())
    };
    let (code, answer) = match h.output(&["jobs".into(), "__submit".into()], Input::Written(&feed))
    {
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

/// What `jobs launch` asks the service for.
fn launch_of<'a>(
    a: &'a JobsLaunchArgs,
    task: &'a crate::core::spec::Task,
    catalog: Option<&'a Path>,
) -> submit::Launch<'a> {
    submit::Launch {
        task,
        task_file: &a.task.task,
        overrides: a.task.overrides(),
        name: a.name.clone(),
        catalog,
    }
}

fn launch(a: &JobsLaunchArgs, catalog: Option<&Path>, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    // The task may name its own controller (`config.jobs.controller`).
    let task_config = a.task.load()?.config;
    if let Some(h) = Hosted::configured_for(&home, task_config.as_ref())? {
        return launch_hosted(&h, a, catalog, &store, out);
    }
    let pending = pending_owner();
    let task = a.task.load()?;
    super::plan::require_values(&task, &a.task.task)?;
    let sub = submit::prepare(&launch_of(a, &task, catalog), &store, &pending, None)?;
    let id = register(&store, sub, Some(&pending))?;
    if a.wait {
        // The controller in this process, the follower beside it.
        let home2 = home.clone();
        let worker =
            std::thread::spawn(move || crate::services::jobs::supervisor::run_for_job(&home2, id));
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
        print_json(&crate::services::cost::job_json(store, &job))?;
    } else {
        eprintln!(
            "Managed job {id} {state}: {} restart(s), {} preemption(s), ${:.4}{}",
            job.restart_count,
            job.preemptions,
            crate::services::cost::job_cost(store, &job, now_ms()),
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
                    eprintln!("gangway: job {} {}: {}", id, e.state, e.reason);
                }
            }
            seen_events = evs.len();
            let runs = crate::services::jobs::runs_of(store, id);
            for &run in &runs {
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
                        // Whole lines only (the rest waits for its end),
                        // unless the job has ended.
                        let whole = if job.state.is_terminal() {
                            buf.len()
                        } else {
                            buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
                        };
                        *pos += whole as u64;
                        stdout.write_all(&crate::services::jobs::story(&buf[..whole], &runs))?;
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

fn queue(out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    if needs_controller(&store)? {
        ensure_controller(&home)?;
    }
    let jobs = store.managed_all()?;
    if out == Output::Json {
        print_json(
            &json!({ "jobs": jobs.iter().map(|j| crate::services::cost::job_json(&store, j)).collect::<Vec<_>>() }),
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
                j.nodes_replaced.to_string(),
                format!("{:.4}", crate::services::cost::job_cost(&store, j, now)),
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
            "NODES REPLACED",
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
    let runs = crate::services::jobs::runs_of(&store, a.id);
    for &run in &runs {
        if let Ok(text) = std::fs::read(store.job_log_dir(run).join("job.log")) {
            stdout.write_all(&crate::services::jobs::story(&text, &runs))?;
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
            &json!({ "jobs": ended.iter().map(|j| crate::services::cost::job_json(&store, j)).collect::<Vec<_>>() }),
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
