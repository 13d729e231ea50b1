//! Commands on clusters that exist: tear down (also what the clouds hold
//! that this state lost), stop, start, refresh what the providers say,
//! and the autostop watcher.

use std::path::Path;
use std::time::Duration;

use gangway_provider::ClusterName;

use crate::core::lifecycle;
use crate::core::provision::{self, node_rows, TeardownError};
use crate::core::ranks::assign_ranks;
use crate::core::registry::Providers;
use crate::core::runtime::runtime;
use crate::core::state::{ClusterRow, ClusterStatus, OwnerLock, Store};
use crate::Error;

/// Tears cluster `name` down under its lock; the error says what is left
/// and how to finish.
pub(crate) fn down(store: &Store, providers: &Providers, name: &str) -> Result<(), Error> {
    let _lock = store.lock_cluster(name, "launching or tearing down")?;
    runtime()?
        .block_on(lifecycle::teardown(store, name, providers))
        .map_err(|e| match e {
            TeardownError::State(e) => Error::State(e),
            // The nodes are gone; a bucket made for it is not.
            e @ TeardownError::Bucket(_) => Error::usage(
                format!("the nodes are terminated, but {e}"),
                Some(&format!(
                    "the cluster stays listed (TERMINATING) until the bucket is deleted: \
                     fix the credentials and run `gangway down {name}` again"
                )),
            ),
            e => Error::leftover(store, name, e),
        })
}

/// A teardown retried: the cluster and how it went.
pub(crate) type Retried = (String, Result<(), TeardownError>);

/// Retries the teardowns that failed before (and that no process works on
/// now): the user asked the providers, so no backoff applies. Returns each
/// one tried and how it went.
pub(crate) fn finish_teardowns(
    store: &Store,
    clusters: &[ClusterRow],
) -> Result<Vec<Retried>, Error> {
    let due: Vec<&ClusterRow> = clusters
        .iter()
        .filter(|c| c.status == ClusterStatus::Terminating && c.teardown_failures > 0)
        .collect();
    let mut tried = Vec::new();
    if due.is_empty() {
        return Ok(tried);
    }
    let providers = Providers::new(store.home());
    let rt = runtime()?;
    for c in due {
        let Ok(_lock) = store.lock_cluster(&c.name, "tearing down") else {
            continue; // someone works on it now
        };
        match rt.block_on(lifecycle::teardown(store, &c.name, &providers)) {
            Err(TeardownError::State(e)) => return Err(e.into()),
            r => tried.push((c.name.clone(), r)),
        }
    }
    Ok(tried)
}

/// Records what the providers say about each cluster's nodes now.
pub(crate) fn refresh(store: &Store, clusters: &[ClusterRow]) -> Result<(), Error> {
    let providers = Providers::new(store.home());
    let rt = runtime()?;
    for c in clusters {
        if c.status == ClusterStatus::Terminating {
            continue;
        }
        let Some(p) = c.cloud.as_deref().and_then(|cl| providers.get(cl)) else {
            continue;
        };
        let seen = rt.block_on(p.describe(&ClusterName(c.name.clone())))?;
        let states: Vec<(String, String)> = seen
            .iter()
            .map(|n| (n.id.0.clone(), provision::state_name(&n.state).to_string()))
            .collect();
        store.update_node_states(&c.name, &states)?;
    }
    Ok(())
}

/// Stops cluster `name`'s jobs and machines (its disks stay).
pub(crate) fn stop(store: &Store, providers: &Providers, row: &ClusterRow) -> Result<(), Error> {
    let n = &row.name;
    let _lock = store.lock_cluster(n, "launching or tearing down")?;
    let cloud = row.cloud.clone().unwrap_or_default();
    let p = providers
        .get(&cloud)
        .ok_or_else(|| TeardownError::NoProvider(cloud.clone()))?;
    let rt = runtime()?;
    rt.block_on(lifecycle::stop_drivers(store, n))?;
    rt.block_on(p.stop(&ClusterName(n.clone())))?;
    store.set_status(n, ClusterStatus::Stopped, None)?;
    store.event(n, None, "stop", "stopped")?;
    Ok(())
}

