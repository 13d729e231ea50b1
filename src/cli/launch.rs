//! `gangway launch` and `gangway exec`: provision if needed, submit a job,
//! follow it.

use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use super::progress::{LogView, Progress};
use super::{interrupts, print_json, LaunchArgs, Output};
use crate::core::gang::JobSpec;
use crate::core::optimizer;
use crate::core::provision::{self, RetryPolicy};
use crate::core::registry::Providers;
use crate::core::spec::{MountSource, Task, Workdir};
use crate::core::state::{ClusterStatus, JobStatus, NewCluster, OwnerLock, Reserved, Store};
use crate::{Error, ExitCode};

pub(crate) use crate::core::config::{gangway_home, local_path};
pub(crate) use crate::core::runtime::runtime;

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

fn generated_name() -> String {
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

fn confirm(question: &str) -> Result<bool, Error> {
    if !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    eprint!("{question} [Y/n] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let a = line.trim().to_ascii_lowercase();
    Ok(a.is_empty() || a == "y" || a == "yes")
}

/// `gangway launch`.
pub(crate) fn launch(
    a: &LaunchArgs,
    catalog_dir: Option<&Path>,
    out: Output,
) -> Result<ExitCode, Error> {
    let (task, plan) =
        super::plan::plan(&a.task, catalog_dir, optimizer::DEFAULT_TYPES_PER_REGION)?;
    super::plan::require_values(&task, &a.task.task)?;
    if a.dry_run {
        super::plan::render(&task, &a.task.task, &plan, out, 20)?;
        return Ok(ExitCode::Ok);
    }
    let name = match &a.cluster {
        Some(n) => n.clone(),
        None => generated_name(),
    };
    check_name(&name)?;
    if crate::services::host::cloud::is_controller(&name)
        && !crate::services::host::cloud::launching_controller()
    {
        return Err(Error::usage(
            "cluster names starting with 'gangway-controller' are the managed-job controller host's",
            Some("pick another name with -c; jobs.controller in config.yaml launches the controller host"),
        ));
    }
    let spec = job_spec(&task, &a.task.task, true, a.down)?;
    let home = gangway_home()?;
    let store = Store::open(&home)?;
    let launch_config = crate::core::config::launch_config(&task, &home)?;
    let providers = Providers::new(&home);
    // Buckets are checked before anything is provisioned.
    let own = crate::core::storage::OwnIdentity::configured(launch_config.as_ref(), &providers);
    crate::core::storage::preflight_now(&task, &a.task.task, &spec.bucket_mounts, &own)?;
    let secrets = secrets_of(&task);
    let progress = Progress::new(out);

    let lock = store.lock_cluster(&name, "launching")?;
    let config = launch_config.map(|c| c.to_string());
    let token = format!("{name}-{}", generated_name().trim_start_matches("gangway-"));
    let rt = runtime()?;
    let mut replaced = false;
    let reserved = loop {
        let reserved = store.reserve_cluster(&NewCluster {
            name: &name,
            num_nodes: task.num_nodes,
            client_token: &token,
            provider_config: config.clone(),
        })?;
        // An UP record is only what was true last time: ask the provider
        // before reusing it, and replace a cluster that lost nodes.
        if let (Reserved::Existing(row), false) = (&reserved, replaced) {
            if row.status == ClusterStatus::Up {
                if let Some(why) = rt.block_on(lost_nodes(&store, &providers, row))? {
                    progress.line(&format!(
                        "Cluster '{name}' {why}: replacing it with a new one"
                    ));
                    store.event(&name, None, "replace", &why)?;
                    if let Err(e) =
                        rt.block_on(crate::core::lifecycle::teardown(&store, &name, &providers))
                    {
                        return Err(Error::leftover(&store, &name, e));
                    }
                    replaced = true;
                    continue;
                }
            }
        }
        break reserved;
    };
    let row = match reserved {
        Reserved::Existing(row) => {
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
            if row.num_nodes < task.num_nodes {
                return Err(Error::usage(
                    format!(
                        "cluster '{name}' has {} node(s); the task needs {}",
                        row.num_nodes, task.num_nodes
                    ),
                    Some("launch a new cluster with another -c name, or `gangway down` this one first"),
                ));
            }
            progress.line(&format!(
                "Reusing cluster '{name}' ({} node(s), {})",
                row.num_nodes, row.status
            ));
            crate::core::storage::make_buckets_now(
                &task,
                &a.task.task,
                &spec.bucket_mounts,
                &store,
                &format!("cluster:{name}"),
            )?;
            row
        }
        Reserved::New(row) | Reserved::Resumed(row) => {
            let best = &plan[0];
            // A cloud on this machine costs nothing real: no question to ask.
            if !a.yes
                && !providers
                    .get(&best.cloud)
                    .is_some_and(|p| p.runs_on_this_machine())
                && out == Output::Table
                && !confirm(&format!(
                    "Launch '{name}': {} x {} on {}/{}/{} at ${:.2}/h?",
                    best.nodes,
                    best.instance_type,
                    best.cloud,
                    best.region,
                    best.zone,
                    best.total_per_hour
                ))?
            {
                store.remove_cluster(&name)?;
                return Ok(ExitCode::Interrupted);
            }
            // Buckets the task names and lacks are made once the user said
            // yes, recorded for the cluster.
            if let Err(e) = crate::core::storage::make_buckets_now(
                &task,
                &a.task.task,
                &spec.bucket_mounts,
                &store,
                &format!("cluster:{name}"),
            ) {
                store.remove_cluster(&name)?;
                crate::core::storage::remove_buckets_now(&store, &format!("cluster:{name}"));
                return Err(e);
            }
            // Ctrl-C while provisioning: stop, and remove what was created.
            interrupts::install();
            let before = interrupts::count();
            let result = rt.block_on(async {
                tokio::select! {
                    r = provision::provision(
                        &store,
                        &row,
                        &plan,
                        &providers,
                        &progress,
                        RetryPolicy::default(),
                        if a.provision_only {
                            provision::Contact::Later
                        } else {
                            provision::Contact::Now
                        },
                    ) => Some(r),
                    _ = async {
                        while interrupts::count() == before {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    } => None,
                }
            });
            let interrupted = match &result {
                None => Some("Interrupted: terminating whatever was created"),
                Some(_) if interrupts::count() != before => {
                    Some("Interrupted: terminating the new cluster")
                }
                Some(_) => None,
            };
            if let Some(what) = interrupted {
                progress.line(what);
                if let Err(e) =
                    rt.block_on(crate::core::lifecycle::teardown(&store, &name, &providers))
                {
                    return Err(Error::leftover(&store, &name, e));
                }
                return Ok(ExitCode::Interrupted);
            }
            let result = result.expect("not interrupted");
            match result {
                Ok(p) => {
                    store.set_nodes(&name, ClusterStatus::Up, &p.nodes)?;
                    progress.line(&format!(
                        "Cluster '{name}' is up: {} node(s), head {}",
                        p.nodes.len(),
                        p.nodes[0].private_ip
                    ));
                    store.cluster(&name)?.expect("cluster row exists")
                }
                Err(e) => {
                    match &e {
                        // The row stays TERMINATING with the reason:
                        // something may still run there.
                        provision::ProvisionError::Leftover { .. } => {
                            return Err(Error::leftover(&store, &name, &e))
                        }
                        provision::ProvisionError::State(_) => {
                            store.set_status(&name, ClusterStatus::Init, Some(&e.to_string()))?
                        }
                        // Every attempt's nodes were confirmed gone.
                        provision::ProvisionError::Exhausted { .. }
                        | provision::ProvisionError::Provider(_) => {
                            store.remove_cluster(&name)?;
                            crate::core::storage::remove_buckets_now(
                                &store,
                                &format!("cluster:{name}"),
                            );
                        }
                    }
                    return Err(e.into());
                }
            }
        }
    };
    drop(lock);
    if a.provision_only {
        if out == Output::Json {
            print_json(&json!({"cluster": name, "status": "UP", "nodes": row.num_nodes}))?;
        } else {
            progress.line(&format!(
                "Provisioned only: run on it with `gangway exec {name} TASK`; remove it with `gangway down {name}`"
            ));
        }
        return Ok(ExitCode::Ok);
    }
    let mut spec = spec;
    spec.gpus_per_node = row.accelerator_count.ceil() as u32;
    let code = submit(
        &store, &home, &name, spec, &secrets, a.detach, out, &progress,
    )?;
    // `--down`: the driver tore the cluster down after the run. If the
    // row is still there, that failed or was skipped: say so, non-zero.
    if a.down && !a.detach {
        if let Some(row) = store.cluster(&name)? {
            let why = row
                .last_error
                .clone()
                .unwrap_or_else(|| "the teardown after the run did not happen".into());
            return Err(Error::leftover(&store, &name, why));
        }
    }
    Ok(code)
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

/// Stores the job, starts its driver, and follows it unless `detach`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit(
    store: &Store,
    home: &Path,
    cluster: &str,
    spec: JobSpec,
    secrets: &[(String, String)],
    detach: bool,
    out: Output,
    progress: &Progress,
) -> Result<ExitCode, Error> {
    let id = crate::core::gang::submit(store, home, cluster, &spec, secrets)?;
    store.event(cluster, Some(id), "job", &format!("job {id} submitted"))?;
    if detach {
        if out == Output::Json {
            print_json(&json!({ "cluster": cluster, "job_id": id, "status": "SUBMITTED" }))?;
        } else {
            progress.line(&format!(
                "Job {id} submitted on '{cluster}'; follow it with `gangway logs {cluster} {id}`"
            ));
        }
        return Ok(ExitCode::Ok);
    }
    // Read before following: with --down the rows are gone at the end.
    let nodes = store.nodes(cluster).unwrap_or_default();
    let status = follow(store, id, out != Output::Json, None)?;
    let job = store.job(id)?;
    if out == Output::Json {
        print_json(&json!({
            "cluster": cluster,
            "job_id": id,
            "status": status,
            "detail": job.as_ref().and_then(|j| j.detail.clone()),
            "nodes": nodes,
        }))?;
    } else if status == JobStatus::FailedDriver {
        // Every other ending is the last line of the job's own log.
        let detail = job
            .and_then(|j| j.detail)
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        progress.line(&format!("Job {id} {status}{detail}"));
    }
    Ok(exit_for(status))
}

/// The exit code for a job's ending.
pub(crate) fn exit_for(s: JobStatus) -> ExitCode {
    match s {
        JobStatus::Succeeded => ExitCode::Ok,
        JobStatus::Cancelled => ExitCode::Interrupted,
        _ => ExitCode::JobFailed,
    }
}

/// Copies a job's log to stdout until the job ends and its driver exits.
/// Ctrl-C once asks the driver to stop the job gracefully, twice to kill it.
/// `rank`: follow one rank's raw log instead of the combined one.
pub(crate) fn follow(
    store: &Store,
    id: i64,
    print: bool,
    rank: Option<u32>,
) -> Result<JobStatus, Error> {
    interrupts::install();
    let dir = store.job_log_dir(id);
    let path = match rank {
        Some(r) => dir.join(format!("rank-{r}.log")),
        None => dir.join("job.log"),
    };
    let lock = store.job_lock_path(id);
    let mut tail = Tail {
        path: path.clone(),
        pos: 0,
        partial: Vec::new(),
        view: LogView::new(),
    };
    let mut sent = interrupts::count();
    let mut ended_at: Option<std::time::Instant> = None;
    let mut last: Option<JobStatus> = None;
    loop {
        if print {
            tail.pump()?;
        }
        let job = match store.job(id)? {
            Some(j) => j,
            // `--down`: the driver removed the cluster (and its jobs) after
            // recording the ending we already saw.
            None if last.is_some_and(JobStatus::is_terminal) || ended_status(&dir).is_some() => {
                if print {
                    tail.pump()?;
                    tail.finish()?;
                }
                // Wait for the driver to finish the teardown it reports.
                let t = std::time::Instant::now();
                while OwnerLock::is_held(&lock) && t.elapsed() < Duration::from_secs(120) {
                    std::thread::sleep(Duration::from_millis(25));
                }
                if print {
                    tail.pump()?;
                    tail.finish()?;
                }
                return Ok(ended_status(&dir)
                    .map(|(s, _)| s)
                    .or(last)
                    .expect("checked"));
            }
            None => {
                return Err(Error::NotFound {
                    message: format!("job {id} no longer exists (its cluster was taken down)"),
                    hint: None,
                })
            }
        };
        last = Some(job.status);
        let c = interrupts::count();
        if let (true, false, Some(pid)) = (c > sent, job.status.is_terminal(), job.driver_pid) {
            sent = c;
            // SAFETY: kill(2) on the driver this job records.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
            eprintln!(
                "{}",
                if c == 1 {
                    "gangway: stopping the job (Ctrl-C again to kill it)"
                } else {
                    "gangway: killing the job"
                }
            );
        }
        let driver_alive = OwnerLock::is_held(&lock);
        if job.status.is_terminal() {
            // Keep copying until the driver has exited (it may be tearing
            // the cluster down), but not forever.
            let t = *ended_at.get_or_insert_with(std::time::Instant::now);
            if !driver_alive || t.elapsed() > Duration::from_secs(120) {
                if print {
                    // One last read for lines written just before the end.
                    tail.pump()?;
                    tail.finish()?;
                }
                return Ok(job.status);
            }
        } else if !driver_alive && job.driver_pid.is_some() {
            crate::core::gang::reap(store)?;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// New lines of a log file, handed to the view as they appear.
struct Tail {
    path: PathBuf,
    pos: u64,
    partial: Vec<u8>,
    view: LogView,
}

impl Tail {
    fn pump(&mut self) -> std::io::Result<()> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Ok(());
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len <= self.pos {
            return Ok(());
        }
        f.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::with_capacity((len - self.pos) as usize);
        Read::by_ref(&mut f)
            .take(len - self.pos)
            .read_to_end(&mut buf)?;
        self.pos += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            self.view.line(&line)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if !self.partial.is_empty() {
            let mut line = std::mem::take(&mut self.partial);
            line.push(b'\n');
            self.view.line(&line)?;
        }
        self.view.finish();
        Ok(())
    }
}

/// How a job ended, from the `status.json` its driver leaves beside the logs.
pub(crate) fn ended_status(log_dir: &Path) -> Option<(JobStatus, Option<String>)> {
    let text = std::fs::read_to_string(log_dir.join("status.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let status = JobStatus::parse(v.get("status")?.as_str()?)?;
    let detail = v.get("detail").and_then(|d| d.as_str()).map(str::to_string);
    Some((status, detail))
}

/// Reads the secrets a launcher writes to the driver's stdin.
pub(crate) fn read_driver_secrets() -> Vec<(String, String)> {
    let mut s = String::new();
    let _ = std::io::stdin().read_to_string(&mut s);
    serde_json::from_str(&s).unwrap_or_default()
}

/// `gangway __drive JOB`: the detached job driver.
pub(crate) fn drive(job: i64) -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let secrets = read_driver_secrets();
    let rt = runtime()?;
    match rt.block_on(crate::core::lifecycle::drive(&home, job, secrets)) {
        Ok(s) => Ok(exit_for(s)),
        Err(e) => {
            eprintln!("gangway driver: job {job}: {e}");
            Ok(ExitCode::Internal)
        }
    }
}
