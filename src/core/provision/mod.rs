//! Provisioning: walk the optimizer's plan until one placement gives the
//! whole gang, and tear clusters down again.
//!
//! `Capacity` blocks the zone and instance type, `Quota` the region; both
//! move on to the next candidate. `Transient` retries the same candidate
//! with exponential backoff and jitter. `Auth`, `InvalidRequest` and `Fatal`
//! stop the walk with the provider's words. A partial gang is never kept:
//! whatever an attempt left behind is terminated before the next one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gangway_provider::{
    ClusterName, ErrorKind, LaunchRequest, Node, NodeState, Placement, Provider, ProviderError,
};
use serde::Serialize;

use crate::core::optimizer::{Block, Candidate};
use crate::core::ranks::assign_ranks;
use crate::core::registry::Providers;
use crate::core::state::owner;
use crate::core::state::{self, ClusterRow, NodeRow, StateError, Store};
use crate::core::transport::ssh::{ContactBoard, ContactState};

/// Whether `p`'s nodes are reached over SSH by the core's transport (it
/// brings none of its own): gangway's key must exist before they are
/// launched, and the first contact records their host keys.
pub(crate) fn over_ssh(p: &dyn Provider, home: &Path, cluster: &str) -> bool {
    p.transport(home, cluster).is_none()
}

/// Whether provisioning connects to new nodes before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Contact {
    /// Connect now: record host keys, wait for sshd (the default).
    Now,
    /// Leave the first connection to the first command (`--provision-only`).
    Later,
}

/// What provisioning reports as it goes; the CLI renders it.
#[derive(Debug)]
pub(crate) enum ProvisionEvent<'a> {
    /// Asking a provider for the gang.
    Trying(&'a Candidate),
    /// That attempt failed; the walk goes on.
    Failed(&'a Candidate, &'a str),
    /// A transient error; retrying after `delay`.
    Retrying(&'a Candidate, &'a ProviderError, Duration),
    /// Every node is up.
    Up(&'a Candidate, usize),
    /// Still waiting for the provider's answer (from 2 s on, every second).
    Waiting(&'a Candidate, Duration),
    /// Still waiting for the nodes to answer over SSH (from 2 s on, every
    /// second): who answered, and what each silent node last said.
    Reaching(&'a Candidate, &'a ContactState, Duration),
}

/// Runs `fut`; from 2 s on, calls `tick` every second with how long it
/// has been waiting.
pub(crate) async fn ticking<T>(
    fut: impl std::future::Future<Output = T>,
    mut tick: impl FnMut(Duration),
) -> T {
    let start = tokio::time::Instant::now();
    let mut every = tokio::time::interval_at(start + TICK_AFTER, Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return r,
            _ = every.tick() => tick(start.elapsed()),
        }
    }
}

/// How long a wait goes unreported.
const TICK_AFTER: Duration = Duration::from_secs(2);

/// Receives provisioning events.
pub(crate) trait Reporter {
    /// One event.
    fn event(&self, e: ProvisionEvent<'_>);
}

/// A reporter that drops everything.
pub(crate) struct Silent;

impl Reporter for Silent {
    fn event(&self, _: ProvisionEvent<'_>) {}
}

/// One placement tried, and how it went.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    /// Cloud.
    pub(crate) cloud: String,
    /// Region.
    pub(crate) region: String,
    /// Zone.
    pub(crate) zone: String,
    /// Instance type.
    pub(crate) instance_type: String,
    /// Spot.
    pub(crate) use_spot: bool,
    /// What happened.
    pub(crate) outcome: String,
}

/// Why provisioning stopped without a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Every candidate failed over.
    #[error("no placement in the plan could provide {nodes} node(s); tried {}", attempts.len())]
    Exhausted {
        /// Nodes asked for.
        nodes: u32,
        /// What was tried.
        attempts: Vec<Attempt>,
    },
    /// A provider said stop (auth, invalid request, fatal).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The state database failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// An attempt failed and removing what it created failed too. The
    /// cluster's row keeps that placement, as `TERMINATING` with the
    /// reason, until a teardown succeeds: nothing is forgotten.
    #[error("{failure}; removing what it created failed: {cleanup}")]
    Leftover {
        /// Why the attempt (or the launch) failed.
        failure: String,
        /// Why the cleanup failed.
        cleanup: ProviderError,
    },
}

/// Terminates what an attempt created, retrying transient errors the way
/// launches are retried. Only an `Ok` says the provider confirmed it gone.
pub(crate) async fn remove_attempt(
    provider: &dyn Provider,
    name: &ClusterName,
    retry: RetryPolicy,
) -> Result<(), ProviderError> {
    retry_transient(retry, || provider.terminate(name)).await
}

/// `call`, retried with `retry`'s backoff and jitter while it fails
/// transiently.
pub(crate) async fn retry_transient<T, F, Fut>(
    retry: RetryPolicy,
    mut call: F,
) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ProviderError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match call().await {
            Err(e) if e.kind == ErrorKind::Transient && tries < retry.attempts => {
                tokio::time::sleep(retry.delay(tries, noise())).await;
            }
            other => return other,
        }
    }
}

