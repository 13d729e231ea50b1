//! What the pages show, read the way the commands read it: clusters as
//! `status` does, managed jobs as `jobs queue`, `jobs events` and `jobs
//! logs` do (on the hosted controller when there is one), costs as
//! `cost-report` does.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

use crate::core::state::{ClusterRow, NodeRow, Store};
use crate::services::host::{Hosted, Input};
use crate::services::{cluster, cost, jobs};
use crate::Error;

/// The most of a log a page shows: its last lines, from its last bytes.
pub(crate) const LOG_LINES: usize = 200;
const LOG_BYTES: u64 = 64 * 1024;

/// How many events the events page lists.
pub(crate) const EVENTS: u32 = 200;

/// The days the cost chart covers (`cost-report`'s default).
pub(crate) const COST_DAYS: u32 = 30;

/// Where the pages read from: this machine's store, and the hosted
/// controller for managed jobs when one is configured.
pub(crate) struct Source<'a> {
    store: &'a Store,
    hosted: Option<Hosted>,
}

/// A cluster as `status` shows it, with its nodes.
pub(crate) struct ClusterView {
    /// The row.
    pub(crate) row: ClusterRow,
    /// Its status as `status` words it.
    pub(crate) shown_status: String,
    /// The managed-job controller's own cloud host.
    pub(crate) controller: bool,
    /// Live jobs on it.
    pub(crate) active_jobs: usize,
    /// Its nodes, in rank order.
    pub(crate) nodes: Vec<NodeRow>,
}

/// A managed job as `jobs queue -o json` gives it.
pub(crate) struct JobView {
    pub(crate) id: i64,
    pub(crate) name: Option<String>,
    pub(crate) state: String,
    pub(crate) restarts: u64,
    pub(crate) preemptions: u64,
    pub(crate) cost: f64,
    pub(crate) placement: Option<String>,
    pub(crate) detail: Option<String>,
    pub(crate) last_checkpoint: Option<i64>,
    pub(crate) submitted_at: i64,
    pub(crate) ended_at: Option<i64>,
    pub(crate) price_per_hour: Option<f64>,
    /// Lost nodes replaced in place, and what their survivors' wait cost
    /// (seconds up alone, USD), from the ledger.
    pub(crate) nodes_replaced: u64,
    pub(crate) survivors_waiting: (f64, f64),
}

impl JobView {
    fn from_json(v: &Value) -> Option<JobView> {
        let text = |k: &str| v[k].as_str().map(str::to_string);
        Some(JobView {
            id: v["id"].as_i64()?,
            name: text("name"),
            state: text("state")?,
            restarts: v["restart_count"].as_u64().unwrap_or(0),
            preemptions: v["preemptions"].as_u64().unwrap_or(0),
            cost: v["cost"].as_f64().unwrap_or(0.0),
            placement: text("placement"),
            detail: text("detail"),
            last_checkpoint: v["last_sync_at"].as_i64(),
            submitted_at: v["submitted_at"].as_i64().unwrap_or(0),
            ended_at: v["ended_at"].as_i64(),
            price_per_hour: v["price_per_hour"].as_f64(),
            nodes_replaced: v["nodes_replaced"].as_u64().unwrap_or(0),
            survivors_waiting: (
                v["survivors_waiting_s"].as_f64().unwrap_or(0.0),
                v["survivors_waiting_usd"].as_f64().unwrap_or(0.0),
            ),
        })
    }

    /// Whether it has ended for good.
    pub(crate) fn ended(&self) -> bool {
        matches!(
            self.state.as_str(),
            "SUCCEEDED" | "FAILED" | "FAILED_SETUP" | "FAILED_NO_RESOURCE" | "CANCELLED"
        )
    }
}

/// One transition of a managed job, as `jobs events -o json` gives it.
#[derive(Clone)]
pub(crate) struct EventView {
    pub(crate) job: i64,
    pub(crate) at: i64,
    pub(crate) state: String,
    pub(crate) placement: Option<String>,
    pub(crate) reason: String,
}

impl EventView {
    fn from_json(job: i64, v: &Value) -> Option<EventView> {
        Some(EventView {
            job,
            at: v["at"].as_i64()?,
            state: v["state"].as_str()?.to_string(),
            placement: v["placement"].as_str().map(str::to_string),
            reason: v["reason"].as_str().unwrap_or("").to_string(),
        })
    }
}

