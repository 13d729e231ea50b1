//! The job driver: sync, setup on all, barrier, run on all, stop the gang
//! when a rank fails, record how it ended.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_provider::{ClusterName, NodeState};
use tokio::task::JoinSet;

use super::files;
use super::{node_env, transport_for, GangInfo, JobSpec, NodeCommand, Phase, Transport};
use crate::core::context::Context;
use crate::core::registry::Providers;
use crate::core::state::{
    ClusterStatus, EndReason, JobStatus, LossSeen, LostNode, NodeRow, OwnerLock, RankEnd,
    RunOutcome, StateError, Store,
};

/// How long ranks get between SIGTERM and SIGKILL.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// What stopped a phase early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cancel {
    None,
    Graceful,
    Kill,
}

/// How a phase ended.
enum PhaseEnd {
    Ok,
    Failed { rank: usize, what: String },
    Cancelled,
}

/// How a process status reads as data.
fn rank_end(s: &ExitStatus) -> RankEnd {
    match (s.code(), s.signal()) {
        (Some(code), _) => RankEnd::Exited { code },
        (None, Some(signal)) => RankEnd::Signalled { signal },
        _ => RankEnd::Unknown,
    }
}

/// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
pub(crate) fn describe_exit(s: &ExitStatus) -> String {
    if let Some(c) = s.code() {
        return format!("exited with code {c}");
    }
    match s.signal() {
        Some(sig) => format!("was killed by signal {sig}{}", signal_name(sig)),
        None => "ended in an unknown way".into(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        _ => "",
    }
}

/// The job's combined log (rank-prefixed lines) and per-rank logs.
#[derive(Clone)]
pub(crate) struct Logs {
    dir: std::path::PathBuf,
    combined: Arc<Mutex<File>>,
}

impl Logs {
    fn open(dir: &Path) -> std::io::Result<Logs> {
        std::fs::create_dir_all(dir)?;
        let combined = File::options()
            .create(true)
            .append(true)
            .open(dir.join("job.log"))?;
        Ok(Logs {
            dir: dir.to_path_buf(),
            combined: Arc::new(Mutex::new(combined)),
        })
    }

    /// Records a rank's process group, so that whoever finds this driver
    /// dead can stop what it started.
    fn record_pid(&self, rank: usize, pgid: u32) {
        if let Ok(mut f) = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))
        {
            let _ = writeln!(f, "{rank} {pgid}");
        }
    }

    /// A line from gangway itself.
    pub(crate) fn say(&self, line: &str) {
        if let Ok(mut f) = self.combined.lock() {
            let _ = writeln!(f, "gangway: {line}");
        }
    }

    /// Copies a node's output into its rank log and the combined log.
    fn pump(
        &self,
        reader: std::io::PipeReader,
        rank: usize,
        ip: &str,
        phase: Phase,
    ) -> std::thread::JoinHandle<Vec<String>> {
        let prefix = match phase {
            Phase::Storage => format!("(storage rank {rank}, {ip}) "),
            Phase::Setup => format!("(setup rank {rank}, {ip}) "),
            Phase::Run => format!("(rank {rank}, {ip}) "),
        };
        let own = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("rank-{rank}.log")));
        let combined = Arc::clone(&self.combined);
        std::thread::spawn(move || {
            let mut own = own.ok();
            let mut tail: std::collections::VecDeque<String> = Default::default();
            let mut r = BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                if let Some(f) = own.as_mut() {
                    let _ = f.write_all(&line);
                }
                if let Ok(mut f) = combined.lock() {
                    let _ = f.write_all(prefix.as_bytes());
                    let _ = f.write_all(&line);
                }
                tail.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
                if tail.len() > 20 {
                    tail.pop_front();
                }
            }
            tail.into()
        })
    }
}

/// Errors that stop a driver before it can record an ending.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DriveError {
    /// State database.
    #[error(transparent)]
    State(#[from] StateError),
    /// Something else.
    #[error("{0}")]
    Other(String),
}

/// How a driven job ended, for what comes after it (`--down`).
pub(crate) struct Driven {
    /// The job's final status.
    pub(crate) status: JobStatus,
    /// What it was driven with.
    pub(crate) cx: Context,
    /// The job's lock, held until what comes after is done: a launcher
    /// following the job waits for it to learn that a `--down` finished.
    pub(crate) _lock: OwnerLock,
    /// Its cluster.
    pub(crate) cluster: String,
    /// Whether the cluster goes down after it.
    pub(crate) down_after: bool,
    /// Its log, for what happens next (none for a job that had ended
    /// before this driver started).
    pub(crate) logs: Option<Logs>,
}