/// Ends a walk whose cleanup failed: the row stays `TERMINATING` at the
/// placement it records, with the reason and the time of the next retry.
fn leftover(store: &Store, name: &str, failure: String, cleanup: ProviderError) -> ProvisionError {
    let why = format!("{failure}; removing what it created failed: {cleanup}");
    let recorded = store
        .set_teardown_failed(name, &why)
        .and_then(|_| store.event(name, None, "leftover", &why));
    match recorded {
        Ok(()) => ProvisionError::Leftover { failure, cleanup },
        Err(e) => ProvisionError::State(e),
    }
}

/// Retries of transient errors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    /// Attempts per candidate, the first included.
    pub(crate) attempts: u32,
    /// First delay.
    pub(crate) base: Duration,
    /// Longest delay.
    pub(crate) max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            base: Duration::from_millis(800),
            max: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Delay before retry `n` (1-based): exponential, capped, with +-50% jitter
    /// from `noise` (any u64, e.g. from the clock).
    pub(crate) fn delay(&self, n: u32, noise: u64) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(16));
        let capped = exp.min(self.max);
        // 50%..150% of the capped delay.
        let frac = 0.5 + (noise % 1000) as f64 / 1000.0;
        capped.mul_f64(frac)
    }
}

/// What a failed attempt blocks for the rest of the walk: the optimizer's
/// one [`Block`] type, without an expiry that matters within a walk.
fn walk_block(c: &Candidate, whole_region: bool) -> Block {
    Block {
        cloud: c.cloud.clone(),
        region: Some(c.region.clone()),
        zone: (!whole_region).then(|| c.zone.clone()),
        instance_type: (!whole_region).then(|| c.instance_type.clone()),
        at_ms: crate::core::state::now_ms(),
        until: std::time::SystemTime::now() + Duration::from_secs(24 * 3600),
        reason: String::new(),
    }
}

/// The zone and instance type of `c`.
fn placement_block(c: &Candidate) -> Block {
    walk_block(c, false)
}

/// The whole region of `c`.
fn region_block(c: &Candidate) -> Block {
    walk_block(c, true)
}

/// What an error of `kind` at `c` blocks: a quota the region, anything else
/// the zone and type.
fn block_after(c: &Candidate, kind: ErrorKind) -> Block {
    walk_block(c, kind == ErrorKind::Quota)
}

/// A provisioned cluster.
#[derive(Debug)]
pub(crate) struct Provisioned {
    /// Nodes in rank order.
    pub(crate) nodes: Vec<NodeRow>,
}

fn noise() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(7);
    t ^ (std::process::id() as u64).rotate_left(17)
}

/// Converts provider nodes (already in rank order) into rows.
pub(crate) fn node_rows(nodes: &[Node]) -> Vec<NodeRow> {
    nodes
        .iter()
        .enumerate()
        .map(|(rank, n)| NodeRow {
            rank: rank as u32,
            instance_id: n.id.0.clone(),
            private_ip: n.private_ip.clone(),
            public_ip: n.public_ip.clone(),
            zone: n.placement.zone.clone(),
            topology: n.topology.join("/"),
            state: state_name(&n.state).to_string(),
            extra: n.extra.clone(),
        })
        .collect()
}

