//! Watching a job's run: preemption notices, lost nodes, the deadline
//! policy's market while it runs, and what an ended run means.

use super::*;

/// The job's nodes and a transport to them, connected when it can be.
pub(super) async fn nodes_and_transport(
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
pub(super) async fn notice(
    nodes: Arc<Vec<NodeRow>>,
    t: Arc<dyn Transport>,
) -> Option<(u32, String)> {
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
pub(super) async fn signal_ranks(
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
pub(super) async fn observe(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
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
pub(super) type Reached = (Arc<Vec<NodeRow>>, Arc<dyn Transport>);

/// Every rank of the run started: the job runs (and, after a loss, says
/// how long resuming took).
pub(super) fn mark_running(sh: &Shared, m: &mut Memo) -> Result<Action, crate::Error> {
    let kept = m.replaced.take();
    let j = m.job();
    let was = j.state;
    j.state = ManagedState::Running;
    j.work_since = Some(now_ms());
    let reason = match j.recovery_started_at.take() {
        Some(t) => format!(
            "resumed {:.1} s after the loss (restart {}){}",
            (now_ms() - t) as f64 / 1000.0,
            j.restart_count,
            kept.map(|k| survivors_wait(k, now_ms() - t))
                .unwrap_or_default()
        ),
        None => "every rank runs".into(),
    };
    m.save(sh, was, &reason)?;
    Ok(Action::Requeue(Duration::ZERO))
}

/// One look at a live run, in order: the provider's advance notice (then
/// checkpoint), the grace after it, the deadline policy's market, a node
/// taken without notice, and the periodic checkpoint sync.
pub(super) async fn watch_live(
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
pub(super) fn noticed(
    sh: &Shared,
    m: &mut Memo,
    rank: u32,
    words: &str,
) -> Result<Action, crate::Error> {
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
pub(super) async fn grace_after_notice(
    sh: &Shared,
    m: &mut Memo,
    t: i64,
) -> Result<Action, crate::Error> {
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
pub(super) async fn keep_synced(
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
pub(super) async fn run_ended(
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
            // A node the provider took during setup (a survivor of an
            // earlier loss too, while the new nodes' setup ran) is a loss
            // to recover, not the task's setup failing.
            if let Some(l) = lost_node(sh, m, &nodes).await {
                return preempted(sh, m, &l.to_string()).await;
            }
            let detail = run.detail.clone().unwrap_or_default();
            finish(sh, m, ManagedState::FailedSetup, &detail).await
        }
        _ => run_failed(sh, m, run, (nodes, transport)).await,
    }
}

/// A run that failed: a preemption when a notice was posted or a node is
/// lost, else requeued for a recoverable exit code or while restarts on
/// errors remain, else the job failed.
pub(super) async fn run_failed(
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
        // The notice is the cause; how the ranks ended is its effect.
        let why = format!("a preemption notice was posted on rank {rank} ({words})");
        return preempted(sh, m, &why).await;
    }
    let outcome = run.outcome.clone();
    let lost = match lost_node(sh, m, &nodes).await {
        Some(l) => Some(l),
        None => outcome.as_ref().and_then(|o| o.lost.clone()),
    };
    if let Some(l) = lost {
        // The loss is the cause; the ranks it killed (the run's detail,
        // kept in the run's record) are its effect.
        return preempted(sh, m, &l.to_string()).await;
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

/// Asks the deadline policy whether the running job should change market;
/// if so, tells the run to checkpoint (as on a notice) and records the
/// move. Returns whether it acted.
pub(super) async fn reconsider(
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
pub(super) async fn lost_node(sh: &Shared, m: &mut Memo, nodes: &[NodeRow]) -> Option<LostNode> {
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
