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
//!
//! By concern: this file is the reconcile loop (the supervisor, the jobs'
//! tasks, one step each); `launch` finds a job its cluster and starts its
//! run; `observe` watches a run; `sync` keeps its checkpoint; `recovery`
//! ends a run, requeueing or finishing the job; `replace` recovers a gang
//! that lost some nodes by replacing only those.

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

mod launch;
mod observe;
mod recovery;
pub(crate) mod replace;
mod sync;

use launch::*;
use observe::*;
use recovery::*;
use replace::*;
use sync::*;

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
    /// What the last recovery kept, when it replaced only lost nodes.
    replaced: Option<Kept>,
    /// When the loss being recovered from was seen, when that was before
    /// the recovery began (a replacement tried first).
    loss_seen_at: Option<i64>,
}

/// Where the controller's lock and log live.
pub(crate) fn controller_paths(home: &Path) -> (PathBuf, PathBuf) {
    (
        home.join("locks").join("controller.lock"),
        home.join("jobs").join("controller.log"),
    )
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
        replaced: None,
        loss_seen_at: None,
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
            // A controller stopped between recording the loss and
            // recovering from it: the recovery starts again (a replacement
            // half done is finished: the provider keeps what it added).
            let why = job.detail.clone().unwrap_or_else(|| "preempted".into());
            if !replace_lost(sh, m).await? {
                requeue(sh, m, &why, true).await?;
            }
            Ok(Action::Requeue(Duration::ZERO))
        }
        _ => Ok(Action::Done),
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
