//! Commands on existing clusters: status, queue, logs, cancel, exec, down,
//! stop, start, autostop.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::launch::{exit_for, follow, gangway_home, runtime, submit};
use super::progress::Progress;
use super::{print_json, table, Output};
use crate::core::gang::{JobSpec, GRACE};
use crate::core::provision;
use crate::core::registry::Providers;
use crate::core::state::{ClusterRow, ClusterStatus, JobRow, OwnerLock, Store};
use crate::services::{self, launch::secrets_of, ui};
use crate::{Error, ExitCode};

/// `gangway status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Only these clusters (shows their nodes too).
    pub(crate) clusters: Vec<String>,
    /// Ask the providers for the nodes' current states (preemptions, nodes
    /// gone) instead of showing the last recorded ones.
    #[arg(long, short = 'r')]
    pub(crate) refresh: bool,
}

/// `gangway queue`.
#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    /// The cluster.
    pub(crate) cluster: String,
}

/// `gangway logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The cluster.
    pub(crate) cluster: String,
    /// The job (default: the latest).
    pub(crate) job: Option<i64>,
    /// Print what is there and return, even if the job is still running.
    #[arg(long)]
    pub(crate) no_follow: bool,
    /// Only this rank's output, without prefixes.
    #[arg(long)]
    pub(crate) rank: Option<u32>,
}

/// `gangway cancel`.
#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// The cluster.
    pub(crate) cluster: String,
    /// Jobs to cancel (default: the latest live one).
    pub(crate) jobs: Vec<i64>,
    /// Every live job on the cluster.
    #[arg(long)]
    pub(crate) all: bool,
}

/// `gangway exec`.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The cluster.
    pub(crate) cluster: String,
    /// A task file, or a command to run on every node.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TASK.yaml|COMMAND"
    )]
    pub(crate) target: Vec<String>,
    /// Set an env value: KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub(crate) env: Vec<String>,
    /// Set a secret: KEY=VALUE, or KEY alone to take it from gangway's own
    /// environment (repeatable; never printed).
    #[arg(long = "secret", value_name = "KEY[=VALUE]")]
    pub(crate) secret: Vec<String>,
    /// Read secrets from a file of KEY=VALUE lines.
    #[arg(long, value_name = "FILE")]
    pub(crate) secret_file: Option<PathBuf>,
    /// Nodes to run on (default: the task's, or every node for a command).
    #[arg(long)]
    pub(crate) num_nodes: Option<u32>,
    /// Return once the job is submitted.
    #[arg(short = 'd', long)]
    pub(crate) detach: bool,
}

/// `gangway down`.
#[derive(Debug, Args)]
pub(crate) struct DownArgs {
    /// Clusters to tear down.
    pub(crate) clusters: Vec<String>,
    /// Every cluster.
    #[arg(long, short = 'a')]
    pub(crate) all: bool,
    /// Also ask the clouds for clusters tagged with this installation's
    /// owner id (`$GANGWAY_HOME/owner`) that its state does not know (a lost
    /// state database), and tear those down too. Other installations'
    /// clusters are never touched; those tagged by earlier versions (a user
    /// name as owner) are listed, not torn down.
    #[arg(long)]
    pub(crate) orphans: bool,
    /// With --orphans: sweep this owner's clusters instead (another
    /// installation's id, or an earlier version's user name as listed):
    /// adopts them and tears them down.
    #[arg(long, requires = "orphans", value_name = "ID")]
    pub(crate) owner: Option<String>,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
}

/// `gangway stop` / `gangway start`.
#[derive(Debug, Args)]
pub(crate) struct NamesArgs {
    /// Clusters.
    #[arg(required = true)]
    pub(crate) clusters: Vec<String>,
}