/// Starts a stopped cluster again with the configuration it was launched
/// with; its ranks are assigned afresh. Returns its node count.
pub(crate) fn start(
    store: &Store,
    providers: &Providers,
    row: &ClusterRow,
) -> Result<usize, Error> {
    let n = &row.name;
    let _lock = store.lock_cluster(n, "launching or tearing down")?;
    let cloud = row.cloud.clone().unwrap_or_default();
    let p = providers
        .get(&cloud)
        .ok_or_else(|| TeardownError::NoProvider(cloud.clone()))?;
    let config: Option<serde_json::Value> = row
        .provider_config
        .as_deref()
        .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
        .and_then(|v| v.get(&cloud).cloned());
    let nodes = runtime()?.block_on(p.start(&ClusterName(n.clone()), config.as_ref()))?;
    let ranked = assign_ranks(nodes);
    store.set_nodes(n, ClusterStatus::Up, &node_rows(&ranked))?;
    store.event(n, None, "start", "started")?;
    Ok(ranked.len())
}

/// Arms autostop on a cluster (`idle` minutes, then stop or, with `down`,
/// tear down) and starts its watcher. A cluster its provider cannot stop
/// is refused now rather than failing later, when nobody watches.
pub(crate) fn autostop(
    home: &Path,
    store: &Store,
    row: &ClusterRow,
    idle: u32,
    down: bool,
) -> Result<(), Error> {
    let name = &row.name;
    if !down {
        let providers = Providers::new(home);
        let why = row
            .cloud
            .as_deref()
            .and_then(|c| providers.get(c))
            .and_then(|p| p.cannot_stop(row.use_spot));
        if let Some(why) = why {
            return Err(Error::usage(
                format!("'{name}' cannot be autostopped: {why}"),
                Some(&format!(
                    "`gangway autostop {name} -i {idle} --down` tears it down when idle instead"
                )),
            ));
        }
    }
    store.set_autostop(name, Some(idle), down)?;
    // One watcher per cluster; a second start finds the lock held and exits.
    let exe = std::env::current_exe()?;
    crate::core::runtime::detached(&exe, home, &["__autostop", name]).spawn()?;
    Ok(())
}

