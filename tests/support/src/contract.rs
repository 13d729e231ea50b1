//! The provider contract: the rules every [`Provider`] keeps, as checks
//! any provider crate runs against its emulator.
//!
//! A provider crate writes a small [`Harness`] (a provider to test, a
//! request that fits it, how to make its API fail, how to list what is
//! left of a cluster without asking the provider) and calls [`run`] from
//! one test:
//!
//! ```ignore
//! #[tokio::test]
//! async fn the_provider_keeps_the_contract() {
//!     let h = MyHarness::new();
//!     gangway_test::contract::run(&h).await;
//! }
//! ```
//!
//! [`run`] checks each rule on a cluster of its own (named
//! `<prefix>-<rule>`), prints one line per rule (`contract <provider>:
//! <rule>: ok`, or why it was excused), and panics at the end with every
//! broken rule, so one run shows all of them. The rules:
//!
//! * `launch`: a launch returns exactly the nodes asked for, running, in
//!   the requested placement, and `describe` reports the same nodes;
//! * `idempotent`: launching again with the same client token returns the
//!   same nodes and creates nothing more;
//! * `terminate`: terminate leaves nothing of the cluster, and a second
//!   terminate, and one of a cluster that never existed, is `Ok`;
//! * `midway`: a launch that fails half-way (the harness makes it) leaves
//!   a cluster that terminate removes completely;
//! * `tags`: everything made carries the cluster's name and the owner, and
//!   [`Provider::clusters`] lists it (where the provider keeps tags);
//! * `owners`: another owner's cluster of the same name is neither listed
//!   as ours nor touched by our terminate (where one place can hold two
//!   owners' resources);
//! * `stop`: where [`Provider::cannot_stop`] is `None`, stop stops every
//!   node and start brings the same nodes back; otherwise stop refuses with
//!   an error and the nodes keep running;
//! * `replace`: where [`Provider::cannot_replace_nodes`] is `None`,
//!   `remove_nodes` removes one node of a 2-node cluster and leaves the
//!   other running, and a launch of 2 again keeps that survivor and adds
//!   one node, running, in the same placement; otherwise `remove_nodes`
//!   refuses with an error and both nodes keep running;
//! * `errors`: the provider's API failures come back with the right
//!   [`ErrorKind`] (capacity and quota fail over, auth and invalid requests
//!   do not), naming the provider and the region, and leave nothing once
//!   terminated.
//!
//! A rule a provider cannot be made to show (no way to inject an auth
//! failure into an inventory of machines) is excused by the harness
//! returning [`Unsupported`] with the reason, which [`run`] prints.
//!
//! What harnesses write alike is here too: [`request`] (a request with
//! everything a provider does not need left at its default), [`Next`] (what
//! the next request asks for instead, where a failure is a request the
//! provider refuses) and [`Flag`] (a failure set up on the place, undone by
//! [`Harness::clear_failures`]).

use std::collections::BTreeSet;
use std::fmt;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Node, NodeState, Provider};

mod kit;
pub use kit::{placement, public_key, request, Flag, Next};

/// Why a harness cannot do something for its provider; [`run`] prints it
/// next to the rule it excuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Something a provider holds for a cluster, as the harness sees it on the
/// provider's side (an instance, a security group, an allocation record),
/// with the tags it carries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Resource {
    /// What it is (`instance`, `security-group`, `record`).
    pub kind: String,
    /// Its id or name.
    pub id: String,
    /// Its cluster tag, if it has one.
    pub cluster: Option<String>,
    /// Its owner tag, if it has one.
    pub owner: Option<String>,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (cluster {:?}, owner {:?})",
            self.kind, self.id, self.cluster, self.owner
        )
    }
}

/// How the launch [`Harness::fail_midway`] set up fails half-way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Midway {
    /// The provider's API fails it: the launch returns an error.
    Fails,
    /// It waits (for capacity, for a queue) and its caller gives up after
    /// this long, dropping the launch, as a killed or interrupted
    /// launcher would; what it made so far stays.
    Abandoned(std::time::Duration),
}

