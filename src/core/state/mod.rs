//! Cluster, node, job and event state in SQLite (`$GANGWAY_HOME/state.db`).
//!
//! The database is the one place that says what gangway has created. It is
//! written before every step that creates something outside it (a cluster row
//! exists, with its placement, before the provider is asked for nodes), so a
//! `kill -9` at any moment leaves a row that `status` shows and `down`
//! removes. WAL mode lets `status` read while a launch writes; writers take
//! `BEGIN IMMEDIATE` and wait up to [`BUSY_TIMEOUT`] for each other.
//!
//! Whether a process still works on a cluster or a job is never guessed from
//! a pid: the owner holds an advisory lock ([`OwnerLock`]) that the kernel
//! drops when the process dies, however it dies.

mod buckets;
mod ledger;
mod lock;
mod managed;
mod outcome;
mod owner;

pub(crate) use owner::{owner, OWNER_FILE};

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

pub(crate) use ledger::LedgerRow;
pub(crate) use lock::OwnerLock;
pub(crate) use managed::{Location, ManagedJob, ManagedState, Market, Watched};
pub(crate) use outcome::{EndReason, LossSeen, LostNode, RankEnd, RunOutcome};

/// How long a writer waits for another before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(15);

/// Schema migrations, applied in order; `PRAGMA user_version` counts them.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE clusters(
        name TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        owner_pid INTEGER,
        cloud TEXT, region TEXT, zone TEXT, instance_type TEXT,
        use_spot INTEGER NOT NULL DEFAULT 0,
        accelerator TEXT,
        accelerator_count REAL NOT NULL DEFAULT 0,
        num_nodes INTEGER NOT NULL,
        price_per_hour REAL,
        client_token TEXT NOT NULL,
        provider_config TEXT,
        autostop_idle_min INTEGER,
        autostop_down INTEGER NOT NULL DEFAULT 0,
        launched_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        last_error TEXT
    );
    CREATE TABLE nodes(
        cluster TEXT NOT NULL REFERENCES clusters(name) ON DELETE CASCADE,
        rank INTEGER NOT NULL,
        instance_id TEXT NOT NULL,
        private_ip TEXT NOT NULL,
        public_ip TEXT,
        zone TEXT NOT NULL,
        topology TEXT NOT NULL,
        state TEXT NOT NULL,
        extra TEXT NOT NULL,
        PRIMARY KEY(cluster, rank)
    );
    CREATE TABLE jobs(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster TEXT NOT NULL REFERENCES clusters(name) ON DELETE CASCADE,
        name TEXT,
        status TEXT NOT NULL,
        spec TEXT NOT NULL,
        driver_pid INTEGER,
        submitted_at INTEGER NOT NULL,
        started_at INTEGER,
        ended_at INTEGER,
        detail TEXT
    );
    CREATE INDEX jobs_cluster ON jobs(cluster, id);
    CREATE TABLE events(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        cluster TEXT NOT NULL,
        job INTEGER,
        kind TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX events_cluster ON events(cluster, id);",
    // 2: managed jobs and their history.
    "CREATE TABLE managed_jobs(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT,
        state TEXT NOT NULL,
        desired TEXT NOT NULL DEFAULT 'run',
        task TEXT NOT NULL,
        cluster TEXT NOT NULL,
        inner_job INTEGER,
        restarts_on_errors INTEGER NOT NULL DEFAULT 0,
        preemptions INTEGER NOT NULL DEFAULT 0,
        restart_count INTEGER NOT NULL DEFAULT 0,
        blocks TEXT NOT NULL DEFAULT '[]',
        placement TEXT,
        price_per_hour REAL,
        cost_so_far REAL NOT NULL DEFAULT 0,
        running_since INTEGER,
        notice_at INTEGER,
        last_sync_at INTEGER,
        recovery_started_at INTEGER,
        next_try_at INTEGER,
        submitted_at INTEGER NOT NULL,
        ended_at INTEGER,
        detail TEXT
    );
    CREATE TABLE managed_events(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job INTEGER NOT NULL,
        at INTEGER NOT NULL,
        state TEXT NOT NULL,
        placement TEXT,
        reason TEXT NOT NULL
    );
    CREATE INDEX managed_events_job ON managed_events(job, id);",
    // 3: progress and market, for deadline policies.
    "ALTER TABLE managed_jobs ADD COLUMN work_done_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE managed_jobs ADD COLUMN work_since INTEGER;
    ALTER TABLE managed_jobs ADD COLUMN market TEXT;",
    // 4: failed teardowns are retried: when next, and how many failed.
    "ALTER TABLE clusters ADD COLUMN retry_at INTEGER;
    ALTER TABLE clusters ADD COLUMN teardown_failures INTEGER NOT NULL DEFAULT 0;",
    // 5: decisions from data: how a run ended (JSON `RunOutcome`), where a
    // managed job runs (JSON `Location`) and the market a deadline
    // policy moves it to, apart from the market it is on (the pending move
    // used to be written `->spot` into `market`).
    "ALTER TABLE jobs ADD COLUMN outcome TEXT;
    ALTER TABLE managed_jobs ADD COLUMN location TEXT;
    ALTER TABLE managed_jobs ADD COLUMN moving_to TEXT;
    CREATE INDEX jobs_status ON jobs(status);
    UPDATE managed_jobs SET moving_to = substr(market, 3),
        market = CASE market WHEN '->spot' THEN 'on-demand' ELSE 'spot' END
        WHERE market LIKE '->%';",
    // 6: buckets gangway created (a task's `{name: ...}` storage mounts),
    // owned by a cluster (`cluster:NAME`) or a managed job (`job:ID`);
    // written before the bucket is made, so none is ever forgotten.
    "CREATE TABLE buckets(
        url TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        persistent INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX buckets_owner ON buckets(owner);",
    // 7: the cost ledger (ledger.rs): rows outlive their clusters.
    "CREATE TABLE ledger(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster TEXT NOT NULL,
        managed_job INTEGER,
        cloud TEXT NOT NULL, region TEXT, zone TEXT, instance_type TEXT,
        market TEXT NOT NULL,
        num_nodes INTEGER NOT NULL,
        price_per_hour REAL NOT NULL,
        started_at INTEGER NOT NULL,
        ended_at INTEGER
    );
    CREATE INDEX ledger_cluster ON ledger(cluster, ended_at);
    CREATE INDEX ledger_job ON ledger(managed_job);",
    // 8: where a ledger row's price came from: the plan's, or what the
    // provider reported for the nodes it launched (a spot market price).
    "ALTER TABLE ledger ADD COLUMN price_source TEXT NOT NULL DEFAULT 'plan';",
    // 9: how many of a managed job's nodes were replaced in place
    // (`REPLACE_LOST_NODES`), for `jobs queue`.
    "ALTER TABLE managed_jobs ADD COLUMN nodes_replaced INTEGER NOT NULL DEFAULT 0;",
    // 10: what a ledger row's stretch was (`run`, or `survivors-waiting`:
    // a gang's survivors alone while its lost nodes are replaced) and the
    // ranks of the nodes it bills (`0,1,3`; NULL in older rows), so a
    // replacement's rows are true per node (ledger.rs).
    "ALTER TABLE ledger ADD COLUMN phase TEXT NOT NULL DEFAULT 'run';
    ALTER TABLE ledger ADD COLUMN ranks TEXT;",
];