/// The stored name of a node state.
pub(crate) fn state_name(s: &NodeState) -> &'static str {
    match s {
        NodeState::Pending => "pending",
        NodeState::Running => "running",
        NodeState::Stopped => "stopped",
        NodeState::Terminated => "terminated",
        NodeState::Preempted { .. } => "preempted",
    }
}

/// What a provider is asked for to give cluster `cluster` the gang at
/// `c` (a replacement asks the same, so that the provider keeps the
/// survivors and adds the shortfall).
pub(crate) fn launch_request(
    store: &Store,
    cluster: &ClusterRow,
    c: &Candidate,
) -> Result<LaunchRequest, StateError> {
    let config: Option<serde_json::Value> = cluster
        .provider_config
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok());
    Ok(LaunchRequest {
        cluster: ClusterName(cluster.name.clone()),
        owner: owner(store.home())?,
        placement: Placement {
            cloud: c.cloud.clone(),
            region: c.region.clone(),
            zone: c.zone.clone(),
        },
        instance_type: c.instance_type.clone(),
        count: c.nodes,
        use_spot: c.use_spot,
        accelerator: c.accelerator.clone().map(|a| (a, c.accelerator_count)),
        disk_size_gib: c.spec.disk_size,
        image_id: c.spec.image_id.clone(),
        client_token: cluster.client_token.clone(),
        provider_config: config.as_ref().and_then(|v| v.get(&c.cloud)).cloned(),
        network_tier: c.spec.network_tier.clone(),
        max_price: c.spec.max_hourly_cost,
        ports: c.spec.ports.iter().map(|p| (p.start, p.end)).collect(),
        labels: c.spec.labels.clone(),
    })
}

/// Walks `plan` until a placement gives all nodes. The cluster row must be
/// reserved (and its owner lock held) by the caller.
///
/// The walk: first settle what an interrupted launch left
/// ([`resume_order`]); then, for each candidate not blocked by an earlier
/// failure, ask its provider for the whole gang ([`Walk::attempt`]). A
/// placement that cannot give it is blocked, whatever it created is
/// removed, and the walk fails over to the next ([`Walk::fail_over`]).
pub(crate) async fn provision(
    store: &Store,
    cluster: &ClusterRow,
    plan: &[Candidate],
    providers: &Providers,
    reporter: &dyn Reporter,
    retry: RetryPolicy,
    contact: Contact,
) -> Result<Provisioned, ProvisionError> {
    let mut walk = Walk {
        store,
        cluster,
        name: ClusterName(cluster.name.clone()),
        reporter,
        retry,
        contact,
        blocks: Vec::new(),
        attempts: Vec::new(),
    };
    let order = resume_order(&walk, plan, providers).await?;
    for c in order {
        if walk.blocks.iter().any(|b| b.covers(c)) {
            continue;
        }
        let Some(provider) = providers.get(&c.cloud) else {
            walk.not_in_build(c);
            continue;
        };
        match walk.attempt(c, &provider).await? {
            Attempted::Up(done) => return Ok(done),
            Attempted::FailOver { block, why, event } => {
                walk.fail_over(c, provider.as_ref(), block, why, event)
                    .await?
            }
        }
    }
    let nodes = plan.first().map_or(cluster.num_nodes, |c| c.nodes);
    Err(ProvisionError::Exhausted {
        nodes,
        attempts: walk.attempts,
    })
}

