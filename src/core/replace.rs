//! Replacing a running cluster's lost nodes in place: the survivors keep
//! their machines, files and setup; the provider is asked for as many
//! nodes as were lost, in the same placement; the new nodes take the lost
//! ranks. Whole-gang recovery (tear down, find capacity for every node
//! again) is what a caller falls back to when this says it cannot.
//!
//! All or nothing, like a launch: a replacement that cannot give every
//! lost node removes whatever it added before it says so, and never
//! touches a survivor.

use std::time::{Duration, Instant};

use gangway_provider::{ClusterName, InstanceId, NodeState, Provider, ProviderError};

use crate::core::gang::SURVIVOR_FACT;
use crate::core::optimizer::Candidate;
use crate::core::provision::{self, retry_transient, ContactError, RetryPolicy};
use crate::core::ranks::assign_ranks;
use crate::core::registry::Providers;
use crate::core::state::{ClusterRow, ClusterStatus, NodeRow, StateError, Store};

/// How long a replacement may take, from asking for the nodes to reaching
/// them, before it is given up for a whole-gang recovery: long enough for
/// a cloud to boot a GPU node (a few minutes), short enough that the
/// survivors do not wait longer than a fresh search for the whole gang
/// would take.
pub(crate) const REPLACE_WAIT: Duration = Duration::from_secs(300);

/// A replacement that worked.
#[derive(Debug)]
pub(crate) struct Replaced {
    /// Every node of the cluster now, in rank order.
    pub(crate) nodes: Vec<NodeRow>,
    /// `(rank, lost instance, new instance)` for each replaced rank.
    pub(crate) swapped: Vec<(u32, String, String)>,
    /// From the first provider call to the new nodes reached.
    pub(crate) took: Duration,
}

/// Why a replacement did not happen (the caller recovers the whole gang).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplaceError {
    /// The provider cannot add nodes to a running cluster.
    #[error("{0}")]
    Cannot(String),
    /// The provider refused or failed (capacity, quota, ...).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The new nodes did not come within the wait.
    #[error("the replacement nodes did not come up within {} s", .0.as_secs())]
    Timeout(Duration),
    /// The provider's answer was not the survivors plus the replacements.
    #[error("{0}")]
    Mismatch(String),
    /// The new nodes could not be reached.
    #[error("cannot reach the replacement nodes: {0}")]
    Contact(#[from] ContactError),
    /// The state database failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The replacement failed and what it added could not be removed: the
    /// whole-gang teardown that follows removes it by the cluster's tag.
    #[error("{failure}; removing the nodes it added failed: {cleanup}")]
    Leftover {
        /// Why the replacement failed.
        failure: String,
        /// Why the removal failed.
        cleanup: ProviderError,
    },
}

