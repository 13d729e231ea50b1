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
use crate::core::provision::{ProvisionEvent, Reporter};
use crate::core::state::{JobStatus, OwnerLock, Store};
use crate::services::launch::{
    check_name, ended_status, generated_name, job_spec, secrets_of, Request, Up,
};
use crate::services::{self, Ui};
use crate::{Error, ExitCode};

pub(crate) use crate::core::config::gangway_home;
pub(crate) use crate::core::runtime::runtime;

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

/// The launcher's side of a service: progress on the terminal, the
/// question asked there, Ctrl-C counted from the first look.
pub(crate) struct LaunchUi<'a> {
    progress: &'a Progress,
    out: Output,
    before: std::cell::OnceCell<usize>,
}

impl<'a> LaunchUi<'a> {
    pub(crate) fn new(progress: &'a Progress, out: Output) -> LaunchUi<'a> {
        LaunchUi {
            progress,
            out,
            before: std::cell::OnceCell::new(),
        }
    }
}

impl Reporter for LaunchUi<'_> {
    fn event(&self, e: ProvisionEvent<'_>) {
        self.progress.event(e)
    }
}

impl Ui for LaunchUi<'_> {
    fn line(&self, s: &str) {
        self.progress.line(s)
    }

    fn confirm(&self, question: &str) -> Result<bool, Error> {
        if self.out != Output::Table {
            return Ok(true);
        }
        confirm(question)
    }

    fn interrupted(&self) -> bool {
        let before = *self.before.get_or_init(|| {
            interrupts::install();
            interrupts::count()
        });
        interrupts::count() != before
    }
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
    let mut spec = job_spec(&task, &a.task.task, true, a.down)?;
    let progress = Progress::new(out);
    let req = Request {
        task: &task,
        task_file: &a.task.task,
        plan: &plan,
        name: &name,
        spec: &spec,
        ask: !a.yes,
        provision_only: a.provision_only,
    };
    let (home, store, row) = match services::launch::up(&req, &LaunchUi::new(&progress, out))? {
        Up::Ready(r) => (r.home, r.store, r.row),
        Up::Declined | Up::Interrupted => return Ok(ExitCode::Interrupted),
    };
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
    spec.gpus_per_node = row.accelerator_count.ceil() as u32;
    let secrets = secrets_of(&task);
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
    let id = services::launch::start_job(store, home, cluster, &spec, secrets)?;
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