/// Drives job `job_id` to its end; `secrets` came over the driver's pipe.
pub(crate) async fn drive(
    home: &Path,
    job_id: i64,
    secrets: Vec<(String, String)>,
) -> Result<Driven, DriveError> {
    let cx = Context::open(home)?;
    let store = cx.store();
    let lock_path = store.job_lock_path(job_id);
    let Some(lock) = OwnerLock::acquire(&lock_path, Duration::from_secs(10))? else {
        return Err(DriveError::Other(format!(
            "job {job_id} already has a driver"
        )));
    };
    store.set_job_driver(job_id, std::process::id())?;
    let job = store
        .job(job_id)?
        .ok_or_else(|| DriveError::Other(format!("no job {job_id}")))?;
    if job.status.is_terminal() {
        return Ok(Driven {
            status: job.status,
            cx,
            _lock: lock,
            cluster: job.cluster,
            down_after: false,
            logs: None,
        });
    }
    let spec: JobSpec = serde_json::from_str(&job.spec)
        .map_err(|e| DriveError::Other(format!("job {job_id}: unreadable spec: {e}")))?;
    let logs = Logs::open(&store.job_log_dir(job_id))
        .map_err(|e| DriveError::Other(format!("job {job_id}: cannot write logs: {e}")))?;

    let (cancel_tx, mut cancel) = tokio::sync::watch::channel(Cancel::None);
    spawn_signal_watch(cancel_tx);

    let mut outcome = RunOutcome::of(EndReason::Succeeded);
    let run = Job {
        cx: &cx,
        cluster: &job.cluster,
        id: job_id,
        spec: &spec,
        secrets: &secrets,
        logs: &logs,
        began: std::time::Instant::now(),
    };
    let (status, detail) = run_job(&run, &mut cancel, &mut outcome).await?;
    record_end(store, &job, status, detail.as_deref(), &mut outcome, &logs)?;
    Ok(Driven {
        status,
        cx,
        _lock: lock,
        cluster: job.cluster,
        down_after: spec.down_after,
        logs: Some(logs),
    })
}

/// Records how job `job` ended: its row and outcome, an event, the last
/// line of its log, and `status.json` beside the logs, which outlive the
/// cluster's rows (`--down` removes them).
fn record_end(
    store: &Store,
    job: &crate::core::state::JobRow,
    status: JobStatus,
    detail: Option<&str>,
    outcome: &mut RunOutcome,
    logs: &Logs,
) -> Result<(), DriveError> {
    outcome.reason = match status {
        JobStatus::Succeeded => EndReason::Succeeded,
        JobStatus::FailedSetup => EndReason::SetupFailed,
        JobStatus::Cancelled => EndReason::Cancelled,
        JobStatus::Failed if outcome.failed_rank.is_some() => EndReason::RankFailed,
        _ => EndReason::NoCluster,
    };
    store.end_job(job.id, status, detail, outcome)?;
    let ending = format!(
        "job {} {status}{}",
        job.id,
        detail.map(|d| format!(": {d}")).unwrap_or_default()
    );
    store.event(&job.cluster, Some(job.id), "job", &ending)?;
    logs.say(&ending);
    let _ = std::fs::write(
        logs.dir.join("status.json"),
        serde_json::json!({ "status": status, "detail": detail }).to_string(),
    );
    Ok(())
}

fn spawn_signal_watch(tx: tokio::sync::watch::Sender<Cancel>) {
    use tokio::signal::unix::{signal, SignalKind};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            // First signal: graceful; any further one: kill.
            let next = if *tx.borrow() == Cancel::None {
                Cancel::Graceful
            } else {
                Cancel::Kill
            };
            let _ = tx.send(next);
        }
    });
}

/// How a job ended: its status and why.
type Ended = (JobStatus, Option<String>);

/// One job as its driver runs it.
struct Job<'a> {
    cx: &'a Context,
    cluster: &'a str,
    id: i64,
    spec: &'a JobSpec,
    secrets: &'a [(String, String)],
    logs: &'a Logs,
    /// When its driver started, for the step times in `driver.log`.
    began: std::time::Instant,
}