/// The plan in the order to try it, after what an interrupted launch left
/// at its recorded placement: that placement first if it is still in the
/// plan (its nodes are reused), else its nodes removed before anything
/// else is tried (the row can name only one placement).
async fn resume_order<'p>(
    walk: &Walk<'_>,
    plan: &'p [Candidate],
    providers: &Providers,
) -> Result<Vec<&'p Candidate>, ProvisionError> {
    let cluster = walk.cluster;
    let mut order: Vec<&Candidate> = plan.iter().collect();
    let Some(cloud) = &cluster.cloud else {
        return Ok(order);
    };
    let same = |c: &&Candidate| {
        Some(&c.cloud) == cluster.cloud.as_ref()
            && Some(&c.zone) == cluster.zone.as_ref()
            && Some(&c.instance_type) == cluster.instance_type.as_ref()
            && c.use_spot == cluster.use_spot
    };
    if let Some(pos) = order.iter().position(same) {
        let c = order.remove(pos);
        order.insert(0, c);
        return Ok(order);
    }
    let left = "an interrupted launch left nodes to remove";
    let Some(p) = providers.get(cloud) else {
        let e = ProviderError::new(
            ErrorKind::Fatal,
            cloud.clone(),
            cluster.region.as_deref().unwrap_or("-"),
            format!("the {cloud} provider is not in this build"),
        );
        return Err(leftover(walk.store, &cluster.name, left.into(), e));
    };
    if let Err(e) = remove_attempt(p.as_ref(), &walk.name, walk.retry).await {
        return Err(leftover(walk.store, &cluster.name, left.into(), e));
    }
    Ok(order)
}

/// What one attempt at a candidate came to, when it did not stop the walk.
enum Attempted {
    /// The whole gang is up (and reached, where that was asked for).
    Up(Provisioned),
    /// This placement cannot give the gang: block `block`, remove what the
    /// attempt created, go on. `event`: record the failover in the
    /// cluster's events (a gang that came up but could not be reached is
    /// reported, not recorded).
    FailOver {
        /// What to block.
        block: Block,
        /// Why, in words.
        why: String,
        /// Record a `failover` event.
        event: bool,
    },
}

/// One walk through the plan: what every attempt shares, and what the
/// failed ones left (blocks on the rest of the plan, their outcomes).
struct Walk<'a> {
    store: &'a Store,
    cluster: &'a ClusterRow,
    name: ClusterName,
    reporter: &'a dyn Reporter,
    retry: RetryPolicy,
    contact: Contact,
    blocks: Vec<Block>,
    attempts: Vec<Attempt>,
}