/// `gangway autostop`.
#[derive(Debug, Args)]
pub(crate) struct AutostopArgs {
    /// The cluster.
    pub(crate) cluster: String,
    /// Idle minutes before stopping (0: as soon as it is idle).
    #[arg(short = 'i', long = "idle-minutes", required_unless_present = "cancel")]
    pub(crate) idle_minutes: Option<u32>,
    /// Tear down instead of stopping.
    #[arg(long)]
    pub(crate) down: bool,
    /// Turn autostop off.
    #[arg(long, conflicts_with_all = ["idle_minutes", "down"])]
    pub(crate) cancel: bool,
}

fn open() -> Result<(PathBuf, Store), Error> {
    let home = gangway_home()?;
    let store = Store::open(&home)?;
    Ok((home, store))
}

fn cluster_row(store: &Store, name: &str) -> Result<ClusterRow, Error> {
    services::exec::cluster(store, name)
}

/// `gangway status`.
pub(crate) fn status(a: &StatusArgs, out: Output) -> Result<ExitCode, Error> {
    let (_, store) = open()?;
    crate::core::gang::reap(&store)?;
    let mut clusters = store.clusters()?;
    if !a.clusters.is_empty() {
        for n in &a.clusters {
            cluster_row(&store, n)?;
        }
        clusters.retain(|c| a.clusters.contains(&c.name));
    }
    let mut still_failing = 0;
    if a.refresh {
        still_failing = finish_teardowns(&store, &clusters, out)?;
        clusters = store.clusters()?;
        if !a.clusters.is_empty() {
            clusters.retain(|c| a.clusters.contains(&c.name));
        }
        services::cluster::refresh(&store, &clusters)?;
    }
    let code = if still_failing > 0 {
        ExitCode::Leftover
    } else {
        ExitCode::Ok
    };
    let active = store.active_jobs()?;
    let live = |name: &str| active.iter().filter(|j| j.cluster == name).count();
    if out == Output::Json {
        let rows: Vec<serde_json::Value> = clusters
            .iter()
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap_or_default();
                v["shown_status"] = json!(services::cluster::shown_status(&store, c));
                v["active_jobs"] = json!(live(&c.name));
                v["jobs_controller"] = json!(crate::services::host::cloud::is_controller(&c.name));
                if !a.clusters.is_empty() {
                    v["nodes"] = json!(store.nodes(&c.name).unwrap_or_default());
                }
                v
            })
            .collect();
        print_json(&json!({ "clusters": rows }))?;
        return Ok(code);
    }
    if clusters.is_empty() {
        println!("No clusters. Launch one with `gangway launch TASK.yaml`.");
        return Ok(code);
    }
    // Nodes not running on an UP cluster (after --refresh): say so.
    let mut node_trouble: std::collections::HashMap<String, String> = Default::default();
    if a.refresh {
        for c in clusters.iter().filter(|c| c.status == ClusterStatus::Up) {
            let nodes = store.nodes(&c.name)?;
            let bad: Vec<&str> = nodes
                .iter()
                .filter(|n| n.state != "running")
                .map(|n| n.state.as_str())
                .collect();
            if !bad.is_empty() {
                node_trouble.insert(c.name.clone(), format!("{} node(s) {}", bad.len(), bad[0]));
            }
        }
    }
    let rows: Vec<Vec<String>> = clusters
        .iter()
        .map(|c| {
            let infra = match (&c.cloud, &c.region, &c.zone) {
                (Some(cl), Some(r), Some(z)) => format!("{cl}/{r}/{z}"),
                _ => "-".into(),
            };
            let gpus = c
                .accelerator
                .as_ref()
                .map(|g| format!(" ({g}:{})", c.accelerator_count))
                .unwrap_or_default();
            let status = services::cluster::shown_status(&store, c);
            let status = match node_trouble.get(&c.name) {
                Some(t) => format!("{status} ({t})"),
                None => status,
            };
            vec![
                if crate::services::host::cloud::is_controller(&c.name) {
                    format!("{} (jobs controller)", c.name)
                } else {
                    c.name.clone()
                },
                status,
                infra,
                format!(
                    "{}x {}{gpus}{}",
                    c.num_nodes,
                    c.instance_type.as_deref().unwrap_or("-"),
                    if c.use_spot { " spot" } else { "" }
                ),
                c.price_per_hour
                    .map(|p| format!("{p:.2}"))
                    .unwrap_or_else(|| "-".into()),
                live(&c.name).to_string(),
                match c.autostop_idle_min {
                    Some(m) => format!("{m}m{}", if c.autostop_down { " (down)" } else { "" }),
                    None => "-".into(),
                },
                ui::ago(c.launched_at),
            ]
        })
        .collect();
    table::print(
        &[
            "NAME",
            "STATUS",
            "INFRA",
            "RESOURCES",
            "$/H",
            "JOBS",
            "AUTOSTOP",
            "LAUNCHED",
        ],
        &rows,
    )?;
    let red = |line: String| {
        if std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
            format!("\x1b[31m{line}\x1b[0m")
        } else {
            line
        }
    };
    for c in &clusters {
        if c.status == ClusterStatus::Terminating && c.teardown_failures > 0 {
            println!(
                "{}",
                red(format!(
                    "TERMINATING '{}': may still be running ({}): the teardown failed {} time(s): {}",
                    c.name,
                    provision::still_running(c),
                    c.teardown_failures,
                    c.last_error.as_deref().unwrap_or("no reason recorded")
                ))
            );
            // Who retries on their own: a managed job's controller, an
            // autostop watcher. Anyone can now, with down or status -r.
            let automatic =
                c.autostop_down || store.managed_all()?.iter().any(|j| j.cluster == c.name);
            println!(
                "  retry: `gangway down {0}` or `gangway status -r`{1}",
                c.name,
                match (automatic, c.retry_at) {
                    (true, Some(t)) =>
                        format!("; next automatic retry {}", crate::cli::clock_time(t)),
                    _ => String::new(),
                }
            );
            continue;
        }
        if c.status == ClusterStatus::Up {
            if let Some(e) = &c.last_error {
                println!("{}", red(format!("'{}': {e}", c.name)));
            }
        }
        if services::cluster::shown_status(&store, c).ends_with("(interrupted)") {
            println!(
                "note: '{}' was interrupted while {}; `gangway down {0}` removes whatever was created{}",
                c.name,
                if c.status == ClusterStatus::Init { "launching" } else { "tearing down" },
                c.last_error.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
            );
        }
    }
    if !a.clusters.is_empty() {
        for c in &clusters {
            let nodes = store.nodes(&c.name)?;
            if nodes.is_empty() {
                continue;
            }
            println!("\nNodes of '{}':", c.name);
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    vec![
                        n.rank.to_string(),
                        n.instance_id.clone(),
                        n.address(),
                        n.zone.clone(),
                        if n.topology.is_empty() {
                            "-".into()
                        } else {
                            n.topology.clone()
                        },
                        n.state.clone(),
                    ]
                })
                .collect();
            table::print(
                &["RANK", "ID", "ADDRESS", "ZONE", "TOPOLOGY", "STATE"],
                &rows,
            )?;
        }
    }
    Ok(code)
}