/// The autostop watcher (`gangway __autostop CLUSTER`): waits until the
/// cluster has been idle long enough, then stops or tears it down; one per
/// cluster (a lock).
pub(crate) fn autostop_watch(home: &Path, cluster: &str) -> Result<(), Error> {
    let store = Store::open(home)?;
    let lock_path = home.join("locks").join(format!("autostop-{cluster}.lock"));
    let Some(_lock) = OwnerLock::try_acquire(&lock_path)? else {
        return Ok(());
    };
    let mut idle_since = crate::core::state::now_ms();
    loop {
        let Some(row) = store.cluster(cluster)? else {
            return Ok(());
        };
        let Some(idle_min) = row.autostop_idle_min else {
            return Ok(());
        };
        // A teardown this watcher started and that failed is retried
        // here when due (the row says when), until the cluster is gone.
        if row.status == ClusterStatus::Terminating && row.autostop_down {
            let due = row
                .retry_at
                .is_none_or(|t| t <= crate::core::state::now_ms());
            if due {
                if let Ok(_l) = store.lock_cluster(cluster, "autostopping") {
                    let providers = Providers::new(home);
                    let _ = runtime()?.block_on(crate::core::lifecycle::teardown(
                        &store, cluster, &providers,
                    ));
                }
            }
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        if row.status != ClusterStatus::Up {
            return Ok(());
        }
        crate::core::gang::reap(&store)?;
        let jobs = store.jobs(cluster)?;
        let busy = jobs.iter().any(|j| !j.status.is_terminal());
        if busy {
            idle_since = crate::core::state::now_ms();
        } else if let Some(end) = jobs.iter().filter_map(|j| j.ended_at).max() {
            idle_since = idle_since.max(end);
        }
        // A cluster with a live job is never idle, whatever the minutes say.
        if !busy && crate::core::state::now_ms() - idle_since >= i64::from(idle_min) * 60_000 {
            let providers = Providers::new(home);
            let rt = runtime()?;
            let Ok(_l) = store.lock_cluster(cluster, "autostopping") else {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            };
            if row.autostop_down {
                store.event(cluster, None, "autostop", "idle: tearing down")?;
                // A failure is kept on the row (TERMINATING, the reason,
                // the next retry) and retried above.
                if rt
                    .block_on(crate::core::lifecycle::teardown(
                        &store, cluster, &providers,
                    ))
                    .is_ok()
                {
                    return Ok(());
                }
                continue;
            }
            let cloud = row.cloud.clone().unwrap_or_default();
            let stopped = match providers.get(&cloud) {
                Some(p) => rt
                    .block_on(p.stop(&ClusterName(cluster.to_string())))
                    .map_err(|e| e.to_string()),
                None => Err(format!("the {cloud} provider is not in this build")),
            };
            match stopped {
                Ok(()) => {
                    store.set_status(cluster, ClusterStatus::Stopped, None)?;
                    store.event(cluster, None, "autostop", "idle: stopped")?;
                    return Ok(());
                }
                Err(e) => {
                    // Shown by `status` until a stop succeeds; tried again
                    // after a minute (the nodes keep running meanwhile).
                    let why = format!("autostop could not stop it (retrying each minute): {e}");
                    store.set_last_error(cluster, Some(&why))?;
                    store.event(cluster, None, "autostop", &why)?;
                    drop(_l);
                    std::thread::sleep(Duration::from_secs(60));
                    continue;
                }
            }
        }
        let pause = if idle_min == 0 { 500 } else { 5_000 };
        std::thread::sleep(Duration::from_millis(pause));
    }
}

/// Earlier versions' clusters by owner tag: (cluster, cloud, user).
pub(crate) type Legacy = Vec<(String, String, Option<String>)>;

/// What the clouds hold under an owner that this state does not know.
pub(crate) struct Orphans {
    /// The owner looked for: this installation's, or one to adopt.
    pub target: String,
    /// (cloud, cluster) under `target` to tear down.
    pub found: Vec<(String, ClusterName)>,
    /// Clusters of earlier versions (a user name as owner), by owner.
    pub legacy: std::collections::BTreeMap<String, Legacy>,
    /// Clusters of other installations, only counted.
    pub others: usize,
    /// The providers, acting for `target`.
    pub providers: Providers,
}

/// Lists what the clouds hold under this installation's owner id and its
/// state does not know, or, with `adopt`, everything under that owner.
/// A cloud without credentials is skipped, saying so on stderr.
pub(crate) fn orphans(home: &Path, store: &Store, adopt: Option<&str>) -> Result<Orphans, Error> {
    let me = crate::core::state::owner(home)?;
    let target = adopt.unwrap_or(&me).to_string();
    if target.is_empty() || target.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::usage(
            format!("--owner '{target}' is not an owner tag"),
            Some("give an installation's owner id (gw-...) or the user name `gangway down --orphans` listed"),
        ));
    }
    let adopting = target != me;
    let providers = Providers::with_owner(home, &target);
    let rt = runtime()?;
    let known: Vec<String> = store.clusters()?.into_iter().map(|c| c.name).collect();
    let mut found: Vec<(String, ClusterName)> = Vec::new();
    let mut legacy: std::collections::BTreeMap<String, Legacy> = Default::default();
    let mut others = 0usize;
    for (cloud, p) in providers.all() {
        let listed = match rt.block_on(p.clusters()) {
            Ok(l) => l,
            // A cloud you have no credentials for holds nothing of yours
            // that this machine could tear down: say so and go on.
            Err(e) if e.kind == gangway_provider::ErrorKind::Auth => {
                eprintln!("{cloud}: skipped: {e}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for c in listed {
            if c.owner == target {
                // Another owner's clusters are not the ones this state knows.
                if (adopting || !known.contains(&c.name.0))
                    && !found.iter().any(|(cl, n)| cl == cloud && *n == c.name)
                {
                    found.push((cloud.to_string(), c.name));
                }
            } else if !gangway_provider::is_owner_id(&c.owner) {
                if !known.contains(&c.name.0) {
                    legacy
                        .entry(c.owner)
                        .or_default()
                        .push((c.name.0, cloud.to_string(), c.user));
                }
            } else {
                others += 1;
            }
        }
    }
    Ok(Orphans {
        target,
        found,
        legacy,
        others,
        providers,
    })
}

/// A cluster's shown status: an `INIT` no process works on was interrupted.
pub(crate) fn shown_status(store: &Store, c: &ClusterRow) -> String {
    match c.status {
        ClusterStatus::Terminating if c.teardown_failures > 0 => format!("{} (failed)", c.status),
        ClusterStatus::Init | ClusterStatus::Terminating if !store.cluster_locked(&c.name) => {
            format!("{} (interrupted)", c.status)
        }
        s => s.to_string(),
    }
}
