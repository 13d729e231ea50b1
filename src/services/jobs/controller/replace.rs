//! A gang that lost some of its nodes, recovered by replacing only those
//! (`job_recovery.strategy: REPLACE_LOST_NODES`, the default): the run is
//! stopped on the survivors, the provider adds as many nodes as were lost
//! in the same placement (`core::replace`), and the next run starts on
//! the same cluster, with setup on the new nodes only. Whatever stands in
//! the way (a provider that cannot add nodes, most of the gang lost at
//! once, no capacity left in the zone, a replacement that does not come
//! up in time) falls back to the whole-gang recovery, saying why.

use super::*;
use crate::core::replace::{self, REPLACE_WAIT};

/// How long the survivors of a loss may take to be asked for a
/// preemption notice; those that do not answer in time are left to the
/// replacement's own checks.
const NOTICE_CHECK: std::time::Duration = std::time::Duration::from_secs(20);

/// The recovery strategy that replaces only lost nodes.
pub(crate) const REPLACE_LOST_NODES: &str = "REPLACE_LOST_NODES";

/// What the last replacement kept, for the line that says the job resumed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Kept {
    survivors: usize,
    price_per_node_hour: Option<f64>,
}

/// Replaces the nodes the job's gang lost, when it can. `Ok(true)`: the
/// cluster has all its nodes again and the job is recovering onto it;
/// `Ok(false)`: the whole gang must be recovered (why is in the job's
/// events when a replacement was possible in principle).
pub(super) async fn replace_lost(sh: &Shared, m: &mut Memo) -> Result<bool, crate::Error> {
    let mt = m.task();
    if !mt.strategy.eq_ignore_ascii_case(REPLACE_LOST_NODES) || m.job().moving_to.is_some() {
        return Ok(false);
    }
    let job = m.job().clone();
    // The loss is dated now, before the run is stopped and the nodes are
    // replaced (or, failing that, before the whole gang is).
    let seen_at = now_ms();
    m.loss_seen_at = Some(seen_at);
    let Some(row) = sh.store().cluster(&job.cluster)? else {
        return Ok(false);
    };
    let nodes = sh.store().nodes(&job.cluster)?;
    if row.status != ClusterStatus::Up || nodes.len() < 2 {
        return Ok(false);
    }
    let Some(p) = row.cloud.as_deref().and_then(|c| sh.cx.providers().get(c)) else {
        return Ok(false);
    };
    if let Some(cannot) = p.cannot_replace_nodes() {
        whole_gang(sh, &job, cannot)?;
        return Ok(false);
    }
    let lock = cluster_lock(sh, &job.cluster).await?;
    // Which nodes were lost is asked while the survivors still run (the
    // notice check reaches them over their open connections); a fallback
    // to the whole gang stops the run with the teardown.
    let lost = match lost_ranks(sh, m, &job.cluster, &nodes).await {
        Ok(l) => l,
        Err(e) => {
            whole_gang(sh, &job, &format!("cannot tell which nodes were lost: {e}"))?;
            return Ok(false);
        }
    };
    if lost.is_empty() {
        whole_gang(sh, &job, "no node is reported lost")?;
        return Ok(false);
    }
    if lost.len() * 2 > nodes.len() {
        let why = format!(
            "{} of {} nodes lost at once (more than half)",
            lost.len(),
            nodes.len()
        );
        whole_gang(sh, &job, &why)?;
        return Ok(false);
    }
    let Some(c) = own_candidate(sh, &job, &mt, &row) else {
        let why = "the cluster's placement is no longer in the job's plan".to_string();
        whole_gang(sh, &job, &why)?;
        return Ok(false);
    };
    let lost_ranks = lost.clone();
    // Survivors keep their setup only if it was done: every rank of the
    // stopped run had started (a loss during setup runs it again there).
    let setup_done = m.run.as_ref().is_some_and(|r| r.started_at.is_some());
    // The run stops on the survivors (its driver stops every rank, within
    // its grace period) while the replacement is asked for and reached:
    // a trainer that saves on SIGTERM takes that time anyway, and the
    // replacement touches only the lost nodes.
    let replacing = sh.off_thread(move |store, providers| async move {
        let _lock = lock;
        replace::replace_nodes(
            &store,
            &row,
            &lost_ranks,
            &c,
            &providers,
            REPLACE_WAIT,
            setup_done,
        )
        .await
    });
    let (stopped, replaced) =
        tokio::join!(lifecycle::stop_drivers(sh.store(), &job.cluster), replacing);
    stopped?;
    let replaced = replaced?;
    let replaced = match replaced {
        Ok(r) => r,
        Err(e) => {
            whole_gang(sh, &job, &format!("replacing rank(s) failed: {e}"))?;
            return Ok(false);
        }
    };
    let survivors = replaced.nodes.len() - replaced.swapped.len();
    let per_node = job.price_per_hour.map(|p| p / replaced.nodes.len() as f64);
    m.reach = None;
    m.replaced = Some(Kept {
        survivors,
        price_per_node_hour: per_node,
    });
    let was = m.job().state;
    m.job().nodes_replaced += replaced.swapped.len() as u32;
    m.loss_seen_at = None;
    let lost_work = close_run(m.job(), true, Some(seen_at));
    m.run = None;
    let swapped = replaced
        .swapped
        .iter()
        .map(|(rank, was, now)| format!("rank {rank} {was} -> {now}"))
        .collect::<Vec<_>>()
        .join(", ");
    m.save(
        sh,
        was,
        &format!(
            "replaced {swapped} in {:.1} s, {survivors} survivor(s) kept {}; work lost: \
             {lost_work}",
            replaced.took.as_secs_f64(),
            if setup_done {
                "with their setup"
            } else {
                "(the loss came before every rank ran: setup runs again where it may not have finished)"
            }
        ),
    )?;
    Ok(true)
}

