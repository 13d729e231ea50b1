//! The managed-job controller: one reconcile step per job per tick.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use gangway_provider::{ClusterName, NodeState};
use serde::{Deserialize, Serialize};

use super::policy::{Choice, PolicyKind, State};
use super::ManagedTask;
use crate::catalog::Catalog;
use crate::gang::{self, transport_for, Transport};
use crate::optimizer::{self, Block, Blocklist, Candidate, Options};
use crate::provision::{self, Providers, RetryPolicy, Silent};
use crate::state::{
    now_ms, ClusterStatus, JobStatus, ManagedJob, ManagedState, NewCluster, NodeRow, OwnerLock,
    Reserved, Store,
};

/// How long a zone that lost a node is avoided.
pub const BLOCK_TTL: Duration = Duration::from_secs(600);
/// Time between reconcile rounds.
pub const TICK: Duration = Duration::from_millis(200);
/// How often a deadline policy reconsiders a running job's market.
const DECIDE_EVERY: Duration = Duration::from_secs(2);
/// Restart overhead assumed before a job has restarted once.
const DEFAULT_OVERHEAD_S: f64 = 30.0;
/// How often a running job's nodes are checked with the provider.
const DESCRIBE_EVERY: Duration = Duration::from_secs(1);
/// Backoff when no placement has capacity during a recovery.
const NO_CAPACITY_BACKOFF_MS: i64 = 5_000;
/// Backoff after an unexpected error in a step.
const ERROR_BACKOFF_MS: i64 = 2_000;
/// How often ended jobs' leftover clusters are looked for.
const LEFTOVER_SWEEP: Duration = Duration::from_secs(2);

/// A zone the job lost a node in.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BlockRec {
    cloud: String,
    region: String,
    zone: String,
    at_ms: i64,
    until_ms: i64,
    reason: String,
}

/// When the controller stops.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// When no managed job is left to watch (after a short quiet spell).
    Idle,
    /// When this job has ended (the `--wait` mode).
    Job(i64),
}

/// The controller's state between rounds.
pub struct Controller {
    home: PathBuf,
    store: Store,
    providers: Providers,
    catalog: Catalog,
    log: Option<std::fs::File>,
    described: std::collections::HashMap<i64, std::time::Instant>,
    decided: std::collections::HashMap<i64, std::time::Instant>,
    no_spot: std::collections::HashSet<i64>,
    transports: std::collections::HashMap<String, Reach>,
}

/// A cluster's transport, kept between passes so SSH connections (one
/// master per node) are made once, not on every look at a job.
struct Reach {
    ids: Vec<String>,
    transport: std::sync::Arc<dyn Transport>,
    connected: bool,
    tried: Option<std::time::Instant>,
}

/// How long after a failed connection the controller tries again.
const RECONNECT_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the controller's lock and log live.
pub fn controller_paths(home: &Path) -> (PathBuf, PathBuf) {
    (
        home.join("locks").join("controller.lock"),
        home.join("jobs").join("controller.log"),
    )
}

fn parse_placement(p: &str) -> Option<(String, String, String)> {
    let loc = p.split_whitespace().next()?;
    let mut it = loc.splitn(3, '/');
    Some((
        it.next()?.to_string(),
        it.next()?.to_string(),
        it.next()?.to_string(),
    ))
}

fn exit_code_in(detail: &str) -> Option<i32> {
    let i = detail.find("exited with code ")?;
    detail[i + "exited with code ".len()..]
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()?
        .parse()
        .ok()
}