/// The cluster's price per hour as its provider reported it at launch
/// (the sum of every node's [`gangway_provider::PRICE_FACT`]), when every
/// node has one.
fn reported_price(nodes: &[NodeRow]) -> Option<f64> {
    if nodes.is_empty() {
        return None;
    }
    nodes
        .iter()
        .map(|n| {
            n.extra
                .get(gangway_provider::PRICE_FACT)
                .and_then(|p| p.parse::<f64>().ok())
                .filter(|p| p.is_finite() && *p >= 0.0)
        })
        .sum()
}

/// A state database failure, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// SQLite refused.
    #[error("state database {path}: {source}")]
    Db {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The directory or a lock file could not be used.
    #[error("state directory {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The database was written by a newer gangway.
    #[error("state database {path} has schema version {found}; this gangway knows up to {known}")]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Version found.
        found: i64,
        /// Newest version known here.
        known: i64,
    },
    /// Another process is provisioning or tearing down this cluster.
    #[error("cluster '{cluster}' is busy: another gangway process{} is {doing} it", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Busy {
        /// The cluster.
        cluster: String,
        /// The other process, if known.
        pid: Option<u32>,
        /// What it is doing.
        doing: String,
    },
}

/// A cluster's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum ClusterStatus {
    /// Being provisioned, or provisioning was interrupted (half-created).
    Init,
    /// All nodes up.
    Up,
    /// Stopped; disks kept.
    Stopped,
    /// Being torn down, or teardown was interrupted.
    Terminating,
}

impl ClusterStatus {
    fn as_str(self) -> &'static str {
        match self {
            ClusterStatus::Init => "INIT",
            ClusterStatus::Up => "UP",
            ClusterStatus::Stopped => "STOPPED",
            ClusterStatus::Terminating => "TERMINATING",
        }
    }
    fn parse(s: &str) -> ClusterStatus {
        match s {
            "UP" => ClusterStatus::Up,
            "STOPPED" => ClusterStatus::Stopped,
            "TERMINATING" => ClusterStatus::Terminating,
            _ => ClusterStatus::Init,
        }
    }
}

