//! The managed-job controller: one reconcile task per job.
//!
//! The kube-runtime pattern: a supervisor watches the jobs (one query, run
//! only when another process wrote to the database, and every few seconds
//! as a safety net), keeps one task for every job that has work, and wakes
//! a job's task when something it did not do itself changed (a cancel, its
//! run's status). Each task reconciles its job (reads what is, takes one
//! idempotent step, records it) and sleeps until its step is due again or
//! it is woken. So at most one reconcile per job runs at a time, any number
//! of jobs at once, and a slow step (a launch waiting minutes for sshd, a
//! teardown waiting for drivers) holds only its own job.
//!
//! Everything runs on one thread (a `LocalSet`): the tasks share one state
//! connection and never hold anything across an await that another task
//! needs. Work that blocks (a node's notice probe over SSH, signalling
//! ranks, copying checkpoints, reaping dead drivers) runs on the blocking
//! pool, never on the runtime's thread; waits are timers.
//!
//! Decisions are made from data: the run's recorded [`RunOutcome`], the
//! job's [`Market`] and pending move, its [`Location`]. The sentences in
//! `detail` and the events are for people.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gangway_provider::{ClusterName, NodeState};
use tokio::sync::Notify;

use super::policy::{Choice, PolicyKind, State};
use super::ManagedTask;
use crate::core::catalog::Catalog;
use crate::core::context::Context;
use crate::core::gang::{self, Transport};
use crate::core::lifecycle;
use crate::core::optimizer::{self, Block, Blocklist, Candidate, Options};
use crate::core::provision::{self, Silent};
use crate::core::registry::Providers;
use crate::core::state::{
    now_ms, ClusterRow, ClusterStatus, EndReason, JobRow, JobStatus, Location, LossSeen, LostNode,
    ManagedJob, ManagedState, Market, NewCluster, NodeRow, OwnerLock, Reserved, Store, Watched,
};
use crate::core::storage::checkpoint;

/// How long a zone that lost a node is avoided.
pub(crate) const BLOCK_TTL: Duration = Duration::from_secs(600);
/// How often the supervisor looks for changes.
pub(crate) const TICK: Duration = Duration::from_millis(200);
/// How often a running job's nodes are asked for a preemption notice.
const NOTICE_EVERY: Duration = Duration::from_millis(500);
/// How often a deadline policy reconsiders a running job's market.
const DECIDE_EVERY: Duration = Duration::from_secs(2);
/// Restart overhead assumed before a job has restarted once.
const DEFAULT_OVERHEAD_S: f64 = 30.0;
/// How often a running job's nodes are checked with the provider (the
/// ranks dying tells the driver sooner; this finds nodes lost quietly).
const DESCRIBE_EVERY: Duration = Duration::from_secs(1);
/// At most this many of those checks a second over all jobs: a thousand
/// jobs must not become a thousand API calls a second (clouds throttle far
/// below that), so with many jobs each is checked less often.
const DESCRIBES_PER_S: f64 = 10.0;
/// Backoff when no placement has capacity during a recovery.
const NO_CAPACITY_BACKOFF: Duration = Duration::from_secs(5);
/// Backoff after an unexpected error in a step.
const ERROR_BACKOFF: Duration = Duration::from_secs(2);
/// How often the supervisor reads the jobs even when nothing was written.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// How often a job's task re-reads its rows even when not woken.
const REREAD_EVERY: Duration = Duration::from_secs(10);
/// How often runs whose driver died are looked for.
const REAP_EVERY: Duration = Duration::from_secs(2);
/// How long a loaded catalog is planned with before it is read again (a
/// `gangway catalog refresh` reaches the next recovery after this).
const CATALOG_TTL: Duration = Duration::from_secs(1);
/// How long a teardown waits for a launcher of the cluster to let go.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// How long after a failed connection the controller tries again.
const RECONNECT_AFTER: Duration = Duration::from_secs(30);
/// How long the controller lingers with nothing to do (`Until::Idle`).
const IDLE_EXIT: Duration = Duration::from_secs(3);
/// Provider work (launches, teardowns, describes) running at once, each on
/// a thread of its own.
const PROVIDER_THREADS: usize = 32;
/// Threads for the jobs' short blocking work.
const BLOCKING_THREADS: usize = 32;

/// When the controller stops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Until {
    /// When no managed job is left to watch (after a short quiet spell).
    Idle,
    /// When this job has ended (the `--wait` mode).
    Job(i64),
}

/// What a reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    /// Reconcile again after this long (or when woken).
    Requeue(Duration),
    /// Nothing is left to do for this job.
    Done,
}

impl Action {
    fn at(ms: i64) -> Action {
        Action::Requeue(Duration::from_millis((ms - now_ms()).max(0) as u64))
    }
}

/// Loaded catalogs by `--catalog` directory, with when each was read.
type Catalogs = HashMap<Option<PathBuf>, (Instant, Rc<Catalog>)>;

/// What every reconcile task shares.
struct Shared {
    cx: Context,
    /// How many jobs have a task (for the describe budget).
    jobs: std::cell::Cell<usize>,
    /// Permits for provider work off this thread.
    provider_threads: tokio::sync::Semaphore,
    log: RefCell<Option<std::fs::File>>,
    catalogs: RefCell<Catalogs>,
}

/// The controller.
pub(crate) struct Controller {
    shared: Rc<Shared>,
}

/// A cluster's transport, kept between passes so SSH connections (one
/// master per node) are made once, not on every look at a job.
struct Reach {
    nodes: Arc<Vec<NodeRow>>,
    transport: Arc<dyn Transport>,
    connected: bool,
    tried: Option<Instant>,
}

/// One job's task state: its rows as last read, and when each periodic
/// check last ran.
struct Memo {
    id: i64,
    job: Option<ManagedJob>,
    task: Option<Rc<ManagedTask>>,
    run: Option<JobRow>,
    reach: Option<Reach>,
    stale: bool,
    read_at: Instant,
    described: Option<Instant>,
    decided: Option<Instant>,
    no_spot: bool,
    wake: Rc<Notify>,
    /// A periodic checkpoint sync running beside the loop (a big upload
    /// takes minutes; notices are read meanwhile).
    syncing: Option<tokio::task::JoinHandle<Result<Synced, SyncError>>>,
}

/// Where the controller's lock and log live.
pub(crate) fn controller_paths(home: &Path) -> (PathBuf, PathBuf) {
    (
        home.join("locks").join("controller.lock"),
        home.join("jobs").join("controller.log"),
    )
}

/// Why no plan could be made for a job.
#[derive(Debug, thiserror::Error)]
enum PlanError {
    #[error(transparent)]
    Task(#[from] crate::core::spec::SpecError),
    #[error(transparent)]
    Override(#[from] crate::core::spec::OverrideError),
    #[error(transparent)]
    Catalog(Box<crate::Error>),
    #[error(transparent)]
    NoPlacement(#[from] optimizer::Infeasible),
}

/// Why a job's secrets cannot be handed to its run.
#[derive(Debug, thiserror::Error)]
enum SecretsError {
    #[error("cannot read the job's secrets ({path}): {source}; the run needs {needs}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
        needs: String,
    },
    #[error("the job's secrets file {path} is damaged (line {line}, column {column}); the run needs {needs}")]
    Damaged {
        path: PathBuf,
        line: usize,
        column: usize,
        needs: String,
    },
    #[error("the job's secrets file {path} lacks {missing}")]
    Missing { path: PathBuf, missing: String },
}

/// A checkpoint copy that ended: when it began, and what the nodes sent
/// that was left out (links out of the directory, devices, ...).
struct Synced {
    at: i64,
    skipped: gangway_provider::Skipped,
}

/// Why copying a checkpoint failed.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Transport(#[from] crate::core::transport::TransportError),
    #[error("the copy stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Bucket(#[from] checkpoint::CheckpointError),
    /// The checkpoint of `at` is complete; removing older ones failed (the
    /// next sync tries again).
    #[error("checkpoint kept, but pruning older ones failed: {error}")]
    Prune {
        at: i64,
        error: gangway_store::StoreError,
    },
}

impl Controller {
    /// A controller for `home`.
    pub(crate) fn new(home: &Path) -> Result<Controller, crate::Error> {
        let cx = Context::open(home)?;
        let (_, log_path) = controller_paths(home);
        if let Some(d) = log_path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .ok();
        Ok(Controller {
            shared: Rc::new(Shared {
                cx,
                jobs: std::cell::Cell::new(0),
                provider_threads: tokio::sync::Semaphore::new(PROVIDER_THREADS),
                log: RefCell::new(log),
                catalogs: RefCell::default(),
            }),
        })
    }