/// Runs the job once it is its turn on the cluster: reaches its nodes,
/// places their files, runs the storage step and setup ([`prepare`]),
/// then the run everywhere ([`phase`]); says how it ended.
async fn run_job(
    job: &Job<'_>,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
) -> Result<Ended, DriveError> {
    let (cx, cluster, spec) = (job.cx, job.cluster, job.spec);
    if let Some(ended) = wait_turn(job, cancel).await? {
        return Ok(ended);
    }
    let (cloud, nodes, transport) = match resolve(job)? {
        Ok(resolved) => resolved,
        Err(ended) => return Ok(ended),
    };
    let storage_env = match storage_env(job, &nodes).await {
        Ok(env) => env,
        Err(why) => return Ok((JobStatus::FailedSetup, Some(why))),
    };
    let _renewing = keep_mounts_renewed(job, &nodes, &transport);
    let nodes = match prepare(job, nodes, &transport, &storage_env, cancel, outcome).await? {
        Ok(nodes) => nodes,
        Err(ended) => return Ok(ended),
    };
    let Some(run) = spec.run.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok((JobStatus::Succeeded, Some("no run commands".into())));
    };
    let info = gang_info(job, &nodes, transport.as_ref(), storage_env);
    let t = transport.as_ref();
    let (end, ranks) = phase(job, Phase::Run, run, &info, t, cancel, None).await?;
    outcome.ranks = ranks;
    match end {
        PhaseEnd::Ok => Ok((JobStatus::Succeeded, None)),
        PhaseEnd::Failed { rank, what } => {
            outcome.failed_rank = Some(rank as u32);
            outcome.lost = preemption(cx.providers(), &cloud, cluster, &nodes).await;
            Ok((
                JobStatus::Failed,
                Some(match &outcome.lost {
                    Some(p) => format!("{what}; {p}"),
                    None => what,
                }),
            ))
        }
        PhaseEnd::Cancelled => Ok((JobStatus::Cancelled, Some("cancelled by the user".into()))),
    }
}

/// Logs how long the job's driver took to get to `what`, for
/// `RUST_LOG=gangway=debug` (driver.log).
fn step(job: &Job<'_>, what: &str) {
    tracing::debug!("job {}: {what} at {:?}", job.id, job.began.elapsed());
}

/// Everything before the run, on every node: reached, files placed, the
/// storage step and setup; the nodes as reached (with the GPUs of
/// machines gangway did not create discovered), or how the job ended.
///
/// After a replacement, only the new nodes stand between the gang and
/// its run: they are reached and given their files first, and their
/// setup starts at once, while the survivors (which keep their setup) are
/// reached and have their checkpoint rolled back beside it. A survivor
/// that fails there stops the new nodes' setup.
async fn prepare(
    job: &Job<'_>,
    nodes: Vec<NodeRow>,
    transport: &Arc<dyn Transport>,
    storage_env: &[(String, String)],
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
) -> Result<Result<Vec<NodeRow>, Ended>, DriveError> {
    let kept: Vec<bool> = nodes.iter().map(super::survivor).collect();
    let split = kept.contains(&true) && kept.contains(&false);
    let first: Vec<bool> = kept.iter().map(|k| !split || !k).collect();
    if let Err(e) = transport.connect(&only(&nodes, &first)).await {
        return Ok(Err((JobStatus::FailedSetup, Some(e.to_string()))));
    }
    let nodes = match place_off_thread(job, nodes, transport, &first).await? {
        Ok(nodes) => nodes,
        Err(why) => return Ok(Err((JobStatus::FailedSetup, Some(why)))),
    };
    step(
        job,
        if split {
            "new nodes reached, files placed"
        } else {
            "nodes reached, files placed"
        },
    );
    let t = transport.as_ref();
    if !split {
        let info = gang_info(job, &nodes, t, storage_env.to_vec());
        if let Some(ended) = before_run(job, &info, t, cancel, outcome, None).await? {
            return Ok(Err(ended));
        }
        step(job, "storage and setup done");
        return Ok(Ok(nodes));
    }
    let split = Split {
        transport,
        storage_env,
        kept: &kept,
    };
    beside_survivors(job, nodes, &split, cancel, outcome).await
}

/// What both sides of a replacement's start use: the transport, the
/// storage step's credentials, and which ranks survived (`kept[r]`).
struct Split<'a> {
    transport: &'a Arc<dyn Transport>,
    storage_env: &'a [(String, String)],
    kept: &'a [bool],
}

