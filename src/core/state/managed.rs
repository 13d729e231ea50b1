//! Managed jobs: the rows the controller reconciles, and their history.

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::{now_ms, StateError, Store};

/// A managed job's state (DESIGN.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum ManagedState {
    /// Submitted, not yet looked at.
    Pending,
    /// Finding and provisioning the first cluster.
    Provisioning,
    /// The cluster is up; setup or the run is starting.
    Starting,
    /// Every rank runs.
    Running,
    /// A node was (or is about to be) taken away.
    Preempted,
    /// Finding a new cluster after a preemption or a recoverable failure.
    Recovering,
    /// The run ended well.
    Succeeded,
    /// The run failed on its own, past its restarts.
    Failed,
    /// Setup failed.
    FailedSetup,
    /// No placement could ever be found for the first launch.
    FailedNoResource,
    /// Cancelled by the user.
    Cancelled,
}

impl ManagedState {
    /// The stored name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ManagedState::Pending => "PENDING",
            ManagedState::Provisioning => "PROVISIONING",
            ManagedState::Starting => "STARTING",
            ManagedState::Running => "RUNNING",
            ManagedState::Preempted => "PREEMPTED",
            ManagedState::Recovering => "RECOVERING",
            ManagedState::Succeeded => "SUCCEEDED",
            ManagedState::Failed => "FAILED",
            ManagedState::FailedSetup => "FAILED_SETUP",
            ManagedState::FailedNoResource => "FAILED_NO_RESOURCE",
            ManagedState::Cancelled => "CANCELLED",
        }
    }

    /// Parses a stored name.
    pub(crate) fn parse(s: &str) -> Option<ManagedState> {
        Some(match s {
            "PENDING" => ManagedState::Pending,
            "PROVISIONING" => ManagedState::Provisioning,
            "STARTING" => ManagedState::Starting,
            "RUNNING" => ManagedState::Running,
            "PREEMPTED" => ManagedState::Preempted,
            "RECOVERING" => ManagedState::Recovering,
            "SUCCEEDED" => ManagedState::Succeeded,
            "FAILED" => ManagedState::Failed,
            "FAILED_SETUP" => ManagedState::FailedSetup,
            "FAILED_NO_RESOURCE" => ManagedState::FailedNoResource,
            "CANCELLED" => ManagedState::Cancelled,
            _ => return None,
        })
    }

    /// Whether the job has ended for good.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(
            self,
            ManagedState::Succeeded
                | ManagedState::Failed
                | ManagedState::FailedSetup
                | ManagedState::FailedNoResource
                | ManagedState::Cancelled
        )
    }
}

impl std::fmt::Display for ManagedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One managed job.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ManagedJob {
    /// Id.
    pub(crate) id: i64,
    /// Name.
    pub(crate) name: Option<String>,
    /// State.
    pub(crate) state: ManagedState,
    /// `run` or `cancel`.
    pub(crate) desired: String,
    /// How to rebuild the task (JSON; never secrets).
    #[serde(skip)]
    pub(crate) task: String,
    /// The cluster this job runs on (one at a time, always this name).
    pub(crate) cluster: String,
    /// The current run on the cluster (a cluster job id).
    pub(crate) inner_job: Option<i64>,
    /// Restarts after the job's own failures (counted against the limit).
    pub(crate) restarts_on_errors: u32,
    /// Preemptions survived.
    pub(crate) preemptions: u32,
    /// Runs started after the first (GANGWAY_RESTART_COUNT).
    pub(crate) restart_count: u32,
    /// Nodes replaced in place after losses (`REPLACE_LOST_NODES`), the
    /// survivors kept.
    pub(crate) nodes_replaced: u32,
    /// Blocked placements (JSON list).
    #[serde(skip)]
    pub(crate) blocks: String,
    /// Where it runs now: `cloud/region/zone type[ spot]`.
    pub(crate) placement: Option<String>,
    /// USD/hour of the current cluster.
    pub(crate) price_per_hour: Option<f64>,
    /// USD spent on finished incarnations.
    pub(crate) cost_so_far: f64,
    /// The current cluster has been up since (unix ms).
    pub(crate) running_since: Option<i64>,
    /// A preemption notice was seen (unix ms).
    pub(crate) notice_at: Option<i64>,
    /// Last checkpoint sync (unix ms).
    pub(crate) last_sync_at: Option<i64>,
    /// When the current recovery began (unix ms).
    pub(crate) recovery_started_at: Option<i64>,
    /// Not before this (unix ms): backoff after finding no capacity.
    pub(crate) next_try_at: Option<i64>,
    /// Submitted (unix ms).
    pub(crate) submitted_at: i64,
    /// Ended (unix ms).
    pub(crate) ended_at: Option<i64>,
    /// How it ended, or what it waits for.
    pub(crate) detail: Option<String>,
    /// Running time kept by checkpoints so far, ms (deadline policies).
    pub(crate) work_done_ms: i64,
    /// The current run has made progress since (unix ms).
    pub(crate) work_since: Option<i64>,
    /// The market the current cluster is on.
    pub(crate) market: Option<Market>,
    /// The market a deadline policy is moving the job to: the run was told
    /// to checkpoint and the next cluster is on this market.
    pub(crate) moving_to: Option<Market>,
    /// Where the current cluster is (what a preemption blocks).
    #[serde(skip)]
    pub(crate) location: Option<Location>,
}