    /// The runtime to run a controller on: one thread for the jobs'
    /// tasks, and a bounded pool for their blocking work (notice probes,
    /// signals, checkpoint copies), which queue when it is busy instead of
    /// growing a thread per burst.
    pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(BLOCKING_THREADS)
            .build()
    }

    /// Reconciles every job, each on its own task, until `until`.
    pub(crate) async fn run(&mut self, until: Until) -> Result<(), crate::Error> {
        let local = tokio::task::LocalSet::new();
        let shared = Rc::clone(&self.shared);
        local.run_until(supervise(shared, until)).await
    }
}

/// A job's task as the supervisor knows it.
struct Handle {
    seen: Watched,
    wake: Rc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// Watches the jobs, starts a task for each job with work, wakes a task
/// when its job changed under it, and decides when to stop.
async fn supervise(sh: Rc<Shared>, until: Until) -> Result<(), crate::Error> {
    sh.say(&format!("controller {} started", std::process::id()));
    // Ended jobs' secrets go, whatever happened before.
    for job in sh.store().managed_all()? {
        if job.state.is_terminal() {
            remove_secrets(&sh.store().managed_dir(job.id));
        }
    }
    let mut tasks: HashMap<i64, Handle> = HashMap::new();
    let mut version = None;
    let mut watched_at = Instant::now() - WATCH_EVERY;
    let mut reaped_at = Instant::now() - REAP_EVERY;
    let mut quiet_since: Option<Instant> = None;
    let mut reaping: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        // Runs whose driver died are marked (their ranks stopped) off the
        // runtime, with a connection of their own.
        if reaped_at.elapsed() >= REAP_EVERY && reaping.as_ref().is_none_or(|r| r.is_finished()) {
            reaped_at = Instant::now();
            let home = sh.cx.home().to_path_buf();
            reaping = Some(tokio::task::spawn_blocking(move || {
                gang::reap_drivers();
                if let Ok(store) = Store::open(&home) {
                    let _ = gang::reap(&store);
                }
            }));
        }
        let v = sh.store().data_version()?;
        let changed = version != Some(v);
        version = Some(v);
        tasks.retain(|_, h| !h.task.is_finished());
        sh.jobs.set(tasks.len());
        if changed || watched_at.elapsed() >= WATCH_EVERY {
            watched_at = Instant::now();
            let rows = sh.store().managed_watch()?;
            for w in &rows {
                match tasks.get_mut(&w.id) {
                    Some(h) => {
                        if h.seen != *w {
                            h.seen = w.clone();
                            h.wake.notify_one();
                        }
                    }
                    None => {
                        let wake = Rc::new(Notify::new());
                        let task = tokio::task::spawn_local(job_task(
                            Rc::clone(&sh),
                            w.id,
                            Rc::clone(&wake),
                        ));
                        tasks.insert(
                            w.id,
                            Handle {
                                seen: w.clone(),
                                wake,
                                task,
                            },
                        );
                    }
                }
            }
            let done = match until {
                // The job's own teardown is waited for, but one that failed
                // is left to a detached controller's retries.
                Until::Job(id) => !rows
                    .iter()
                    .any(|w| w.id == id && (!w.state.is_terminal() || w.teardown_failures == 0)),
                Until::Idle => {
                    if rows.is_empty() && tasks.is_empty() {
                        quiet_since.get_or_insert_with(Instant::now).elapsed() > IDLE_EXIT
                    } else {
                        quiet_since = None;
                        false
                    }
                }
            };
            if done {
                break;
            }
        }
        tokio::time::sleep(TICK).await;
    }
    // Running steps are not cut short mid-way: each is idempotent, and the
    // next controller picks up from the rows.
    for (_, h) in tasks {
        h.task.abort();
    }
    sh.say(&format!("controller {} stopped", std::process::id()));
    Ok(())
}

/// One job's task: reconcile, then sleep until due or woken; until the job
/// has ended and holds nothing.
async fn job_task(sh: Rc<Shared>, id: i64, wake: Rc<Notify>) {
    let mut m = Memo {
        id,
        job: None,
        task: None,
        run: None,
        reach: None,
        stale: true,
        read_at: Instant::now(),
        described: None,
        decided: None,
        no_spot: false,
        wake: Rc::clone(&wake),
        syncing: None,
    };
    loop {
        if m.read_at.elapsed() >= REREAD_EVERY {
            m.stale = true;
        }
        // Boxed: a sleeping task keeps only its memo, not the largest
        // step's state.
        let step = Box::pin(reconcile(&sh, &mut m)).await;
        let action = match step {
            Ok(a) => a,
            Err(e) => error_policy(&sh, &mut m, &e),
        };
        let wait = match action {
            Action::Done => return,
            Action::Requeue(d) => d,
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified() => m.stale = true,
        }
    }
}

/// After a failed step: the reason goes on the job, and it is tried again
/// after a backoff (a failed teardown's own, longer one when it has one).
fn error_policy(sh: &Shared, m: &mut Memo, e: &crate::Error) -> Action {
    sh.say(&format!("job {}: {e}", m.id));
    m.stale = true;
    let Ok(Some(mut j)) = sh.store().managed(m.id) else {
        return Action::Requeue(ERROR_BACKOFF);
    };
    let was = j.state;
    let retry = sh
        .store()
        .cluster(&j.cluster)
        .ok()
        .flatten()
        .and_then(|c| c.retry_at)
        .filter(|t| *t > now_ms());
    let next = retry.unwrap_or(now_ms() + ERROR_BACKOFF.as_millis() as i64);
    j.next_try_at = Some(next);
    j.detail = Some(e.to_string());
    let _ = sh.store().save_managed(&j, was, "");
    Action::at(next)
}

impl Shared {
    fn store(&self) -> &Store {
        self.cx.store()
    }