impl std::fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum JobStatus {
    /// Waiting for earlier jobs on the cluster.
    Pending,
    /// Setup running on every node.
    SettingUp,
    /// Run started on every node.
    Running,
    /// Every rank exited 0.
    Succeeded,
    /// A rank failed.
    Failed,
    /// Setup failed on a node; the run never started.
    FailedSetup,
    /// Cancelled by the user.
    Cancelled,
    /// The process driving the job died without recording an end.
    FailedDriver,
}

impl JobStatus {
    /// The stored name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "PENDING",
            JobStatus::SettingUp => "SETTING_UP",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::FailedSetup => "FAILED_SETUP",
            JobStatus::Cancelled => "CANCELLED",
            JobStatus::FailedDriver => "FAILED_DRIVER",
        }
    }
    /// Parses a stored name.
    pub(crate) fn parse(s: &str) -> Option<JobStatus> {
        Some(match s {
            "PENDING" => JobStatus::Pending,
            "SETTING_UP" => JobStatus::SettingUp,
            "RUNNING" => JobStatus::Running,
            "SUCCEEDED" => JobStatus::Succeeded,
            "FAILED" => JobStatus::Failed,
            "FAILED_SETUP" => JobStatus::FailedSetup,
            "CANCELLED" => JobStatus::Cancelled,
            "FAILED_DRIVER" => JobStatus::FailedDriver,
            _ => return None,
        })
    }
    /// Whether the job has ended.
    pub(crate) fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobStatus::Pending | JobStatus::SettingUp | JobStatus::Running
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One cluster row.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ClusterRow {
    /// Name.
    pub(crate) name: String,
    /// Lifecycle state.
    pub(crate) status: ClusterStatus,
    /// Cloud, once a placement was tried.
    pub(crate) cloud: Option<String>,
    /// Region.
    pub(crate) region: Option<String>,
    /// Zone.
    pub(crate) zone: Option<String>,
    /// Instance type.
    pub(crate) instance_type: Option<String>,
    /// Spot market.
    pub(crate) use_spot: bool,
    /// GPU name.
    pub(crate) accelerator: Option<String>,
    /// GPUs per node.
    pub(crate) accelerator_count: f32,
    /// Nodes asked for.
    pub(crate) num_nodes: u32,
    /// USD per hour, whole cluster.
    pub(crate) price_per_hour: Option<f64>,
    /// The idempotency token every launch of this cluster reuses.
    #[serde(skip)]
    pub(crate) client_token: String,
    /// The provider's `config.<cloud>` options, as JSON text.
    #[serde(skip)]
    pub(crate) provider_config: Option<String>,
    /// Autostop after this many idle minutes.
    pub(crate) autostop_idle_min: Option<u32>,
    /// Autostop tears down instead of stopping.
    pub(crate) autostop_down: bool,
    /// Created, unix ms.
    pub(crate) launched_at: i64,
    /// Last change, unix ms.
    pub(crate) updated_at: i64,
    /// Why the last step failed, if it did.
    pub(crate) last_error: Option<String>,
    /// A failed teardown is retried from then on (unix ms).
    pub(crate) retry_at: Option<i64>,
    /// Teardowns that failed in a row.
    pub(crate) teardown_failures: u32,
}

/// One node row (rank order): the provider contract's type, which every
/// transport is handed.
pub(crate) use gangway_provider::NodeRow;

/// One job row.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct JobRow {
    /// Id, unique across clusters.
    pub(crate) id: i64,
    /// Cluster.
    pub(crate) cluster: String,
    /// Task name.
    pub(crate) name: Option<String>,
    /// State.
    pub(crate) status: JobStatus,
    /// What to run, as JSON (never secrets).
    #[serde(skip)]
    pub(crate) spec: String,
    /// The driving process.
    pub(crate) driver_pid: Option<u32>,
    /// Submitted, unix ms.
    pub(crate) submitted_at: i64,
    /// All ranks started, unix ms.
    pub(crate) started_at: Option<i64>,
    /// Ended, unix ms.
    pub(crate) ended_at: Option<i64>,
    /// How it ended (which rank, which exit code), for people.
    pub(crate) detail: Option<String>,
    /// How it ended, as data (runs that ended before outcomes were
    /// recorded have none).
    pub(crate) outcome: Option<RunOutcome>,
}

/// One event.
#[cfg(test)]
#[derive(Clone, Debug, Serialize)]
pub(crate) struct EventRow {
    /// Unix ms.
    pub(crate) at: i64,
    /// Job, if about one.
    pub(crate) job: Option<i64>,
    /// Short kind (`provision`, `failover`, `setup`, ...).
    pub(crate) kind: String,
    /// What happened.
    pub(crate) message: String,
}