/// One provider set up for the contract suite.
pub trait Harness: Send + Sync {
    /// The provider under test.
    fn provider(&self) -> &dyn Provider;

    /// The owner id the provider should tag with.
    fn owner(&self) -> String;

    /// Prefix of the cluster names the suite uses (short, lowercase):
    /// `ct`, or one unique to this test run where the place is shared.
    fn prefix(&self) -> String {
        "ct".into()
    }

    /// A request for `count` (1 or 2) nodes of `cluster` that this provider
    /// can satisfy, with `client_token` as its token.
    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest;

    /// Makes the next launch of `cluster` fail half-way: after it made
    /// something (a node, a group, a record) and before it finished.
    fn fail_midway(&self, cluster: &ClusterName) -> Result<Midway, Unsupported>;

    /// Makes the next launch of `cluster` fail as the provider's API fails
    /// with an error of `kind`.
    fn fail_with(&self, cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported>;

    /// Takes back whatever [`Harness::fail_midway`] or
    /// [`Harness::fail_with`] set up and did not fire.
    fn clear_failures(&self, cluster: &ClusterName) {
        let _ = cluster;
    }

    /// Everything the provider holds for `cluster`, looked up on its side
    /// (not through the provider), in any order: empty when nothing is
    /// left. Ended resources (terminated instances a cloud still lists) are
    /// not included.
    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource>;

    /// Whether [`Provider::clusters`] lists this provider's clusters (it
    /// does where resources carry tags; providers that keep every resource
    /// in local records return an empty list, as the trait allows).
    fn lists_clusters(&self) -> bool;

    /// The same place as another gangway installation (another owner id)
    /// sees it, with that owner's id: `Unsupported` where one place cannot
    /// hold two owners' resources (records under one `$GANGWAY_HOME`).
    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported>;
}

/// Runs every rule against the harness's provider; panics listing each
/// broken rule.
pub async fn run(h: &dyn Harness) {
    let name = h.provider().name().to_string();
    let mut broken = Vec::new();
    for rule in RULES {
        let outcome = match *rule {
            "launch" => launch_and_describe(h).await,
            "idempotent" => idempotent(h).await,
            "terminate" => terminate(h).await,
            "midway" => midway(h).await,
            "tags" => tags(h).await,
            "owners" => owners(h).await,
            "stop" => stop(h).await,
            "replace" => replace(h).await,
            "errors" => errors(h).await,
            other => unreachable!("rule {other}"),
        };
        match outcome {
            Ok(Outcome::Kept) => eprintln!("contract {name}: {rule}: ok"),
            Ok(Outcome::Partly(why)) => eprintln!("contract {name}: {rule}: ok, except: {why}"),
            Ok(Outcome::Excused(why)) => eprintln!("contract {name}: {rule}: excused: {why}"),
            Err(why) => {
                eprintln!("contract {name}: {rule}: BROKEN: {why}");
                broken.push(format!("{rule}: {why}"));
            }
        }
        // Whatever a broken rule left, so the next rule starts clean.
        let cluster = cluster(h, rule);
        h.clear_failures(&cluster);
        let _ = h.provider().terminate(&cluster).await;
    }
    assert!(
        broken.is_empty(),
        "provider {name} breaks the contract:\n  {}",
        broken.join("\n  ")
    );
}

/// The rules, in the order [`run`] checks them.
pub const RULES: &[&str] = &[
    "launch",
    "idempotent",
    "terminate",
    "midway",
    "tags",
    "owners",
    "stop",
    "replace",
    "errors",
];

/// How a rule came out, when it was not broken.
enum Outcome {
    /// Checked in full.
    Kept,
    /// Checked, but for a part the harness excused.
    Partly(String),
    /// Not checked, for the harness's reason.
    Excused(String),
}

type Check = Result<Outcome, String>;

fn cluster(h: &dyn Harness, rule: &str) -> ClusterName {
    ClusterName(format!("{}-{rule}", h.prefix()))
}

fn token(h: &dyn Harness, rule: &str, n: u32) -> String {
    format!("{}-{rule}-t{n}", h.prefix())
}

fn ids(nodes: &[Node]) -> BTreeSet<String> {
    nodes.iter().map(|n| n.id.0.clone()).collect()
}

/// Nodes not yet gone (terminated or preempted nodes a provider still
/// reports are not the cluster's any more).
fn live(nodes: &[Node]) -> Vec<Node> {
    nodes
        .iter()
        .filter(|n| !matches!(n.state, NodeState::Terminated | NodeState::Preempted { .. }))
        .cloned()
        .collect()
}

fn ensure(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why())
    }
}