    /// Runs provider work on a thread of its own, with its own runtime and
    /// state connection: a provider that blocks (the local cloud's file
    /// work, Slurm's and SSH pools' commands, a launch waiting minutes for
    /// sshd) then holds only that thread, never the jobs' reconciles. At
    /// most [`PROVIDER_THREADS`] at once. Dropping the returned future drops
    /// the work at its next await (a launch cancelled half-way is torn down
    /// by name afterwards, as after a crash).
    async fn off_thread<T, F, Fut>(&self, work: F) -> Result<T, crate::Error>
    where
        T: Send + 'static,
        F: FnOnce(Store, Providers) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let _permit = self
            .provider_threads
            .acquire()
            .await
            .map_err(|e| crate::Error::Io(std::io::Error::other(e)))?;
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (cancel_tx, cancel_rx) = tokio::sync::oneshot::channel::<()>();
        let home = self.cx.home().to_path_buf();
        let providers = self.cx.providers().clone();
        std::thread::Builder::new()
            .name("gangway-provider".into())
            .spawn(move || {
                let out = (|| -> Result<Option<T>, crate::Error> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let store = Store::open(&home)?;
                    Ok(rt.block_on(async {
                        tokio::select! {
                            v = work(store, providers) => Some(v),
                            // The awaiting side went away.
                            _ = cancel_rx => None,
                        }
                    }))
                })();
                let _ = done_tx.send(out);
            })?;
        let result = done_rx.await;
        drop(cancel_tx);
        match result {
            Ok(Ok(Some(v))) => Ok(v),
            Ok(Ok(None)) => Err(crate::Error::Io(std::io::Error::other(
                "provider work was cancelled",
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(crate::Error::Io(std::io::Error::other(
                "provider work ended without an answer",
            ))),
        }
    }

    fn say(&self, line: &str) {
        if let Some(f) = self.log.borrow_mut().as_mut() {
            let _ = writeln!(f, "{} {line}", now_ms());
        }
    }

    /// The catalog a job plans with: [`crate::core::context::load_catalog`] with
    /// the job's `--catalog`, read again after [`CATALOG_TTL`].
    fn catalog(&self, dir: Option<&Path>) -> Result<Rc<Catalog>, crate::Error> {
        let key = dir.map(Path::to_path_buf);
        if let Some((at, c)) = self.catalogs.borrow().get(&key) {
            if at.elapsed() < CATALOG_TTL {
                return Ok(Rc::clone(c));
            }
        }
        let c = Rc::new(crate::core::context::load_catalog(
            Some(self.cx.home()),
            dir,
        )?);
        self.catalogs
            .borrow_mut()
            .insert(key, (Instant::now(), Rc::clone(&c)));
        Ok(c)
    }
}

impl Memo {
    fn job(&mut self) -> &mut ManagedJob {
        self.job.as_mut().expect("read before use")
    }

    fn task(&self) -> Rc<ManagedTask> {
        Rc::clone(self.task.as_ref().expect("read before use"))
    }

    /// Reads the job's rows again when they may have changed under it.
    fn refresh(&mut self, sh: &Shared) -> Result<bool, crate::Error> {
        if !self.stale && self.job.is_some() {
            return Ok(true);
        }
        let Some(mut job) = sh.store().managed(self.id)? else {
            return Ok(false);
        };
        if self.task.is_none() {
            self.task = Some(Rc::new(serde_json::from_str(&job.task).map_err(|e| {
                crate::Error::usage(
                    format!("managed job {}: unreadable task: {e}", job.id),
                    None,
                )
            })?));
        }
        // Parsed once above; a thousand jobs need not keep the text too.
        job.task = String::new();
        self.run = match job.inner_job {
            Some(id) => sh.store().job(id)?,
            None => None,
        };
        self.job = Some(job);
        self.stale = false;
        self.read_at = Instant::now();
        Ok(true)
    }

    /// Saves the job (and an event when its state changed from `was`).
    fn save(&mut self, sh: &Shared, was: ManagedState, reason: &str) -> Result<(), crate::Error> {
        sh.store().save_managed(self.job(), was, reason)?;
        Ok(())
    }
}

/// One step for one job.
async fn reconcile(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    if !m.refresh(sh)? {
        return Ok(Action::Done);
    }
    let job = m.job();
    if job.state.is_terminal() {
        return clean_up_ended(sh, m).await;
    }
    if job.desired == "cancel" {
        finish(sh, m, ManagedState::Cancelled, "cancelled by the user").await?;
        return Ok(Action::Requeue(Duration::ZERO));
    }
    if let Some(t) = job.next_try_at.filter(|t| now_ms() < *t) {
        return Ok(Action::at(t));
    }
    match job.state {
        ManagedState::Pending => {
            let was = job.state;
            job.state = ManagedState::Provisioning;
            m.save(sh, was, "looking for a placement")?;
            Ok(Action::Requeue(Duration::ZERO))
        }
        ManagedState::Provisioning | ManagedState::Recovering => provision_or_cancel(sh, m).await,
        ManagedState::Starting | ManagedState::Running => observe(sh, m).await,
        ManagedState::Preempted => {
            let why = job.detail.clone().unwrap_or_else(|| "preempted".into());
            requeue(sh, m, &why, true).await?;
            Ok(Action::Requeue(Duration::ZERO))
        }
        _ => Ok(Action::Done),
    }
}

/// Provisions, unless the user cancels meanwhile: then the launch is
/// dropped where it stands and the next step tears down whatever it made
/// (teardown finds a cluster's nodes by name, however far it got).
async fn provision_or_cancel(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let wake = Rc::clone(&m.wake);
    let id = m.id;
    let cancelled = async {
        loop {
            wake.notified().await;
            if sh
                .store()
                .managed(id)
                .ok()
                .flatten()
                .is_some_and(|j| j.desired == "cancel")
            {
                return;
            }
        }
    };
    tokio::select! {
        r = Box::pin(provision_and_submit(sh, m)) => r,
        _ = cancelled => {
            sh.say(&format!("job {id}: cancelled while provisioning"));
            m.stale = true;
            Ok(Action::Requeue(Duration::ZERO))
        }
    }
}

/// The failover plan for the job now: blocked zones avoided (the oldest
/// block is dropped when everything is blocked), ordered by the recovery
/// strategy. `market` is the deadline policy's pick, if it made one.
fn plan(
    sh: &Shared,
    job: &ManagedJob,
    mt: &ManagedTask,
    market: Option<Market>,
) -> Result<Vec<Candidate>, PlanError> {
    let mut task = crate::core::spec::load(&mt.task_file)?;
    mt.overrides.apply(&mut task)?;
    if let Some(m) = market {
        task.set_market(m == Market::Spot);
    }
    let catalog = sh
        .catalog(mt.catalog_dir.as_deref())
        .map_err(|e| PlanError::Catalog(Box::new(e)))?;
    let opts = Options::default();
    let mut list = Blocklist {
        entries: blocks_of(job),
    };
    list.entries.retain(|b| b.until > opts.now);
    loop {
        match optimizer::optimize(&task, &catalog, &list, &opts) {
            Ok(plan) => {
                let lost_region = list
                    .entries
                    .iter()
                    .max_by_key(|b| b.at_ms)
                    .and_then(|b| Some((b.cloud.clone(), b.region.clone()?)));
                return Ok(order_for(&mt.strategy, plan, lost_region));
            }
            Err(e) if list.entries.is_empty() => return Err(e.into()),
            Err(_) => {
                // Everything left is blocked: the zone lost longest ago is
                // the best bet.
                let oldest = list
                    .entries
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, b)| b.at_ms)
                    .map(|(i, _)| i)
                    .unwrap_or(0);
                list.entries.remove(oldest);
            }
        }
    }
}

/// Finds the job a cluster and starts its run there: reserve the
/// cluster's row, bring a new one up (or reuse one up), submit the run
/// (or adopt the one already there), and record where it runs.
async fn provision_and_submit(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let job = m.job().clone();
    let Ok(lock) = sh.store().lock_cluster(&job.cluster, "recovering") else {
        return Ok(Action::Requeue(ERROR_BACKOFF)); // someone else works on it
    };
    let row = match reserve(sh, m)? {
        Reserved::Existing(row) if row.status == ClusterStatus::Up => row,
        Reserved::Existing(row) => return clear_stale(sh, m, &row).await,
        Reserved::New(row) | Reserved::Resumed(row) => match bring_up(sh, m, row).await? {
            Ok(row) => row,
            Err(next) => {
                drop(lock);
                return next.await_action(sh, m).await;
            }
        },
    };
    drop(lock);
    m.reach = None;
    let inner = match adopt_or_submit(sh, m, &row).await? {
        Ok(inner) => inner,
        Err(next) => return next.await_action(sh, m).await,
    };
    record_running(sh, m, &row, inner)
}

/// Reserves the job's cluster row for this run (the run's token makes a
/// retry of the same run resume the same reservation).
fn reserve(sh: &Shared, m: &mut Memo) -> Result<Reserved, crate::Error> {
    let mt = m.task();
    let job = m.job();
    let store = sh.store();
    let config = crate::core::spec::load(&mt.task_file)
        .ok()
        // A user file broken since the job was launched leaves the task's.
        .and_then(|t| {
            let own = t.config.clone();
            crate::core::config::launch_config(&t, store.home()).unwrap_or(own)
        })
        .map(|c| c.to_string());
    let token = format!("{}-{}", job.cluster, job.restart_count);
    Ok(store.reserve_cluster(&NewCluster {
        name: &job.cluster,
        num_nodes: mt.spec.num_nodes,
        client_token: &token,
        provider_config: config,
    })?)
}

/// A cluster row of the job's that is stopped or half torn down: removed
/// (when its retry is due) so that the next step starts afresh.
async fn clear_stale(sh: &Shared, m: &mut Memo, row: &ClusterRow) -> Result<Action, crate::Error> {
    // A teardown that failed is tried again when it is due, not on every
    // round.
    if let Some(t) = row.retry_at.filter(|t| *t > now_ms()) {
        let was = m.job().state;
        m.job().next_try_at = Some(t);
        m.save(sh, was, "")?;
        return Ok(Action::at(t));
    }
    let name = row.name.clone();
    let done = sh
        .off_thread(move |store, providers| async move {
            lifecycle::teardown(&store, &name, &providers).await
        })
        .await?;
    if let Err(e) = done {
        return Err(crate::Error::leftover(sh.store(), &row.name, e));
    }
    Ok(Action::Requeue(Duration::ZERO))
}

/// What a step does instead of going on: a plain next action, or one
/// that needs the job's task (waiting for capacity, ending the job).
enum Detour {
    Now(Action),
    NoCapacity(String),
    Fail(String),
}

impl Detour {
    async fn await_action(self, sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
        match self {
            Detour::Now(a) => Ok(a),
            Detour::NoCapacity(why) => no_capacity(sh, m, &why).await,
            Detour::Fail(why) => {
                finish(sh, m, ManagedState::Failed, &why).await?;
                Ok(Action::Requeue(Duration::ZERO))
            }
        }
    }
}