/// Spot or on-demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Market {
    /// Spot (preemptible) capacity.
    #[serde(rename = "spot")]
    Spot,
    /// On-demand capacity.
    #[serde(rename = "on-demand")]
    OnDemand,
}

impl Market {
    /// The stored (and shown) name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Market::Spot => "spot",
            Market::OnDemand => "on-demand",
        }
    }

    /// The market of a `use_spot` flag.
    pub(crate) fn of_spot(spot: bool) -> Market {
        if spot {
            Market::Spot
        } else {
            Market::OnDemand
        }
    }

    fn parse(s: &str) -> Option<Market> {
        match s {
            "spot" => Some(Market::Spot),
            "on-demand" => Some(Market::OnDemand),
            _ => None,
        }
    }
}

/// Where a managed job's cluster is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Location {
    /// Cloud.
    pub(crate) cloud: String,
    /// Region.
    pub(crate) region: String,
    /// Zone.
    pub(crate) zone: String,
}

impl ManagedJob {
    /// Cost so far, including the current cluster's running time.
    pub(crate) fn cost_now(&self, now: i64) -> f64 {
        let current = match (self.running_since, self.price_per_hour) {
            (Some(since), Some(p)) if self.ended_at.is_none() => {
                p * ((now - since).max(0) as f64 / 3_600_000.0)
            }
            _ => 0.0,
        };
        self.cost_so_far + current
    }
}

/// The states that end a managed job, as an SQL list.
const TERMINAL: &str = "('SUCCEEDED','FAILED','FAILED_SETUP','FAILED_NO_RESOURCE','CANCELLED')";

/// One managed job as the controller watches it ([`Store::managed_watch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Watched {
    /// The job.
    pub(crate) id: i64,
    /// Its state.
    pub(crate) state: ManagedState,
    /// The user asked to cancel it.
    pub(crate) cancel: bool,
    /// The status of its current run, if it has one.
    pub(crate) run: Option<super::JobStatus>,
    /// Its cluster's row exists.
    pub(crate) has_cluster: bool,
    /// When the cluster's failed teardown is due again.
    pub(crate) retry_at: Option<i64>,
    /// How many teardowns of the cluster failed.
    pub(crate) teardown_failures: u32,
}

/// One transition of a managed job.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ManagedEvent {
    /// Unix ms.
    pub(crate) at: i64,
    /// The state entered.
    pub(crate) state: String,
    /// Where the job was or goes.
    pub(crate) placement: Option<String>,
    /// Why.
    pub(crate) reason: String,
}