/// [`Harness::leftovers`] of `c`, sorted (harnesses list them in any
/// order).
fn leftovers(h: &dyn Harness, c: &ClusterName) -> Vec<Resource> {
    let mut held = h.leftovers(c);
    held.sort();
    held
}

fn list(rs: &[Resource]) -> String {
    rs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Terminates and checks that nothing is left, on both sides.
async fn gone(h: &dyn Harness, c: &ClusterName) -> Result<(), String> {
    let p = h.provider();
    p.terminate(c)
        .await
        .map_err(|e| format!("terminate {c}: {e}"))?;
    let left = leftovers(h, c);
    ensure(left.is_empty(), || {
        format!("terminate {c} left {}", list(&left))
    })?;
    let described = p
        .describe(c)
        .await
        .map_err(|e| format!("describe {c} after terminate: {e}"))?;
    let still = live(&described);
    ensure(still.is_empty(), || {
        format!(
            "describe {c} after terminate still reports {:?}",
            ids(&still)
        )
    })
}

async fn launch_and_describe(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "launch");
    let req = h.request(&c, 2, &token(h, "launch", 1));
    let nodes = p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    ensure(nodes.len() == 2, || {
        format!("asked for 2 nodes, got {}", nodes.len())
    })?;
    ensure(ids(&nodes).len() == 2, || {
        format!("two nodes with one id: {:?}", ids(&nodes))
    })?;
    for n in &nodes {
        ensure(n.state == NodeState::Running, || {
            format!("node {} launched {:?}", n.id, n.state)
        })?;
        ensure(n.placement == req.placement, || {
            format!(
                "node {} is in {}, asked for {}",
                n.id, n.placement, req.placement
            )
        })?;
    }
    let described = p.describe(&c).await.map_err(|e| format!("describe: {e}"))?;
    ensure(ids(&described) == ids(&nodes), || {
        format!(
            "describe reports {:?}, launch returned {:?}",
            ids(&described),
            ids(&nodes)
        )
    })?;
    for n in &described {
        ensure(n.state == NodeState::Running, || {
            format!("describe: node {} is {:?}", n.id, n.state)
        })?;
        ensure(n.placement == req.placement, || {
            format!("describe: node {} is in {}", n.id, n.placement)
        })?;
    }
    gone(h, &c).await?;
    Ok(Outcome::Kept)
}

async fn idempotent(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "idempotent");
    let req = h.request(&c, 2, &token(h, "idempotent", 1));
    let first = p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    let before = leftovers(h, &c);
    let again = p
        .launch(&req)
        .await
        .map_err(|e| format!("second launch with the same token: {e}"))?;
    ensure(ids(&again) == ids(&first), || {
        format!(
            "the second launch returned {:?}, the first {:?}",
            ids(&again),
            ids(&first)
        )
    })?;
    let after = leftovers(h, &c);
    ensure(after == before, || {
        format!(
            "the second launch changed what the cluster holds: before {}, after {}",
            list(&before),
            list(&after)
        )
    })?;
    let described = live(&p.describe(&c).await.map_err(|e| format!("describe: {e}"))?);
    ensure(described.len() == 2, || {
        format!("describe reports {} live nodes, not 2", described.len())
    })?;
    gone(h, &c).await?;
    Ok(Outcome::Kept)
}