/// Brings a newly reserved cluster up on the market the deadline policy
/// picks (or waits, when it would rather), along the job's plan.
async fn bring_up(
    sh: &Shared,
    m: &mut Memo,
    row: ClusterRow,
) -> Result<Result<ClusterRow, Detour>, crate::Error> {
    let store = sh.store();
    let job = m.job().clone();
    let choice = market_choice(sh, m, Choice::Idle);
    if choice == Some(Choice::Idle) {
        // The policy would rather wait for spot than pay now.
        store.remove_cluster(&job.cluster)?;
        let j = m.job();
        j.next_try_at = Some(now_ms() + DECIDE_EVERY.as_millis() as i64);
        j.detail = Some("deadline policy: waiting for spot capacity".into());
        m.save(sh, job.state, "")?;
        return Ok(Err(Detour::Now(Action::Requeue(DECIDE_EVERY))));
    }
    let market = choice.map(|c| Market::of_spot(c == Choice::Spot));
    let plan = match plan(sh, &job, &m.task(), market) {
        Ok(p) => p,
        Err(why) => {
            store.remove_cluster(&job.cluster)?;
            m.no_spot |= market == Some(Market::Spot);
            return Ok(Err(Detour::NoCapacity(why.to_string())));
        }
    };
    let started = now_ms();
    let result = sh
        .off_thread(move |store, providers| async move {
            let contact = provision::Contact::Now;
            lifecycle::bring_up(&store, &row, &plan, &providers, &Silent, contact).await
        })
        .await?;
    match result {
        Ok(row) => {
            let ms = now_ms() - started;
            sh.say(&format!(
                "job {}: provisioned {} in {ms} ms",
                job.id, job.cluster
            ));
            Ok(Ok(row))
        }
        Err(provision::ProvisionError::Exhausted { attempts, .. }) => {
            m.no_spot |= market == Some(Market::Spot);
            let why = attempts
                .iter()
                .map(|a| format!("{}/{}/{}: {}", a.cloud, a.region, a.zone, a.outcome))
                .collect::<Vec<_>>()
                .join("; ");
            Ok(Err(Detour::NoCapacity(why)))
        }
        // The cluster stays TERMINATING (something may still run there);
        // the next step tears it down first.
        Err(e @ provision::ProvisionError::Leftover { .. }) => {
            Err(crate::Error::leftover(store, &job.cluster, e))
        }
        Err(e) => {
            // A managed job's cluster is its own: no row stays.
            store.remove_cluster(&job.cluster)?;
            Ok(Err(Detour::Fail(e.to_string())))
        }
    }
}

/// The run on the cluster: one already there (the controller died right
/// after submitting it) is adopted, never doubled; else a new one is
/// submitted, restoring the newest complete checkpoint.
async fn adopt_or_submit(
    sh: &Shared,
    m: &mut Memo,
    row: &ClusterRow,
) -> Result<Result<i64, Detour>, crate::Error> {
    let store = sh.store();
    let job = m.job().clone();
    let mt = m.task();
    let runs = store.managed_dir(job.id).join("runs");
    let existing = store
        .jobs(&job.cluster)?
        .into_iter()
        .rfind(|j| !j.status.is_terminal());
    if let Some(j) = existing {
        let listed = std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .any(|l| l.trim() == j.id.to_string());
        if !listed {
            append_line(&runs, &j.id.to_string());
        }
        return Ok(Ok(j.id));
    }
    let mut spec = mt.spec.clone();
    spec.job_id = Some(job.id.to_string());
    spec.restart_count = job.restart_count;
    spec.gpus_per_node = row.accelerator_count.ceil() as u32;
    spec.restore_from = mt.storage.is_dir().then(|| mt.storage.clone());
    if let Some(url) = &mt.storage_url {
        match newest_checkpoint(url).await {
            Ok(restore) => spec.restore_bucket = restore,
            Err(e) => {
                sh.say(&format!(
                    "cannot read the checkpoints in {url}: {e}; will retry"
                ));
                return Ok(Err(Detour::Now(Action::Requeue(Duration::from_secs(30)))));
            }
        }
    }
    let secrets = match secrets_of(store, &job, &mt) {
        Ok(s) => s,
        Err(why) => return Ok(Err(Detour::Fail(why.to_string()))),
    };
    let id = gang::submit(store, sh.cx.home(), &job.cluster, &spec, &secrets)?;
    append_line(&runs, &id.to_string());
    Ok(Ok(id))
}

/// The newest complete checkpoint in the job's bucket, for the nodes to
/// restore (`None` before the first).
async fn newest_checkpoint(
    url: &str,
) -> Result<Option<crate::core::storage::Restore>, checkpoint::CheckpointError> {
    let bucket = checkpoint::open(url).await?;
    let newest = checkpoint::complete(&bucket).await?.last().copied();
    Ok(newest.map(|generation| crate::core::storage::Restore {
        url: url.to_string(),
        generation,
    }))
}

/// Records that run `inner` starts on `row`: where, on which market, at
/// what price.
fn record_running(
    sh: &Shared,
    m: &mut Memo,
    row: &ClusterRow,
    inner: i64,
) -> Result<Action, crate::Error> {
    let placement = format!(
        "{}/{}/{} {}{}",
        row.cloud.as_deref().unwrap_or("-"),
        row.region.as_deref().unwrap_or("-"),
        row.zone.as_deref().unwrap_or("-"),
        row.instance_type.as_deref().unwrap_or("-"),
        if row.use_spot { " spot" } else { "" }
    );
    if row.use_spot {
        m.no_spot = false;
    }
    m.run = sh.store().job(inner)?;
    let j = m.job();
    let was = j.state;
    j.market = Some(Market::of_spot(row.use_spot));
    j.moving_to = None;
    j.location = match (&row.cloud, &row.region, &row.zone) {
        (Some(cloud), Some(region), Some(zone)) => Some(Location {
            cloud: cloud.clone(),
            region: region.clone(),
            zone: zone.clone(),
        }),
        _ => None,
    };
    j.inner_job = Some(inner);
    j.placement = Some(placement);
    j.price_per_hour = row.price_per_hour;
    j.running_since = Some(now_ms());
    j.notice_at = None;
    j.next_try_at = None;
    j.detail = None;
    j.state = ManagedState::Starting;
    m.save(sh, was, &format!("cluster up; run {inner} submitted"))?;
    Ok(Action::Requeue(Duration::ZERO))
}

fn append_line(path: &Path, line: &str) {
    if let Ok(mut f) = std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The job's secret values. A task that has secrets and no readable file
/// of them is an error: a run without its secrets is not the run the user
/// launched.
fn secrets_of(
    store: &Store,
    job: &ManagedJob,
    mt: &ManagedTask,
) -> Result<Vec<(String, String)>, SecretsError> {
    let path = store.managed_dir(job.id).join("secrets.json");
    let needs = || mt.spec.secret_names.join(", ");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && mt.spec.secret_names.is_empty() => {
            return Ok(Vec::new())
        }
        Err(source) => {
            return Err(SecretsError::Unreadable {
                path,
                source,
                needs: needs(),
            })
        }
    };
    let secrets: Vec<(String, String)> =
        serde_json::from_str(&text).map_err(|e| SecretsError::Damaged {
            path: path.clone(),
            line: e.line(),
            column: e.column(),
            needs: needs(),
        })?;
    let missing: Vec<&str> = mt
        .spec
        .secret_names
        .iter()
        .filter(|n| !secrets.iter().any(|(k, _)| k == *n))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(SecretsError::Missing {
            path,
            missing: missing.join(", "),
        });
    }
    Ok(secrets)
}

async fn no_capacity(sh: &Shared, m: &mut Memo, why: &str) -> Result<Action, crate::Error> {
    let mt = m.task();
    let policy_may_switch = mt.deadline_s.is_some() && mt.work_s.is_some() && m.no_spot;
    let job = m.job();
    if job.state == ManagedState::Provisioning && job.restart_count == 0 && !policy_may_switch {
        finish(
            sh,
            m,
            ManagedState::FailedNoResource,
            &format!("no placement: {why}"),
        )
        .await?;
        return Ok(Action::Requeue(Duration::ZERO));
    }
    let was = job.state;
    let next = now_ms() + NO_CAPACITY_BACKOFF.as_millis() as i64;
    job.next_try_at = Some(next);
    job.detail = Some(format!("waiting for capacity: {why}"));
    m.save(sh, was, "")?;
    Ok(Action::at(next))
}