impl<'a> Source<'a> {
    /// Reads `store`, and the controller `home` configures, if any.
    pub(crate) fn new(home: &Path, store: &'a Store) -> Result<Source<'a>, Error> {
        Ok(Source {
            store,
            hosted: Hosted::configured(home)?,
        })
    }

    /// The hosted controller's address, if managed jobs live there.
    pub(crate) fn controller(&self) -> Option<String> {
        self.hosted.as_ref().map(Hosted::address)
    }

    /// `gangway ARGS -o json` on the hosted controller.
    fn hosted_json(h: &Hosted, args: &[&str]) -> Result<Value, Error> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["-o".into(), "json".into()]);
        let (code, out) = h.output(&all, Input::Nothing)?;
        if code != 0 {
            return Err(Error::usage(
                format!(
                    "the controller at {} answered `gangway {}` with exit code {code}",
                    h.address(),
                    args.join(" ")
                ),
                None,
            ));
        }
        serde_json::from_slice(&out).map_err(|e| {
            Error::usage(
                format!(
                    "the controller at {} answered `gangway {}` with something else than JSON: {e}",
                    h.address(),
                    args.join(" ")
                ),
                None,
            )
        })
    }

    /// Every cluster with its nodes, by name.
    pub(crate) fn clusters(&self) -> Result<Vec<ClusterView>, Error> {
        let mut active: std::collections::HashMap<String, usize> = Default::default();
        for j in self.store.active_jobs()? {
            *active.entry(j.cluster).or_default() += 1;
        }
        self.store
            .clusters()?
            .into_iter()
            .map(|row| {
                Ok(ClusterView {
                    shown_status: cluster::shown_status(self.store, &row),
                    controller: crate::services::host::cloud::is_controller(&row.name),
                    active_jobs: active.get(&row.name).copied().unwrap_or(0),
                    nodes: self.store.nodes(&row.name)?,
                    row,
                })
            })
            .collect()
    }

    /// Every managed job, oldest first.
    pub(crate) fn jobs(&self) -> Result<Vec<JobView>, Error> {
        let list = match &self.hosted {
            Some(h) => Self::hosted_json(h, &["jobs", "queue"])?["jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            None => self
                .store
                .managed_all()?
                .iter()
                .map(|j| cost::job_json(self.store, j))
                .collect(),
        };
        Ok(list.iter().filter_map(JobView::from_json).collect())
    }

    /// One managed job, if it exists.
    pub(crate) fn job(&self, id: i64) -> Result<Option<JobView>, Error> {
        if self.hosted.is_some() {
            return Ok(self.jobs()?.into_iter().find(|j| j.id == id));
        }
        Ok(self
            .store
            .managed(id)?
            .map(|j| cost::job_json(self.store, &j))
            .as_ref()
            .and_then(JobView::from_json))
    }

    /// A managed job's transitions, oldest first.
    pub(crate) fn events(&self, id: i64) -> Result<Vec<EventView>, Error> {
        let list = match &self.hosted {
            Some(h) => Self::hosted_json(h, &["jobs", "events", &id.to_string()])?["events"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            None => self
                .store
                .managed_events(id)?
                .iter()
                .map(|e| serde_json::to_value(e).unwrap_or_default())
                .collect(),
        };
        Ok(list
            .iter()
            .filter_map(|v| EventView::from_json(id, v))
            .collect())
    }

    /// The newest transitions of every managed job, newest first (on this
    /// machine; a hosted controller's are on each job's page).
    pub(crate) fn recent_events(&self) -> Result<Option<Vec<EventView>>, Error> {
        if self.hosted.is_some() {
            return Ok(None);
        }
        Ok(Some(
            self.store
                .managed_events_recent(EVENTS)?
                .into_iter()
                .map(|(job, e)| EventView {
                    job,
                    at: e.at,
                    state: e.state,
                    placement: e.placement,
                    reason: e.reason,
                })
                .collect(),
        ))
    }

    /// The last [`LOG_LINES`] lines of a managed job's output, across its
    /// runs, as `jobs logs` prints it.
    pub(crate) fn log_tail(&self, id: i64) -> Result<String, Error> {
        let text = match &self.hosted {
            Some(h) => {
                let (_, out) = h.output(
                    &["jobs".into(), "logs".into(), id.to_string()],
                    Input::Nothing,
                )?;
                String::from_utf8_lossy(&out).into_owned()
            }
            None => {
                let mut all = Vec::new();
                let runs = jobs::runs_of(self.store, id);
                for &run in &runs {
                    let path = self.store.job_log_dir(run).join("job.log");
                    if let Ok(mut f) = std::fs::File::open(path) {
                        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                        f.seek(SeekFrom::Start(len.saturating_sub(LOG_BYTES)))?;
                        f.take(LOG_BYTES).read_to_end(&mut all)?;
                        if !all.is_empty() && !all.ends_with(b"\n") {
                            all.push(b'\n');
                        }
                    }
                }
                // The job's one story, as `jobs logs` tells it.
                String::from_utf8_lossy(&jobs::story(&all, &runs)).into_owned()
            }
        };
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines[lines.len().saturating_sub(LOG_LINES)..].join("\n"))
    }

    /// `cost-report -o json` over [`COST_DAYS`], the hosted controller's
    /// managed jobs included.
    pub(crate) fn cost_report(&self) -> Result<Value, Error> {
        let mut report = cost::report(self.store, COST_DAYS)?;
        if let Some(h) = &self.hosted {
            let days = COST_DAYS.to_string();
            let remote = Self::hosted_json(h, &["cost-report", "--days", &days])?;
            cost::merge_hosted(&mut report, &remote, h);
        }
        Ok(report)
    }
}