async fn terminate(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "terminate");
    let req = h.request(&c, 1, &token(h, "terminate", 1));
    p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    gone(h, &c).await?;
    p.terminate(&c)
        .await
        .map_err(|e| format!("a second terminate: {e}"))?;
    let never = ClusterName(format!("{}-never", h.prefix()));
    p.terminate(&never)
        .await
        .map_err(|e| format!("terminate of a cluster that never existed: {e}"))?;
    let d = p
        .describe(&never)
        .await
        .map_err(|e| format!("describe of a cluster that never existed: {e}"))?;
    ensure(d.is_empty(), || {
        format!("a cluster that never existed has nodes {:?}", ids(&d))
    })?;
    Ok(Outcome::Kept)
}

async fn midway(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "midway");
    let how = match h.fail_midway(&c) {
        Ok(how) => how,
        Err(why) => return Ok(Outcome::Excused(why.0)),
    };
    let req = h.request(&c, 2, &token(h, "midway", 1));
    let launch = p.launch(&req);
    let outcome = match how {
        Midway::Fails => Some(launch.await),
        Midway::Abandoned(after) => tokio::time::timeout(after, launch).await.ok(),
    };
    match outcome {
        Some(Ok(nodes)) => {
            return Err(format!(
                "a launch made to fail half-way succeeded with {:?}",
                ids(&nodes)
            ))
        }
        Some(Err(e)) => ensure(e.provider == p.name(), || {
            format!("the failure names provider {:?}: {e}", e.provider)
        })?,
        None => {}
    }
    h.clear_failures(&c);
    let half = leftovers(h, &c);
    ensure(!half.is_empty(), || {
        "the launch failed before it made anything: there was no half-created cluster to clean \
         (make the harness fail it later)"
            .into()
    })?;
    gone(h, &c).await?;
    // The half-created cluster is truly gone: a new launch starts afresh.
    let req = h.request(&c, 1, &token(h, "midway", 2));
    let nodes = p
        .launch(&req)
        .await
        .map_err(|e| format!("launch after cleaning a half-created cluster: {e}"))?;
    ensure(nodes.len() == 1, || {
        format!("relaunch gave {} nodes, not 1", nodes.len())
    })?;
    gone(h, &c).await?;
    Ok(Outcome::Kept)
}

async fn tags(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "tags");
    let owner = h.owner();
    let req = h.request(&c, 1, &token(h, "tags", 1));
    p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    let held = leftovers(h, &c);
    ensure(!held.is_empty(), || {
        "the harness sees nothing of a launched cluster".to_string()
    })?;
    for r in &held {
        ensure(r.cluster.as_deref() == Some(c.0.as_str()), || {
            format!("{r} does not carry the cluster's name")
        })?;
        ensure(r.owner.as_deref() == Some(owner.as_str()), || {
            format!("{r} does not carry the owner {owner}")
        })?;
    }
    if h.lists_clusters() {
        let found = p.clusters().await.map_err(|e| format!("clusters(): {e}"))?;
        let ours: Vec<_> = found.iter().filter(|t| t.name == c).collect();
        ensure(ours.len() == 1 && ours[0].owner == owner, || {
            format!("clusters() lists {c} as {ours:?}, not once with owner {owner}")
        })?;
    }
    gone(h, &c).await?;
    if h.lists_clusters() {
        let found = p
            .clusters()
            .await
            .map_err(|e| format!("clusters() after terminate: {e}"))?;
        ensure(!found.iter().any(|t| t.name == c), || {
            format!("clusters() still lists {c} after terminate")
        })?;
        Ok(Outcome::Kept)
    } else {
        Ok(Outcome::Partly(
            "clusters() lists nothing here, as the trait allows where there are no tags \
             to sweep; what the cluster holds carries its name and owner"
                .into(),
        ))
    }
}