/// The new nodes' storage step and setup, and beside them the survivors
/// made ready ([`survivors_ready`]), after a replacement. Each side has a
/// cancel channel of its own: a cancel reaches both, and the side that
/// fails first stops the other and says why the job ended. The nodes as
/// reached, or how the job ended.
async fn beside_survivors(
    job: &Job<'_>,
    mut nodes: Vec<NodeRow>,
    split: &Split<'_>,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
) -> Result<Result<Vec<NodeRow>, Ended>, DriveError> {
    let (t, new): (&dyn Transport, Vec<bool>) = (
        split.transport.as_ref(),
        split.kept.iter().map(|k| !k).collect(),
    );
    let (stop_new, mut new_cancel) = tokio::sync::watch::channel(*cancel.borrow());
    let (stop_old, mut old_cancel) = tokio::sync::watch::channel(*cancel.borrow());
    let mut old_outcome = RunOutcome::of(EndReason::Succeeded);
    let mut cause: Option<(Ended, bool)> = None;
    let mut survived = None;
    {
        let info = gang_info(job, &nodes, t, split.storage_env.to_vec());
        let new_side = before_run(job, &info, t, &mut new_cancel, outcome, Some(&new));
        let (old, o) = (&mut old_cancel, &mut old_outcome);
        let old_side = survivors_ready(job, &nodes, split, old, o);
        tokio::pin!(new_side, old_side);
        let (mut new_done, mut old_done) = (false, false);
        while !new_done || !old_done {
            tokio::select! {
                r = &mut new_side, if !new_done => {
                    new_done = true;
                    step(job, "the new nodes' storage and setup done");
                    if let Some(ended) = r? {
                        cause.get_or_insert((ended, false));
                        let _ = stop_old.send(Cancel::Graceful);
                    }
                }
                r = &mut old_side, if !old_done => {
                    old_done = true;
                    step(job, "survivors reached, checkpoint rolled back");
                    match r? {
                        Ok(rows) => survived = Some(rows),
                        Err(ended) => {
                            cause.get_or_insert((ended, true));
                            let _ = stop_new.send(Cancel::Graceful);
                        }
                    }
                }
                Ok(()) = cancel.changed() => {
                    let level = *cancel.borrow();
                    let _ = stop_new.send(level);
                    let _ = stop_old.send(level);
                }
            }
        }
    }
    if let Some((ended, by_survivors)) = cause {
        if by_survivors && old_outcome.failed_rank.is_some() {
            outcome.failed_rank = old_outcome.failed_rank;
            outcome.ranks = old_outcome.ranks;
        }
        return Ok(Err(ended));
    }
    let Some(survived) = survived else {
        return Err(DriveError::Other(
            "the survivors' preparation ended without an answer".into(),
        ));
    };
    for ((n, s), k) in nodes.iter_mut().zip(survived).zip(split.kept) {
        if *k {
            *n = s;
        }
    }
    Ok(Ok(nodes))
}

/// The survivors' part of [`prepare`]: reached, their GPUs asked where
/// they must be and their checkpoint directory rolled back (on a thread
/// of its own: it waits on ssh processes), then the storage step. Every
/// node back (the survivors' rows as reached), or how the job ended.
async fn survivors_ready(
    job: &Job<'_>,
    nodes: &[NodeRow],
    split: &Split<'_>,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
) -> Result<Result<Vec<NodeRow>, Ended>, DriveError> {
    let (transport, storage_env, kept) = (split.transport, split.storage_env, split.kept);
    let survivors: Vec<NodeRow> = only(nodes, kept);
    // A survivor that is gone keeps its connection retrying until the
    // transport's deadline: a cancel (the new nodes' setup failed, the
    // controller stops the run) does not wait for that.
    tokio::select! {
        reached = transport.connect(&survivors) => {
            if let Err(e) = reached {
                return Ok(Err((JobStatus::FailedSetup, Some(e.to_string()))));
            }
        }
        _ = cancel.changed() => {
            let why = "cancelled while the survivors were being reached";
            return Ok(Err((JobStatus::Cancelled, Some(why.into()))));
        }
    }
    let all = match place_off_thread(job, nodes.to_vec(), transport, kept).await? {
        Ok(all) => all,
        Err(why) => return Ok(Err((JobStatus::FailedSetup, Some(why)))),
    };
    job.logs.say(&format!(
        "{} survivor(s) reached beside the new nodes' setup; their workdir and file mounts \
         kept, their checkpoint directory back to the kept checkpoint",
        survivors.len()
    ));
    let info = gang_info(job, &all, transport.as_ref(), storage_env.to_vec());
    let t = transport.as_ref();
    let ended = before_run(job, &info, t, cancel, outcome, Some(kept)).await?;
    Ok(match ended {
        Some(ended) => Err(ended),
        None => Ok(all),
    })
}