/// Retries the teardowns that failed before, saying how each went.
/// Returns how many still failed.
fn finish_teardowns(store: &Store, clusters: &[ClusterRow], out: Output) -> Result<usize, Error> {
    let mut failing = 0;
    for (name, r) in services::cluster::finish_teardowns(store, clusters)? {
        match r {
            Ok(()) => {
                if out == Output::Table {
                    println!("Finished tearing down '{name}' (it had failed before).");
                }
            }
            Err(e) => {
                failing += 1;
                eprintln!("gangway: {name}: the teardown failed again: {e}");
            }
        }
    }
    Ok(failing)
}

fn job_rows(jobs: &[JobRow]) -> Vec<Vec<String>> {
    jobs.iter()
        .map(|j| {
            let dur = match (j.started_at, j.ended_at) {
                (Some(s), Some(e)) => ui::duration(e - s),
                (Some(s), None) => ui::duration(crate::core::state::now_ms() - s),
                _ => "-".into(),
            };
            vec![
                j.id.to_string(),
                j.name.clone().unwrap_or_else(|| "-".into()),
                ui::ago(j.submitted_at),
                dur,
                j.status.to_string(),
                j.detail
                    .as_deref()
                    .and_then(|d| d.lines().next())
                    .unwrap_or("")
                    .to_string(),
            ]
        })
        .collect()
}