/// The job's nodes and a transport to them, connected when it can be.
async fn nodes_and_transport(
    sh: &Shared,
    m: &mut Memo,
) -> Result<Option<(Arc<Vec<NodeRow>>, Arc<dyn Transport>)>, crate::Error> {
    let cluster = m.job().cluster.clone();
    if m.reach.is_none() {
        let Some(row) = sh.store().cluster(&cluster)? else {
            return Ok(None);
        };
        let Some(cloud) = row.cloud.clone() else {
            return Ok(None);
        };
        let nodes = sh.store().nodes(&cluster)?;
        let Some(t) = sh.cx.providers().transport(&cloud, sh.cx.home(), &cluster) else {
            return Ok(None);
        };
        m.reach = Some(Reach {
            nodes: Arc::new(nodes),
            transport: Arc::from(t),
            // A transport without connections answers connect at once.
            connected: false,
            tried: None,
        });
    }
    let reach = m.reach.as_mut().expect("just set");
    if !reach.connected && reach.tried.is_none_or(|t| t.elapsed() > RECONNECT_AFTER) {
        reach.tried = Some(Instant::now());
        reach.connected = reach.transport.connect(&reach.nodes).await.is_ok();
    }
    Ok(Some((
        Arc::clone(&reach.nodes),
        Arc::clone(&reach.transport),
    )))
}

/// A preemption notice on any node, as (rank, the provider's words):
/// asked off the runtime (over SSH it is a command on the node), or right
/// here when it is a read of this machine's files (the local cloud): a
/// thousand jobs asking twice a second would otherwise spend their time
/// handing work to the blocking pool.
async fn notice(nodes: Arc<Vec<NodeRow>>, t: Arc<dyn Transport>) -> Option<(u32, String)> {
    let local = t.notice_is_local();
    let ask = move || {
        nodes
            .iter()
            .find_map(|n| t.preemption_notice(n).map(|w| (n.rank, w)))
    };
    if local {
        return ask();
    }
    tokio::task::spawn_blocking(ask).await.ok().flatten()
}

/// Sends `sig` to every rank of run `inner`, off the runtime; returns once
/// it was sent.
async fn signal_ranks(
    sh: &Shared,
    nodes: Arc<Vec<NodeRow>>,
    t: Arc<dyn Transport>,
    inner: i64,
    sig: i32,
) {
    let dir = sh.store().job_log_dir(inner);
    let _ = tokio::task::spawn_blocking(move || {
        gang::signal_ranks(&dir, t.as_ref(), &nodes, inner, sig)
    })
    .await;
}

/// Watches a job's run: marks it running once every rank runs, watches a
/// live run ([`watch_live`]) and decides what an ended one means
/// ([`run_ended`]).
async fn observe(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let was = m.job().state;
    let Some(inner_id) = m.job().inner_job else {
        m.job().state = ManagedState::Recovering;
        m.save(sh, was, "no run recorded; starting one")?;
        return Ok(Action::Requeue(Duration::ZERO));
    };
    let Some(run) = m.run.clone() else {
        preempted(sh, m, "the job's cluster disappeared").await?;
        return Ok(Action::Requeue(Duration::ZERO));
    };
    if run.status == JobStatus::Running && was == ManagedState::Starting {
        return mark_running(sh, m);
    }
    let Some(reach) = nodes_and_transport(sh, m).await? else {
        preempted(sh, m, "the job's cluster disappeared").await?;
        return Ok(Action::Requeue(Duration::ZERO));
    };
    if !run.status.is_terminal() {
        return watch_live(sh, m, &run, inner_id, reach).await;
    }
    // A periodic sync still going finishes first: the last one must not
    // race it.
    if m.syncing.is_some() {
        sync_ended(sh, m, was).await?;
    }
    run_ended(sh, m, &run, reach).await?;
    Ok(Action::Requeue(Duration::ZERO))
}

/// A run's nodes and a transport to them.
type Reached = (Arc<Vec<NodeRow>>, Arc<dyn Transport>);

/// Every rank of the run started: the job runs (and, after a loss, says
/// how long resuming took).
fn mark_running(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let j = m.job();
    let was = j.state;
    j.state = ManagedState::Running;
    j.work_since = Some(now_ms());
    let reason = match j.recovery_started_at.take() {
        Some(t) => format!(
            "resumed {:.1} s after the loss (restart {})",
            (now_ms() - t) as f64 / 1000.0,
            j.restart_count
        ),
        None => "every rank runs".into(),
    };
    m.save(sh, was, &reason)?;
    Ok(Action::Requeue(Duration::ZERO))
}

/// One look at a live run, in order: the provider's advance notice (then
/// checkpoint), the grace after it, the deadline policy's market, a node
/// taken without notice, and the periodic checkpoint sync.
async fn watch_live(
    sh: &Shared,
    m: &mut Memo,
    run: &JobRow,
    inner_id: i64,
    (nodes, transport): Reached,
) -> Result<Action, crate::Error> {
    let mt = m.task();
    if m.job().notice_at.is_none() {
        if let Some((rank, words)) = notice(Arc::clone(&nodes), Arc::clone(&transport)).await {
            signal_ranks(sh, Arc::clone(&nodes), transport, inner_id, mt.signal).await;
            return noticed(sh, m, rank, &words);
        }
    }
    if let Some(t) = m.job().notice_at {
        return grace_after_notice(sh, m, t).await;
    }
    // The deadline policy may want the other market.
    if run.status == JobStatus::Running && reconsider(sh, m, &nodes, &transport, inner_id).await? {
        return Ok(Action::Requeue(Duration::from_secs_f64(mt.grace_s)));
    }
    // The provider took a node without notice (asked at most every
    // DESCRIBE_EVERY: the ranks dying tells the driver sooner).
    let every = DESCRIBE_EVERY.max(Duration::from_secs_f64(
        sh.jobs.get() as f64 / DESCRIBES_PER_S,
    ));
    if m.described.is_none_or(|t| t.elapsed() >= every) {
        m.described = Some(Instant::now());
        if let Some(lost) = lost_node(sh, m, &nodes).await {
            preempted(sh, m, &lost.to_string()).await?;
            return Ok(Action::Requeue(Duration::ZERO));
        }
    }
    keep_synced(sh, m, run, (nodes, transport)).await?;
    Ok(Action::Requeue(NOTICE_EVERY))
}

/// A preemption notice was seen on `rank` and the ranks were signalled:
/// recorded, with the grace period they have to checkpoint.
fn noticed(sh: &Shared, m: &mut Memo, rank: u32, words: &str) -> Result<Action, crate::Error> {
    let mt = m.task();
    let j = m.job();
    let was = j.state;
    j.notice_at = Some(now_ms());
    let reason = format!(
        "preemption notice on rank {rank} ({words}); signal {} sent, {} s to checkpoint",
        mt.signal, mt.grace_s
    );
    sh.store()
        .managed_event(j.id, "NOTICE", j.placement.as_deref(), &reason)?;
    m.save(sh, was, "")?;
    Ok(Action::Requeue(Duration::from_secs_f64(mt.grace_s)))
}

/// After a notice at `t`: once the grace period ran out, the run is lost
/// (or moved, for the deadline policy); until then, wait for it.
async fn grace_after_notice(sh: &Shared, m: &mut Memo, t: i64) -> Result<Action, crate::Error> {
    let end = t + (m.task().grace_s * 1000.0) as i64;
    if now_ms() <= end {
        return Ok(Action::at(end));
    }
    if m.job().moving_to.is_some() {
        requeue(sh, m, "moved by the deadline policy", false).await?;
    } else {
        preempted(sh, m, "the grace period after the notice ran out").await?;
    }
    Ok(Action::Requeue(Duration::ZERO))
}

/// Keeps the checkpoint fresh, beside the watch loop: a big upload takes
/// minutes, and the notice must still be read meanwhile.
async fn keep_synced(
    sh: &Shared,
    m: &mut Memo,
    run: &JobRow,
    (nodes, transport): Reached,
) -> Result<(), crate::Error> {
    let mt = m.task();
    if m.syncing.as_ref().is_some_and(|h| h.is_finished()) {
        let was = m.job().state;
        sync_ended(sh, m, was).await?;
    }
    let due = m
        .job()
        .last_sync_at
        .is_none_or(|t| (now_ms() - t) as f64 >= mt.sync_interval_s * 1000.0);
    if due && run.status == JobStatus::Running && m.syncing.is_none() {
        m.syncing = Some(tokio::task::spawn_local(async move {
            sync(&mt, nodes, transport).await
        }));
    }
    Ok(())
}