impl Controller {
    /// A controller for `home`.
    pub fn new(home: &Path) -> Result<Controller, crate::Error> {
        let store = Store::open(home)?;
        let mut catalog = Catalog::embedded();
        if let Some(dir) = std::env::var_os("GANGWAY_CATALOG_DIR").filter(|d| !d.is_empty()) {
            catalog.overlay(Catalog::load_dir(Path::new(&dir))?);
        }
        if let Some(inv) = crate::inventory::load(home)? {
            catalog.overlay(inv.catalog());
        }
        if let Some(s) = crate::slurm_clusters::load(home)? {
            catalog.overlay(s.catalog());
        }
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
            home: home.to_path_buf(),
            store,
            providers: Providers::new(home),
            catalog,
            log,
            described: Default::default(),
            transports: Default::default(),
            decided: Default::default(),
            no_spot: Default::default(),
        })
    }

    fn say(&mut self, line: &str) {
        if let Some(f) = self.log.as_mut() {
            let _ = writeln!(f, "{} {line}", now_ms());
        }
    }

    /// Reconciles every live job, round after round, until `until`.
    pub async fn run(&mut self, until: Until) -> Result<(), crate::Error> {
        self.say(&format!("controller {} started", std::process::id()));
        if let Err(e) = self.clean_up_ended(true).await {
            self.say(&format!("cleanup: {e}"));
        }
        let mut quiet_since: Option<std::time::Instant> = None;
        let mut swept = std::time::Instant::now();
        loop {
            let jobs = self.store.managed_active()?;
            // Ended jobs whose teardown failed keep the controller alive
            // (and are retried when due) until their clusters are gone.
            if swept.elapsed() >= LEFTOVER_SWEEP {
                swept = std::time::Instant::now();
                if let Err(e) = self.clean_up_ended(false).await {
                    self.say(&format!("cleanup: {e}"));
                }
            }
            match until {
                Until::Job(id) => {
                    // The job's own teardown is waited for, but one that
                    // failed is left to a detached controller's retries.
                    if !jobs.iter().any(|j| j.id == id) && !self.tearing_down(id)? {
                        break;
                    }
                }
                Until::Idle => {
                    if jobs.is_empty() && self.leftovers()?.is_empty() {
                        let t = *quiet_since.get_or_insert_with(std::time::Instant::now);
                        if t.elapsed() > Duration::from_secs(3) {
                            break;
                        }
                    } else {
                        quiet_since = None;
                    }
                }
            }
            // Runs whose driver died are marked (and their ranks stopped)
            // once per round, not once per job.
            gang::reap(&self.store)?;
            for job in jobs {
                let id = job.id;
                if let Err(e) = self.reconcile(job).await {
                    self.say(&format!("job {id}: {e}"));
                    if let Some(mut j) = self.store.managed(id)? {
                        let was = j.state;
                        // A failed teardown has its own, longer backoff.
                        let retry = self
                            .store
                            .cluster(&j.cluster)?
                            .and_then(|c| c.retry_at)
                            .filter(|t| *t > now_ms());
                        j.next_try_at = Some(retry.unwrap_or(now_ms() + ERROR_BACKOFF_MS));
                        j.detail = Some(e.to_string());
                        self.store.save_managed(&j, was, "")?;
                    }
                }
            }
            tokio::time::sleep(TICK).await;
        }
        self.say(&format!("controller {} stopped", std::process::id()));
        Ok(())
    }

    fn task_of(&self, job: &ManagedJob) -> Result<ManagedTask, crate::Error> {
        serde_json::from_str(&job.task).map_err(|e| {
            crate::Error::usage(
                format!("managed job {}: unreadable task: {e}", job.id),
                None,
            )
        })
    }

    /// The job's secret values. A task that has secrets and no readable
    /// file of them is an error: a run without its secrets is not the run
    /// the user launched.
    fn secrets_of(
        &self,
        job: &ManagedJob,
        mt: &ManagedTask,
    ) -> Result<Vec<(String, String)>, String> {
        let path = self.store.managed_dir(job.id).join("secrets.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && mt.spec.secret_names.is_empty() =>
            {
                return Ok(Vec::new())
            }
            Err(e) => {
                return Err(format!(
                    "cannot read the job's secrets ({}): {e}; the run needs {}",
                    path.display(),
                    mt.spec.secret_names.join(", ")
                ))
            }
        };
        let secrets: Vec<(String, String)> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the job's secrets file {} is damaged (line {}, column {}); the run needs {}",
                path.display(),
                e.line(),
                e.column(),
                mt.spec.secret_names.join(", ")
            )
        })?;
        let missing: Vec<&str> = mt
            .spec
            .secret_names
            .iter()
            .filter(|n| !secrets.iter().any(|(k, _)| k == *n))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the job's secrets file {} lacks {}",
                path.display(),
                missing.join(", ")
            ));
        }
        Ok(secrets)
    }

    /// One step for one job.
    async fn reconcile(&mut self, mut job: ManagedJob) -> Result<(), crate::Error> {
        let mt = self.task_of(&job)?;
        if job.desired == "cancel" {
            return self
                .finish(&mut job, ManagedState::Cancelled, "cancelled by the user")
                .await;
        }
        if job.next_try_at.is_some_and(|t| now_ms() < t) {
            return Ok(());
        }
        match job.state {
            ManagedState::Pending => {
                let was = job.state;
                job.state = ManagedState::Provisioning;
                self.store
                    .save_managed(&job, was, "looking for a placement")?;
                Ok(())
            }
            ManagedState::Provisioning | ManagedState::Recovering => {
                self.provision_and_submit(&mut job, &mt).await
            }
            ManagedState::Starting | ManagedState::Running => self.observe(&mut job, &mt).await,
            ManagedState::Preempted => {
                let why = job.detail.clone().unwrap_or_else(|| "preempted".into());
                self.requeue(&mut job, &mt, &why, true).await
            }
            _ => Ok(()),
        }
    }

    /// The failover plan for the job now: blocked zones avoided (the
    /// oldest block is dropped when everything is blocked), ordered by the
    /// recovery strategy.
    fn plan(
        &self,
        job: &ManagedJob,
        mt: &ManagedTask,
        spot: Option<bool>,
    ) -> Result<Vec<Candidate>, String> {
        let args = crate::cli::TaskArgs {
            task: mt.task_file.clone(),
            infra: mt.infra.clone(),
            gpus: mt.gpus.clone(),
            cpus: mt.cpus.clone(),
            memory: mt.memory.clone(),
            instance_type: mt.instance_type.clone(),
            num_nodes: mt.num_nodes,
            use_spot: mt.use_spot,
            env: Vec::new(),
            env_file: None,
            secret: Vec::new(),
            secret_file: None,
        };
        let mut task = args.load().map_err(|e| e.to_string())?;
        if let Some(spot) = spot {
            // The deadline policy picked the market.
            task.resources.base.use_spot = Some(spot);
            if let crate::spec::Choice::AnyOf(items) | crate::spec::Choice::Ordered(items) =
                &mut task.resources.choice
            {
                for i in items {
                    i.use_spot = Some(spot);
                }
            }
        }
        let now = now_ms();
        let mut blocks: Vec<BlockRec> = serde_json::from_str(&job.blocks).unwrap_or_default();
        blocks.retain(|b| b.until_ms > now);
        let opts = Options::default();
        loop {
            let list = Blocklist {
                entries: blocks
                    .iter()
                    .map(|b| Block {
                        cloud: b.cloud.clone(),
                        region: Some(b.region.clone()),
                        zone: Some(b.zone.clone()),
                        instance_type: None,
                        until: UNIX_EPOCH + Duration::from_millis(b.until_ms as u64),
                        reason: b.reason.clone(),
                    })
                    .collect(),
            };
            match optimizer::optimize(&task, &self.catalog, &list, &opts) {
                Ok(plan) => {
                    let lost_region = blocks
                        .iter()
                        .max_by_key(|b| b.at_ms)
                        .map(|b| (b.cloud.clone(), b.region.clone()));
                    return Ok(order_for(&mt.strategy, plan, lost_region));
                }
                Err(e) if blocks.is_empty() => return Err(e.to_string()),
                Err(_) => {
                    // Everything left is blocked: the zone lost longest ago
                    // is the best bet.
                    let oldest = blocks
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, b)| b.at_ms)
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    blocks.remove(oldest);
                }
            }
        }
    }

    async fn provision_and_submit(
        &mut self,
        job: &mut ManagedJob,
        mt: &ManagedTask,
    ) -> Result<(), crate::Error> {
        let was = job.state;
        let Ok(lock) = self.store.lock_cluster(&job.cluster, "recovering") else {
            return Ok(()); // someone else works on it; next round
        };
        let config = crate::spec::load(&mt.task_file)
            .ok()
            .and_then(|t| t.config.map(|c| c.to_string()));
        let token = format!("{}-{}", job.cluster, job.restart_count);
        let reserved = self.store.reserve_cluster(&NewCluster {
            name: &job.cluster,
            num_nodes: mt.spec.num_nodes,
            client_token: &token,
            provider_config: config,
        })?;
        let row = match reserved {
            Reserved::Existing(row) if row.status == ClusterStatus::Up => row,
            Reserved::Existing(row) => {
                // A teardown that failed is tried again when it is due,
                // not on every round.
                if let Some(t) = row.retry_at.filter(|t| *t > now_ms()) {
                    let was = job.state;
                    job.next_try_at = Some(t);
                    self.store.save_managed(job, was, "")?;
                    return Ok(());
                }
                // Stopped or half torn down: remove it and start afresh.
                if let Err(e) =
                    provision::teardown(&self.store, &job.cluster, &self.providers).await
                {
                    return Err(crate::Error::leftover(&self.store, &job.cluster, e));
                }
                return Ok(());
            }
            Reserved::New(row) | Reserved::Resumed(row) => {
                let market = self.market_choice(job, mt, Choice::Idle);
                if market == Some(Choice::Idle) {
                    // The policy would rather wait for spot than pay now.
                    self.store.remove_cluster(&job.cluster)?;
                    job.next_try_at = Some(now_ms() + DECIDE_EVERY.as_millis() as i64);
                    job.detail = Some("deadline policy: waiting for spot capacity".into());
                    self.store.save_managed(job, was, "")?;
                    return Ok(());
                }
                let spot = market.map(|c| c == Choice::Spot);
                let plan = match self.plan(job, mt, spot) {
                    Ok(p) => p,
                    Err(why) => {
                        self.store.remove_cluster(&job.cluster)?;
                        if spot == Some(true) {
                            self.no_spot.insert(job.id);
                        }
                        return self.no_capacity(job, &why).await;
                    }
                };
                let started = now_ms();
                let result = provision::provision(
                    &self.store,
                    &row,
                    &plan,
                    &self.providers,
                    &Silent,
                    RetryPolicy::default(),
                    provision::Contact::Now,
                )
                .await;
                match result {
                    Ok(p) => {
                        self.store
                            .set_nodes(&job.cluster, ClusterStatus::Up, &p.nodes)?;
                        self.say(&format!(
                            "job {}: provisioned {} in {} ms",
                            job.id,
                            job.cluster,
                            now_ms() - started
                        ));
                        self.store.cluster(&job.cluster)?.expect("just set up")
                    }
                    Err(provision::ProvisionError::Exhausted { attempts, .. }) => {
                        self.store.remove_cluster(&job.cluster)?;
                        if spot == Some(true) {
                            self.no_spot.insert(job.id);
                        }
                        let why = attempts
                            .iter()
                            .map(|a| format!("{}/{}/{}: {}", a.cloud, a.region, a.zone, a.outcome))
                            .collect::<Vec<_>>()
                            .join("; ");
                        return self.no_capacity(job, &why).await;
                    }
                    // The cluster stays TERMINATING (something may still
                    // run there); the next round tears it down first.
                    Err(e @ provision::ProvisionError::Leftover { .. }) => {
                        return Err(crate::Error::leftover(&self.store, &job.cluster, e));
                    }
                    Err(e) => {
                        self.store.remove_cluster(&job.cluster)?;
                        drop(lock);
                        return self.finish(job, ManagedState::Failed, &e.to_string()).await;
                    }
                }
            }
        };
        drop(lock);
        // A run already on the cluster (the controller died right after
        // submitting it) is adopted, never doubled.
        let existing = self
            .store
            .jobs(&job.cluster)?
            .into_iter()
            .rfind(|j| !j.status.is_terminal());
        let runs = self.store.managed_dir(job.id).join("runs");
        let inner = match existing {
            Some(j) => {
                let listed = std::fs::read_to_string(&runs)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.trim() == j.id.to_string());
                if !listed {
                    if let Ok(mut f) = std::fs::File::options()
                        .create(true)
                        .append(true)
                        .open(&runs)
                    {
                        let _ = writeln!(f, "{}", j.id);
                    }
                }
                j.id
            }
            None => {
                let mut spec = mt.spec.clone();
                spec.job_id = Some(job.id.to_string());
                spec.restart_count = job.restart_count;
                spec.gpus_per_node = row.accelerator_count.ceil() as u32;
                spec.restore_from = mt.storage.is_dir().then(|| mt.storage.clone());
                let secrets = match self.secrets_of(job, mt) {
                    Ok(s) => s,
                    Err(why) => return self.finish(job, ManagedState::Failed, &why).await,
                };
                let id = gang::submit(&self.store, &self.home, &job.cluster, &spec, &secrets)?;
                if let Ok(mut f) = std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&runs)
                {
                    let _ = writeln!(f, "{id}");
                }
                id
            }
        };
        let placement = format!(
            "{}/{}/{} {}{}",
            row.cloud.as_deref().unwrap_or("-"),
            row.region.as_deref().unwrap_or("-"),
            row.zone.as_deref().unwrap_or("-"),
            row.instance_type.as_deref().unwrap_or("-"),
            if row.use_spot { " spot" } else { "" }
        );
        if row.use_spot {
            self.no_spot.remove(&job.id);
        }
        job.market = Some(if row.use_spot { "spot" } else { "on-demand" }.into());
        job.inner_job = Some(inner);
        job.placement = Some(placement);
        job.price_per_hour = row.price_per_hour;
        job.running_since = Some(now_ms());
        job.notice_at = None;
        job.next_try_at = None;
        job.detail = None;
        job.state = ManagedState::Starting;
        self.store
            .save_managed(job, was, &format!("cluster up; run {inner} submitted"))?;
        Ok(())
    }

    async fn no_capacity(&mut self, job: &mut ManagedJob, why: &str) -> Result<(), crate::Error> {
        let policy_may_switch = mt_has_policy(&job.task) && self.no_spot.contains(&job.id);
        if job.state == ManagedState::Provisioning && job.restart_count == 0 && !policy_may_switch {
            return self
                .finish(
                    job,
                    ManagedState::FailedNoResource,
                    &format!("no placement: {why}"),
                )
                .await;
        }
        let was = job.state;
        job.next_try_at = Some(now_ms() + NO_CAPACITY_BACKOFF_MS);
        job.detail = Some(format!("waiting for capacity: {why}"));
        self.store.save_managed(job, was, "")?;
        Ok(())
    }

    async fn nodes_and_transport(
        &mut self,
        job: &ManagedJob,
    ) -> Option<(Vec<NodeRow>, std::sync::Arc<dyn Transport>)> {
        let Some(row) = self.store.cluster(&job.cluster).ok().flatten() else {
            self.transports.remove(&job.cluster);
            return None;
        };
        let cloud = row.cloud.clone()?;
        let nodes = self.store.nodes(&job.cluster).ok()?;
        let ids: Vec<String> = nodes.iter().map(|n| n.instance_id.clone()).collect();
        let same = self
            .transports
            .get(&job.cluster)
            .is_some_and(|r| r.ids == ids);
        if !same {
            let t = transport_for(&cloud, &self.home, &job.cluster)?;
            self.transports.insert(
                job.cluster.clone(),
                Reach {
                    ids,
                    transport: std::sync::Arc::from(t),
                    connected: cloud == "local",
                    tried: None,
                },
            );
        }
        let reach = self.transports.get_mut(&job.cluster)?;
        if !reach.connected && reach.tried.is_none_or(|t| t.elapsed() > RECONNECT_AFTER) {
            reach.tried = Some(std::time::Instant::now());
            reach.connected = reach.transport.connect(&nodes).await.is_ok();
        }
        Some((nodes, std::sync::Arc::clone(&reach.transport)))
    }

    async fn observe(
        &mut self,
        job: &mut ManagedJob,
        mt: &ManagedTask,
    ) -> Result<(), crate::Error> {
        let was = job.state;
        let Some(inner_id) = job.inner_job else {
            job.state = ManagedState::Recovering;
            self.store
                .save_managed(job, was, "no run recorded; starting one")?;
            return Ok(());
        };
        let Some(inner) = self.store.job(inner_id)? else {
            job.detail = Some("the job's cluster disappeared".into());
            return self.preempted(job, "the job's cluster disappeared").await;
        };
        if inner.status == JobStatus::Running && job.state == ManagedState::Starting {
            job.state = ManagedState::Running;
            job.work_since = Some(now_ms());
            let reason = match job.recovery_started_at.take() {
                Some(t) => format!(
                    "resumed {:.1} s after the loss (restart {})",
                    (now_ms() - t) as f64 / 1000.0,
                    job.restart_count
                ),
                None => "every rank runs".into(),
            };
            self.store.save_managed(job, was, &reason)?;
            return Ok(());
        }
        let Some((nodes, transport)) = self.nodes_and_transport(job).await else {
            return self.preempted(job, "the job's cluster disappeared").await;
        };
        if !inner.status.is_terminal() {
            // 1. The provider's advance notice: checkpoint now.
            if job.notice_at.is_none() {
                let notice = nodes
                    .iter()
                    .find_map(|n| transport.preemption_notice(n).map(|w| (n.rank, w)));
                if let Some((rank, words)) = notice {
                    job.notice_at = Some(now_ms());
                    self.signal_ranks(transport.as_ref(), &nodes, inner_id, mt.signal);
                    let reason = format!(
                        "preemption notice on rank {rank} ({words}); signal {} sent, {} s to checkpoint",
                        mt.signal, mt.grace_s
                    );
                    self.store.managed_event(
                        job.id,
                        "NOTICE",
                        job.placement.as_deref(),
                        &reason,
                    )?;
                    self.store.save_managed(job, was, "")?;
                    return Ok(());
                }
            }
            if let Some(t) = job.notice_at {
                if (now_ms() - t) as f64 > mt.grace_s * 1000.0 {
                    if is_move(job) {
                        return self
                            .requeue(job, mt, "moved by the deadline policy", false)
                            .await;
                    }
                    return self
                        .preempted(job, "the grace period after the notice ran out")
                        .await;
                }
                return Ok(());
            }
            // The deadline policy may want the other market.
            if inner.status == JobStatus::Running
                && self.reconsider(job, mt, &nodes, transport.as_ref(), inner_id)?
            {
                return Ok(());
            }
            // 2. The provider took a node without notice (asked at most
            // every DESCRIBE_EVERY per job: the ranks dying tells us sooner).
            let due = self
                .described
                .get(&job.id)
                .is_none_or(|t| t.elapsed() >= DESCRIBE_EVERY);
            if due {
                self.described.insert(job.id, std::time::Instant::now());
                if let Some(why) = self.lost_node(job, &nodes).await {
                    return self.preempted(job, &why).await;
                }
            }
            // 3. Keep the checkpoint fresh.
            let due = job
                .last_sync_at
                .is_none_or(|t| (now_ms() - t) as f64 >= mt.sync_interval_s * 1000.0);
            if due && inner.status == JobStatus::Running {
                if let Ok(t) = self.sync(mt, &nodes, transport.as_ref()) {
                    job.last_sync_at = Some(t);
                    self.store.save_managed(job, was, "")?;
                }
            }
            return Ok(());
        }
        // The run ended.
        let detail = inner.detail.clone().unwrap_or_default();
        if job.notice_at.is_some() {
            // It ended because we asked it to checkpoint: keep that.
            if let Ok(t) = self.sync(mt, &nodes, transport.as_ref()) {
                job.last_sync_at = Some(t);
            }
            if is_move(job) {
                return self
                    .requeue(
                        job,
                        mt,
                        "checkpointed for the deadline policy's move",
                        false,
                    )
                    .await;
            }
            return self
                .preempted(job, "checkpointed on the preemption notice")
                .await;
        }
        match inner.status {
            JobStatus::Succeeded => {
                if let Ok(t) = self.sync(mt, &nodes, transport.as_ref()) {
                    job.last_sync_at = Some(t);
                }
                // A scheduler that signals the ranks itself (Slurm's
                // GraceTime) can have them checkpoint and exit 0 before the
                // notice was seen here: that is a preemption, not the end.
                if let Some((rank, words)) = nodes
                    .iter()
                    .find_map(|n| transport.preemption_notice(n).map(|w| (n.rank, w)))
                {
                    return self
                        .preempted(
                            job,
                            &format!("the ranks ended on a preemption (rank {rank}: {words})"),
                        )
                        .await;
                }
                self.finish(job, ManagedState::Succeeded, "every rank exited 0")
                    .await
            }
            JobStatus::FailedSetup => self.finish(job, ManagedState::FailedSetup, &detail).await,
            _ => {
                if let Some(why) = self.lost_node(job, &nodes).await {
                    return self.preempted(job, &why).await;
                }
                if detail.contains("preempted") {
                    return self.preempted(job, &detail).await;
                }
                let code = exit_code_in(&detail);
                if code.is_some_and(|c| mt.recover_on_exit_codes.contains(&c)) {
                    job.detail = Some(detail.clone());
                    return self
                        .requeue(
                            job,
                            mt,
                            &format!("{detail} (a recoverable exit code)"),
                            false,
                        )
                        .await;
                }
                if job.restarts_on_errors < mt.max_restarts_on_errors {
                    job.restarts_on_errors += 1;
                    job.detail = Some(detail.clone());
                    return self
                        .requeue(
                            job,
                            mt,
                            &format!(
                                "{detail} (restart {} of {} on errors)",
                                job.restarts_on_errors, mt.max_restarts_on_errors
                            ),
                            false,
                        )
                        .await;
                }
                self.finish(job, ManagedState::Failed, &detail).await
            }
        }
    }

    /// What the deadline policy would run the job on now, if the task has
    /// one (`deadline: {within, work}`); `running` is the current market.
    fn market_choice(&self, job: &ManagedJob, mt: &ManagedTask, running: Choice) -> Option<Choice> {
        let (deadline, work) = (mt.deadline_s?, mt.work_s?);
        let kind = match mt.policy.as_deref() {
            Some("greedy") => PolicyKind::Greedy,
            Some("on_demand") => PolicyKind::AlwaysOnDemand,
            _ => PolicyKind::UniformProgress,
        };
        let now = now_ms();
        let current = job.work_since.map_or(0, |s| (now - s).max(0));
        let state = State {
            elapsed: (now - job.submitted_at).max(0) as f64 / 1000.0,
            work_done: (job.work_done_ms + current) as f64 / 1000.0,
            job_length: work,
            deadline,
            restart_overhead: self.overhead_estimate(job),
            tick: DECIDE_EVERY.as_secs_f64(),
            spot_available: running == Choice::Spot || !self.no_spot.contains(&job.id),
            running,
            overhead_left: 0.0,
        };
        Some(kind.build().decide(&state))
    }

    /// The last run's time from looking for a cluster to every rank
    /// running: the restart overhead the policy plans with.
    fn overhead_estimate(&self, job: &ManagedJob) -> f64 {
        let Ok(events) = self.store.managed_events(job.id) else {
            return DEFAULT_OVERHEAD_S;
        };
        let mut began = None;
        let mut last = None;
        for e in &events {
            match e.state.as_str() {
                "PROVISIONING" | "RECOVERING" => began = Some(e.at),
                "RUNNING" => {
                    if let Some(b) = began.take() {
                        last = Some((e.at - b) as f64 / 1000.0);
                    }
                }
                _ => {}
            }
        }
        last.map_or(DEFAULT_OVERHEAD_S, |s| s.max(1.0))
    }

    /// Asks the deadline policy whether the running job should change
    /// market; if so, tells the run to checkpoint (as on a notice) and
    /// marks the move. Returns whether it acted.
    fn reconsider(
        &mut self,
        job: &mut ManagedJob,
        mt: &ManagedTask,
        nodes: &[NodeRow],
        transport: &dyn Transport,
        inner: i64,
    ) -> Result<bool, crate::Error> {
        if self
            .decided
            .get(&job.id)
            .is_some_and(|t| t.elapsed() < DECIDE_EVERY)
        {
            return Ok(false);
        }
        self.decided.insert(job.id, std::time::Instant::now());
        let running = match job.market.as_deref() {
            Some("spot") => Choice::Spot,
            Some("on-demand") => Choice::OnDemand,
            _ => return Ok(false),
        };
        let Some(want) = self.market_choice(job, mt, running) else {
            return Ok(false);
        };
        if want == running || want == Choice::Idle {
            return Ok(false);
        }
        let was = job.state;
        let to = if want == Choice::Spot {
            "spot"
        } else {
            "on-demand"
        };
        job.market = Some(format!("->{to}"));
        job.notice_at = Some(now_ms());
        self.signal_ranks(transport, nodes, inner, mt.signal);
        let reason = format!(
            "deadline policy: moving to {to} ({:.0} s of {:.0} s of work kept, {:.0} s to the deadline)",
            job.work_done_ms as f64 / 1000.0,
            mt.work_s.unwrap_or(0.0),
            mt.deadline_s.unwrap_or(0.0) - (now_ms() - job.submitted_at) as f64 / 1000.0
        );
        self.store
            .managed_event(job.id, "MOVE", job.placement.as_deref(), &reason)?;
        self.store.save_managed(job, was, "")?;
        Ok(true)
    }

    /// What the provider says about nodes gone without notice.
    async fn lost_node(&self, job: &ManagedJob, nodes: &[NodeRow]) -> Option<String> {
        let cloud = self.store.cluster(&job.cluster).ok()??.cloud?;
        let p = self.providers.get(&cloud)?;
        let seen = p.describe(&ClusterName(job.cluster.clone())).await.ok()?;
        for n in nodes {
            match seen.iter().find(|s| s.id.0 == n.instance_id) {
                None => return Some(format!("node {} (rank {}) is gone", n.instance_id, n.rank)),
                Some(s) => {
                    if let NodeState::Preempted { reason } = &s.state {
                        return Some(format!(
                            "node {} (rank {}) was preempted: {reason}",
                            n.instance_id, n.rank
                        ));
                    }
                    if s.state == NodeState::Terminated {
                        return Some(format!(
                            "node {} (rank {}) was terminated",
                            n.instance_id, n.rank
                        ));
                    }
                }
            }
        }
        None
    }

    fn signal_ranks(&self, transport: &dyn Transport, nodes: &[NodeRow], inner: i64, sig: i32) {
        gang::signal_run(&self.store, transport, nodes, inner, sig);
    }

    /// Copies every node's checkpoint directory into the kept one,
    /// atomically (a failed copy keeps the previous one), then tells the
    /// nodes (`.gangway-synced` holds the time the copy began: everything
    /// written before it is kept). Returns that time.
    fn sync(
        &self,
        mt: &ManagedTask,
        nodes: &[NodeRow],
        transport: &dyn Transport,
    ) -> Result<i64, String> {
        let started = now_ms();
        let storage = &mt.storage;
        let name = storage
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = storage.parent().unwrap_or(Path::new("."));
        let tmp = parent.join(format!("{name}.partial"));
        let old = parent.join(format!("{name}.old"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
        let ck = mt
            .spec
            .checkpoint_dir
            .as_deref()
            .unwrap_or(gang::DEFAULT_CHECKPOINT_DIR);
        for n in nodes {
            // The path is the node's: only the transport can tell whether
            // it exists there (over SSH it is not on this machine).
            let path = transport.node_path(n, ck);
            transport
                .download(n, &path, &tmp)
                .map_err(|e| e.to_string())?;
        }
        let _ = std::fs::remove_dir_all(&old);
        if storage.exists() {
            std::fs::rename(storage, &old).map_err(|e| e.to_string())?;
        }
        std::fs::rename(&tmp, storage).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&old);
        for n in nodes {
            let path = format!("{}/.gangway-synced", transport.node_path(n, ck));
            let _ = transport.write_file(n, &path, started.to_string().as_bytes());
        }
        Ok(started)
    }

    async fn teardown_cluster(&mut self, job: &ManagedJob) -> Result<(), crate::Error> {
        if self.store.cluster(&job.cluster)?.is_none() {
            return Ok(());
        }
        // Wait for a launcher or another teardown to let go.
        let lock = OwnerLock::acquire(
            &self
                .home
                .join("locks")
                .join(format!("cluster-{}.lock", job.cluster)),
            Duration::from_secs(30),
        )?;
        if lock.is_none() {
            return Err(crate::Error::usage(
                format!("cluster {} stays busy; will retry", job.cluster),
                None,
            ));
        }
        provision::teardown(&self.store, &job.cluster, &self.providers).await?;
        Ok(())
    }

    async fn preempted(&mut self, job: &mut ManagedJob, why: &str) -> Result<(), crate::Error> {
        let was = job.state;
        job.state = ManagedState::Preempted;
        job.detail = Some(why.to_string());
        self.store.save_managed(job, was, why)?;
        let mt = self.task_of(job)?;
        if mt.strategy.eq_ignore_ascii_case("NONE") {
            return self
                .finish(
                    job,
                    ManagedState::Failed,
                    &format!("{why}; job_recovery is NONE"),
                )
                .await;
        }
        self.requeue(job, &mt, why, true).await
    }

    /// Tears the cluster down and goes back to finding one. A preemption
    /// blocks the zone it happened in for [`BLOCK_TTL`].
    async fn requeue(
        &mut self,
        job: &mut ManagedJob,
        _mt: &ManagedTask,
        why: &str,
        preempted: bool,
    ) -> Result<(), crate::Error> {
        let was = job.state;
        let lost_at = job.notice_at.unwrap_or_else(now_ms);
        let lost_work = match (job.notice_at, job.last_sync_at) {
            (Some(_), _) => "none (checkpointed on notice)".to_string(),
            (None, Some(t)) => format!(
                "up to {:.1} s since the last sync",
                (now_ms() - t) as f64 / 1000.0
            ),
            (None, None) => "everything since the start of this run (no sync yet)".to_string(),
        };
        // Progress this run kept: all of it when it checkpointed on request,
        // up to the last kept checkpoint otherwise.
        if let Some(since) = job.work_since {
            let kept_until = if job.notice_at.is_some() {
                now_ms()
            } else {
                job.last_sync_at.unwrap_or(since)
            };
            job.work_done_ms += (kept_until - since).max(0);
        }
        job.work_since = None;
        if let Some(m) = job.market.as_deref().and_then(|m| m.strip_prefix("->")) {
            job.market = Some(m.to_string());
        }
        self.teardown_cluster(job).await?;
        let now = now_ms();
        if preempted {
            if let Some((cloud, region, zone)) = job.placement.as_deref().and_then(parse_placement)
            {
                let mut blocks: Vec<BlockRec> =
                    serde_json::from_str(&job.blocks).unwrap_or_default();
                blocks.retain(|b| b.until_ms > now && !(b.cloud == cloud && b.zone == zone));
                blocks.push(BlockRec {
                    cloud,
                    region,
                    zone,
                    at_ms: now,
                    until_ms: now + BLOCK_TTL.as_millis() as i64,
                    reason: why.to_string(),
                });
                job.blocks = serde_json::to_string(&blocks).unwrap_or_else(|_| "[]".into());
            }
            job.preemptions += 1;
        }
        if let (Some(since), Some(p)) = (job.running_since, job.price_per_hour) {
            job.cost_so_far += p * ((now - since).max(0) as f64 / 3_600_000.0);
        }
        job.running_since = None;
        job.price_per_hour = None;
        job.inner_job = None;
        job.notice_at = None;
        job.last_sync_at = None;
        job.restart_count += 1;
        job.recovery_started_at = Some(lost_at);
        job.state = ManagedState::Recovering;
        self.store.save_managed(
            job,
            was,
            &format!("requeued after: {why}; work lost: {lost_work}"),
        )?;
        Ok(())
    }

    async fn finish(
        &mut self,
        job: &mut ManagedJob,
        state: ManagedState,
        why: &str,
    ) -> Result<(), crate::Error> {
        let was = job.state;
        if state == ManagedState::Cancelled {
            crate::provision::stop_drivers(&self.store, &job.cluster)?;
        }
        // The ending is recorded first, so a controller killed during the
        // teardown never runs a finished job again; the cleanup pass in
        // `run` removes a cluster a terminal job still has (a finalizer).
        let now = now_ms();
        if let (Some(since), Some(p)) = (job.running_since, job.price_per_hour) {
            job.cost_so_far += p * ((now - since).max(0) as f64 / 3_600_000.0);
        }
        job.running_since = None;
        if let Some(since) = job.work_since.take() {
            job.work_done_ms += (now - since).max(0);
        }
        job.state = state;
        job.detail = Some(why.to_string());
        remove_secrets(&self.store.managed_dir(job.id));
        self.store.save_managed(job, was, why)?;
        self.teardown_cluster(job).await
    }

    /// Whether the ended job `id` still has a cluster whose teardown has
    /// not failed yet.
    fn tearing_down(&self, id: i64) -> Result<bool, crate::Error> {
        let Some(job) = self.store.managed(id)? else {
            return Ok(false);
        };
        Ok(self
            .store
            .cluster(&job.cluster)?
            .is_some_and(|c| c.teardown_failures == 0))
    }

    /// Ended jobs that still have a cluster.
    fn leftovers(&self) -> Result<Vec<i64>, crate::Error> {
        let names: std::collections::HashSet<String> =
            self.store.clusters()?.into_iter().map(|c| c.name).collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .store
            .managed_all()?
            .into_iter()
            .filter(|j| j.state.is_terminal() && names.contains(&j.cluster))
            .map(|j| j.id)
            .collect())
    }

    /// Removes clusters that ended jobs still hold (a controller died
    /// between recording the ending and the teardown, or the teardown
    /// failed and is due again), and the secrets of every ended job.
    async fn clean_up_ended(&mut self, startup: bool) -> Result<(), crate::Error> {
        let now = now_ms();
        let mut first_err = None;
        for job in self.store.managed_all()? {
            if !job.state.is_terminal() {
                continue;
            }
            if startup {
                remove_secrets(&self.store.managed_dir(job.id));
            }
            let Some(row) = self.store.cluster(&job.cluster)? else {
                continue;
            };
            if row.retry_at.is_some_and(|t| t > now) {
                continue;
            }
            self.say(&format!("job {}: removing its leftover cluster", job.id));
            if let Err(e) = self.teardown_cluster(&job).await {
                self.say(&format!("job {}: teardown failed: {e}", job.id));
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Removes an ended job's secrets (nothing to do when there are none).
fn remove_secrets(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("secrets.json"));
}

/// Whether the run is being stopped for a market move, not a preemption.
fn is_move(job: &ManagedJob) -> bool {
    job.market.as_deref().is_some_and(|m| m.starts_with("->"))
}

/// Whether a stored task has a deadline policy (both `within` and `work`).
fn mt_has_policy(task: &str) -> bool {
    serde_json::from_str::<ManagedTask>(task)
        .map(|t| t.deadline_s.is_some() && t.work_s.is_some())
        .unwrap_or(false)
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

    #[test]
    fn exit_codes_are_read_from_the_run_detail() {
        assert_eq!(
            exit_code_in("rank 1 (127.0.0.2) exited with code 3"),
            Some(3)
        );
        assert_eq!(
            exit_code_in("rank 0 (x) exited with code 137; node ..."),
            Some(137)
        );
        assert_eq!(exit_code_in("was killed by signal 9"), None);
    }

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
    fn placements_parse() {
        assert_eq!(
            parse_placement("local/local/local-b local.cpu spot"),
            Some(("local".into(), "local".into(), "local-b".into()))
        );
        assert_eq!(parse_placement("nonsense"), None);
    }
}
