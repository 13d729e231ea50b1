//! Running a job on a cluster that is up (`gangway exec`): the cluster
//! checked, the job fitted to it; starting it is [`super::launch::start_job`].

use std::path::Path;

use crate::core::gang::JobSpec;
use crate::core::spec::Task;
use crate::core::state::{ClusterRow, ClusterStatus, Store};
use crate::Error;

/// Cluster `name`'s row, when it exists.
pub(crate) fn cluster(store: &Store, name: &str) -> Result<ClusterRow, Error> {
    store.cluster(name)?.ok_or_else(|| Error::NotFound {
        message: format!("no cluster named '{name}'"),
        hint: Some("`gangway status` lists the clusters".into()),
    })
}

/// Cluster `name`, when it is up.
pub(crate) fn up_cluster(store: &Store, name: &str) -> Result<ClusterRow, Error> {
    super::launch::check_name(name)?;
    let row = cluster(store, name)?;
    if row.status != ClusterStatus::Up {
        return Err(Error::usage(
            format!("cluster '{name}' is {}, not UP", row.status),
            Some(&format!("`gangway start {name}` starts a stopped cluster")),
        ));
    }
    Ok(row)
}

/// A task's job on cluster `name`, without its setup: the task's buckets
/// are checked with what the nodes reach by themselves (they are there:
/// no credentials from here) and made for the cluster.
pub(crate) fn task_job(
    store: &Store,
    name: &str,
    task: &Task,
    file: &Path,
) -> Result<JobSpec, Error> {
    let spec = super::launch::job_spec(task, file, false, false)?;
    let own = crate::core::storage::OwnIdentity::of_nodes(&store.nodes(name)?);
    crate::core::storage::preflight_now(task, file, &spec.bucket_mounts, &own)?;
    crate::core::storage::make_buckets_now(
        task,
        file,
        &spec.bucket_mounts,
        store,
        &format!("cluster:{name}"),
    )?;
    Ok(spec)
}

/// Fits a job to the cluster: no more nodes than it has, and the GPUs its
/// nodes have.
pub(crate) fn fit(spec: &mut JobSpec, row: &ClusterRow) -> Result<(), Error> {
    if spec.num_nodes > row.num_nodes {
        return Err(Error::usage(
            format!(
                "the job needs {} nodes; cluster '{}' has {}",
                spec.num_nodes, row.name, row.num_nodes
            ),
            None,
        ));
    }
    spec.gpus_per_node = row.accelerator_count.ceil() as u32;
    Ok(())
}
