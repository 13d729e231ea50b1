//! Launching: a cluster reserved, brought up (or reused when it is still
//! whole) and a job started on it; what `gangway launch` and
//! `gangway exec` do under their arguments and rendering.

use std::path::{Path, PathBuf};

use super::Ui;
use crate::core::config::local_path;
use crate::core::gang::JobSpec;
use crate::core::lifecycle;
use crate::core::optimizer::Candidate;
use crate::core::provision::{self, Contact, ProvisionError};
use crate::core::registry::Providers;
use crate::core::runtime::runtime;
use crate::core::spec::{MountSource, Task, Workdir};
use crate::core::state::{ClusterRow, ClusterStatus, JobStatus, NewCluster, Reserved, Store};
use crate::Error;

/// Checks a cluster name: letters, digits, `-`, `_`, `.`; starts with a letter.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    let ok = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::usage(
            format!("cluster name '{name}' is not valid"),
            Some("use up to 63 letters, digits, '-', '_' or '.', starting with a letter"),
        ))
    }
}

/// A fresh cluster name, `gangway-XXXX`.
pub(crate) fn generated_name() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let h = (t ^ ((std::process::id() as u64) << 20)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("gangway-{:04x}", h >> 48)
}

/// What a task runs, ready to store with a job.
pub(crate) fn job_spec(
    task: &Task,
    task_file: &Path,
    setup: bool,
    down_after: bool,
) -> Result<JobSpec, Error> {
    let mut git_workdir = None;
    let workdir = match &task.workdir {
        None => None,
        Some(Workdir::Path(p)) => {
            let path = local_path(p);
            if !path.is_dir() {
                return Err(Error::usage(
                    format!(
                        "{}: workdir {} is not a directory",
                        task_file.display(),
                        path.display()
                    ),
                    Some("workdir is resolved against the directory you run gangway from"),
                ));
            }
            Some(path)
        }
        Some(Workdir::Git { url, git_ref }) => {
            git_workdir = Some(crate::core::gang::GitWorkdir {
                url: url.clone(),
                git_ref: git_ref.clone(),
            });
            None
        }
    };
    let mut mounts = Vec::new();
    for m in &task.file_mounts {
        if let MountSource::Local(src) = &m.source {
            let path = local_path(src);
            if !path.exists() {
                return Err(Error::usage(
                    format!(
                        "{}: file_mounts.{}: {} does not exist",
                        task_file.display(),
                        m.dest,
                        path.display()
                    ),
                    None,
                ));
            }
            mounts.push((m.dest.clone(), path));
        }
    }
    let bucket_mounts = crate::core::storage::bucket_mounts(task, task_file)?;
    Ok(JobSpec {
        name: task.name.clone(),
        setup: if setup { task.setup.clone() } else { None },
        run: task.run.clone(),
        envs: task
            .envs
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect(),
        secret_names: task.secrets.iter().map(|(k, _)| k.clone()).collect(),
        workdir,
        git_workdir,
        file_mounts: mounts,
        num_nodes: task.num_nodes,
        gpus_per_node: 0,
        checkpoint_dir: task.checkpoint.as_ref().and_then(|c| c.path.clone()),
        down_after,
        ports: task
            .resources
            .base
            .ports
            .iter()
            .map(|p| (p.start, p.end))
            .collect(),
        bucket_mounts,
        ..JobSpec::default()
    })
}

/// Secret values of a task, for the driver's pipe.
pub(crate) fn secrets_of(task: &Task) -> Vec<(String, String)> {
    task.secrets
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.expose().to_string())))
        .collect()
}

/// What to launch: the task, its plan and where it goes.
pub(crate) struct Request<'a> {
    /// The task, overrides applied.
    pub task: &'a Task,
    /// Its file, for errors.
    pub task_file: &'a Path,
    /// The failover plan, best first.
    pub plan: &'a [Candidate],
    /// The cluster's name.
    pub name: &'a str,
    /// The job the task makes (its bucket mounts are checked and made).
    pub spec: &'a JobSpec,
    /// Ask before paying for a new cluster.
    pub ask: bool,
    /// Provision only: the nodes are contacted by the first job.
    pub provision_only: bool,
}

/// A cluster up and recorded, new or reused.
pub(crate) struct Ready {
    /// gangway's home.
    pub home: PathBuf,
    /// The state store.
    pub store: Store,
    /// The cluster's row.
    pub row: ClusterRow,
}

/// How bringing a cluster up ended.
pub(crate) enum Up {
    /// The cluster is up.
    Ready(Box<Ready>),
    /// The person said no; nothing was made.
    Declined,
    /// Interrupted; whatever was made is gone.
    Interrupted,
}