impl Walk<'_> {
    /// Records `c` as tried, with its outcome.
    fn tried(&mut self, c: &Candidate, outcome: String) {
        self.attempts.push(Attempt {
            cloud: c.cloud.clone(),
            region: c.region.clone(),
            zone: c.zone.clone(),
            instance_type: c.instance_type.clone(),
            use_spot: c.use_spot,
            outcome,
        });
    }

    /// A candidate of a cloud this build has no provider for: its whole
    /// region is blocked.
    fn not_in_build(&mut self, c: &Candidate) {
        let why = format!("the {} provider is not in this build yet", c.cloud);
        self.reporter.event(ProvisionEvent::Failed(c, &why));
        self.tried(c, why);
        self.blocks.push(region_block(c));
    }

    /// Asks `provider` for the gang at `c`: records the placement first
    /// (a crash from then on leaves a row that says where to look), makes
    /// sure gangway's key exists for nodes reached over SSH, launches with
    /// retries, then brings the nodes up. Errors that stop the walk
    /// (auth, invalid request, fatal) come back as errors, after whatever
    /// the attempt created is removed.
    async fn attempt(
        &mut self,
        c: &Candidate,
        provider: &Arc<dyn Provider>,
    ) -> Result<Attempted, ProvisionError> {
        let store = self.store;
        store.set_placement(
            &self.cluster.name,
            &state::Placement {
                cloud: &c.cloud,
                region: &c.region,
                zone: &c.zone,
                instance_type: &c.instance_type,
                use_spot: c.use_spot,
                accelerator: c.accelerator.as_deref(),
                accelerator_count: c.accelerator_count,
                price_per_hour: c.total_per_hour,
            },
        )?;
        let req = self.launch_request(c)?;
        self.reporter.event(ProvisionEvent::Trying(c));
        // Clouds import gangway's public key into the nodes: it must exist.
        let ssh = over_ssh(provider.as_ref(), store.home(), &self.cluster.name);
        if ssh {
            if let Err(e) = crate::core::transport::ssh::ensure_key(store.home()) {
                return Err(ProviderError::new(
                    ErrorKind::Fatal,
                    c.cloud.clone(),
                    "local",
                    e.to_string(),
                )
                .into());
            }
        }
        match self.launch_with_retry(c, provider.as_ref(), &req).await {
            Ok(got)
                if got.len() == c.nodes as usize
                    && got.iter().all(|n| n.state == NodeState::Running) =>
            {
                self.bring_up(c, provider, got, ssh).await
            }
            Ok(got) => {
                let running = got.iter().filter(|n| n.state == NodeState::Running).count();
                Ok(Attempted::FailOver {
                    block: placement_block(c),
                    why: format!("only {running} of {} nodes came up", c.nodes),
                    event: true,
                })
            }
            Err(e) if e.kind.fails_over() || e.kind == ErrorKind::Transient => {
                Ok(Attempted::FailOver {
                    block: block_after(c, e.kind),
                    why: format!("{}: {}", e.kind, e.message),
                    event: true,
                })
            }
            Err(e) => {
                // Stop: but never leave a half-created gang behind.
                store.event(&self.cluster.name, None, "provision", &e.to_string())?;
                if let Err(cleanup) =
                    remove_attempt(provider.as_ref(), &self.name, self.retry).await
                {
                    return Err(leftover(store, &self.cluster.name, e.to_string(), cleanup));
                }
                Err(e.into())
            }
        }
    }

    /// What the provider is asked for at `c`.
    fn launch_request(&self, c: &Candidate) -> Result<LaunchRequest, ProvisionError> {
        Ok(launch_request(self.store, self.cluster, c)?)
    }

    /// `provider.launch`, retried with backoff while it fails transiently.
    async fn launch_with_retry(
        &self,
        c: &Candidate,
        provider: &dyn Provider,
        req: &LaunchRequest,
    ) -> Result<Vec<Node>, ProviderError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let asked = ticking(provider.launch(req), |waited| {
                self.reporter.event(ProvisionEvent::Waiting(c, waited))
            });
            match asked.await {
                Err(e) if e.kind == ErrorKind::Transient && tries < self.retry.attempts => {
                    let d = self.retry.delay(tries, noise());
                    self.reporter.event(ProvisionEvent::Retrying(c, &e, d));
                    tokio::time::sleep(d).await;
                }
                other => return other,
            }
        }
    }

    /// A whole gang came up: ranks from the provider's topology, then, for
    /// nodes reached over SSH, the first contact (host keys recorded, sshd
    /// waited for) unless it is left to the first command.
    async fn bring_up(
        &self,
        c: &Candidate,
        provider: &Arc<dyn Provider>,
        mut got: Vec<Node>,
        ssh: bool,
    ) -> Result<Attempted, ProvisionError> {
        let paths = provider.topology(&got).await.unwrap_or_default();
        if paths.len() == got.len() {
            for (n, p) in got.iter_mut().zip(paths) {
                n.topology = p;
            }
        }
        let ranked = assign_ranks(got);
        let mut rows = node_rows(&ranked);
        if ssh {
            for r in &mut rows {
                r.extra.insert("gpus.discover".into(), "true".into());
                if self.contact == Contact::Later {
                    r.extra.insert(
                        crate::core::transport::ssh::FIRST_CONTACT.into(),
                        "pending".into(),
                    );
                }
            }
            // First contact: record host keys (verified strictly from
            // now on) and wait for sshd on freshly booted nodes.
            let reached = match self.contact {
                Contact::Now => {
                    let board = Arc::new(ContactBoard::default());
                    let reaching = first_contact(
                        self.store.home(),
                        provider,
                        &self.cluster.name,
                        &rows,
                        Some(Arc::clone(&board)),
                    );
                    ticking(reaching, |waited| {
                        let now = board.snapshot();
                        self.reporter
                            .event(ProvisionEvent::Reaching(c, &now, waited))
                    })
                    .await
                }
                Contact::Later => Ok(()),
            };
            if let Err(e) = reached {
                return Ok(Attempted::FailOver {
                    block: placement_block(c),
                    why: format!("cannot reach the nodes: {e}"),
                    event: false,
                });
            }
        }
        self.reporter.event(ProvisionEvent::Up(c, ranked.len()));
        self.store.event(
            &self.cluster.name,
            None,
            "provision",
            &format!(
                "{} node(s) of {} up in {}/{}/{}",
                ranked.len(),
                c.instance_type,
                c.cloud,
                c.region,
                c.zone
            ),
        )?;
        Ok(Attempted::Up(Provisioned { nodes: rows }))
    }

    /// All or nothing: removes whatever the failed attempt at `c` created
    /// before the next one, blocks what it says is blocked, and records
    /// why. If the removal fails the walk stops here, with the row kept at
    /// this placement, rather than move on and forget these nodes.
    async fn fail_over(
        &mut self,
        c: &Candidate,
        provider: &dyn Provider,
        block: Block,
        why: String,
        event: bool,
    ) -> Result<(), ProvisionError> {
        self.blocks.push(block);
        if let Err(cleanup) = remove_attempt(provider, &self.name, self.retry).await {
            return Err(leftover(self.store, &self.cluster.name, why, cleanup));
        }
        self.reporter.event(ProvisionEvent::Failed(c, &why));
        if event {
            self.store.event(
                &self.cluster.name,
                None,
                "failover",
                &format!(
                    "{}/{}/{} {}: {why}",
                    c.cloud, c.region, c.zone, c.instance_type
                ),
            )?;
        }
        self.tried(c, why);
        Ok(())
    }
}

