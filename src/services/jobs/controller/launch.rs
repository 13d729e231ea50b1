//! Finding the job a cluster and starting its run there: the plan (blocked
//! zones, the recovery strategy, the deadline policy's market), the cluster
//! brought up through `core::lifecycle`, the run submitted or adopted.

use super::*;

/// Why no plan could be made for a job.
#[derive(Debug, thiserror::Error)]
pub(super) enum PlanError {
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
pub(super) enum SecretsError {
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

/// Provisions, unless the user cancels meanwhile: then the launch is
/// dropped where it stands and the next step tears down whatever it made
/// (teardown finds a cluster's nodes by name, however far it got).
pub(super) async fn provision_or_cancel(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
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
pub(super) fn plan(
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
pub(super) async fn provision_and_submit(
    sh: &Shared,
    m: &mut Memo,
) -> Result<Action, crate::Error> {
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
pub(super) fn reserve(sh: &Shared, m: &mut Memo) -> Result<Reserved, crate::Error> {
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
pub(super) async fn clear_stale(
    sh: &Shared,
    m: &mut Memo,
    row: &ClusterRow,
) -> Result<Action, crate::Error> {
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
pub(super) enum Detour {
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
pub(super) async fn bring_up(
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
pub(super) async fn adopt_or_submit(
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
pub(super) async fn newest_checkpoint(
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
pub(super) fn record_running(
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
    // The job's own count of runs, not the cluster's job id (`inner`),
    // which is another numbering.
    let run = j.restart_count + 1;
    m.save(sh, was, &format!("cluster up; run {run} submitted"))?;
    Ok(Action::Requeue(Duration::ZERO))
}

pub(super) fn append_line(path: &Path, line: &str) {
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
pub(super) fn secrets_of(
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

pub(super) async fn no_capacity(
    sh: &Shared,
    m: &mut Memo,
    why: &str,
) -> Result<Action, crate::Error> {
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

/// What the deadline policy would run the job on now, if the task has one
/// (`deadline: {within, work}`); `running` is the current market.
pub(super) fn market_choice(sh: &Shared, m: &mut Memo, running: Choice) -> Option<Choice> {
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
pub(super) fn overhead_estimate(store: &Store, id: i64) -> f64 {
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

/// The zones a job lost nodes in (stored with the job as JSON).
pub(super) fn blocks_of(job: &ManagedJob) -> Vec<Block> {
    serde_json::from_str(&job.blocks).unwrap_or_default()
}

/// Orders a plan by recovery strategy: `FAILOVER` tries the region just
/// lost first (other zones of it), `EAGER_NEXT_REGION` every other region
/// first. The optimizer's order holds within each part.
pub(super) fn order_for(
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