/// `gangway queue`.
pub(crate) fn queue(a: &QueueArgs, out: Output) -> Result<ExitCode, Error> {
    let (_, store) = open()?;
    cluster_row(&store, &a.cluster)?;
    crate::core::gang::reap(&store)?;
    let jobs = store.jobs(&a.cluster)?;
    if out == Output::Json {
        print_json(&json!({ "cluster": a.cluster, "jobs": jobs }))?;
        return Ok(ExitCode::Ok);
    }
    if jobs.is_empty() {
        println!("No jobs on '{}'.", a.cluster);
        return Ok(ExitCode::Ok);
    }
    table::print(
        &["ID", "NAME", "SUBMITTED", "DURATION", "STATUS", "DETAIL"],
        &job_rows(&jobs),
    )?;
    Ok(ExitCode::Ok)
}

fn pick_job(store: &Store, cluster: &str, job: Option<i64>) -> Result<JobRow, Error> {
    let jobs = store.jobs(cluster)?;
    let found = match job {
        Some(id) => jobs.into_iter().find(|j| j.id == id),
        None => jobs.into_iter().last(),
    };
    found.ok_or_else(|| Error::NotFound {
        message: match job {
            Some(id) => format!("cluster '{cluster}' has no job {id}"),
            None => format!("cluster '{cluster}' has no jobs"),
        },
        hint: Some(format!("`gangway queue {cluster}` lists its jobs")),
    })
}

/// `gangway logs`.
pub(crate) fn logs(a: &LogsArgs) -> Result<ExitCode, Error> {
    let (_, store) = open()?;
    if store.cluster(&a.cluster)?.is_none() {
        // Logs outlive their cluster: `logs NAME JOB` still replays them.
        if let Some(id) = a.job {
            let dir = store.job_log_dir(id);
            if dir.is_dir() {
                let file = match a.rank {
                    Some(r) => dir.join(format!("rank-{r}.log")),
                    None => dir.join("job.log"),
                };
                if let Ok(mut f) = std::fs::File::open(file) {
                    std::io::copy(&mut f, &mut super::term::NodeOutput::stdout())?;
                }
                return Ok(ExitCode::Ok);
            }
        }
        cluster_row(&store, &a.cluster)?;
    }
    crate::core::gang::reap(&store)?;
    let job = pick_job(&store, &a.cluster, a.job)?;
    if a.no_follow || job.status.is_terminal() {
        let dir = store.job_log_dir(job.id);
        let path = match a.rank {
            Some(r) => dir.join(format!("rank-{r}.log")),
            None => dir.join("job.log"),
        };
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                std::io::copy(&mut f, &mut super::term::NodeOutput::stdout())?;
            }
            Err(_) if a.rank.is_some() => {
                return Err(Error::NotFound {
                    message: format!(
                        "job {} has no output from rank {}",
                        job.id,
                        a.rank.unwrap_or(0)
                    ),
                    hint: None,
                })
            }
            Err(_) => {}
        }
        return Ok(ExitCode::Ok);
    }
    let status = follow(&store, job.id, true, a.rank)?;
    Ok(exit_for(status))
}

