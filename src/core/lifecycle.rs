//! One cluster's life cycle, as every service goes through it (`launch`,
//! `exec`, the managed-job controller, the controller host): reserve a row
//! ([`Store::reserve_cluster`]), provision and record it ([`bring_up`]),
//! start jobs on it ([`gang::submit`], driven by [`drive`]), tear it down
//! ([`teardown`]). Billing rides on the records: the store opens a ledger
//! row when a cluster's nodes are recorded up and closes it when the row
//! goes, whoever asked.

use std::path::Path;
use std::time::Duration;

use gangway_provider::ClusterName;

use crate::core::gang::{self, DriveError};
use crate::core::optimizer::Candidate;
use crate::core::provision::{
    self, remove_attempt, Contact, ProvisionError, Reporter, RetryPolicy, TeardownError,
};
use crate::core::registry::Providers;
use crate::core::state::{ClusterRow, ClusterStatus, JobStatus, OwnerLock, StateError, Store};

/// Provisions a reserved cluster along `plan` and records its nodes `UP`
/// (which opens its ledger row). A failure leaves the state as it
/// demands: a leftover keeps the `TERMINATING` row with the reason
/// (something may still run there); a state error leaves the row `INIT`
/// with the reason, for the next reservation to resume; anything else
/// (every attempt's nodes confirmed gone) forgets the row and deletes the
/// buckets made for it.
pub(crate) async fn bring_up(
    store: &Store,
    row: &ClusterRow,
    plan: &[Candidate],
    providers: &Providers,
    reporter: &dyn Reporter,
    contact: Contact,
) -> Result<ClusterRow, ProvisionError> {
    let name = &row.name;
    let result = provision::provision(
        store,
        row,
        plan,
        providers,
        reporter,
        RetryPolicy::default(),
        contact,
    )
    .await;
    match result {
        Ok(p) => {
            store.set_nodes(name, ClusterStatus::Up, &p.nodes)?;
            Ok(store
                .cluster(name)?
                .expect("the cluster row was just set up"))
        }
        Err(e) => {
            match &e {
                ProvisionError::Leftover { .. } => {}
                ProvisionError::State(_) => {
                    store.set_status(name, ClusterStatus::Init, Some(&e.to_string()))?
                }
                ProvisionError::Exhausted { .. } | ProvisionError::Provider(_) => {
                    store.remove_cluster(name)?;
                    crate::core::storage::remove_buckets_saying(store, &format!("cluster:{name}"))
                        .await;
                }
            }
            Err(e)
        }
    }
}

/// Tears a cluster down: stops its jobs, terminates every node by tag,
/// then forgets it. The row stays (`TERMINATING`, with the error) if the
/// provider fails, so nothing is left running unseen.
pub(crate) async fn teardown(
    store: &Store,
    name: &str,
    providers: &Providers,
) -> Result<(), TeardownError> {
    let Some(row) = store.cluster(name)? else {
        return Ok(());
    };
    store.set_status(name, ClusterStatus::Terminating, None)?;
    stop_drivers(store, name).await?;
    if let Some(cloud) = &row.cloud {
        let Some(p) = providers.get(cloud) else {
            let e = TeardownError::NoProvider(cloud.clone());
            store.set_teardown_failed(name, &e.to_string())?;
            return Err(e);
        };
        // On machines that outlive the cluster (ssh pools), whatever the
        // cluster still runs there is killed before they are released.
        // Cloud VMs go with everything on them: no connection needed.
        if p.machines_outlive_clusters() {
            let nodes = store.nodes(name)?;
            if let Some(t) = providers.transport(cloud, store.home(), name) {
                if t.connect(&nodes).await.is_ok() {
                    for n in &nodes {
                        t.kill_cluster(n, name);
                    }
                }
            }
        }
        if let Err(e) = remove_attempt(
            p.as_ref(),
            &ClusterName(name.to_string()),
            RetryPolicy::default(),
        )
        .await
        {
            store.set_teardown_failed(name, &e.to_string())?;
            store.event(name, None, "leftover", &format!("teardown failed: {e}"))?;
            return Err(e.into());
        }
    }
    // The buckets made for it (persistent: false) go with it; one that
    // cannot be deleted keeps the row, so `down` tries again.
    match crate::core::storage::remove_buckets(store, &format!("cluster:{name}")).await {
        Ok(urls) => {
            for u in urls {
                store.event(name, None, "bucket", &format!("deleted {u}"))?;
            }
        }
        Err(e) => {
            let e = TeardownError::Bucket(e);
            store.set_teardown_failed(name, &e.to_string())?;
            return Err(e);
        }
    }
    store.remove_cluster(name)?;
    Ok(())
}

/// Asks the drivers of a cluster's live jobs to stop (they record how the
/// job ended); jobs without a live driver are marked now. Waits (without
/// blocking the runtime) up to the drivers' grace period for them.
pub(crate) async fn stop_drivers(store: &Store, name: &str) -> Result<(), StateError> {
    let mut signalled = Vec::new();
    let deadline = std::time::Instant::now() + crate::core::gang::GRACE + Duration::from_secs(5);
    for mut j in store.jobs(name)? {
        if j.status.is_terminal() {
            continue;
        }
        if OwnerLock::is_held(&store.job_lock_path(j.id)) {
            // A driver records its pid right after taking the lock: one
            // caught in between is waited for, not skipped (skipped, it
            // would run its ranks on nodes about to be torn down).
            while j.driver_pid.is_none() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(25)).await;
                match store.job(j.id)? {
                    Some(now) => j = now,
                    None => break,
                }
            }
            if let Some(pid) = j.driver_pid {
                // SAFETY: plain kill(2) on a pid the job's lock says is alive.
                unsafe {
                    libc::kill(pid as i32, libc::SIGTERM);
                }
                signalled.push(j.id);
            }
        } else {
            store.set_job_status(
                j.id,
                JobStatus::Cancelled,
                Some("the cluster was taken down"),
            )?;
        }
    }
    // Let the drivers stop their ranks gracefully and record the ending
    // before the nodes go away under them.
    for id in signalled {
        while std::time::Instant::now() < deadline {
            match store.job(id)? {
                Some(j) if !j.status.is_terminal() => {
                    tokio::time::sleep(Duration::from_millis(25)).await
                }
                _ => break,
            }
        }
    }
    Ok(())
}

/// Drives job `job_id` to its end (see [`gang::drive`]), then tears its
/// cluster down when the job asked for it (`--down`), saying so in the
/// job's log. Returns the job's final status.
pub(crate) async fn drive(
    home: &Path,
    job_id: i64,
    secrets: Vec<(String, String)>,
) -> Result<JobStatus, DriveError> {
    let driven = gang::drive(home, job_id, secrets).await?;
    let (true, Some(logs)) = (driven.down_after, &driven.logs) else {
        return Ok(driven.status);
    };
    let cluster = &driven.cluster;
    let store = driven.cx.store();
    logs.say(&format!("tearing down cluster {cluster} (--down)"));
    match store.lock_cluster(cluster, "tearing down") {
        Ok(_l) => match teardown(store, cluster, driven.cx.providers()).await {
            Ok(()) => logs.say(&format!("cluster {cluster} torn down")),
            Err(e) => logs.say(&format!(
                "teardown failed: {e}; run `gangway down {cluster}`"
            )),
        },
        Err(e) => {
            // The launcher reads this to exit non-zero: the cluster runs on.
            let why = format!("--down skipped the teardown: {e}");
            let _ = store.set_last_error(cluster, Some(&why));
            logs.say(&format!("{why}; run `gangway down {cluster}`"));
        }
    }
    Ok(driven.status)
}