/// Replaces the nodes of `row` at ranks `lost` with new ones from the
/// provider at `c` (the cluster's own placement): removes the lost nodes
/// (confirmed gone), asks for the gang again (the provider keeps the
/// survivors and adds the shortfall), checks the survivors are all still
/// there, reaches the new nodes, and records the cluster with the new
/// nodes in the lost ranks. With `setup_done` (every rank of the stopped
/// run had started, so every node's setup was done) the survivors are
/// marked [`SURVIVOR_FACT`] and keep their setup; otherwise only those
/// already marked by an earlier replacement are (a node stopped in its
/// setup runs it again). The caller holds the cluster's lock and has
/// stopped its run.
pub(crate) async fn replace_nodes(
    store: &Store,
    row: &ClusterRow,
    lost: &[u32],
    c: &Candidate,
    providers: &Providers,
    wait: Duration,
    setup_done: bool,
) -> Result<Replaced, ReplaceError> {
    let started = Instant::now();
    let cloud = row.cloud.clone().unwrap_or_default();
    let Some(p) = providers.get(&cloud) else {
        return Err(ReplaceError::Cannot(format!(
            "the {cloud} provider is not in this build"
        )));
    };
    if let Some(why) = p.cannot_replace_nodes() {
        return Err(ReplaceError::Cannot(why.to_string()));
    }
    let name = ClusterName(row.name.clone());
    let rows = store.nodes(&row.name)?;
    let (gone, kept): (Vec<NodeRow>, Vec<NodeRow>) =
        rows.into_iter().partition(|n| lost.contains(&n.rank));
    if gone.is_empty() || kept.is_empty() {
        return Err(ReplaceError::Cannot(format!(
            "{} of the cluster's nodes lost: nothing to keep",
            gone.len()
        )));
    }
    let gone_ids: Vec<InstanceId> = gone
        .iter()
        .map(|n| InstanceId(n.instance_id.clone()))
        .collect();
    store.event(
        &row.name,
        None,
        "replace",
        &format!(
            "replacing rank(s) {} ({}); keeping {} survivor(s)",
            ranks_text(gone.iter().map(|n| n.rank)),
            gone_ids
                .iter()
                .map(|i| i.0.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            kept.len()
        ),
    )?;
    // Whatever is left of the lost nodes goes first (a node gone quiet
    // may still run, and bill): the provider then sees a shortfall. On
    // machines that outlive the cluster (SSH pools), what the cluster ran
    // there is killed first, where the machine still answers.
    if p.machines_outlive_clusters() {
        if let Some(t) = providers.transport(&cloud, store.home(), &row.name) {
            if t.connect(&gone).await.is_ok() {
                for n in &gone {
                    t.kill_cluster(n, &row.name);
                }
            }
        }
    }
    retry_transient(RetryPolicy::default(), || p.remove_nodes(&name, &gone_ids)).await?;
    // Confirmed gone: they bill no more, and the survivors wait on their
    // own in the ledger until the replacements are recorded up.
    let gone_ranks: Vec<u32> = gone.iter().map(|n| n.rank).collect();
    store.lost_nodes_removed(&row.name, &gone_ranks)?;
    let mut req = provision::launch_request(store, row, c)?;
    req.count = (kept.len() + gone.len()) as u32;
    req.client_token = format!("{}-{}", row.client_token, gone_ids[0].0);
    let kept_ids: Vec<&str> = kept.iter().map(|n| n.instance_id.as_str()).collect();
    let got = match tokio::time::timeout(
        wait,
        retry_transient(RetryPolicy::default(), || p.launch(&req)),
    )
    .await
    {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => return Err(undo(p.as_ref(), &name, &kept_ids, e.into()).await),
        Err(_) => {
            return Err(undo(p.as_ref(), &name, &kept_ids, ReplaceError::Timeout(wait)).await)
        }
    };
    let (survivors, new): (Vec<_>, Vec<_>) = got
        .into_iter()
        .partition(|n| kept_ids.contains(&n.id.0.as_str()));
    let short = kept_ids
        .iter()
        .filter(|id| {
            !survivors
                .iter()
                .any(|n| n.id.0 == **id && n.state == NodeState::Running)
        })
        .count();
    let bad = if short > 0 {
        Some(format!(
            "{short} survivor(s) were lost during the replacement"
        ))
    } else if new.len() != gone.len() || new.iter().any(|n| n.state != NodeState::Running) {
        Some(format!(
            "the provider gave {} running replacement(s) for {} lost node(s)",
            new.iter().filter(|n| n.state == NodeState::Running).count(),
            gone.len()
        ))
    } else {
        None
    };
    if let Some(why) = bad {
        return Err(undo(p.as_ref(), &name, &kept_ids, ReplaceError::Mismatch(why)).await);
    }
    let mut new_rows = rank_new_nodes(p.as_ref(), new, &gone).await;
    if provision::over_ssh(p.as_ref(), store.home(), &row.name) {
        for r in &mut new_rows {
            r.extra.insert("gpus.discover".into(), "true".into());
        }
        let contact = tokio::time::timeout(
            wait.saturating_sub(started.elapsed()),
            provision::first_contact(store.home(), &p, &row.name, &new_rows, None),
        )
        .await;
        let failed = match contact {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(ReplaceError::Contact(e)),
            Err(_) => Some(ReplaceError::Timeout(wait)),
        };
        if let Some(e) = failed {
            return Err(undo(p.as_ref(), &name, &kept_ids, e).await);
        }
    }
    let swapped: Vec<(u32, String, String)> = new_rows
        .iter()
        .map(|r| {
            let was = gone
                .iter()
                .find(|g| g.rank == r.rank)
                .map(|g| g.instance_id.clone())
                .unwrap_or_default();
            (r.rank, was, r.instance_id.clone())
        })
        .collect();
    let mut all: Vec<NodeRow> = kept
        .into_iter()
        .map(|mut n| {
            if setup_done {
                n.extra.insert(SURVIVOR_FACT.into(), "true".into());
            }
            n
        })
        .chain(new_rows)
        .collect();
    all.sort_by_key(|n| n.rank);
    store.set_nodes(&row.name, ClusterStatus::Up, &all)?;
    let took = started.elapsed();
    store.event(
        &row.name,
        None,
        "replace",
        &format!(
            "replaced {} in {:.1} s",
            swapped
                .iter()
                .map(|(rank, was, now)| format!("rank {rank}: {was} -> {now}"))
                .collect::<Vec<_>>()
                .join(", "),
            took.as_secs_f64()
        ),
    )?;
    Ok(Replaced {
        nodes: all,
        swapped,
        took,
    })
}

/// The new nodes as rows in the lost ranks: ordered among themselves by
/// the provider's topology (then address), as a launch orders a gang, and
/// given the vacant ranks in that order; the survivors keep theirs.
async fn rank_new_nodes(
    p: &dyn Provider,
    mut new: Vec<gangway_provider::Node>,
    gone: &[NodeRow],
) -> Vec<NodeRow> {
    let paths = p.topology(&new).await.unwrap_or_default();
    if paths.len() == new.len() {
        for (n, path) in new.iter_mut().zip(paths) {
            n.topology = path;
        }
    }
    let mut vacant: Vec<u32> = gone.iter().map(|g| g.rank).collect();
    vacant.sort_unstable();
    let mut rows = provision::node_rows(&assign_ranks(new));
    for (r, rank) in rows.iter_mut().zip(vacant) {
        r.rank = rank;
    }
    rows
}

/// A failed replacement: whatever it added (any node of the cluster that
/// is not a survivor) is removed, then `failure` is returned (or why the
/// removal failed too).
async fn undo(
    p: &dyn Provider,
    name: &ClusterName,
    kept: &[&str],
    failure: ReplaceError,
) -> ReplaceError {
    let added = match p.describe(name).await {
        Ok(nodes) => nodes
            .into_iter()
            .filter(|n| !kept.contains(&n.id.0.as_str()))
            .map(|n| n.id)
            .collect::<Vec<_>>(),
        Err(cleanup) => {
            return ReplaceError::Leftover {
                failure: failure.to_string(),
                cleanup,
            }
        }
    };
    if added.is_empty() {
        return failure;
    }
    match retry_transient(RetryPolicy::default(), || p.remove_nodes(name, &added)).await {
        Ok(()) => failure,
        Err(cleanup) => ReplaceError::Leftover {
            failure: failure.to_string(),
            cleanup,
        },
    }
}

/// `0, 2, 5`.
fn ranks_text(ranks: impl Iterator<Item = u32>) -> String {
    ranks.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}