const COLS: &str = "id, name, state, desired, task, cluster, inner_job, restarts_on_errors,
    preemptions, restart_count, blocks, placement, price_per_hour, cost_so_far, running_since,
    notice_at, last_sync_at, recovery_started_at, next_try_at, submitted_at, ended_at, detail,
    work_done_ms, work_since, market, moving_to, location, nodes_replaced";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ManagedJob> {
    let state: String = r.get(2)?;
    Ok(ManagedJob {
        id: r.get(0)?,
        name: r.get(1)?,
        state: ManagedState::parse(&state).unwrap_or(ManagedState::Failed),
        desired: r.get(3)?,
        task: r.get(4)?,
        cluster: r.get(5)?,
        inner_job: r.get(6)?,
        restarts_on_errors: r.get(7)?,
        preemptions: r.get(8)?,
        restart_count: r.get(9)?,
        blocks: r.get(10)?,
        placement: r.get(11)?,
        price_per_hour: r.get(12)?,
        cost_so_far: r.get(13)?,
        running_since: r.get(14)?,
        notice_at: r.get(15)?,
        last_sync_at: r.get(16)?,
        recovery_started_at: r.get(17)?,
        next_try_at: r.get(18)?,
        submitted_at: r.get(19)?,
        ended_at: r.get(20)?,
        detail: r.get(21)?,
        work_done_ms: r.get(22)?,
        work_since: r.get(23)?,
        market: r
            .get::<_, Option<String>>(24)?
            .and_then(|m| Market::parse(&m)),
        moving_to: r
            .get::<_, Option<String>>(25)?
            .and_then(|m| Market::parse(&m)),
        location: r
            .get::<_, Option<String>>(26)?
            .and_then(|t| serde_json::from_str(&t).ok()),
        nodes_replaced: r.get(27)?,
    })
}

impl Store {
    /// Adds a managed job in `PENDING`; its cluster is `managed-<id>`.
    pub(crate) fn add_managed(
        &self,
        name: Option<&str>,
        task: &str,
    ) -> Result<ManagedJob, StateError> {
        let now = now_ms();
        self.conn
            .execute(
                "INSERT INTO managed_jobs(name, state, task, cluster, submitted_at)
                 VALUES (?1, 'PENDING', ?2, '', ?3)",
                params![name, task, now],
            )
            .map_err(|e| self.db(e))?;
        let id = self.conn.last_insert_rowid();
        self.conn
            .execute(
                "UPDATE managed_jobs SET cluster = ?2 WHERE id = ?1",
                params![id, format!("managed-{id}")],
            )
            .map_err(|e| self.db(e))?;
        self.managed_event(id, "PENDING", None, "submitted")?;
        Ok(self.managed(id)?.expect("just inserted"))
    }

    /// Stores how to rebuild a managed job's task (set once, at submit).
    pub(crate) fn set_managed_task(&self, id: i64, task: &str) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE managed_jobs SET task = ?2 WHERE id = ?1",
                params![id, task],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// One managed job.
    pub(crate) fn managed(&self, id: i64) -> Result<Option<ManagedJob>, StateError> {
        // Cached: `cost-report` and the dashboard ask for every job in turn.
        self.conn
            .prepare_cached(&format!("SELECT {COLS} FROM managed_jobs WHERE id = ?1"))
            .and_then(|mut st| st.query_row([id], row).optional())
            .map_err(|e| self.db(e))
    }

    /// Every managed job, oldest first.
    pub(crate) fn managed_all(&self) -> Result<Vec<ManagedJob>, StateError> {
        self.query_all(
            &format!("SELECT {COLS} FROM managed_jobs ORDER BY id"),
            [],
            row,
        )
    }

    /// Managed jobs that have not ended.
    pub(crate) fn managed_active(&self) -> Result<Vec<ManagedJob>, StateError> {
        self.query_all(
            &format!("SELECT {COLS} FROM managed_jobs WHERE state NOT IN {TERMINAL} ORDER BY id"),
            [],
            row,
        )
    }

    /// What the controller watches, in one query: every managed job that
    /// has not ended or still has a cluster, with its current run's status.
    pub(crate) fn managed_watch(&self) -> Result<Vec<Watched>, StateError> {
        self.query_all(
            &format!(
                "SELECT m.id, m.state, m.desired, j.status, c.name IS NOT NULL, c.retry_at,
                    COALESCE(c.teardown_failures, 0)
                 FROM managed_jobs m
                 LEFT JOIN jobs j ON j.id = m.inner_job
                 LEFT JOIN clusters c ON c.name = m.cluster
                 WHERE m.state NOT IN {TERMINAL} OR c.name IS NOT NULL
                 ORDER BY m.id"
            ),
            [],
            |r| {
                let state: String = r.get(1)?;
                let desired: String = r.get(2)?;
                let run: Option<String> = r.get(3)?;
                Ok(Watched {
                    id: r.get(0)?,
                    state: ManagedState::parse(&state).unwrap_or(ManagedState::Failed),
                    cancel: desired == "cancel",
                    run: run.as_deref().and_then(super::JobStatus::parse),
                    has_cluster: r.get(4)?,
                    retry_at: r.get(5)?,
                    teardown_failures: r.get(6)?,
                })
            },
        )
    }

