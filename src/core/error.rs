//! The library's error type and the process exit codes it maps to.

use crate::core::catalog::CatalogError;
use crate::core::optimizer::Infeasible;
use crate::core::provision::{ProvisionError, TeardownError};
use crate::core::spec::SpecError;
use crate::core::state::StateError;
use gangway_provider::{ErrorKind, ProviderError};

/// Exit codes, as documented in the README.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    /// Success.
    Ok = 0,
    /// The job itself failed.
    JobFailed = 1,
    /// Bad input: task file, flags, catalog directory.
    BadInput = 2,
    /// No resources anywhere in the plan.
    NoResources = 3,
    /// Credentials missing or refused.
    Credentials = 4,
    /// Interrupted or cancelled.
    Interrupted = 5,
    /// A teardown did not finish: instances may still be running, and the
    /// cluster is kept (`TERMINATING`) until `gangway down` removes them.
    Leftover = 6,
    /// The managed-job controller's host could not be reached (down, no
    /// route, refused the login): nothing of the job was decided here.
    Unreachable = 7,
    /// A bug or an unimplemented command.
    Internal = 10,
}

impl ExitCode {
    /// The code a process exited with, as one of these (a remote gangway's
    /// answer); anything else is [`ExitCode::Internal`].
    pub fn from_code(code: i32) -> ExitCode {
        match code {
            0 => ExitCode::Ok,
            1 => ExitCode::JobFailed,
            2 => ExitCode::BadInput,
            3 => ExitCode::NoResources,
            4 => ExitCode::Credentials,
            5 => ExitCode::Interrupted,
            6 => ExitCode::Leftover,
            7 => ExitCode::Unreachable,
            _ => ExitCode::Internal,
        }
    }
}

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A task file was refused. Transparent: the `SpecError` is the whole
    /// message, not a cause to print again under it.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Flags or other input were wrong.
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
        /// What to do.
        hint: Option<String>,
    },
    /// A catalog could not be loaded.
    #[error("catalog: {0}")]
    Catalog(#[from] CatalogError),
    /// The optimizer found nothing.
    #[error("no feasible placement for {task}")]
    NoResources {
        /// The task's name.
        task: String,
        /// Why (printed as the error's details).
        why: Infeasible,
    },
    /// A command that a later version fills in.
    #[error("not implemented yet: {0}")]
    NotImplemented(String),
    /// Writing output failed.
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
    /// The state database or a lock failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Provisioning found no cluster.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// Tearing down, stopping or starting failed.
    #[error(transparent)]
    Teardown(#[from] TeardownError),
    /// A provider refused outside provisioning.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A teardown did not finish: something may still be running.
    #[error("cluster '{cluster}' may still be running ({running}): {reason}")]
    Leftover {
        /// The cluster, kept as `TERMINATING`.
        cluster: String,
        /// What may still be running, and where.
        running: String,
        /// Why the teardown failed.
        reason: String,
    },
    /// The managed-job controller's host could not be reached.
    #[error("{message}")]
    Unreachable {
        /// What failed, with the address.
        message: String,
        /// What to check.
        hint: String,
    },
    /// Something the user named does not exist.
    #[error("{message}")]
    NotFound {
        /// What.
        message: String,
        /// What to do.
        hint: Option<String>,
    },
}

fn provider_exit(e: &ProviderError) -> ExitCode {
    match e.kind {
        ErrorKind::Auth => ExitCode::Credentials,
        ErrorKind::InvalidRequest => ExitCode::BadInput,
        ErrorKind::Capacity | ErrorKind::Quota | ErrorKind::Transient => ExitCode::NoResources,
        ErrorKind::Fatal => ExitCode::Internal,
    }
}

impl Error {
    /// The exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Spec(_) | Error::Usage { .. } | Error::Catalog(_) => ExitCode::BadInput,
            Error::NoResources { .. } => ExitCode::NoResources,
            Error::NotImplemented(_) | Error::Io(_) => ExitCode::Internal,
            Error::State(StateError::Busy { .. }) => ExitCode::BadInput,
            Error::State(_) => ExitCode::Internal,
            Error::Provision(ProvisionError::Exhausted { .. }) => ExitCode::NoResources,
            Error::Provision(ProvisionError::Provider(e))
            | Error::Teardown(TeardownError::Provider(e))
            | Error::Provider(e) => provider_exit(e),
            Error::Provision(ProvisionError::State(_)) | Error::Teardown(_) => ExitCode::Internal,
            Error::NotFound { .. } => ExitCode::BadInput,
            Error::Unreachable { .. } => ExitCode::Unreachable,
            Error::Provision(ProvisionError::Leftover { .. }) | Error::Leftover { .. } => {
                ExitCode::Leftover
            }
        }
    }

    /// Lines to print under the message, each a `Caused by`/`hint` line.
    pub fn details(&self) -> Vec<String> {
        match self {
            Error::Usage { hint: Some(h), .. } | Error::NotFound { hint: Some(h), .. } => {
                vec![format!("hint: {h}")]
            }
            Error::Unreachable { hint, .. } => vec![format!("hint: {hint}")],
            Error::State(StateError::Busy { .. }) => vec![
                "hint: wait for it to finish (`gangway status` shows it), or pick another name with -c"
                    .into(),
            ],
            Error::Provision(ProvisionError::Exhausted { attempts, .. }) => {
                let mut v: Vec<String> = attempts
                    .iter()
                    .map(|a| {
                        format!(
                            "- {}/{}/{} {}{}: {}",
                            a.cloud,
                            a.region,
                            a.zone,
                            a.instance_type,
                            if a.use_spot { " (spot)" } else { "" },
                            a.outcome
                        )
                    })
                    .collect();
                // Nodes that came up but could not be logged in to: more
                // zones would not help; the SSH error's own hint says what.
                if attempts
                    .iter()
                    .all(|a| a.outcome.starts_with("cannot reach the nodes"))
                {
                    v.push("hint: the nodes came up but gangway could not log in to them over SSH; the reason and what to do are on the line(s) above".into());
                } else {
                    v.push("hint: allow more zones, regions or GPU types (infra, any_of), try --use-spot, or raise config.local.capacity on the local provider".into());
                }
                v
            }
            Error::Provision(ProvisionError::Provider(e)) | Error::Provider(e)
                if e.kind == ErrorKind::Auth =>
            {
                vec![format!("hint: `gangway check` says how to set up {} credentials", e.provider)]
            }
            Error::Leftover { cluster, .. } => vec![format!(
                "hint: it is kept as TERMINATING (`gangway status` shows it); `gangway down {cluster}` or `gangway status -r` tries again"
            )],
            Error::Teardown(_) => vec![
                "hint: the cluster is kept as TERMINATING; run `gangway down` again once the provider answers".into(),
            ],
            Error::NoResources { why, .. } => {
                let mut v: Vec<String> = why.reasons.iter().map(|r| format!("- {r}")).collect();
                v.push("hint: relax the constraints above, or see `gangway show-gpus` for what exists where".into());
                v
            }
            Error::NotImplemented(_) => vec![
                "hint: this command arrives in a later release; see the README's feature table"
                    .into(),
            ],
            _ => Vec::new(),
        }
    }

    /// A teardown of `cluster` that did not finish, with what its row says
    /// may still be running.
    pub(crate) fn leftover(
        store: &crate::core::state::Store,
        cluster: &str,
        reason: impl std::fmt::Display,
    ) -> Error {
        let row = store.cluster(cluster).ok().flatten();
        Error::Leftover {
            cluster: cluster.to_string(),
            running: row
                .as_ref()
                .map(crate::core::provision::still_running)
                .unwrap_or_else(|| "unknown".into()),
            reason: reason.to_string(),
        }
    }

    /// Shorthand for a usage error.
    pub(crate) fn usage(message: impl Into<String>, hint: Option<&str>) -> Error {
        Error::Usage {
            message: message.into(),
            hint: hint.map(str::to_string),
        }
    }
}