async fn owners(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "owners");
    let (theirs, their_owner) = match h.other_owner() {
        Ok(other) => other,
        Err(why) => return Ok(Outcome::Excused(why.0)),
    };
    let mut req = h.request(&c, 1, &token(h, "owners", 1));
    req.owner = their_owner.clone();
    let their_nodes = theirs
        .launch(&req)
        .await
        .map_err(|e| format!("the other owner's launch: {e}"))?;
    let outcome: Check = async {
        // Not ours: not described, not listed as ours.
        let d = live(&p.describe(&c).await.map_err(|e| format!("describe: {e}"))?);
        ensure(d.is_empty(), || {
            format!(
                "describe lists the other owner's nodes {:?} as ours",
                ids(&d)
            )
        })?;
        if h.lists_clusters() {
            let found = p.clusters().await.map_err(|e| format!("clusters(): {e}"))?;
            ensure(
                !found.iter().any(|t| t.name == c && t.owner == h.owner()),
                || format!("clusters() lists the other owner's {c} as ours: {found:?}"),
            )?;
        }
        // Ours of the same name, then our terminate: theirs survive.
        let req = h.request(&c, 1, &token(h, "owners", 2));
        let ours = p
            .launch(&req)
            .await
            .map_err(|e| format!("our launch beside theirs: {e}"))?;
        ensure(ids(&ours).is_disjoint(&ids(&their_nodes)), || {
            format!(
                "our launch adopted the other owner's nodes {:?}",
                ids(&ours)
            )
        })?;
        p.terminate(&c)
            .await
            .map_err(|e| format!("terminate: {e}"))?;
        let left = live(
            &theirs
                .describe(&c)
                .await
                .map_err(|e| format!("the other owner's describe: {e}"))?,
        );
        ensure(ids(&left) == ids(&their_nodes), || {
            format!(
                "our terminate touched the other owner's cluster: {:?} of {:?} left",
                ids(&left),
                ids(&their_nodes)
            )
        })?;
        Ok(Outcome::Kept)
    }
    .await;
    let cleanup = theirs.terminate(&c).await;
    let outcome = outcome?;
    cleanup.map_err(|e| format!("the other owner's terminate: {e}"))?;
    gone(h, &c).await?;
    Ok(outcome)
}

async fn stop(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "stop");
    let req = h.request(&c, 1, &token(h, "stop", 1));
    let nodes = p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    match p.cannot_stop(req.use_spot) {
        None => {
            p.stop(&c).await.map_err(|e| format!("stop: {e}"))?;
            let d = p.describe(&c).await.map_err(|e| format!("describe: {e}"))?;
            ensure(
                ids(&d) == ids(&nodes) && d.iter().all(|n| n.state == NodeState::Stopped),
                || format!("after stop describe reports {d:?}"),
            )?;
            p.stop(&c)
                .await
                .map_err(|e| format!("a second stop: {e}"))?;
            let started = p
                .start(&c, req.provider_config.as_ref())
                .await
                .map_err(|e| format!("start: {e}"))?;
            ensure(ids(&started) == ids(&nodes), || {
                format!(
                    "start brought back {:?}, not {:?}",
                    ids(&started),
                    ids(&nodes)
                )
            })?;
            let d = p.describe(&c).await.map_err(|e| format!("describe: {e}"))?;
            ensure(d.iter().all(|n| n.state == NodeState::Running), || {
                format!("after start describe reports {d:?}")
            })?;
        }
        Some(why) => {
            ensure(!why.is_empty(), || "cannot_stop gives no reason".into())?;
            match p.stop(&c).await {
                Ok(()) => return Err(format!("cannot_stop says {why:?}, yet stop returned Ok")),
                Err(e) => ensure(e.kind == ErrorKind::InvalidRequest, || {
                    format!("stop refuses with {:?}, not InvalidRequest: {e}", e.kind)
                })?,
            }
            let d = p.describe(&c).await.map_err(|e| format!("describe: {e}"))?;
            ensure(
                ids(&d) == ids(&nodes) && d.iter().all(|n| n.state == NodeState::Running),
                || format!("a refused stop changed the nodes: {d:?}"),
            )?;
        }
    }
    gone(h, &c).await?;
    Ok(Outcome::Kept)
}