/// What an ended run means for the job: checkpointed on a notice, done,
/// failed in setup, or failed ([`run_failed`]).
async fn run_ended(
    sh: &Shared,
    m: &mut Memo,
    run: &JobRow,
    (nodes, transport): Reached,
) -> Result<(), crate::Error> {
    let mt = m.task();
    // Only a run whose ranks all started has a checkpoint of its own: the
    // directories of one stopped in setup hold at most the restored copy.
    let ran = run.started_at.is_some();
    if m.job().notice_at.is_some() {
        // It ended because we asked it to checkpoint: keep that.
        if ran {
            last_sync(sh, m, &mt, nodes, transport).await;
        }
        if m.job().moving_to.is_some() {
            return requeue(sh, m, "checkpointed for the deadline policy's move", false).await;
        }
        return preempted(sh, m, "checkpointed on the preemption notice").await;
    }
    match run.status {
        JobStatus::Succeeded => {
            last_sync(sh, m, &mt, Arc::clone(&nodes), Arc::clone(&transport)).await;
            // A scheduler that signals the ranks itself (Slurm's GraceTime)
            // can have them checkpoint and exit 0 before the notice was
            // seen here: that is a preemption, not the end.
            if let Some((rank, words)) = notice(nodes, transport).await {
                let why = format!("the ranks ended on a preemption (rank {rank}: {words})");
                preempted(sh, m, &why).await
            } else {
                finish(sh, m, ManagedState::Succeeded, "every rank exited 0").await
            }
        }
        JobStatus::FailedSetup => {
            let detail = run.detail.clone().unwrap_or_default();
            finish(sh, m, ManagedState::FailedSetup, &detail).await
        }
        _ => run_failed(sh, m, run, (nodes, transport)).await,
    }
}

/// A run that failed: a preemption when a notice was posted or a node is
/// lost, else requeued for a recoverable exit code or while restarts on
/// errors remain, else the job failed.
async fn run_failed(
    sh: &Shared,
    m: &mut Memo,
    run: &JobRow,
    (nodes, transport): Reached,
) -> Result<(), crate::Error> {
    let mt = m.task();
    let detail = run.detail.clone().unwrap_or_default();
    // A rank that died of the notice's signal before this loop saw the
    // notice (the node's own reader signals it first): the checkpoint it
    // was asked for is kept, and it is a preemption.
    if let Some((rank, words)) = notice(Arc::clone(&nodes), Arc::clone(&transport)).await {
        if run.started_at.is_some() {
            last_sync(sh, m, &mt, Arc::clone(&nodes), Arc::clone(&transport)).await;
        }
        let why = format!("{detail}; a preemption notice was posted (rank {rank}: {words})");
        return preempted(sh, m, &why).await;
    }
    let outcome = run.outcome.clone();
    let lost = match lost_node(sh, m, &nodes).await {
        Some(l) => Some(l),
        None => outcome.as_ref().and_then(|o| o.lost.clone()),
    };
    if let Some(l) = lost {
        let why = if detail.is_empty() {
            l.to_string()
        } else {
            format!("{detail}; {l}")
        };
        return preempted(sh, m, &why).await;
    }
    let code = outcome
        .as_ref()
        .filter(|o| o.reason == EndReason::RankFailed)
        .and_then(|o| o.failed_code());
    if code.is_some_and(|c| mt.recover_on_exit_codes.contains(&c)) {
        m.job().detail = Some(detail.clone());
        let why = format!("{detail} (a recoverable exit code)");
        return requeue(sh, m, &why, false).await;
    }
    if m.job().restarts_on_errors < mt.max_restarts_on_errors {
        let j = m.job();
        j.restarts_on_errors += 1;
        j.detail = Some(detail.clone());
        let why = format!(
            "{detail} (restart {} of {} on errors)",
            j.restarts_on_errors, mt.max_restarts_on_errors
        );
        return requeue(sh, m, &why, false).await;
    }
    finish(sh, m, ManagedState::Failed, &detail).await
}

/// What the deadline policy would run the job on now, if the task has one
/// (`deadline: {within, work}`); `running` is the current market.
fn market_choice(sh: &Shared, m: &mut Memo, running: Choice) -> Option<Choice> {
    let mt = m.task();
    let (deadline, work) = (mt.deadline_s?, mt.work_s?);
    let kind = match mt.policy.as_deref() {
        Some("greedy") => PolicyKind::Greedy,
        Some("on_demand") => PolicyKind::AlwaysOnDemand,
        _ => PolicyKind::UniformProgress,
    };
    let no_spot = m.no_spot;
    let job = m.job();
    let now = now_ms();
    let current = job.work_since.map_or(0, |s| (now - s).max(0));
    let state = State {
        elapsed: (now - job.submitted_at).max(0) as f64 / 1000.0,
        work_done: (job.work_done_ms + current) as f64 / 1000.0,
        job_length: work,
        deadline,
        restart_overhead: overhead_estimate(sh.store(), job.id),
        tick: DECIDE_EVERY.as_secs_f64(),
        spot_available: running == Choice::Spot || !no_spot,
        running,
        overhead_left: 0.0,
    };
    Some(kind.build().decide(&state))
}

/// The longest a run of this job took from looking for a cluster to every
/// rank running: the restart overhead the policy plans with. The longest,
/// not the last: one quick restart must not make the policy count on the
/// next (the one to on-demand that has to meet the deadline) being as
/// quick.
fn overhead_estimate(store: &Store, id: i64) -> f64 {
    let Ok(events) = store.managed_events(id) else {
        return DEFAULT_OVERHEAD_S;
    };
    let mut began = None;
    let mut worst: Option<f64> = None;
    for e in &events {
        match ManagedState::parse(&e.state) {
            Some(ManagedState::Provisioning | ManagedState::Recovering) => began = Some(e.at),
            Some(ManagedState::Running) => {
                if let Some(b) = began.take() {
                    let took = (e.at - b) as f64 / 1000.0;
                    worst = Some(worst.map_or(took, |w| w.max(took)));
                }
            }
            _ => {}
        }
    }
    worst.map_or(DEFAULT_OVERHEAD_S, |s| s.max(1.0))
}

/// Asks the deadline policy whether the running job should change market;
/// if so, tells the run to checkpoint (as on a notice) and records the
/// move. Returns whether it acted.
async fn reconsider(
    sh: &Shared,
    m: &mut Memo,
    nodes: &Arc<Vec<NodeRow>>,
    transport: &Arc<dyn Transport>,
    inner: i64,
) -> Result<bool, crate::Error> {
    if m.decided.is_some_and(|t| t.elapsed() < DECIDE_EVERY) {
        return Ok(false);
    }
    m.decided = Some(Instant::now());
    let running = match m.job().market {
        Some(Market::Spot) => Choice::Spot,
        Some(Market::OnDemand) => Choice::OnDemand,
        None => return Ok(false),
    };
    let Some(want) = market_choice(sh, m, running) else {
        return Ok(false);
    };
    if want == running || want == Choice::Idle {
        return Ok(false);
    }
    let mt = m.task();
    let to = Market::of_spot(want == Choice::Spot);
    signal_ranks(
        sh,
        Arc::clone(nodes),
        Arc::clone(transport),
        inner,
        mt.signal,
    )
    .await;
    let was = m.job().state;
    let j = m.job();
    j.moving_to = Some(to);
    j.notice_at = Some(now_ms());
    let reason = format!(
        "deadline policy: moving to {} ({:.0} s of {:.0} s of work kept, {:.0} s to the deadline)",
        to.as_str(),
        j.work_done_ms as f64 / 1000.0,
        mt.work_s.unwrap_or(0.0),
        mt.deadline_s.unwrap_or(0.0) - (now_ms() - j.submitted_at) as f64 / 1000.0
    );
    sh.store()
        .managed_event(j.id, "MOVE", j.placement.as_deref(), &reason)?;
    m.save(sh, was, "")?;
    Ok(true)
}