/// `gangway cancel`.
pub(crate) fn cancel(a: &CancelArgs, out: Output) -> Result<ExitCode, Error> {
    let (_, store) = open()?;
    cluster_row(&store, &a.cluster)?;
    crate::core::gang::reap(&store)?;
    let live: Vec<JobRow> = store
        .jobs(&a.cluster)?
        .into_iter()
        .filter(|j| !j.status.is_terminal())
        .collect();
    let chosen: Vec<&JobRow> = if a.all {
        live.iter().collect()
    } else if a.jobs.is_empty() {
        live.last().into_iter().collect()
    } else {
        for id in &a.jobs {
            if !live.iter().any(|j| j.id == *id) {
                let j = pick_job(&store, &a.cluster, Some(*id))?;
                return Err(Error::usage(
                    format!("job {id} has already ended ({})", j.status),
                    None,
                ));
            }
        }
        live.iter().filter(|j| a.jobs.contains(&j.id)).collect()
    };
    if chosen.is_empty() {
        if out == Output::Json {
            print_json(&json!({ "cancelled": [] }))?;
        } else {
            println!("No live jobs on '{}'.", a.cluster);
        }
        return Ok(ExitCode::Ok);
    }
    for j in &chosen {
        signal_driver(&store, j, libc::SIGTERM);
    }
    // Wait for the drivers to record the ending (they give ranks GRACE).
    let deadline = std::time::Instant::now() + GRACE + Duration::from_secs(5);
    let mut ended = Vec::new();
    for j in &chosen {
        loop {
            crate::core::gang::reap(&store)?;
            let now = store.job(j.id)?;
            match now {
                Some(n) if !n.status.is_terminal() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Some(n) => {
                    ended.push(n);
                    break;
                }
                None => break,
            }
        }
    }
    if out == Output::Json {
        print_json(&json!({ "cancelled": ended }))?;
    } else {
        for j in &ended {
            println!("Job {} {}", j.id, j.status);
        }
    }
    Ok(ExitCode::Ok)
}