async fn replace(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "replace");
    let req = h.request(&c, 2, &token(h, "replace", 1));
    let first = p.launch(&req).await.map_err(|e| format!("launch: {e}"))?;
    let mut first_ids: Vec<String> = ids(&first).into_iter().collect();
    let survivor = first_ids.remove(0);
    let lost = gangway_provider::InstanceId(first_ids.remove(0));
    let removed = p.remove_nodes(&c, std::slice::from_ref(&lost)).await;
    let live_now = |nodes: Vec<Node>| -> BTreeSet<String> { ids(&live(&nodes)) };
    if p.cannot_replace_nodes().is_some() {
        ensure(removed.is_err(), || {
            "cannot_replace_nodes says it cannot, yet remove_nodes answered Ok".to_string()
        })?;
        let still = live_now(p.describe(&c).await.map_err(|e| format!("describe: {e}"))?);
        ensure(still == ids(&first), || {
            format!(
                "a refused remove_nodes changed the cluster: {still:?}, was {:?}",
                ids(&first)
            )
        })?;
        gone(h, &c).await?;
        return Ok(Outcome::Kept);
    }
    removed.map_err(|e| format!("remove_nodes of {lost}: {e}"))?;
    let after = live_now(p.describe(&c).await.map_err(|e| format!("describe: {e}"))?);
    ensure(after == BTreeSet::from([survivor.clone()]), || {
        format!("after removing {lost} describe reports {after:?}, not only {survivor}")
    })?;
    let again = h.request(&c, 2, &token(h, "replace", 2));
    let grown = p
        .launch(&again)
        .await
        .map_err(|e| format!("the launch that replaces {lost}: {e}"))?;
    ensure(grown.len() == 2, || {
        format!("the replacing launch returned {} nodes", grown.len())
    })?;
    ensure(grown.iter().any(|n| n.id.0 == survivor), || {
        format!(
            "the replacing launch dropped the survivor {survivor}: {:?}",
            ids(&grown)
        )
    })?;
    for n in &grown {
        ensure(n.state == NodeState::Running, || {
            format!("node {} after the replacement is {:?}", n.id, n.state)
        })?;
        ensure(n.placement == req.placement, || {
            format!("the replacement {} is in {}", n.id, n.placement)
        })?;
    }
    gone(h, &c).await?;
    Ok(Outcome::Kept)
}

async fn errors(h: &dyn Harness) -> Check {
    let p = h.provider();
    let c = cluster(h, "errors");
    let mut excused = Vec::new();
    for (n, kind) in [
        ErrorKind::Capacity,
        ErrorKind::Quota,
        ErrorKind::Auth,
        ErrorKind::InvalidRequest,
    ]
    .into_iter()
    .enumerate()
    {
        if let Err(why) = h.fail_with(&c, kind) {
            excused.push(format!("{kind:?}: {why}"));
            continue;
        }
        let req = h.request(&c, 1, &token(h, "errors", n as u32));
        let e = match p.launch(&req).await {
            Ok(nodes) => {
                return Err(format!(
                    "a launch made to fail with {kind:?} succeeded: {:?}",
                    ids(&nodes)
                ))
            }
            Err(e) => e,
        };
        h.clear_failures(&c);
        ensure(e.kind == kind, || {
            format!("an injected {kind:?} came back as {:?}: {e}", e.kind)
        })?;
        ensure(
            e.kind.fails_over() == matches!(kind, ErrorKind::Capacity | ErrorKind::Quota),
            || format!("{kind:?} fails over: {}", e.kind.fails_over()),
        )?;
        ensure(e.provider == p.name(), || {
            format!("a {kind:?} error names provider {:?}: {e}", e.provider)
        })?;
        ensure(e.location.contains(&req.placement.region), || {
            format!(
                "a {kind:?} error's location {:?} does not name region {}: {e}",
                e.location, req.placement.region
            )
        })?;
        gone(h, &c).await?;
    }
    if excused.is_empty() {
        Ok(Outcome::Kept)
    } else {
        Ok(Outcome::Partly(format!(
            "not injectable here: {}",
            excused.join("; ")
        )))
    }
}