/// What a new cluster is.
#[derive(Clone, Debug)]
pub(crate) struct NewCluster<'a> {
    /// Name.
    pub(crate) name: &'a str,
    /// Nodes.
    pub(crate) num_nodes: u32,
    /// Token for idempotent launches.
    pub(crate) client_token: &'a str,
    /// `config.<cloud>` JSON.
    pub(crate) provider_config: Option<String>,
}

/// What `reserve_cluster` found.
#[derive(Debug)]
pub(crate) enum Reserved {
    /// A new row in `INIT`.
    New(ClusterRow),
    /// A half-created cluster whose launcher died: ours to finish (same token).
    Resumed(ClusterRow),
    /// The cluster exists (up or stopped).
    Existing(ClusterRow),
}

/// Where a placement attempt goes.
#[derive(Clone, Debug)]
pub(crate) struct Placement<'a> {
    /// Cloud.
    pub(crate) cloud: &'a str,
    /// Region.
    pub(crate) region: &'a str,
    /// Zone.
    pub(crate) zone: &'a str,
    /// Instance type.
    pub(crate) instance_type: &'a str,
    /// Spot.
    pub(crate) use_spot: bool,
    /// GPU name.
    pub(crate) accelerator: Option<&'a str>,
    /// GPUs per node.
    pub(crate) accelerator_count: f32,
    /// USD per hour, whole cluster.
    pub(crate) price_per_hour: f64,
}

/// An open state database.
pub(crate) struct Store {
    conn: Connection,
    path: PathBuf,
    home: PathBuf,
}

