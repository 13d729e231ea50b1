//! Ending a run: a preemption or a move requeues the job (its cluster torn
//! down, the zone blocked), an ending finishes it.

use super::*;

/// The cluster's owner lock, waiting (on a timer) for a launcher or
/// another teardown of it to let go.
pub(super) async fn cluster_lock(sh: &Shared, cluster: &str) -> Result<OwnerLock, crate::Error> {
    let path = sh
        .cx
        .home()
        .join("locks")
        .join(format!("cluster-{cluster}.lock"));
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        if let Some(l) = OwnerLock::try_acquire(&path)? {
            return Ok(l);
        }
        if Instant::now() >= deadline {
            return Err(crate::Error::usage(
                format!("cluster {cluster} stays busy; will retry"),
                None,
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Tears the job's cluster down, once its lock is free.
pub(super) async fn teardown_cluster(sh: &Shared, cluster: &str) -> Result<(), crate::Error> {
    if sh.store().cluster(cluster)?.is_none() {
        return Ok(());
    }
    let lock = cluster_lock(sh, cluster).await?;
    let name = cluster.to_string();
    sh.off_thread(move |store, providers| async move {
        // The owner lock goes with the work, and is let go when it ends.
        let _lock = lock;
        crate::core::lifecycle::teardown(&store, &name, &providers).await
    })
    .await??;
    Ok(())
}

pub(super) async fn preempted(sh: &Shared, m: &mut Memo, why: &str) -> Result<(), crate::Error> {
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
    if replace_lost(sh, m).await? {
        return Ok(());
    }
    requeue(sh, m, why, true).await
}

/// Ends the job's run in its record: the progress it kept, what it cost,
/// and a new run to come (`restart_count`); says what work was lost.
/// The loss is dated at the notice, else at `seen_at` (when it was first
/// seen), else now.
pub(super) fn close_run(j: &mut ManagedJob, preempted: bool, seen_at: Option<i64>) -> String {
    let lost_at = j.notice_at.or(seen_at).unwrap_or_else(now_ms);
    let lost_work = match (j.notice_at, j.last_sync_at) {
        (Some(_), _) => "none (checkpointed on notice)".to_string(),
        (None, Some(t)) => format!(
            "up to {:.1} s since the last sync",
            (lost_at - t).max(0) as f64 / 1000.0
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
    let now = now_ms();
    if preempted {
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
    lost_work
}

/// Tears the cluster down and goes back to finding one. A preemption
/// blocks the zone it happened in for [`BLOCK_TTL`].
pub(super) async fn requeue(
    sh: &Shared,
    m: &mut Memo,
    why: &str,
    preempted: bool,
) -> Result<(), crate::Error> {
    // The loss is dated before the teardown (which takes a while).
    let was = m.job().state;
    let mut closed = m.job().clone();
    let lost_work = close_run(&mut closed, preempted, m.loss_seen_at.take());
    let cluster = closed.cluster.clone();
    teardown_cluster(sh, &cluster).await?;
    m.reach = None;
    m.replaced = None;
    let j = m.job();
    *j = closed;
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
                at_ms: now_ms(),
                until: at + BLOCK_TTL,
                reason: why.to_string(),
            });
            j.blocks = serde_json::to_string(&blocks).unwrap_or_else(|_| "[]".into());
        }
    }
    m.run = None;
    // After a preemption the PREEMPTED event just said why.
    let told = if preempted {
        format!("work lost: {lost_work}")
    } else {
        format!("requeued after: {why}; work lost: {lost_work}")
    };
    m.save(sh, was, &told)
}

pub(super) async fn finish(
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
    // The files a laptop sent to this controller host with the job go.
    if let Some(dir) = m.task.as_ref().and_then(|t| t.files_dir.clone()) {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                sh.say(&format!(
                    "job {id}: its files in {} could not be deleted: {e}",
                    dir.display()
                ));
            }
        }
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
pub(super) async fn clean_up_ended(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
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

/// Removes an ended job's secrets (nothing to do when there are none).
pub(super) fn remove_secrets(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("secrets.json"));
}