/// What the provider says about nodes gone without notice.
async fn lost_node(sh: &Shared, m: &mut Memo, nodes: &[NodeRow]) -> Option<LostNode> {
    let cluster = m.job().cluster.clone();
    let cloud = sh.store().cluster(&cluster).ok()??.cloud?;
    let p = sh.cx.providers().get(&cloud)?;
    let seen = sh
        .off_thread(move |_, _| async move { p.describe(&ClusterName(cluster)).await })
        .await
        .ok()?
        .ok()?;
    nodes.iter().find_map(|n| {
        let lost = |seen: LossSeen, reason: String| LostNode {
            instance_id: n.instance_id.clone(),
            rank: Some(n.rank),
            seen,
            reason,
        };
        match seen.iter().find(|s| s.id.0 == n.instance_id) {
            None => Some(lost(LossSeen::Gone, String::new())),
            Some(s) => match &s.state {
                NodeState::Preempted { reason } => Some(lost(LossSeen::Preempted, reason.clone())),
                NodeState::Terminated => Some(lost(LossSeen::Terminated, String::new())),
                _ => None,
            },
        }
    })
}

/// The sync at a run's end: its time is recorded in the job (saved with
/// the job's next state), a failure said in the controller's log.
async fn last_sync(
    sh: &Shared,
    m: &mut Memo,
    mt: &ManagedTask,
    nodes: Arc<Vec<NodeRow>>,
    transport: Arc<dyn Transport>,
) {
    if let Some(t) = synced(sh, m.job().id, sync(mt, nodes, transport).await) {
        m.job().last_sync_at = Some(t);
    }
}

/// Waits for the periodic sync running beside the loop and records its
/// time.
async fn sync_ended(sh: &Shared, m: &mut Memo, was: ManagedState) -> Result<(), crate::Error> {
    let Some(h) = m.syncing.take() else {
        return Ok(());
    };
    let r = h.await.map_err(SyncError::from).and_then(|r| r);
    if let Some(t) = synced(sh, m.job().id, r) {
        m.job().last_sync_at = Some(t);
        m.save(sh, was, "")?;
    }
    Ok(())
}

/// The sync's time, or `None` after saying in the controller's log why
/// it failed (the previous checkpoint stays the one restored). A sync
/// whose checkpoint completed but whose pruning failed is said and counts.
fn synced(sh: &Shared, job: i64, r: Result<Synced, SyncError>) -> Option<i64> {
    match r {
        Ok(Synced { at, skipped }) => {
            if !skipped.is_empty() {
                let shown: Vec<&str> = skipped.iter().take(5).map(String::as_str).collect();
                let more = skipped.len().saturating_sub(shown.len());
                let why = format!(
                    "checkpoint sync left out {} entr{} a node sent: {}{}",
                    skipped.len(),
                    if skipped.len() == 1 { "y" } else { "ies" },
                    shown.join("; "),
                    if more > 0 {
                        format!("; and {more} more")
                    } else {
                        String::new()
                    }
                );
                sh.say(&format!("job {job}: {why}"));
                let _ = sh.store().managed_event(job, "WARNING", None, &why);
            }
            Some(at)
        }
        Err(e @ SyncError::Prune { at, .. }) => {
            sh.say(&format!("job {job}: {e}"));
            Some(at)
        }
        Err(e) => {
            sh.say(&format!("job {job}: checkpoint sync failed: {e}"));
            None
        }
    }
}

/// Copies every node's checkpoint directory into the kept one, atomically
/// (a failed copy keeps the previous one), then tells the nodes
/// (`.gangway-synced` holds the time the copy began: everything written
/// before it is kept). Returns that time. Runs off the runtime.
async fn sync(
    mt: &ManagedTask,
    nodes: Arc<Vec<NodeRow>>,
    transport: Arc<dyn Transport>,
) -> Result<Synced, SyncError> {
    let storage = mt.storage.clone();
    let ck = mt
        .spec
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| gang::DEFAULT_CHECKPOINT_DIR.to_string());
    if let Some(url) = &mt.storage_url {
        // The nodes upload to the bucket themselves; this process writes
        // the manifest that makes the checkpoint complete, tells the nodes,
        // then prunes.
        let started = now_ms();
        let dirs: Vec<String> = nodes.iter().map(|n| transport.node_path(n, &ck)).collect();
        let bucket = checkpoint::open(url).await?;
        let synced = checkpoint::sync(
            &bucket,
            started as u64,
            &nodes,
            &dirs,
            Arc::clone(&transport),
        )
        .await?;
        let stamp = started.to_string();
        tokio::task::spawn_blocking(move || {
            for (n, d) in nodes.iter().zip(&dirs) {
                let _ = transport.write_file(n, &format!("{d}/.gangway-synced"), stamp.as_bytes());
            }
        })
        .await?;
        if synced.new {
            checkpoint::prune(&bucket, mt.keep)
                .await
                .map_err(|error| SyncError::Prune { at: started, error })?;
        }
        return Ok(Synced {
            at: started,
            skipped: Vec::new(),
        });
    }
    tokio::task::spawn_blocking(move || sync_now(&storage, &ck, &nodes, transport.as_ref())).await?
}