/// Says in the job's events why its gang is recovered whole.
fn whole_gang(sh: &Shared, job: &ManagedJob, why: &str) -> Result<(), crate::Error> {
    sh.store().managed_event(
        job.id,
        "RECOVERY",
        job.placement.as_deref(),
        &format!("whole-gang recovery: {why}"),
    )?;
    Ok(())
}

/// The ranks of the nodes the gang lost: those the provider no longer
/// runs, and those with a preemption notice (reclaimed any moment now).
async fn lost_ranks(
    sh: &Shared,
    m: &mut Memo,
    cluster: &str,
    nodes: &[NodeRow],
) -> Result<Vec<u32>, crate::Error> {
    let cloud = sh
        .store()
        .cluster(cluster)?
        .and_then(|r| r.cloud)
        .unwrap_or_default();
    let Some(p) = sh.cx.providers().get(&cloud) else {
        return Ok(Vec::new());
    };
    let name = ClusterName(cluster.to_string());
    let seen = sh
        .off_thread(move |_, _| async move { p.describe(&name).await })
        .await?
        .map_err(crate::Error::from)?;
    let mut lost: Vec<u32> = nodes
        .iter()
        .filter(|n| {
            !seen
                .iter()
                .any(|s| s.id.0 == n.instance_id && s.state == NodeState::Running)
        })
        .map(|n| n.rank)
        .collect();
    // Of the others, those about to be reclaimed: asked on the nodes
    // themselves, so only of those still there (connecting to a lost one
    // would wait out its connect timeout), and not for long.
    let alive: Vec<NodeRow> = nodes
        .iter()
        .filter(|n| !lost.contains(&n.rank))
        .cloned()
        .collect();
    let transport = match &m.reach {
        Some(r) => Some(Arc::clone(&r.transport)),
        None => sh
            .cx
            .providers()
            .transport(&cloud, sh.cx.home(), cluster)
            .map(Arc::from),
    };
    if let Some(transport) = transport {
        let reached = tokio::time::timeout(NOTICE_CHECK, transport.connect(&alive)).await;
        if matches!(reached, Ok(Ok(()))) {
            // Every survivor at once: one question each (an IMDS read over
            // its connection), so 63 survivors take one answer's time.
            let asks: Vec<_> = alive
                .into_iter()
                .map(|n| {
                    let t = Arc::clone(&transport);
                    tokio::task::spawn_blocking(move || {
                        t.preemption_notice(&n).is_some().then_some(n.rank)
                    })
                })
                .collect();
            let noticed = tokio::time::timeout(NOTICE_CHECK, futures::future::join_all(asks))
                .await
                .unwrap_or_default();
            lost.extend(noticed.into_iter().filter_map(|r| r.ok().flatten()));
        }
    }
    lost.sort_unstable();
    lost.dedup();
    Ok(lost)
}

/// The candidate of the job's plan that is the cluster's own placement
/// (cloud, zone, type, market), planned without the job's blocks: the
/// replacement goes where the survivors are.
fn own_candidate(
    sh: &Shared,
    job: &ManagedJob,
    mt: &ManagedTask,
    row: &ClusterRow,
) -> Option<Candidate> {
    let mut unblocked = job.clone();
    unblocked.blocks = "[]".into();
    let plan = plan(sh, &unblocked, mt, Some(Market::of_spot(row.use_spot))).ok()?;
    plan.into_iter().find(|c| {
        Some(&c.cloud) == row.cloud.as_ref()
            && Some(&c.region) == row.region.as_ref()
            && Some(&c.zone) == row.zone.as_ref()
            && Some(&c.instance_type) == row.instance_type.as_ref()
            && c.use_spot == row.use_spot
    })
}

/// What the survivors' wait cost, for the line that says the job resumed.
pub(super) fn survivors_wait(kept: Kept, waited_ms: i64) -> String {
    let s = waited_ms.max(0) as f64 / 1000.0;
    match kept.price_per_node_hour {
        Some(p) => format!(
            "; {} survivor(s) waited {s:.1} s (${:.4} at ${p:.2}/node-hour)",
            kept.survivors,
            p * kept.survivors as f64 * s / 3600.0
        ),
        None => format!("; {} survivor(s) waited {s:.1} s", kept.survivors),
    }
}