/// How long after its `n`-th failure (1-based) a teardown is retried.
pub(crate) fn teardown_backoff(n: u32) -> Duration {
    let s = 5u64.saturating_mul(1u64 << n.saturating_sub(1).min(10));
    Duration::from_secs(s.min(15 * 60))
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) `home/state.db` and brings its schema up to date.
    ///
    /// Several processes may create the database at once; SQLite answers
    /// some of the first steps (switching to WAL) with "busy" without
    /// waiting, so the whole opening is retried for up to [`BUSY_TIMEOUT`].
    pub(crate) fn open(home: &Path) -> Result<Store, StateError> {
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(5);
        loop {
            match Self::open_once(home) {
                Err(StateError::Db { source, .. })
                    if is_busy(&source) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    fn open_once(home: &Path) -> Result<Store, StateError> {
        make_home(home).map_err(|source| StateError::Io {
            path: home.to_path_buf(),
            source,
        })?;
        let path = home.join("state.db");
        let db = db_err(&path);
        // Owner-only whatever the umask: SQLite gives its -wal and -shm
        // files the database's mode.
        {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::File::options()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => f
                    .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .map_err(|source| StateError::Io {
                        path: path.clone(),
                        source,
                    })?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(StateError::Io {
                        path: path.clone(),
                        source,
                    })
                }
            }
        }
        let conn = Connection::open(&path).map_err(db)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db)?;
        // WAL is a property of the file: set it only once.
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(db)?;
        if !mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(db)?;
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(db)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(db)?;
        let mut store = Store {
            conn,
            path: path.clone(),
            home: home.to_path_buf(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The gangway home this database lives in.
    pub(crate) fn home(&self) -> &Path {
        &self.home
    }

    /// A number that changes whenever another connection (another
    /// process) commits to the database: a cheap way to tell that nothing
    /// changed.
    pub(crate) fn data_version(&self) -> Result<i64, StateError> {
        self.conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(|e| self.db(e))
    }

    fn db(&self, source: rusqlite::Error) -> StateError {
        StateError::Db {
            path: self.path.clone(),
            source,
        }
    }

    fn migrate(&mut self) -> Result<(), StateError> {
        let known = MIGRATIONS.len() as i64;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.db(e))?;
        if version > known {
            return Err(StateError::TooNew {
                path: self.path.clone(),
                found: version,
                known,
            });
        }
        if version == known {
            return Ok(());
        }
        let db = db_err(&self.path);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        // Another process may have migrated while we waited for the lock.
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(db)?;
        for sql in &MIGRATIONS[version.min(known) as usize..] {
            tx.execute_batch(sql).map_err(db)?;
        }
        tx.pragma_update(None, "user_version", known).map_err(db)?;
        tx.commit().map_err(db)
    }

    /// Path of a cluster's owner lock.
    fn lock_path(&self, name: &str) -> PathBuf {
        self.home.join("locks").join(format!("cluster-{name}.lock"))
    }

    /// Takes the cluster's owner lock without waiting: `Busy` if another
    /// live process holds it.
    pub(crate) fn lock_cluster(&self, name: &str, doing: &str) -> Result<OwnerLock, StateError> {
        let path = self.lock_path(name);
        match OwnerLock::try_acquire(&path)? {
            Some(l) => Ok(l),
            None => Err(StateError::Busy {
                cluster: name.to_string(),
                pid: OwnerLock::holder(&path),
                doing: doing.to_string(),
            }),
        }
    }

    /// Whether some live process holds the cluster's owner lock.
    pub(crate) fn cluster_locked(&self, name: &str) -> bool {
        OwnerLock::is_held(&self.lock_path(name))
    }

    /// Creates the cluster row in `INIT`, or finds it. The caller must hold
    /// the cluster's owner lock.
    pub(crate) fn reserve_cluster(&self, c: &NewCluster<'_>) -> Result<Reserved, StateError> {
        let now = now_ms();
        let db = db_err(&self.path);
        // Shared, not `&mut`: the controller's reconcile tasks share one
        // connection, and nothing here awaits while the transaction is open.
        let tx = rusqlite::Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
            .map_err(db)?;
        let existing = query_cluster(&tx, c.name).map_err(db)?;
        let reserved = match existing {
            Some(row) if row.status == ClusterStatus::Init => {
                tx.execute(
                    "UPDATE clusters SET owner_pid = ?2, updated_at = ?3 WHERE name = ?1",
                    params![c.name, std::process::id(), now],
                )
                .map_err(db)?;
                Reserved::Resumed(row)
            }
            Some(row) => Reserved::Existing(row),
            None => {
                tx.execute(
                    "INSERT INTO clusters(name, status, owner_pid, num_nodes, client_token,
                        provider_config, launched_at, updated_at)
                     VALUES (?1, 'INIT', ?2, ?3, ?4, ?5, ?6, ?6)",
                    params![
                        c.name,
                        std::process::id(),
                        c.num_nodes,
                        c.client_token,
                        c.provider_config,
                        now
                    ],
                )
                .map_err(db)?;
                Reserved::New(
                    query_cluster(&tx, c.name)
                        .map_err(db)?
                        .expect("just inserted"),
                )
            }
        };
        tx.commit().map_err(db)?;
        Ok(reserved)
    }

    /// Records where the next launch attempt goes, before the provider is asked.
    pub(crate) fn set_placement(&self, name: &str, p: &Placement<'_>) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE clusters SET cloud = ?2, region = ?3, zone = ?4, instance_type = ?5,
                    use_spot = ?6, accelerator = ?7, accelerator_count = ?8,
                    price_per_hour = ?9, updated_at = ?10
                 WHERE name = ?1",
                params![
                    name,
                    p.cloud,
                    p.region,
                    p.zone,
                    p.instance_type,
                    p.use_spot,
                    p.accelerator,
                    p.accelerator_count,
                    p.price_per_hour,
                    now_ms()
                ],
            )
            .map_err(|e| self.db(e))?;
        // Nodes at a new placement are a new stretch, at its price.
        ledger::close(&self.conn, name).map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Replaces the cluster's nodes and sets its status, in one transaction.
    pub(crate) fn set_nodes(
        &self,
        name: &str,
        status: ClusterStatus,
        nodes: &[NodeRow],
    ) -> Result<(), StateError> {
        let db = db_err(&self.path);
        let tx = rusqlite::Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
            .map_err(db)?;
        tx.execute("DELETE FROM nodes WHERE cluster = ?1", [name])
            .map_err(db)?;
        {
            let mut ins = tx
                .prepare(
                    "INSERT INTO nodes(cluster, rank, instance_id, private_ip, public_ip, zone,
                        topology, state, extra) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )
                .map_err(db)?;
            for n in nodes {
                let extra = serde_json::to_string(&n.extra).unwrap_or_else(|_| "{}".into());
                ins.execute(params![
                    name,
                    n.rank,
                    n.instance_id,
                    n.private_ip,
                    n.public_ip,
                    n.zone,
                    n.topology,
                    n.state,
                    extra
                ])
                .map_err(db)?;
            }
        }
        tx.execute(
            "UPDATE clusters SET status = ?2, owner_pid = NULL, last_error = NULL, updated_at = ?3
             WHERE name = ?1",
            params![name, status.as_str(), now_ms()],
        )
        .map_err(db)?;
        match status {
            ClusterStatus::Up => {
                ledger::open(&tx, name, nodes, reported_price(nodes)).map_err(db)?
            }
            ClusterStatus::Stopped => ledger::close(&tx, name).map_err(db)?,
            ClusterStatus::Init | ClusterStatus::Terminating => {}
        }
        tx.commit().map_err(db)
    }

    /// Records that the nodes of `name` at `ranks` are confirmed removed
    /// while the others stay up to wait for their replacements: the lost
    /// nodes become `gone`, the ledger's open stretch closes and one of the
    /// survivors alone (`survivors-waiting`) opens, in one transaction.
    /// Returns the survivors.
    pub(crate) fn lost_nodes_removed(
        &self,
        name: &str,
        ranks: &[u32],
    ) -> Result<Vec<NodeRow>, StateError> {
        let db = db_err(&self.path);
        let tx = rusqlite::Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
            .map_err(db)?;
        for rank in ranks {
            tx.execute(
                "UPDATE nodes SET state = 'gone' WHERE cluster = ?1 AND rank = ?2",
                params![name, rank],
            )
            .map_err(db)?;
        }
        let survivors: Vec<NodeRow> = self
            .nodes(name)?
            .into_iter()
            .filter(|n| !ranks.contains(&n.rank))
            .collect();
        ledger::survivors_waiting(&tx, name, &survivors, reported_price(&survivors)).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(survivors)
    }

    /// Updates the last known state of a cluster's nodes by instance id;
    /// nodes the provider no longer knows become `gone`.
    pub(crate) fn update_node_states(
        &self,
        cluster: &str,
        seen: &[(String, String)],
    ) -> Result<(), StateError> {
        for n in self.nodes(cluster)? {
            let state = seen
                .iter()
                .find(|(id, _)| *id == n.instance_id)
                .map_or("gone", |(_, s)| s.as_str());
            if state != n.state {
                self.conn
                    .execute(
                        "UPDATE nodes SET state = ?3 WHERE cluster = ?1 AND instance_id = ?2",
                        params![cluster, n.instance_id, state],
                    )
                    .map_err(|e| self.db(e))?;
            }
        }
        Ok(())
    }

    /// Sets a cluster's status (and its last error, if any).
    pub(crate) fn set_status(
        &self,
        name: &str,
        status: ClusterStatus,
        error: Option<&str>,
    ) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE clusters SET status = ?2, last_error = ?3, updated_at = ?4 WHERE name = ?1",
                params![name, status.as_str(), error, now_ms()],
            )
            .map_err(|e| self.db(e))?;
        // Stopped nodes cost (nearly) nothing: the ledger's row closes.
        if status == ClusterStatus::Stopped {
            ledger::close(&self.conn, name).map_err(|e| self.db(e))?;
        }
        Ok(())
    }

    /// Records a teardown that did not finish: the cluster stays, as
    /// `TERMINATING` with the reason, and is retried from the returned time
    /// on (5 s after the first failure, doubling up to 15 minutes).
    pub(crate) fn set_teardown_failed(&self, name: &str, reason: &str) -> Result<i64, StateError> {
        let failures: u32 = self
            .conn
            .query_row(
                "SELECT teardown_failures FROM clusters WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.db(e))?
            .unwrap_or(0);
        let now = now_ms();
        let retry_at = now + teardown_backoff(failures + 1).as_millis() as i64;
        self.conn
            .execute(
                "UPDATE clusters SET status = 'TERMINATING', last_error = ?2, retry_at = ?3,
                    teardown_failures = teardown_failures + 1, updated_at = ?4
                 WHERE name = ?1",
                params![name, reason, retry_at, now],
            )
            .map_err(|e| self.db(e))?;
        Ok(retry_at)
    }

    /// Records a failure of an automatic step (autostop) without changing
    /// the cluster's status: `status` shows it until the next success.
    pub(crate) fn set_last_error(&self, name: &str, error: Option<&str>) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE clusters SET last_error = ?2, updated_at = ?3 WHERE name = ?1",
                params![name, error, now_ms()],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Sets autostop.
    pub(crate) fn set_autostop(
        &self,
        name: &str,
        idle_min: Option<u32>,
        down: bool,
    ) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE clusters SET autostop_idle_min = ?2, autostop_down = ?3, updated_at = ?4
                 WHERE name = ?1",
                params![name, idle_min, down, now_ms()],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Deletes a cluster with its nodes and jobs.
    pub(crate) fn remove_cluster(&self, name: &str) -> Result<(), StateError> {
        let db = db_err(&self.path);
        let tx = rusqlite::Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
            .map_err(db)?;
        // Its nodes are gone: the ledger's row closes (and stays).
        ledger::close(&tx, name).map_err(db)?;
        tx.execute("DELETE FROM clusters WHERE name = ?1", [name])
            .map_err(db)?;
        tx.commit().map_err(db)
    }

    /// One cluster.
    pub(crate) fn cluster(&self, name: &str) -> Result<Option<ClusterRow>, StateError> {
        query_cluster(&self.conn, name).map_err(|e| self.db(e))
    }

    /// Runs a query and collects its rows.
    pub(crate) fn query_all<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StateError> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| self.db(e))?;
        let rows = st
            .query_map(params, f)
            .map_err(|e| self.db(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.db(e));
        rows
    }

    /// Every cluster, by name.
    pub(crate) fn clusters(&self) -> Result<Vec<ClusterRow>, StateError> {
        self.query_all(
            &format!("SELECT {CLUSTER_COLS} FROM clusters ORDER BY name"),
            [],
            cluster_row,
        )
    }

    /// A cluster's nodes in rank order.
    pub(crate) fn nodes(&self, name: &str) -> Result<Vec<NodeRow>, StateError> {
        self.query_all(
            "SELECT rank, instance_id, private_ip, public_ip, zone, topology, state, extra
                 FROM nodes WHERE cluster = ?1 ORDER BY rank",
            [name],
            |r| {
                let extra: String = r.get(7)?;
                Ok(NodeRow {
                    rank: r.get(0)?,
                    instance_id: r.get(1)?,
                    private_ip: r.get(2)?,
                    public_ip: r.get(3)?,
                    zone: r.get(4)?,
                    topology: r.get(5)?,
                    state: r.get(6)?,
                    extra: serde_json::from_str(&extra).unwrap_or_default(),
                })
            },
        )
    }

    /// Adds a job in `PENDING`; returns its id.
    pub(crate) fn add_job(
        &self,
        cluster: &str,
        name: Option<&str>,
        spec: &str,
    ) -> Result<i64, StateError> {
        self.conn
            .execute(
                "INSERT INTO jobs(cluster, name, status, spec, submitted_at)
                 VALUES (?1, ?2, 'PENDING', ?3, ?4)",
                params![cluster, name, spec, now_ms()],
            )
            .map_err(|e| self.db(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records the process driving a job.
    pub(crate) fn set_job_driver(&self, id: i64, pid: u32) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE jobs SET driver_pid = ?2 WHERE id = ?1",
                params![id, pid],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Moves a job to `status`; stamps start and end times. A job that has
    /// ended keeps its first ending.
    pub(crate) fn set_job_status(
        &self,
        id: i64,
        status: JobStatus,
        detail: Option<&str>,
    ) -> Result<(), StateError> {
        self.set_job_state(id, status, detail, None)
    }

    /// Ends a job: its status, the sentence for people and the outcome the
    /// controller decides from. A job that has ended keeps its first ending.
    pub(crate) fn end_job(
        &self,
        id: i64,
        status: JobStatus,
        detail: Option<&str>,
        outcome: &RunOutcome,
    ) -> Result<(), StateError> {
        self.set_job_state(id, status, detail, Some(outcome))
    }

    fn set_job_state(
        &self,
        id: i64,
        status: JobStatus,
        detail: Option<&str>,
        outcome: Option<&RunOutcome>,
    ) -> Result<(), StateError> {
        let outcome = outcome.and_then(|o| serde_json::to_string(o).ok());
        let now = now_ms();
        let started = (status == JobStatus::Running).then_some(now);
        let ended = status.is_terminal().then_some(now);
        self.conn
            .execute(
                "UPDATE jobs SET status = ?2,
                    started_at = COALESCE(started_at, ?3),
                    ended_at = COALESCE(ended_at, ?4),
                    detail = COALESCE(?5, detail),
                    outcome = COALESCE(?6, outcome)
                 WHERE id = ?1 AND status NOT IN
                    ('SUCCEEDED','FAILED','FAILED_SETUP','CANCELLED','FAILED_DRIVER')",
                params![id, status.as_str(), started, ended, detail, outcome],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// One job.
    pub(crate) fn job(&self, id: i64) -> Result<Option<JobRow>, StateError> {
        self.conn
            .query_row(
                &format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"),
                [id],
                job_row,
            )
            .optional()
            .map_err(|e| self.db(e))
    }

    /// A cluster's jobs, oldest first.
    pub(crate) fn jobs(&self, cluster: &str) -> Result<Vec<JobRow>, StateError> {
        self.query_all(
            &format!("SELECT {JOB_COLS} FROM jobs WHERE cluster = ?1 ORDER BY id"),
            [cluster],
            job_row,
        )
    }

    /// Jobs of every cluster that have not ended, oldest first.
    pub(crate) fn active_jobs(&self) -> Result<Vec<JobRow>, StateError> {
        self.query_all(
            &format!(
                "SELECT {JOB_COLS} FROM jobs
                 WHERE status IN ('PENDING','SETTING_UP','RUNNING') ORDER BY id"
            ),
            [],
            job_row,
        )
    }

    /// Appends an event.
    pub(crate) fn event(
        &self,
        cluster: &str,
        job: Option<i64>,
        kind: &str,
        message: &str,
    ) -> Result<(), StateError> {
        self.conn
            .execute(
                "INSERT INTO events(at, cluster, job, kind, message) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![now_ms(), cluster, job, kind, message],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// A cluster's events, oldest first.
    #[cfg(test)]
    pub(crate) fn events(&self, cluster: &str) -> Result<Vec<EventRow>, StateError> {
        self.query_all(
            "SELECT at, job, kind, message FROM events WHERE cluster = ?1 ORDER BY id",
            [cluster],
            |r| {
                Ok(EventRow {
                    at: r.get(0)?,
                    job: r.get(1)?,
                    kind: r.get(2)?,
                    message: r.get(3)?,
                })
            },
        )
    }

    /// Path of a job's driver lock.
    pub(crate) fn job_lock_path(&self, id: i64) -> PathBuf {
        self.home.join("locks").join(format!("job-{id}.lock"))
    }

    /// Directory holding a job's logs.
    pub(crate) fn job_log_dir(&self, id: i64) -> PathBuf {
        self.home.join("logs").join(format!("job-{id}"))
    }

    /// Marks jobs whose driver died without recording an end as
    /// `FAILED_DRIVER` and returns them (their ranks may still run: see
    /// `gang::reap`). Cheap: one lock probe per live job.
    pub(crate) fn reap_dead_jobs(&self) -> Result<Vec<JobRow>, StateError> {
        let mut reaped = Vec::new();
        // Without their specs (a few KiB each): a thousand live jobs are
        // looked at every few seconds.
        let live = self.query_all(
            "SELECT id, cluster, name, status, '', driver_pid, submitted_at, started_at,
                ended_at, detail, NULL FROM jobs
             WHERE status IN ('PENDING','SETTING_UP','RUNNING') ORDER BY id",
            [],
            job_row,
        )?;
        for j in live {
            // A job not yet handed to a driver is only dead once its
            // submitter is gone too; give it the submit grace period.
            if j.driver_pid.is_none() && now_ms() - j.submitted_at < 30_000 {
                continue;
            }
            if !OwnerLock::is_held(&self.job_lock_path(j.id)) {
                self.end_job(
                    j.id,
                    JobStatus::FailedDriver,
                    Some("the process driving this job exited without recording how it ended"),
                    &RunOutcome::of(EndReason::DriverDied),
                )?;
                reaped.push(j);
            }
        }
        Ok(reaped)
    }
}

/// Turns SQLite's errors into ours, naming the database file.
/// Creates `$GANGWAY_HOME` (and its parents) when it is missing: the home
/// itself 0700 whatever the umask, so nothing in it is readable by other
/// users. An existing home is left as its owner set it.
pub(crate) fn make_home(home: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if home.is_dir() {
        return Ok(());
    }
    if let Some(parent) = home.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(home) {
        Ok(()) => std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn db_err(path: &Path) -> impl Fn(rusqlite::Error) -> StateError + Copy + '_ {
    move |source| StateError::Db {
        path: path.to_path_buf(),
        source,
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

const CLUSTER_COLS: &str = "name, status, cloud, region, zone, instance_type, use_spot,
    accelerator, accelerator_count, num_nodes, price_per_hour, client_token, provider_config,
    autostop_idle_min, autostop_down, launched_at, updated_at, last_error, retry_at,
    teardown_failures";

fn cluster_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ClusterRow> {
    let status: String = r.get(1)?;
    Ok(ClusterRow {
        name: r.get(0)?,
        status: ClusterStatus::parse(&status),
        cloud: r.get(2)?,
        region: r.get(3)?,
        zone: r.get(4)?,
        instance_type: r.get(5)?,
        use_spot: r.get(6)?,
        accelerator: r.get(7)?,
        accelerator_count: r.get::<_, f64>(8)? as f32,
        num_nodes: r.get(9)?,
        price_per_hour: r.get(10)?,
        client_token: r.get(11)?,
        provider_config: r.get(12)?,
        autostop_idle_min: r.get(13)?,
        autostop_down: r.get(14)?,
        launched_at: r.get(15)?,
        updated_at: r.get(16)?,
        last_error: r.get(17)?,
        retry_at: r.get(18)?,
        teardown_failures: r.get(19)?,
    })
}

fn query_cluster(conn: &Connection, name: &str) -> rusqlite::Result<Option<ClusterRow>> {
    conn.query_row(
        &format!("SELECT {CLUSTER_COLS} FROM clusters WHERE name = ?1"),
        [name],
        cluster_row,
    )
    .optional()
}

const JOB_COLS: &str = "id, cluster, name, status, spec, driver_pid, submitted_at, started_at,
    ended_at, detail, outcome";

fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    let status: String = r.get(3)?;
    Ok(JobRow {
        id: r.get(0)?,
        cluster: r.get(1)?,
        name: r.get(2)?,
        status: JobStatus::parse(&status).unwrap_or(JobStatus::FailedDriver),
        spec: r.get(4)?,
        driver_pid: r.get(5)?,
        submitted_at: r.get(6)?,
        started_at: r.get(7)?,
        ended_at: r.get(8)?,
        detail: r.get(9)?,
        outcome: r
            .get::<_, Option<String>>(10)?
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

#[cfg(test)]
mod tests;