/// Reserves the cluster, then reuses it (when it is up and whole) or
/// brings it up along the plan, holding the cluster's lock throughout.
/// Buckets are checked before anything is provisioned.
pub(crate) fn up(req: &Request<'_>, ui: &dyn Ui) -> Result<Up, Error> {
    let home = crate::core::config::gangway_home()?;
    let store = Store::open(&home)?;
    let launch_config = crate::core::config::launch_config(req.task, &home)?;
    let providers = Providers::new(&home);
    let own = crate::core::storage::OwnIdentity::configured(launch_config.as_ref(), &providers);
    crate::core::storage::preflight_now(req.task, req.task_file, &req.spec.bucket_mounts, &own)?;
    let _lock = store.lock_cluster(req.name, "launching")?;
    let config = launch_config.map(|c| c.to_string());
    let rt = runtime()?;
    let reserved = reserve_whole(req, &store, &providers, config, &rt, ui)?;
    let row = match reserved {
        Reserved::Existing(row) => reuse(req, &store, row, ui)?,
        Reserved::New(row) | Reserved::Resumed(row) => {
            match bring_up(req, &store, &providers, &row, &rt, ui)? {
                Ok(row) => row,
                Err(ended) => return Ok(ended),
            }
        }
    };
    Ok(Up::Ready(Box::new(Ready { home, store, row })))
}

/// Reserves the cluster's row. An `UP` record is only what was true last
/// time: the provider is asked before it is reused, and a cluster that
/// lost nodes is torn down and reserved afresh.
fn reserve_whole(
    req: &Request<'_>,
    store: &Store,
    providers: &Providers,
    config: Option<String>,
    rt: &tokio::runtime::Runtime,
    ui: &dyn Ui,
) -> Result<Reserved, Error> {
    let name = req.name;
    let token = format!("{name}-{}", generated_name().trim_start_matches("gangway-"));
    let new = NewCluster {
        name,
        num_nodes: req.task.num_nodes,
        client_token: &token,
        provider_config: config,
    };
    let reserved = store.reserve_cluster(&new)?;
    let Reserved::Existing(row) = &reserved else {
        return Ok(reserved);
    };
    if row.status != ClusterStatus::Up {
        return Ok(reserved);
    }
    let Some(why) = rt.block_on(lost_nodes(store, providers, row))? else {
        return Ok(reserved);
    };
    ui.line(&format!(
        "Cluster '{name}' {why}: replacing it with a new one"
    ));
    store.event(name, None, "replace", &why)?;
    if let Err(e) = rt.block_on(lifecycle::teardown(store, name, providers)) {
        return Err(Error::leftover(store, name, e));
    }
    Ok(store.reserve_cluster(&new)?)
}

/// An existing cluster, reused when it is up and big enough; the task's
/// buckets are made for it.
fn reuse(
    req: &Request<'_>,
    store: &Store,
    row: ClusterRow,
    ui: &dyn Ui,
) -> Result<ClusterRow, Error> {
    let name = req.name;
    match row.status {
        ClusterStatus::Up => {}
        ClusterStatus::Stopped => {
            return Err(Error::usage(
                format!("cluster '{name}' is stopped"),
                Some(&format!(
                    "start it with `gangway start {name}`, or pick another name with -c"
                )),
            ))
        }
        _ => {
            return Err(Error::usage(
                format!(
                    "cluster '{name}' is being torn down{}",
                    row.last_error
                        .as_deref()
                        .map(|e| format!(" (last error: {e})"))
                        .unwrap_or_default()
                ),
                Some(&format!(
                    "run `gangway down {name}` to finish, then launch again"
                )),
            ))
        }
    }
    if row.num_nodes < req.task.num_nodes {
        return Err(Error::usage(
            format!(
                "cluster '{name}' has {} node(s); the task needs {}",
                row.num_nodes, req.task.num_nodes
            ),
            Some("launch a new cluster with another -c name, or `gangway down` this one first"),
        ));
    }
    ui.line(&format!(
        "Reusing cluster '{name}' ({} node(s), {})",
        row.num_nodes, row.status
    ));
    crate::core::storage::make_buckets_now(
        req.task,
        req.task_file,
        &req.spec.bucket_mounts,
        store,
        &format!("cluster:{name}"),
    )?;
    Ok(row)
}

