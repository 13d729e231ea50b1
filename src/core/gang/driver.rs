//! The job driver: sync, setup on all, barrier, run on all, stop the gang
//! when a rank fails, record how it ended.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_provider::{ClusterName, NodeState};
use tokio::task::JoinSet;

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
    let (status, detail) = run_job(
        &cx,
        &job.cluster,
        job_id,
        &spec,
        &secrets,
        &logs,
        &mut cancel,
        &mut outcome,
    )
    .await?;
    outcome.reason = match status {
        JobStatus::Succeeded => EndReason::Succeeded,
        JobStatus::FailedSetup => EndReason::SetupFailed,
        JobStatus::Cancelled => EndReason::Cancelled,
        JobStatus::Failed if outcome.failed_rank.is_some() => EndReason::RankFailed,
        _ => EndReason::NoCluster,
    };
    store.end_job(job_id, status, detail.as_deref(), &outcome)?;
    store.event(
        &job.cluster,
        Some(job_id),
        "job",
        &format!(
            "job {job_id} {status}{}",
            detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ),
    )?;
    logs.say(&format!(
        "job {job_id} {status}{}",
        detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default()
    ));
    // The ending also goes next to the logs, which outlive the cluster's
    // rows (`--down` removes them).
    let _ = std::fs::write(
        logs.dir.join("status.json"),
        serde_json::json!({ "status": status, "detail": detail }).to_string(),
    );
    Ok(Driven {
        status,
        cx,
        _lock: lock,
        cluster: job.cluster,
        down_after: spec.down_after,
        logs: Some(logs),
    })
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

