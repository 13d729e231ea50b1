//! Managed jobs: a controller that keeps a job running through spot
//! preemptions by checkpoint-and-requeue, and the spot/on-demand policies
//! that race a deadline (with a trace-replay simulator to compare them).
//!
//! Each managed job owns one cluster, always named `managed-<id>`, so it can
//! never have two clusters at once. The controller is a reconcile loop: it
//! reads a job's row and what it observes (the cluster job's status, the
//! provider's `describe`, the nodes' preemption notices), takes one
//! idempotent step, records it, and moves on; killed at any point and
//! started again, it picks up from the row.

pub(crate) mod controller;
pub(crate) mod policy;
pub(crate) mod sim;
pub(crate) mod submit;
pub(crate) mod supervisor;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::core::gang::JobSpec;

/// What a managed job needs to be rebuilt on every recovery: how to load
/// the task again (for the optimizer) and the resolved job spec.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ManagedTask {
    /// The copy of the task file kept with the job.
    pub(crate) task_file: PathBuf,
    /// The task file as the user named it (for messages).
    pub(crate) task_path: String,
    /// The command line's resource overrides (`--gpus`, `--infra`, ...),
    /// applied again on every recovery. Flattened: stored as the separate
    /// fields earlier versions wrote.
    #[serde(flatten)]
    pub(crate) overrides: crate::core::spec::Overrides,
    /// The `--catalog DIR` (or `GANGWAY_CATALOG_DIR`) the job was launched
    /// with, overlaid on every recovery's catalog.
    #[serde(default)]
    pub(crate) catalog_dir: Option<PathBuf>,
    /// The job itself (workdir and mounts already absolute).
    pub(crate) spec: JobSpec,
    /// Where checkpoints are kept (a local directory), unless
    /// `storage_url` names a bucket.
    pub(crate) storage: PathBuf,
    /// `checkpoint.storage` when it is a bucket (`s3://b/run1`): the nodes
    /// upload to it and restore from it themselves.
    #[serde(default)]
    pub(crate) storage_url: Option<String>,
    /// Where `jobs.bucket` holds this job's workdir and local file mounts
    /// (`s3://b/gangway-jobs/<tag>`), deleted when the job ends.
    #[serde(default)]
    pub(crate) job_files: Option<String>,
    /// Where a controller host keeps the workdir and local file mounts the
    /// laptop sent it with the job (no jobs.bucket): the spec's paths point
    /// here; deleted when the job ends.
    #[serde(default)]
    pub(crate) files_dir: Option<PathBuf>,
    /// `checkpoint.keep`: complete bucket checkpoints kept.
    #[serde(default = "default_keep")]
    pub(crate) keep: u32,
    /// `checkpoint.sync_interval`, seconds.
    pub(crate) sync_interval_s: f64,
    /// `checkpoint.signal`, as a number.
    pub(crate) signal: i32,
    /// `checkpoint.grace_period`, seconds.
    pub(crate) grace_s: f64,
    /// `job_recovery.strategy` (`REPLACE_LOST_NODES`, `FAILOVER`,
    /// `EAGER_NEXT_REGION`, `NONE`).
    pub(crate) strategy: String,
    /// `job_recovery.max_restarts_on_errors`.
    pub(crate) max_restarts_on_errors: u32,
    /// `job_recovery.recover_on_exit_codes`.
    pub(crate) recover_on_exit_codes: Vec<i32>,
    /// `deadline` (or `deadline.within`), seconds from submission.
    #[serde(default)]
    pub(crate) deadline_s: Option<f64>,
    /// `deadline.work`: running time the job needs, seconds.
    #[serde(default)]
    pub(crate) work_s: Option<f64>,
    /// `deadline.policy`.
    #[serde(default)]
    pub(crate) policy: Option<String>,
}

/// The signal number for a `checkpoint.signal` name.
pub(crate) fn signal_number(name: &str) -> i32 {
    match name.trim_start_matches("SIG") {
        "INT" => libc::SIGINT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "HUP" => libc::SIGHUP,
        _ => libc::SIGTERM,
    }
}

fn default_keep() -> u32 {
    crate::core::spec::Checkpoint::default().keep
}

/// A managed job's runs (the cluster jobs it ran, one per recovery), in
/// order: whose logs make up its output.
pub(crate) fn runs_of(store: &crate::core::state::Store, id: i64) -> Vec<i64> {
    std::fs::read_to_string(store.managed_dir(id).join("runs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A managed job's runs' output as its one story: the ranks' lines and
/// gangway's own as they are, except each run's own ending (`gangway: job
/// 2 FAILED: ...`) and its "all ranks running": those are the run's, in
/// the run's own numbering, and the job's events tell them in the job's
/// (a run that ended on a preemption is the job's PREEMPTED, not a
/// failure).
pub(crate) fn story(text: &[u8], runs: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|b| *b == b'\n') {
        if !is_runs_own_line(line, runs) {
            out.extend_from_slice(line);
        }
    }
    out
}

fn is_runs_own_line(line: &[u8], runs: &[i64]) -> bool {
    let Some(rest) = line.strip_prefix(b"gangway: ") else {
        return false;
    };
    if rest.starts_with(b"all ") && rest.trim_ascii_end().ends_with(b"rank(s) running") {
        return true;
    }
    let Some(rest) = rest.strip_prefix(b"job ") else {
        return false;
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let id = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|d| d.parse::<i64>().ok());
    id.is_some_and(|id| runs.contains(&id)) && rest.get(digits) == Some(&b' ')
}

#[cfg(test)]
mod tests {
    use super::story;

    #[test]
    fn a_runs_own_ending_and_numbering_leave_the_jobs_story() {
        let log = b"(rank 0, 10.0.0.1) step 5\n\
gangway: all 2 rank(s) running\n\
gangway: rank 0 (10.0.0.1) was killed by signal 9 (SIGKILL); stopping the other ranks\n\
gangway: job 2 FAILED: rank 0 (10.0.0.1) was killed by signal 9 (SIGKILL)\n\
gangway: job 7 SUCCEEDED\n\
(rank 1, 10.0.0.2) gangway: job 2 FAILED is what my program printed\n";
        let told = String::from_utf8(story(log, &[1, 2, 3])).unwrap();
        assert_eq!(
            told,
            "(rank 0, 10.0.0.1) step 5\n\
gangway: rank 0 (10.0.0.1) was killed by signal 9 (SIGKILL); stopping the other ranks\n\
gangway: job 7 SUCCEEDED\n\
(rank 1, 10.0.0.2) gangway: job 2 FAILED is what my program printed\n"
        );
    }
}