/// A new cluster: asked for (unless it costs nothing real), its buckets
/// made, then provisioned; an interrupt removes whatever was created.
fn bring_up(
    req: &Request<'_>,
    store: &Store,
    providers: &Providers,
    row: &ClusterRow,
    rt: &tokio::runtime::Runtime,
    ui: &dyn Ui,
) -> Result<Result<ClusterRow, Up>, Error> {
    let name = req.name;
    let best = &req.plan[0];
    let free = providers
        .get(&best.cloud)
        .is_some_and(|p| p.runs_on_this_machine());
    if req.ask
        && !free
        && !ui.confirm(&format!(
            "Launch '{name}': {} x {} on {}/{}/{} at ${:.2}/h?",
            best.nodes, best.instance_type, best.cloud, best.region, best.zone, best.total_per_hour
        ))?
    {
        store.remove_cluster(name)?;
        return Ok(Err(Up::Declined));
    }
    // Buckets the task names and lacks are made once the user said yes,
    // recorded for the cluster.
    let owner = format!("cluster:{name}");
    let mounts = &req.spec.bucket_mounts;
    if let Err(e) =
        crate::core::storage::make_buckets_now(req.task, req.task_file, mounts, store, &owner)
    {
        store.remove_cluster(name)?;
        crate::core::storage::remove_buckets_now(store, &owner);
        return Err(e);
    }
    let contact = if req.provision_only {
        Contact::Later
    } else {
        Contact::Now
    };
    let result = rt.block_on(async {
        tokio::select! {
            r = lifecycle::bring_up(store, row, req.plan, providers, ui, contact) => Some(r),
            _ = async {
                while !ui.interrupted() {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            } => None,
        }
    });
    let interrupted = match &result {
        None => Some("Interrupted: terminating whatever was created"),
        Some(_) if ui.interrupted() => Some("Interrupted: terminating the new cluster"),
        Some(_) => None,
    };
    if let Some(what) = interrupted {
        ui.line(what);
        if let Err(e) = rt.block_on(lifecycle::teardown(store, name, providers)) {
            return Err(Error::leftover(store, name, e));
        }
        return Ok(Err(Up::Interrupted));
    }
    match result.expect("not interrupted") {
        Ok(row) => {
            ui.line(&format!(
                "Cluster '{name}' is up: {} node(s), head {}",
                row.num_nodes,
                store
                    .nodes(name)?
                    .first()
                    .map(|n| n.private_ip.as_str())
                    .unwrap_or("-")
            ));
            Ok(Ok(row))
        }
        // The row stays TERMINATING with the reason: something may still
        // run there.
        Err(e @ ProvisionError::Leftover { .. }) => Err(Error::leftover(store, name, &e)),
        Err(e) => Err(e.into()),
    }
}

/// Why an `UP` cluster cannot be reused as it is: a node the provider no
/// longer reports running (preempted, stopped, gone). `None` when all are.
async fn lost_nodes(
    store: &Store,
    providers: &Providers,
    row: &crate::core::state::ClusterRow,
) -> Result<Option<String>, Error> {
    let Some(p) = row.cloud.as_deref().and_then(|c| providers.get(c)) else {
        return Ok(None);
    };
    let seen = p
        .describe(&gangway_provider::ClusterName(row.name.clone()))
        .await?;
    for n in store.nodes(&row.name)? {
        let state = seen
            .iter()
            .find(|s| s.id.0 == n.instance_id)
            .map(|s| &s.state);
        let why = match state {
            Some(gangway_provider::NodeState::Running) => continue,
            Some(gangway_provider::NodeState::Preempted { reason }) => {
                format!(
                    "lost node {} (rank {}): preempted: {reason}",
                    n.instance_id, n.rank
                )
            }
            Some(s) => format!(
                "lost node {} (rank {}): it is {}",
                n.instance_id,
                n.rank,
                provision::state_name(s)
            ),
            None => format!(
                "lost node {} (rank {}): the provider no longer has it",
                n.instance_id, n.rank
            ),
        };
        return Ok(Some(why));
    }
    Ok(None)
}

/// Stores a job on `cluster` and starts its driver; returns its id.
pub(crate) fn start_job(
    store: &Store,
    home: &Path,
    cluster: &str,
    spec: &JobSpec,
    secrets: &[(String, String)],
) -> Result<i64, Error> {
    let id = crate::core::gang::submit(store, home, cluster, spec, secrets)?;
    store.event(cluster, Some(id), "job", &format!("job {id} submitted"))?;
    Ok(id)
}

/// How a job ended, from the `status.json` its driver leaves beside the logs.
pub(crate) fn ended_status(log_dir: &Path) -> Option<(JobStatus, Option<String>)> {
    let text = std::fs::read_to_string(log_dir.join("status.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let status = JobStatus::parse(v.get("status")?.as_str()?)?;
    let detail = v.get("detail").and_then(|d| d.as_str()).map(str::to_string);
    Some((status, detail))
}