fn sync_now(
    storage: &Path,
    ck: &str,
    nodes: &[NodeRow],
    transport: &dyn Transport,
) -> Result<Synced, SyncError> {
    let started = now_ms();
    let name = storage
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = storage.parent().unwrap_or(Path::new("."));
    let tmp = parent.join(format!("{name}.partial"));
    let old = parent.join(format!("{name}.old"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let mut skipped = Vec::new();
    for n in nodes {
        // The path is the node's: only the transport can tell whether it
        // exists there (over SSH it is not on this machine).
        let path = transport.node_path(n, ck);
        for s in transport.download(n, &path, &tmp)? {
            skipped.push(format!("rank {} ({}): {s}", n.rank, n.label()));
        }
    }
    let _ = std::fs::remove_dir_all(&old);
    if storage.exists() {
        std::fs::rename(storage, &old)?;
    }
    std::fs::rename(&tmp, storage)?;
    let _ = std::fs::remove_dir_all(&old);
    for n in nodes {
        let path = format!("{}/.gangway-synced", transport.node_path(n, ck));
        let _ = transport.write_file(n, &path, started.to_string().as_bytes());
    }
    Ok(Synced {
        at: started,
        skipped,
    })
}

/// Tears the job's cluster down, waiting (on a timer) for a launcher or
/// another teardown of it to let go.
async fn teardown_cluster(sh: &Shared, cluster: &str) -> Result<(), crate::Error> {
    if sh.store().cluster(cluster)?.is_none() {
        return Ok(());
    }
    let path = sh
        .cx
        .home()
        .join("locks")
        .join(format!("cluster-{cluster}.lock"));
    let deadline = Instant::now() + LOCK_WAIT;
    let lock = loop {
        if let Some(l) = OwnerLock::try_acquire(&path)? {
            break l;
        }
        if Instant::now() >= deadline {
            return Err(crate::Error::usage(
                format!("cluster {cluster} stays busy; will retry"),
                None,
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let name = cluster.to_string();
    sh.off_thread(move |store, providers| async move {
        // The owner lock goes with the work, and is let go when it ends.
        let _lock = lock;
        crate::core::lifecycle::teardown(&store, &name, &providers).await
    })
    .await??;
    Ok(())
}

async fn preempted(sh: &Shared, m: &mut Memo, why: &str) -> Result<(), crate::Error> {
    let was = m.job().state;
    let j = m.job();
    j.state = ManagedState::Preempted;
    j.detail = Some(why.to_string());
    m.save(sh, was, why)?;
    if m.task().strategy.eq_ignore_ascii_case("NONE") {
        return finish(
            sh,
            m,
            ManagedState::Failed,
            &format!("{why}; job_recovery is NONE"),
        )
        .await;
    }
    requeue(sh, m, why, true).await
}

/// Tears the cluster down and goes back to finding one. A preemption
/// blocks the zone it happened in for [`BLOCK_TTL`].
async fn requeue(
    sh: &Shared,
    m: &mut Memo,
    why: &str,
    preempted: bool,
) -> Result<(), crate::Error> {
    let j = m.job();
    let was = j.state;
    let lost_at = j.notice_at.unwrap_or_else(now_ms);
    let lost_work = match (j.notice_at, j.last_sync_at) {
        (Some(_), _) => "none (checkpointed on notice)".to_string(),
        (None, Some(t)) => format!(
            "up to {:.1} s since the last sync",
            (now_ms() - t) as f64 / 1000.0
        ),
        (None, None) => "everything since the start of this run (no sync yet)".to_string(),
    };
    // Progress this run kept: all of it when it checkpointed on request,
    // up to the last kept checkpoint otherwise.
    if let Some(since) = j.work_since {
        let kept_until = if j.notice_at.is_some() {
            now_ms()
        } else {
            j.last_sync_at.unwrap_or(since)
        };
        j.work_done_ms += (kept_until - since).max(0);
    }
    j.work_since = None;
    let cluster = j.cluster.clone();
    teardown_cluster(sh, &cluster).await?;
    m.reach = None;
    let j = m.job();
    let now = now_ms();
    if preempted {
        if let Some(l) = j.location.clone() {
            let at = SystemTime::now();
            let mut blocks = blocks_of(j);
            blocks.retain(|b| {
                b.until > at && !(b.cloud == l.cloud && b.zone.as_deref() == Some(&l.zone))
            });
            blocks.push(Block {
                cloud: l.cloud,
                region: Some(l.region),
                zone: Some(l.zone),
                instance_type: None,
                at_ms: now,
                until: at + BLOCK_TTL,
                reason: why.to_string(),
            });
            j.blocks = serde_json::to_string(&blocks).unwrap_or_else(|_| "[]".into());
        }
        j.preemptions += 1;
    }
    if let (Some(since), Some(p)) = (j.running_since, j.price_per_hour) {
        j.cost_so_far += p * ((now - since).max(0) as f64 / 3_600_000.0);
    }
    // A move's market is the next cluster's; the policy asks again there.
    if let Some(to) = j.moving_to.take() {
        j.market = Some(to);
    }
    j.running_since = None;
    j.price_per_hour = None;
    j.inner_job = None;
    j.notice_at = None;
    j.last_sync_at = None;
    j.restart_count += 1;
    j.recovery_started_at = Some(lost_at);
    j.state = ManagedState::Recovering;
    m.run = None;
    m.save(
        sh,
        was,
        &format!("requeued after: {why}; work lost: {lost_work}"),
    )
}

async fn finish(
    sh: &Shared,
    m: &mut Memo,
    state: ManagedState,
    why: &str,
) -> Result<(), crate::Error> {
    let cluster = m.job().cluster.clone();
    if state == ManagedState::Cancelled {
        crate::core::lifecycle::stop_drivers(sh.store(), &cluster).await?;
    }
    // The ending is recorded first, so a controller killed during the
    // teardown never runs a finished job again; the ended job's task (or
    // the next controller's) removes a cluster it still has (a finalizer).
    let j = m.job();
    let was = j.state;
    let now = now_ms();
    if let (Some(since), Some(p)) = (j.running_since, j.price_per_hour) {
        j.cost_so_far += p * ((now - since).max(0) as f64 / 3_600_000.0);
    }
    j.running_since = None;
    if let Some(since) = j.work_since.take() {
        j.work_done_ms += (now - since).max(0);
    }
    j.state = state;
    j.detail = Some(why.to_string());
    let id = j.id;
    remove_secrets(&sh.store().managed_dir(id));
    m.save(sh, was, why)?;
    m.reach = None;
    teardown_cluster(sh, &cluster).await?;
    // The buckets this job made (persistent: false) go with it.
    match crate::core::storage::remove_buckets(sh.store(), &format!("job:{id}")).await {
        Ok(urls) => {
            for u in urls {
                sh.say(&format!("job {id}: deleted bucket {u}"));
            }
        }
        Err(e) => sh.say(&format!(
            "job {id}: a bucket it created could not be deleted: {e}"
        )),
    }
    // Its workdir and file mounts in jobs.bucket go too.
    if let Some(url) = m.task.as_ref().and_then(|t| t.job_files.clone()) {
        if let Err(e) = crate::core::storage::remove_job_files(&url).await {
            sh.say(&format!(
                "job {id}: its files in {url} could not be deleted: {e}"
            ));
        }
    }
    Ok(())
}

/// An ended job: removes the cluster it still holds (a controller died
/// between recording the ending and the teardown, or the teardown failed
/// and is due again), then its task ends.
async fn clean_up_ended(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let (id, cluster) = (m.id, m.job().cluster.clone());
    let Some(row) = sh.store().cluster(&cluster)? else {
        return Ok(Action::Done);
    };
    if let Some(t) = row.retry_at.filter(|t| *t > now_ms()) {
        return Ok(Action::at(t));
    }
    sh.say(&format!("job {id}: removing its leftover cluster"));
    teardown_cluster(sh, &cluster).await?;
    Ok(Action::Requeue(Duration::ZERO))
}

/// The zones a job lost nodes in (stored with the job as JSON).
fn blocks_of(job: &ManagedJob) -> Vec<Block> {
    serde_json::from_str(&job.blocks).unwrap_or_default()
}

/// Removes an ended job's secrets (nothing to do when there are none).
fn remove_secrets(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("secrets.json"));
}

/// Orders a plan by recovery strategy: `FAILOVER` tries the region just
/// lost first (other zones of it), `EAGER_NEXT_REGION` every other region
/// first. The optimizer's order holds within each part.
fn order_for(
    strategy: &str,
    plan: Vec<Candidate>,
    lost: Option<(String, String)>,
) -> Vec<Candidate> {
    let Some((cloud, region)) = lost else {
        return plan;
    };
    let (same, other): (Vec<Candidate>, Vec<Candidate>) = plan
        .into_iter()
        .partition(|c| c.cloud == cloud && c.region == region);
    if strategy.eq_ignore_ascii_case("FAILOVER") {
        same.into_iter().chain(other).collect()
    } else {
        other.into_iter().chain(same).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(cloud: &str, region: &str, zone: &str) -> Candidate {
        Candidate {
            cloud: cloud.into(),
            region: region.into(),
            zone: zone.into(),
            instance_type: "t".into(),
            accelerator: None,
            accelerator_count: 0.0,
            use_spot: true,
            nodes: 1,
            price_per_node_hour: 1.0,
            total_per_hour: 1.0,
            price_estimated: false,
            interruption: None,
            expected_cost_per_node_hour: None,
            vcpus: 1.0,
            memory_gib: 1.0,
            group: 0,
            spec: Default::default(),
        }
    }

    #[test]
    fn recovery_strategies_order_the_lost_region_first_or_last() {
        let plan = vec![
            cand("aws", "us-east-1", "us-east-1b"),
            cand("aws", "us-west-2", "us-west-2a"),
            cand("aws", "us-east-1", "us-east-1c"),
            cand("gcp", "us-central1", "us-central1-a"),
        ];
        let zones = |p: Vec<Candidate>| p.into_iter().map(|c| c.zone).collect::<Vec<_>>();
        let lost = Some(("aws".to_string(), "us-east-1".to_string()));
        // EAGER_NEXT_REGION never goes back to the region just lost while
        // another region has a candidate.
        assert_eq!(
            zones(order_for("EAGER_NEXT_REGION", plan.clone(), lost.clone())),
            ["us-west-2a", "us-central1-a", "us-east-1b", "us-east-1c"]
        );
        assert_eq!(
            zones(order_for("FAILOVER", plan.clone(), lost)),
            ["us-east-1b", "us-east-1c", "us-west-2a", "us-central1-a"]
        );
        assert_eq!(
            zones(order_for("FAILOVER", plan, None)),
            ["us-east-1b", "us-west-2a", "us-east-1c", "us-central1-a"]
        );
    }

    #[test]
    fn blocks_stored_by_earlier_versions_still_read() {
        let stored = r#"[{"cloud":"local","region":"local","zone":"local-a","at_ms":5,"until_ms":1796000000000,"reason":"preempted"}]"#;
        let blocks: Vec<Block> = serde_json::from_str(stored).unwrap();
        assert_eq!(blocks[0].zone.as_deref(), Some("local-a"));
        assert_eq!(blocks[0].at_ms, 5);
        assert_eq!(blocks[0].instance_type, None);
        let again = serde_json::to_string(&blocks).unwrap();
        assert!(again.contains(r#""until_ms":1796000000000"#), "{again}");
        assert!(blocks[0].covers(&cand("local", "local", "local-a")));
        assert!(!blocks[0].covers(&cand("local", "local", "local-b")));
    }

    #[test]
    fn a_step_due_in_the_past_runs_at_once() {
        assert_eq!(
            Action::at(now_ms() - 5_000),
            Action::Requeue(Duration::ZERO)
        );
        let Action::Requeue(d) = Action::at(now_ms() + 60_000) else {
            panic!("a requeue")
        };
        assert!(
            d > Duration::from_secs(59) && d <= Duration::from_secs(60),
            "{d:?}"
        );
    }
}