/// The nodes of rank `r` with `mask[r]`.
fn only(nodes: &[NodeRow], mask: &[bool]) -> Vec<NodeRow> {
    nodes
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Places the files of the nodes of rank `r` with `mask[r]`, once they
/// are reached ([`files::discover_and_place`]), on the blocking pool: it
/// waits on a transport's processes, and the other side of a replacement's
/// start runs beside it. The nodes back, or why not.
async fn place_off_thread(
    job: &Job<'_>,
    mut nodes: Vec<NodeRow>,
    transport: &Arc<dyn Transport>,
    mask: &[bool],
) -> Result<Result<Vec<NodeRow>, String>, DriveError> {
    let (spec, t, mask) = (job.spec.clone(), Arc::clone(transport), mask.to_vec());
    let placed = tokio::task::spawn_blocking(move || {
        files::discover_and_place(&spec, &mut nodes, t.as_ref(), &mask).map(|()| nodes)
    })
    .await
    .map_err(|e| DriveError::Other(format!("placing the nodes' files: {e}")))?;
    for note in transport.take_notes() {
        job.logs.say(&note);
    }
    Ok(placed)
}

/// Jobs on one cluster run one at a time, in submission order: waits for
/// the earlier ones (an ending when cancelled meanwhile).
async fn wait_turn(
    job: &Job<'_>,
    cancel: &tokio::sync::watch::Receiver<Cancel>,
) -> Result<Option<Ended>, DriveError> {
    let store = job.cx.store();
    loop {
        crate::core::gang::reap(store)?;
        let earlier = store
            .jobs(job.cluster)?
            .into_iter()
            .any(|j| j.id < job.id && !j.status.is_terminal());
        if !earlier {
            return Ok(None);
        }
        if *cancel.borrow() != Cancel::None {
            return Ok(Some((
                JobStatus::Cancelled,
                Some("cancelled while waiting in the queue".into()),
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The job's nodes (as many as it asks for, in rank order), not reached
/// yet, and their cloud and transport.
#[allow(clippy::type_complexity)]
fn resolve(
    job: &Job<'_>,
) -> Result<Result<(String, Vec<NodeRow>, Arc<dyn Transport>), Ended>, DriveError> {
    let (store, cluster, spec) = (job.cx.store(), job.cluster, job.spec);
    let Some(row) = store.cluster(cluster)? else {
        let why = format!("cluster {cluster} no longer exists");
        return Ok(Err((JobStatus::Failed, Some(why))));
    };
    let mut nodes = store.nodes(cluster)?;
    if nodes.len() < spec.num_nodes as usize {
        let why = format!(
            "the job needs {} nodes; cluster {cluster} has {}",
            spec.num_nodes,
            nodes.len()
        );
        return Ok(Err((JobStatus::Failed, Some(why))));
    }
    nodes.truncate(spec.num_nodes.max(1) as usize);
    let cloud = row.cloud.clone().unwrap_or_default();
    let Some(transport) = transport_for(&cloud, store.home(), cluster) else {
        let why = format!("no transport for {cloud} nodes yet");
        return Ok(Err((JobStatus::Failed, Some(why))));
    };
    store.set_job_status(job.id, JobStatus::SettingUp, None)?;
    Ok(Ok((cloud, nodes, Arc::from(transport))))
}

/// The storage step's bucket credentials. Those are made now, from the
/// user's own chain, for this run only: never stored, never on the
/// driver's pipe; none for the buckets every node reaches with an
/// identity of its own.
async fn storage_env(job: &Job<'_>, nodes: &[NodeRow]) -> Result<Vec<(String, String)>, String> {
    let spec = job.spec;
    let own = crate::core::storage::OwnIdentity::of_nodes(nodes);
    crate::core::storage::node_credentials(&spec.bucket_mounts, spec.restore_bucket.as_ref(), &own)
        .await
        .map_err(|e| e.to_string())
}

/// What every phase of the job needs: its paths as each node sees them
/// and the storage step's bucket credentials.
fn gang_info<'a>(
    job: &Job<'a>,
    nodes: &'a [NodeRow],
    transport: &dyn Transport,
    storage_env: Vec<(String, String)>,
) -> GangInfo<'a> {
    let spec = job.spec;
    let ck = files::checkpoint_dir(spec);
    let on_each = |path: &str| -> Vec<String> {
        nodes.iter().map(|n| transport.node_path(n, path)).collect()
    };
    let mount_dirs: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            spec.bucket_mounts
                .iter()
                .map(|m| transport.node_path(n, &m.dest))
                .collect()
        })
        .collect();
    GangInfo {
        spec,
        secrets: job.secrets,
        nodes,
        cluster: job.cluster,
        job_id: job.id,
        checkpoint_dirs: on_each(ck),
        storage_env,
        mount_dirs,
        workdir_dirs: on_each(super::WORKDIR_ON_NODE),
    }
}

/// Bucket mounts outlive the storage step: while setup and the run go on,
/// their credentials are renewed before they expire (until the returned
/// guard is dropped).
fn keep_mounts_renewed(
    job: &Job<'_>,
    nodes: &[NodeRow],
    transport: &Arc<dyn Transport>,
) -> Option<AbortOnDrop> {
    let own = crate::core::storage::OwnIdentity::of_nodes(nodes);
    let renewed = crate::core::storage::renewed_mounts(&job.spec.bucket_mounts, &own);
    if renewed.is_empty() {
        return None;
    }
    let (transport, nodes) = (Arc::clone(transport), nodes.to_vec());
    let (cluster, logs) = (job.cluster.to_string(), job.logs.clone());
    Some(AbortOnDrop(tokio::spawn(async move {
        let every = crate::core::storage::renew_every();
        loop {
            tokio::time::sleep(every).await;
            let t = Arc::clone(&transport);
            match crate::core::storage::renew_mounts(&renewed, &cluster, &nodes, t).await {
                Ok(n) => logs.say(&format!(
                    "renewed the bucket mounts' credentials on {n} node(s)"
                )),
                Err(e) => logs.say(&format!(
                    "could not renew the bucket mounts' credentials: {e}"
                )),
            }
        }
    })))
}

/// The storage step (a git workdir, bucket mounts, a checkpoint to
/// restore), when the job has one: its script and what it says it does.
fn storage_step(spec: &JobSpec, nodes: usize) -> Option<(String, String)> {
    if spec.bucket_mounts.is_empty() && spec.restore_bucket.is_none() && spec.git_workdir.is_none()
    {
        return None;
    }
    let mut what: Vec<String> = spec
        .git_workdir
        .iter()
        .map(|g| format!("git {} -> {}", g.url, super::WORKDIR_ON_NODE))
        .collect();
    what.extend(
        spec.bucket_mounts
            .iter()
            .map(|m| format!("{} -> {}", m.url, m.dest)),
    );
    if let Some(r) = &spec.restore_bucket {
        what.push(format!("checkpoint {} of {}", r.generation, r.url));
    }
    Some((
        crate::core::storage::node_script(&spec.bucket_mounts),
        format!("storage on {nodes} node(s): {}", what.join(", ")),
    ))
}

/// Before the run, on every node: the storage step, then setup; either
/// failing (or a cancel) ends the job.
async fn before_run(
    job: &Job<'_>,
    info: &GangInfo<'_>,
    transport: &dyn Transport,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
    only: Option<&[bool]>,
) -> Result<Option<Ended>, DriveError> {
    let survivor = super::survivor;
    let scoped: Vec<&NodeRow> = (info.nodes.iter().enumerate())
        .filter(|(r, _)| only.is_none_or(|o| o[*r]))
        .map(|(_, n)| n)
        .collect();
    let new = scoped.iter().filter(|n| !survivor(n)).count();
    let setup = (job.spec.setup.as_deref())
        .filter(|s| !s.trim().is_empty() && new > 0)
        .map(|s| {
            let what = match info.nodes.iter().filter(|n| survivor(n)).count() {
                0 => format!("setup on {new} node(s)"),
                k => format!("setup on {new} new node(s); {k} kept theirs"),
            };
            (s.to_string(), what)
        });
    let steps = [
        (
            Phase::Storage,
            storage_step(job.spec, scoped.len()),
            "storage",
            "setup does not start",
        ),
        (Phase::Setup, setup, "setup", "the run does not start"),
    ];
    for (which, step, name, stops) in steps {
        let Some((script, starting)) = step else {
            continue;
        };
        job.logs.say(&starting);
        let (end, ranks) = phase(job, which, &script, info, transport, cancel, only).await?;
        outcome.ranks = ranks;
        match end {
            PhaseEnd::Ok => {}
            PhaseEnd::Failed { rank, what } => {
                outcome.failed_rank = Some(rank as u32);
                job.logs
                    .say(&format!("{name} failed on rank {rank}; {stops}"));
                let why = format!("{name} on {what}");
                return Ok(Some((JobStatus::FailedSetup, Some(why))));
            }
            PhaseEnd::Cancelled => {
                let why = format!("cancelled during {name}");
                return Ok(Some((JobStatus::Cancelled, Some(why))));
            }
        }
    }
    Ok(None)
}

/// Which node the provider took away, if it did.
async fn preemption(
    providers: &Providers,
    cloud: &str,
    cluster: &str,
    nodes: &[NodeRow],
) -> Option<LostNode> {
    let p = providers.get(cloud)?;
    let seen = p.describe(&ClusterName(cluster.to_string())).await.ok()?;
    seen.iter().find_map(|n| match &n.state {
        NodeState::Preempted { reason } => Some(LostNode {
            instance_id: n.id.0.clone(),
            rank: nodes
                .iter()
                .find(|r| r.instance_id == n.id.0)
                .map(|r| r.rank),
            seen: LossSeen::Preempted,
            reason: reason.clone(),
        }),
        _ => None,
    })
}

/// A task that stops when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one phase (storage, setup or the run) on every rank at once and
/// waits for all of them: the first failure, a cancel or the cluster going
/// away stops the others (SIGTERM, SIGKILL after [`GRACE`]). Returns how
/// the phase ended and how each rank did.
async fn phase(
    job: &Job<'_>,
    which: Phase,
    script: &str,
    info: &GangInfo<'_>,
    transport: &dyn Transport,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    only: Option<&[bool]>,
) -> Result<(PhaseEnd, Vec<Option<RankEnd>>), DriveError> {
    let (store, logs) = (job.cx.store(), job.logs);
    let mut g = Ranks::new(which, info.nodes, transport, logs);
    let (mut set, pumps) = g.start(script, info, only);
    // What starting the ranks taught the transport (e.g. that a local
    // node's absolute paths could not be put in place).
    for note in transport.take_notes() {
        logs.say(&note);
    }
    if g.end.is_none() && which == Phase::Run {
        // Every rank was started; record it (the run's clock starts here).
        store.set_job_status(info.job_id, JobStatus::Running, None)?;
        step(job, "every rank started");
        logs.say(&format!("all {} rank(s) running", g.nodes.len()));
    }
    if g.end.is_some() {
        g.stop_all();
    }
    // A teardown signals the driver; should that signal be missed (a
    // driver caught starting), the cluster's row still says it is going.
    let mut going = tokio::time::interval(Duration::from_secs(2));
    going.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let kill_at = g.kill_at;
        let sleep = async {
            match kill_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = set.join_next() => {
                let Some(done) = done else { break };
                let Ok((rank, status)) = done else { continue };
                g.rank_ended(rank, status);
            }
            _ = cancel.changed() => {
                let level = *cancel.borrow();
                g.cancelled(level);
            }
            _ = going.tick(), if g.end.is_none() && g.failed.is_none() => {
                if cluster_going(store, info.cluster) {
                    logs.say(&format!(
                        "cluster {} is being taken down; stopping every rank (SIGTERM; SIGKILL after {}s)",
                        info.cluster,
                        GRACE.as_secs()
                    ));
                    g.end = Some(PhaseEnd::Cancelled);
                    g.stop_all();
                }
            }
            _ = sleep => {
                g.signal_all(libc::SIGKILL);
                g.kill_at = None;
            }
        }
    }
    let tails = last_lines(pumps).await;
    Ok(g.verdict(&tails))
}

/// Whether the cluster's row says it is going (or gone).
fn cluster_going(store: &Store, cluster: &str) -> bool {
    match store.cluster(cluster) {
        Ok(row) => row.is_none_or(|r| r.status == ClusterStatus::Terminating),
        Err(_) => false,
    }
}

/// A rank's process as the phase waits for it: (rank, how it exited).
type RankWait = JoinSet<(usize, std::io::Result<ExitStatus>)>;

/// A rank's output being copied into the logs; its last lines at the end.
type Pump = (usize, std::thread::JoinHandle<Vec<String>>);

/// The ranks of one phase while it runs.
struct Ranks<'a> {
    which: Phase,
    nodes: &'a [NodeRow],
    transport: &'a dyn Transport,
    logs: &'a Logs,
    /// Each rank's process group, while it runs.
    pgids: Vec<Option<u32>>,
    /// How each rank ended.
    ends: Vec<Option<RankEnd>>,
    /// How the phase ends regardless of the ranks (a rank that could not
    /// start, a cancel, the cluster going away).
    end: Option<PhaseEnd>,
    /// The first rank that failed, and how.
    failed: Option<(usize, String)>,
    /// When the ranks still running get SIGKILL.
    kill_at: Option<tokio::time::Instant>,
    /// Ranks whose setup is done.
    setup_done: usize,
}

impl<'a> Ranks<'a> {
    fn new(
        which: Phase,
        nodes: &'a [NodeRow],
        transport: &'a dyn Transport,
        logs: &'a Logs,
    ) -> Self {
        Ranks {
            which,
            nodes,
            transport,
            logs,
            pgids: vec![None; nodes.len()],
            ends: vec![None; nodes.len()],
            end: None,
            failed: None,
            kill_at: None,
            setup_done: 0,
        }
    }

    /// Starts `script` on every rank, each with its own environment and
    /// its output copied into the logs; a rank that cannot start fails the
    /// phase (and no later rank is started).
    fn start(
        &mut self,
        script: &str,
        info: &GangInfo<'_>,
        only: Option<&[bool]>,
    ) -> (RankWait, Vec<Pump>) {
        let mut set: RankWait = JoinSet::new();
        let mut pumps = Vec::new();
        for (rank, node) in self.nodes.iter().enumerate() {
            if self.which == Phase::Setup && super::survivor(node) {
                // Its setup ran before the loss it survived.
                self.ends[rank] = Some(RankEnd::Exited { code: 0 });
                self.setup_done += 1;
                self.logs.say(&format!(
                    "setup kept on rank {rank} ({}): it survived the loss of other nodes",
                    node.private_ip
                ));
                continue;
            }
            if only.is_some_and(|o| !o[rank]) {
                // Another part of the gang runs this phase on it.
                continue;
            }
            let cmd = NodeCommand {
                script: script.to_string(),
                env: node_env(self.which, info, rank),
                cwd: super::WORKDIR_ON_NODE.to_string(),
                // The storage step spells paths as the transport does.
                task_view: self.which != Phase::Storage,
            };
            let spawned = std::io::pipe()
                .map_err(|e| super::TransportError {
                    node: format!("rank {rank} ({})", node.private_ip),
                    what: "cannot make an output pipe".into(),
                    source: e,
                })
                .and_then(|(r, w)| self.transport.spawn(node, &cmd, w).map(|c| (r, c)));
            match spawned {
                Ok((reader, child)) => {
                    if child.id() != 0 {
                        self.pgids[rank] = Some(child.id());
                        self.logs.record_pid(rank, child.id());
                    }
                    let pump = self.logs.pump(reader, rank, &node.private_ip, self.which);
                    pumps.push((rank, pump));
                    set.spawn(async move { (rank, child.wait().await) });
                }
                Err(e) => {
                    let what = e.to_string();
                    self.end = Some(PhaseEnd::Failed { rank, what });
                    break;
                }
            }
        }
        (set, pumps)
    }

    /// Sends `sig` to every rank still running.
    fn signal_all(&self, sig: i32) {
        for (rank, p) in self.pgids.iter().enumerate() {
            if let Some(p) = p {
                self.transport.signal(&self.nodes[rank], *p, sig);
            }
        }
    }

    /// SIGTERM to every rank now, SIGKILL after [`GRACE`].
    fn stop_all(&mut self) {
        self.signal_all(libc::SIGTERM);
        self.kill_at = Some(tokio::time::Instant::now() + GRACE);
    }

    /// Rank `rank` exited: recorded; the first failure stops the others.
    fn rank_ended(&mut self, rank: usize, status: std::io::Result<ExitStatus>) {
        self.ends[rank] = Some(status.as_ref().map_or(RankEnd::Unknown, rank_end));
        if let Some(p) = self.pgids[rank].take() {
            self.transport.reaped(&self.nodes[rank], p);
        }
        let ip = &self.nodes[rank].private_ip;
        if self.which == Phase::Setup && matches!(&status, Ok(s) if s.success()) {
            self.setup_done += 1;
            let (done, of) = (self.setup_done, self.nodes.len());
            self.logs
                .say(&format!("setup done on rank {rank} ({ip}) [{done}/{of}]"));
        }
        let what = match status {
            Ok(s) if s.success() => return,
            Ok(s) => self
                .transport
                .explain_exit(&s)
                .unwrap_or_else(|| describe_exit(&s)),
            Err(e) => format!("could not be waited for: {e}"),
        };
        if self.failed.is_none() && self.end.is_none() {
            self.logs.say(&format!(
                "rank {rank} ({ip}) {what}; stopping the other ranks"
            ));
            self.failed = Some((rank, what));
            self.stop_all();
        }
    }

    /// The driver was asked to stop: gracefully the first time, a kill
    /// after that.
    fn cancelled(&mut self, level: Cancel) {
        if self.end.is_none() && self.failed.is_none() {
            self.end = Some(PhaseEnd::Cancelled);
        }
        if level == Cancel::Kill {
            self.logs.say("killing every rank");
            self.signal_all(libc::SIGKILL);
        } else {
            self.logs.say(&format!(
                "stopping every rank (SIGTERM; SIGKILL after {}s)",
                GRACE.as_secs()
            ));
            self.stop_all();
        }
    }

    /// How the phase ended: a failed setup says its rank's last lines.
    fn verdict(self, tails: &HashMap<usize, Vec<String>>) -> (PhaseEnd, Vec<Option<RankEnd>>) {
        if let Some(e) = self.end {
            return (e, self.ends);
        }
        let end = match self.failed {
            None => PhaseEnd::Ok,
            Some((rank, what)) => {
                let node = &self.nodes[rank];
                let mut msg = format!("rank {rank} ({}) {what}", node.private_ip);
                if self.which == Phase::Setup {
                    if let Some(t) = tails.get(&rank).filter(|t| !t.is_empty()) {
                        msg.push_str("; last lines:\n");
                        msg.push_str(&t.join("\n"));
                    }
                }
                PhaseEnd::Failed { rank, what: msg }
            }
        };
        (end, self.ends)
    }
}

/// Each rank's last lines, once its output ended. Output ends when the
/// last holder of a pipe exits; a process that escaped its group must not
/// hold the driver forever (2 s at most).
async fn last_lines(pumps: Vec<Pump>) -> HashMap<usize, Vec<String>> {
    let mut tails = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    for (rank, h) in pumps {
        while !h.is_finished() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if h.is_finished() {
            if let Ok(t) = h.join() {
                tails.insert(rank, t);
            }
        }
    }
    tails
}