fn signal_driver(store: &Store, j: &JobRow, sig: i32) {
    if let Some(pid) = j.driver_pid {
        if OwnerLock::is_held(&store.job_lock_path(j.id)) {
            // SAFETY: kill(2) on the pid of a driver whose lock is held.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }
}

/// `gangway exec`.
pub(crate) fn exec(a: &ExecArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let row = services::exec::up_cluster(&store, &a.cluster)?;
    let first = &a.target[0];
    let is_task = a.target.len() == 1
        && (first.ends_with(".yaml") || first.ends_with(".yml"))
        && std::path::Path::new(first).is_file();
    let (mut spec, secrets): (JobSpec, Vec<(String, String)>) = if is_task {
        let args = super::TaskArgs {
            task: PathBuf::from(first),
            infra: None,
            gpus: None,
            cpus: None,
            memory: None,
            instance_type: None,
            num_nodes: a.num_nodes,
            use_spot: false,
            env: a.env.clone(),
            env_file: None,
            secret: a.secret.clone(),
            secret_file: a.secret_file.clone(),
        };
        let task = args.load()?;
        super::plan::require_values(&task, &args.task)?;
        let spec = services::exec::task_job(&store, &a.cluster, &task, &args.task)?;
        (spec, secrets_of(&task))
    } else {
        let mut envs = Vec::new();
        for e in &a.env {
            envs.push(
                crate::core::spec::parse_assignment(e)
                    .map_err(|m| Error::usage(format!("--env: {m}"), None))?,
            );
        }
        let mut secrets = Vec::new();
        if let Some(f) = &a.secret_file {
            secrets
                .extend(crate::core::spec::read_secret_file(f).map_err(|e| Error::usage(e, None))?);
        }
        for s in &a.secret {
            secrets.push(super::plan::secret_arg(s)?);
        }
        let spec = JobSpec {
            run: Some(a.target.join(" ")),
            envs,
            secret_names: secrets.iter().map(|(k, _)| k.clone()).collect(),
            num_nodes: a.num_nodes.unwrap_or(row.num_nodes),
            ..JobSpec::default()
        };
        (spec, secrets)
    };
    services::exec::fit(&mut spec, &row)?;
    let progress = Progress::new(out);
    submit(
        &store, &home, &a.cluster, spec, &secrets, a.detach, out, &progress,
    )
}

fn confirm_names(what: &str, names: &[String], yes: bool) -> Result<bool, Error> {
    use std::io::{IsTerminal, Write};
    if yes || !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    eprint!("{what} {}? [Y/n] ", names.join(", "));
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let a = line.trim().to_ascii_lowercase();
    Ok(a.is_empty() || a == "y" || a == "yes")
}

/// `gangway down`.
pub(crate) fn down(a: &DownArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    if a.orphans {
        let code = down_orphans(&home, &store, a.yes, out, a.owner.as_deref())?;
        if a.clusters.is_empty() && !a.all {
            return Ok(code);
        }
    }
    let names: Vec<String> = if a.all {
        store.clusters()?.into_iter().map(|c| c.name).collect()
    } else if a.clusters.is_empty() {
        return Err(Error::usage(
            "name the clusters to tear down, or pass --all",
            None,
        ));
    } else {
        for n in &a.clusters {
            cluster_row(&store, n)?;
        }
        a.clusters.clone()
    };
    if names.is_empty() {
        if out == Output::Json {
            print_json(&json!({ "terminated": [] }))?;
        } else {
            println!("No clusters.");
        }
        return Ok(ExitCode::Ok);
    }
    // A controller host with jobs still running: their clusters would be
    // left without a controller. Refused unless --yes, which cancels them.
    for n in names
        .iter()
        .filter(|n| crate::services::host::cloud::is_controller(n))
    {
        let left = crate::services::host::cloud::unfinished_jobs(&home, &store, n)?;
        if left == 0 {
            continue;
        }
        if !a.yes {
            return Err(Error::usage(
                format!(
                    "'{n}' is the managed-job controller host, and {left} of its managed job(s) have not finished"
                ),
                Some("cancel them first (`gangway jobs cancel --all`), or pass --yes to cancel them and tear it down"),
            ));
        }
        eprintln!(
            "gangway: cancelling the {left} unfinished managed job(s) on the controller host '{n}'"
        );
        crate::services::host::cloud::cancel_all(&home, &store, n)?;
    }
    if out == Output::Table && !confirm_names("Tear down", &names, a.yes)? {
        return Ok(ExitCode::Interrupted);
    }
    let providers = Providers::new(&home);
    let mut done = Vec::new();
    let mut first_err: Option<Error> = None;
    for n in &names {
        let result = services::cluster::down(&store, &providers, n);
        match result {
            Ok(()) => {
                if out == Output::Table {
                    println!("Terminated cluster '{n}'.");
                }
                done.push(n.clone());
            }
            Err(e) => {
                eprintln!("gangway: error: {n}: {e}");
                first_err.get_or_insert(e);
            }
        }
    }
    if out == Output::Json {
        print_json(&json!({ "terminated": done }))?;
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(ExitCode::Ok),
    }
}

/// Tears down what the clouds hold under this installation's owner id and
/// its state does not know, or, with `adopt`, everything under that owner.
/// Clusters of earlier versions (a user name as owner) are listed with the
/// command that adopts them; other installations' are only counted.
fn down_orphans(
    home: &std::path::Path,
    store: &Store,
    yes: bool,
    out: Output,
    adopt: Option<&str>,
) -> Result<ExitCode, Error> {
    let services::cluster::Orphans {
        target,
        found,
        legacy,
        others,
        providers,
    } = services::cluster::orphans(home, store, adopt)?;
    let rt = runtime()?;
    let names: Vec<String> = found.iter().map(|(cl, c)| format!("{c} ({cl})")).collect();
    if out == Output::Table {
        for (owner, clusters) in &legacy {
            let list: Vec<String> = clusters
                .iter()
                .map(|(c, cloud, _)| format!("{c} ({cloud})"))
                .collect();
            println!(
                "Tagged by an earlier gangway with owner '{owner}' (a user name, not an owner id), left alone: {}",
                list.join(", ")
            );
            println!("  to adopt and tear them down: gangway down --orphans --owner {owner}");
        }
        if others > 0 {
            println!("{others} cluster(s) of other gangway installations seen, not touched.");
        }
    }
    if found.is_empty() {
        if out == Output::Table {
            println!("No orphaned clusters under owner '{target}'.");
        }
    } else if out == Output::Table && !confirm_names("Tear down orphaned", &names, yes)? {
        return Ok(ExitCode::Interrupted);
    }
    let mut done = Vec::new();
    for (cloud, c) in &found {
        let p = providers.get(cloud).expect("listed by this provider");
        rt.block_on(p.terminate(c))?;
        if out == Output::Table {
            println!("Terminated orphaned cluster '{c}' on {cloud}.");
        }
        done.push(json!({"cloud": cloud, "cluster": c.0}));
    }
    if out == Output::Json {
        let legacy: Vec<serde_json::Value> = legacy
            .iter()
            .flat_map(|(owner, clusters)| {
                clusters.iter().map(move |(c, cloud, user)| {
                    json!({"cloud": cloud, "cluster": c, "owner": owner, "user": user,
                           "adopt": format!("gangway down --orphans --owner {owner}")})
                })
            })
            .collect();
        print_json(&json!({
            "owner": target,
            "orphans_terminated": done,
            "earlier_versions": legacy,
            "other_installations": others,
        }))?;
    }
    Ok(ExitCode::Ok)
}

/// `gangway stop`.
pub(crate) fn stop(a: &NamesArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let providers = Providers::new(&home);
    for n in &a.clusters {
        let row = cluster_row(&store, n)?;
        services::cluster::stop(&store, &providers, &row)?;
        if out == Output::Table {
            println!("Stopped cluster '{n}'.");
        }
    }
    if out == Output::Json {
        print_json(&json!({ "stopped": a.clusters }))?;
    }
    Ok(ExitCode::Ok)
}

/// `gangway start`.
pub(crate) fn start(a: &NamesArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let providers = Providers::new(&home);
    for n in &a.clusters {
        let row = cluster_row(&store, n)?;
        if row.status == ClusterStatus::Up {
            if out == Output::Table {
                println!("Cluster '{n}' is already up.");
            }
            continue;
        }
        let count = services::cluster::start(&store, &providers, &row)?;
        if out == Output::Table {
            println!("Started cluster '{n}' ({count} node(s)).");
        }
    }
    if out == Output::Json {
        print_json(&json!({ "started": a.clusters }))?;
    }
    Ok(ExitCode::Ok)
}

/// `gangway autostop`.
pub(crate) fn autostop(a: &AutostopArgs, out: Output) -> Result<ExitCode, Error> {
    let (home, store) = open()?;
    let row = cluster_row(&store, &a.cluster)?;
    if a.cancel {
        store.set_autostop(&a.cluster, None, false)?;
        if out == Output::Table {
            println!("Autostop off for '{}'.", a.cluster);
        }
        return Ok(ExitCode::Ok);
    }
    let idle = a.idle_minutes.unwrap_or(0);
    services::cluster::autostop(&home, &store, &row, idle, a.down)?;
    if out == Output::Json {
        print_json(&json!({ "cluster": a.cluster, "idle_minutes": idle, "down": a.down }))?;
    } else {
        println!(
            "'{}' will be {} after {idle} idle minute(s).",
            a.cluster,
            if a.down { "torn down" } else { "stopped" }
        );
    }
    Ok(ExitCode::Ok)
}

/// `gangway __autostop CLUSTER`.
pub(crate) fn autostop_watch(cluster: &str) -> Result<ExitCode, Error> {
    services::cluster::autostop_watch(&gangway_home()?, cluster)?;
    Ok(ExitCode::Ok)
}