#[allow(clippy::too_many_arguments)] // the job's whole context, passed once
async fn run_job(
    cx: &Context,
    cluster: &str,
    job_id: i64,
    spec: &JobSpec,
    secrets: &[(String, String)],
    logs: &Logs,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
    outcome: &mut RunOutcome,
) -> Result<(JobStatus, Option<String>), DriveError> {
    let store = cx.store();
    // Jobs on one cluster run one at a time, in submission order.
    loop {
        crate::core::gang::reap(store)?;
        let earlier = store
            .jobs(cluster)?
            .into_iter()
            .any(|j| j.id < job_id && !j.status.is_terminal());
        if !earlier {
            break;
        }
        if *cancel.borrow() != Cancel::None {
            return Ok((
                JobStatus::Cancelled,
                Some("cancelled while waiting in the queue".into()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(row) = store.cluster(cluster)? else {
        return Ok((
            JobStatus::Failed,
            Some(format!("cluster {cluster} no longer exists")),
        ));
    };
    let mut nodes = store.nodes(cluster)?;
    if nodes.len() < spec.num_nodes as usize {
        return Ok((
            JobStatus::Failed,
            Some(format!(
                "the job needs {} nodes; cluster {cluster} has {}",
                spec.num_nodes,
                nodes.len()
            )),
        ));
    }
    nodes.truncate(spec.num_nodes.max(1) as usize);
    let cloud = row.cloud.clone().unwrap_or_default();
    let Some(transport) = transport_for(&cloud, store.home(), cluster) else {
        return Ok((
            JobStatus::Failed,
            Some(format!("no transport for {cloud} nodes yet")),
        ));
    };
    let transport: Arc<dyn Transport> = Arc::from(transport);
    store.set_job_status(job_id, JobStatus::SettingUp, None)?;
    if let Err(e) = transport.connect(&nodes).await {
        return Ok((JobStatus::FailedSetup, Some(e.to_string())));
    }
    // Machines gangway did not create say what GPUs they have: ask them.
    for n in nodes
        .iter_mut()
        .filter(|n| n.extra.get("gpus.discover").is_some_and(|v| v == "true"))
    {
        let out = transport
            .probe(n, super::gpus::DISCOVER_SCRIPT)
            .unwrap_or_default();
        let (gpus, order) = super::gpus::discovered(&out);
        n.extra.insert("gpus.discovered".into(), gpus.to_string());
        if !order.is_empty() {
            n.extra.insert(
                "env.CUDA_VISIBLE_DEVICES".into(),
                order
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
    }
    let ck = spec
        .checkpoint_dir
        .as_deref()
        .unwrap_or(super::DEFAULT_CHECKPOINT_DIR);
    let checkpoint_dirs: Vec<String> = nodes.iter().map(|n| transport.node_path(n, ck)).collect();
    // Bucket credentials are made now, from the user's own chain, for
    // this run only: never stored, never on the driver's pipe; none for
    // the buckets every node reaches with an identity of its own.
    let own = crate::core::storage::OwnIdentity::of_nodes(&nodes);
    let storage_env = match crate::core::storage::node_credentials(
        &spec.bucket_mounts,
        spec.restore_bucket.as_ref(),
        &own,
    )
    .await
    {
        Ok(env) => env,
        Err(e) => return Ok((JobStatus::FailedSetup, Some(e.to_string()))),
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
    let workdir_dirs = nodes
        .iter()
        .map(|n| transport.node_path(n, super::WORKDIR_ON_NODE))
        .collect();
    let info = GangInfo {
        spec,
        secrets,
        nodes: &nodes,
        cluster,
        job_id,
        checkpoint_dirs,
        storage_env,
        mount_dirs,
        workdir_dirs,
    };

    // Bucket mounts outlive the storage step: while setup and the run go
    // on, their credentials are renewed before they expire.
    let renewed = crate::core::storage::renewed_mounts(&spec.bucket_mounts, &own);
    let _renewing = (!renewed.is_empty()).then(|| {
        let (transport, nodes) = (Arc::clone(&transport), nodes.clone());
        let (mounts, cluster, logs) = (renewed, cluster.to_string(), logs.clone());
        AbortOnDrop(tokio::spawn(async move {
            let every = crate::core::storage::renew_every();
            loop {
                tokio::time::sleep(every).await;
                let t = Arc::clone(&transport);
                match crate::core::storage::renew_mounts(&mounts, &cluster, &nodes, t).await {
                    Ok(n) => logs.say(&format!(
                        "renewed the bucket mounts' credentials on {n} node(s)"
                    )),
                    Err(e) => logs.say(&format!(
                        "could not renew the bucket mounts' credentials: {e}"
                    )),
                }
            }
        }))
    });

    // Files first, on every node.
    for (rank, n) in nodes.iter().enumerate() {
        if let Err(e) = transport.make_dir(n, &info.checkpoint_dirs[rank]) {
            return Ok((JobStatus::FailedSetup, Some(e.to_string())));
        }
        if let Some(kept) = spec.restore_from.as_deref().filter(|p| p.is_dir()) {
            // `upload` takes the node's own spelling of the path.
            if let Err(e) = transport.upload(n, kept, ck) {
                return Ok((
                    JobStatus::FailedSetup,
                    Some(format!("restoring the checkpoint: {e}")),
                ));
            }
        }
        let mut uploads: Vec<(&Path, &str)> = Vec::new();
        if let Some(w) = &spec.workdir {
            uploads.push((w.as_path(), super::WORKDIR_ON_NODE));
        }
        for (dest, src) in &spec.file_mounts {
            uploads.push((src.as_path(), dest.as_str()));
        }
        for (src, dest) in uploads {
            if let Err(e) = transport.upload(n, src, dest) {
                return Ok((JobStatus::FailedSetup, Some(e.to_string())));
            }
        }
    }
    // Before the run, on every node: the storage step (bucket mounts, a
    // checkpoint to restore), then setup; either failing stops the job.
    let storage = (!spec.bucket_mounts.is_empty()
        || spec.restore_bucket.is_some()
        || spec.git_workdir.is_some())
    .then(|| {
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
        (
            crate::core::storage::node_script(&spec.bucket_mounts),
            format!("storage on {} node(s): {}", nodes.len(), what.join(", ")),
        )
    });
    let setup = spec
        .setup
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .map(|s| (s.to_string(), format!("setup on {} node(s)", nodes.len())));
    for (which, step, name, stops) in [
        (Phase::Storage, storage, "storage", "setup does not start"),
        (Phase::Setup, setup, "setup", "the run does not start"),
    ] {
        let Some((script, starting)) = step else {
            continue;
        };
        logs.say(&starting);
        let (end, ranks) = phase(
            which,
            &script,
            &info,
            transport.as_ref(),
            store,
            logs,
            cancel,
        )
        .await?;
        outcome.ranks = ranks;
        match end {
            PhaseEnd::Ok => {}
            PhaseEnd::Failed { rank, what } => {
                outcome.failed_rank = Some(rank as u32);
                logs.say(&format!("{name} failed on rank {rank}; {stops}"));
                return Ok((JobStatus::FailedSetup, Some(format!("{name} on {what}"))));
            }
            PhaseEnd::Cancelled => {
                return Ok((
                    JobStatus::Cancelled,
                    Some(format!("cancelled during {name}")),
                ))
            }
        }
    }
    let Some(run) = spec.run.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok((JobStatus::Succeeded, Some("no run commands".into())));
    };
    let (end, ranks) = phase(
        Phase::Run,
        run,
        &info,
        transport.as_ref(),
        store,
        logs,
        cancel,
    )
    .await?;
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

async fn phase(
    which: Phase,
    script: &str,
    info: &GangInfo<'_>,
    transport: &dyn Transport,
    store: &Store,
    logs: &Logs,
    cancel: &mut tokio::sync::watch::Receiver<Cancel>,
) -> Result<(PhaseEnd, Vec<Option<RankEnd>>), DriveError> {
    let nodes = info.nodes;
    let mut ends: Vec<Option<RankEnd>> = vec![None; nodes.len()];
    let cwd = super::WORKDIR_ON_NODE.to_string();
    let mut set: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut pgids: Vec<Option<u32>> = vec![None; nodes.len()];
    let mut pumps = Vec::new();
    let mut end: Option<PhaseEnd> = None;
    for (rank, node) in nodes.iter().enumerate() {
        let cmd = NodeCommand {
            script: script.to_string(),
            env: node_env(which, info, rank),
            cwd: cwd.clone(),
        };
        let spawned = std::io::pipe()
            .map_err(|e| super::TransportError {
                node: format!("rank {rank} ({})", node.private_ip),
                what: "cannot make an output pipe".into(),
                source: e,
            })
            .and_then(|(r, w)| transport.spawn(node, &cmd, w).map(|c| (r, c)));
        match spawned {
            Ok((reader, child)) => {
                if child.id() != 0 {
                    pgids[rank] = Some(child.id());
                    logs.record_pid(rank, child.id());
                }
                pumps.push((rank, logs.pump(reader, rank, &node.private_ip, which)));
                set.spawn(async move { (rank, child.wait().await) });
            }
            Err(e) => {
                end = Some(PhaseEnd::Failed {
                    rank,
                    what: e.to_string(),
                });
                break;
            }
        }
    }
    if end.is_none() && which == Phase::Run {
        // Every rank was started; record it (the run's clock starts here).
        store.set_job_status(info.job_id, JobStatus::Running, None)?;
        logs.say(&format!("all {} rank(s) running", nodes.len()));
    }
    let signal_all = |pgids: &[Option<u32>], sig: i32| {
        for (rank, p) in pgids.iter().enumerate() {
            if let Some(p) = p {
                transport.signal(&nodes[rank], *p, sig);
            }
        }
    };
    let mut kill_at: Option<tokio::time::Instant> = None;
    // A teardown signals the driver; should that signal be missed (a
    // driver caught starting), the cluster's row still says it is going.
    let mut going = tokio::time::interval(Duration::from_secs(2));
    going.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    if end.is_some() {
        signal_all(&pgids, libc::SIGTERM);
        kill_at = Some(tokio::time::Instant::now() + GRACE);
    }
    let mut tails: std::collections::HashMap<usize, Vec<String>> = Default::default();
    let mut failed: Option<(usize, String)> = None;
    let mut setup_done = 0usize;
    loop {
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
                ends[rank] = Some(status.as_ref().map_or(RankEnd::Unknown, rank_end));
                if let Some(p) = pgids[rank].take() {
                    transport.reaped(&nodes[rank], p);
                }
                if which == Phase::Setup && matches!(&status, Ok(s) if s.success()) {
                    setup_done += 1;
                    logs.say(&format!(
                        "setup done on rank {rank} ({}) [{setup_done}/{}]",
                        nodes[rank].private_ip,
                        nodes.len()
                    ));
                }
                let what = match status {
                    Ok(s) if s.success() => None,
                    Ok(s) => Some(
                        transport
                            .explain_exit(&s)
                            .unwrap_or_else(|| describe_exit(&s)),
                    ),
                    Err(e) => Some(format!("could not be waited for: {e}")),
                };
                if let Some(what) = what {
                    if failed.is_none() && end.is_none() {
                        logs.say(&format!(
                            "rank {rank} ({}) {what}; stopping the other ranks",
                            nodes[rank].private_ip
                        ));
                        failed = Some((rank, what));
                        signal_all(&pgids, libc::SIGTERM);
                        kill_at = Some(tokio::time::Instant::now() + GRACE);
                    }
                }
            }
            _ = cancel.changed() => {
                let level = *cancel.borrow();
                if end.is_none() && failed.is_none() {
                    end = Some(PhaseEnd::Cancelled);
                }
                if level == Cancel::Kill {
                    logs.say("killing every rank");
                    signal_all(&pgids, libc::SIGKILL);
                } else {
                    logs.say(&format!("stopping every rank (SIGTERM; SIGKILL after {}s)", GRACE.as_secs()));
                    signal_all(&pgids, libc::SIGTERM);
                    kill_at = Some(tokio::time::Instant::now() + GRACE);
                }
            }
            _ = going.tick(), if end.is_none() && failed.is_none() => {
                let gone = match store.cluster(info.cluster) {
                    Ok(row) => row.is_none_or(|r| r.status == ClusterStatus::Terminating),
                    Err(_) => false,
                };
                if gone {
                    logs.say(&format!(
                        "cluster {} is being taken down; stopping every rank (SIGTERM; SIGKILL after {}s)",
                        info.cluster,
                        GRACE.as_secs()
                    ));
                    end = Some(PhaseEnd::Cancelled);
                    signal_all(&pgids, libc::SIGTERM);
                    kill_at = Some(tokio::time::Instant::now() + GRACE);
                }
            }
            _ = sleep => {
                signal_all(&pgids, libc::SIGKILL);
                kill_at = None;
            }
        }
    }
    // Output ends when the last holder of a pipe exits; a process that
    // escaped its group must not hold the driver forever.
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
    if let Some(e) = end {
        return Ok((e, ends));
    }
    let end = match failed {
        None => PhaseEnd::Ok,
        Some((rank, what)) => {
            let node = &nodes[rank];
            let mut msg = format!("rank {rank} ({}) {what}", node.private_ip);
            if which == Phase::Setup {
                if let Some(t) = tails.get(&rank).filter(|t| !t.is_empty()) {
                    msg.push_str("; last lines:\n");
                    msg.push_str(&t.join("\n"));
                }
            }
            PhaseEnd::Failed { rank, what: msg }
        }
    };
    Ok((end, ends))
}