/// Opens the first SSH connection to new nodes, accepting their host keys,
/// for as long as their provider says they may take to answer.
pub(crate) async fn first_contact(
    home: &Path,
    provider: &Arc<dyn Provider>,
    cluster: &str,
    rows: &[NodeRow],
    board: Option<Arc<ContactBoard>>,
) -> Result<(), ContactError> {
    use crate::core::transport::Transport;
    let mut t = crate::core::transport::ssh::SshTransport::new(home, cluster, true)?
        .for_provider(Arc::clone(provider))
        .with_connect_timeout(provider.first_contact_wait());
    if let Some(b) = board {
        t = t.with_board(b);
    }
    Ok(t.connect(rows).await?)
}

/// Why the first connection to new nodes failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContactError {
    #[error(transparent)]
    Key(#[from] crate::core::transport::ssh::KeyError),
    #[error(transparent)]
    Transport(#[from] crate::core::transport::TransportError),
}

/// What a cluster row says is still running, for messages about a
/// teardown that did not finish.
pub(crate) fn still_running(row: &ClusterRow) -> String {
    match (&row.cloud, &row.region, &row.instance_type) {
        (Some(cloud), Some(region), Some(t)) => format!(
            "up to {} x {t}{} on {cloud}/{region}{}",
            row.num_nodes,
            if row.use_spot { " (spot)" } else { "" },
            row.price_per_hour
                .map(|p| format!(" (${p:.2}/h)"))
                .unwrap_or_default()
        ),
        _ => "nothing was placed yet".into(),
    }
}

/// Why a teardown stopped.
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    /// The provider refused or failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The state database failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The cluster's provider is not in this build.
    #[error("the {0} provider is not in this build; cannot reach the cluster's nodes")]
    NoProvider(String),
    /// A bucket made for the cluster could not be deleted.
    #[error("deleting a bucket made for the cluster: {0}")]
    Bucket(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_secs(1),
            max: Duration::from_secs(5),
        };
        assert_eq!(p.delay(1, 500), Duration::from_secs(1));
        assert_eq!(p.delay(2, 500), Duration::from_secs(2));
        assert_eq!(p.delay(4, 500), Duration::from_secs(5));
        assert_eq!(p.delay(20, 500), Duration::from_secs(5));
        assert_eq!(p.delay(1, 0), Duration::from_millis(500));
        assert_eq!(p.delay(1, 999), Duration::from_millis(1499));
    }
}