    /// Writes every mutable field of `job` back, and records a transition
    /// event when the state changed from `was`.
    pub(crate) fn save_managed(
        &self,
        job: &ManagedJob,
        was: ManagedState,
        reason: &str,
    ) -> Result<(), StateError> {
        let ended = job.state.is_terminal().then(now_ms);
        self.conn
            .execute(
                "UPDATE managed_jobs SET state = ?2, inner_job = ?3, restarts_on_errors = ?4,
                    preemptions = ?5, restart_count = ?6, blocks = ?7, placement = ?8,
                    price_per_hour = ?9, cost_so_far = ?10, running_since = ?11, notice_at = ?12,
                    last_sync_at = ?13, recovery_started_at = ?14, next_try_at = ?15,
                    ended_at = COALESCE(ended_at, ?16), detail = ?17, work_done_ms = ?18,
                    work_since = ?19, market = ?20, moving_to = ?21, location = ?22,
                    nodes_replaced = ?23
                 WHERE id = ?1",
                params![
                    job.id,
                    job.state.as_str(),
                    job.inner_job,
                    job.restarts_on_errors,
                    job.preemptions,
                    job.restart_count,
                    job.blocks,
                    job.placement,
                    job.price_per_hour,
                    job.cost_so_far,
                    job.running_since,
                    job.notice_at,
                    job.last_sync_at,
                    job.recovery_started_at,
                    job.next_try_at,
                    ended,
                    job.detail,
                    job.work_done_ms,
                    job.work_since,
                    job.market.map(Market::as_str),
                    job.moving_to.map(Market::as_str),
                    job.location
                        .as_ref()
                        .and_then(|l| serde_json::to_string(l).ok()),
                    job.nodes_replaced,
                ],
            )
            .map_err(|e| self.db(e))?;
        if job.state != was {
            self.managed_event(job.id, job.state.as_str(), job.placement.as_deref(), reason)?;
        }
        Ok(())
    }

    /// Asks for a managed job to be cancelled (the controller does it).
    pub(crate) fn cancel_managed(&self, id: i64) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE managed_jobs SET desired = 'cancel' WHERE id = ?1",
                [id],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Appends a transition.
    pub(crate) fn managed_event(
        &self,
        job: i64,
        state: &str,
        placement: Option<&str>,
        reason: &str,
    ) -> Result<(), StateError> {
        self.conn
            .execute(
                "INSERT INTO managed_events(job, at, state, placement, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![job, now_ms(), state, placement, reason],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// A managed job's transitions, oldest first.
    pub(crate) fn managed_events(&self, job: i64) -> Result<Vec<ManagedEvent>, StateError> {
        self.query_all(
            "SELECT at, state, placement, reason FROM managed_events WHERE job = ?1 ORDER BY id",
            [job],
            |r| {
                Ok(ManagedEvent {
                    at: r.get(0)?,
                    state: r.get(1)?,
                    placement: r.get(2)?,
                    reason: r.get(3)?,
                })
            },
        )
    }

    /// The newest `limit` transitions of all managed jobs, newest first,
    /// each with its job's id.
    pub(crate) fn managed_events_recent(
        &self,
        limit: u32,
    ) -> Result<Vec<(i64, ManagedEvent)>, StateError> {
        self.query_all(
            "SELECT job, at, state, placement, reason FROM managed_events ORDER BY id DESC LIMIT ?1",
            [limit],
            |r| {
                Ok((
                    r.get(0)?,
                    ManagedEvent {
                        at: r.get(1)?,
                        state: r.get(2)?,
                        placement: r.get(3)?,
                        reason: r.get(4)?,
                    },
                ))
            },
        )
    }

    /// A managed job's own directory: the task copy, its secrets (mode
    /// 0600), the list of its runs, and by default its kept checkpoints.
    pub(crate) fn managed_dir(&self, id: i64) -> std::path::PathBuf {
        self.home.join("jobs").join(format!("managed-{id}"))
    }
}
