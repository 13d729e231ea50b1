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
