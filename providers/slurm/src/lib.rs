//! The `slurm` provider: a cluster's nodes are a Slurm allocation.
//!
//! A launch submits one batch job per gangway cluster (`gangway-<cluster>`,
//! `--nodes=N --ntasks-per-node=1`, the partition, GPUs per node, account,
//! QoS, time limit) whose script only holds the allocation; setup and run
//! are then job steps on its nodes (`srun --jobid ... --overlap`, one per
//! rank, started by the gang driver through the Slurm transport). Slurm
//! does the allocation, so a pending job is waited for (and its reason
//! reported) up to `max_queue_wait`, after which the launch is a capacity
//! failure and the failover plan moves on. A job Slurm requeues (node
//! failure, preemption) or ends with `NODE_FAIL` / `PREEMPTED` is a
//! preemption to the managed-job controller. `terminate` is `scancel`.
//!
//! Commands run on this machine (the login node, or any host with Slurm's
//! client commands and a `SLURM_CONF` for the cluster).
#![deny(missing_docs)]

pub mod clusters;
pub mod parse;
mod transport;

pub use transport::SlurmTransport;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, LaunchRequest, Node, NodeState, Placement, Provider,
    ProviderError, Result,
};

use parse::Job;

/// One partition of a cluster, as the optimizer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// Partition name.
    pub name: String,
    /// GPU type and count per node (`A100:8`), if any.
    pub gpu: Option<(String, u32)>,
    /// Slurm's GRES type for those GPUs when it differs from the name the
    /// task uses (`a100` for `A100`); none: `--gpus-per-node=N` of any type.
    pub gres_type: Option<String>,
    /// vCPUs per node.
    pub cpus: f32,
    /// Memory per node, GiB.
    pub memory_gib: f32,
    /// Most nodes one launch may ask for.
    pub max_nodes: u32,
    /// USD per GPU-hour, for cost reports (0 by default: it is yours).
    pub price_per_gpu_hour: f64,
    /// `--exclusive`.
    pub exclusive: bool,
}

/// A login node reached over SSH (the system's `ssh`, so your
/// `~/.ssh/config`, agent and known_hosts apply).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Login {
    /// Host name or address (or a `Host` alias of your ssh config).
    pub host: String,
    /// Port, when not ssh's default.
    pub port: Option<u16>,
    /// User, when not ssh's default.
    pub user: Option<String>,
    /// Private key, when not ssh's default.
    pub key: Option<PathBuf>,
    /// `ProxyJump`.
    pub jump: Option<String>,
}

impl Login {
    /// Parses `[user@]host[:port]`.
    pub fn parse(text: &str) -> Option<Login> {
        let (user, rest) = match text.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, text),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p.parse().ok()?)),
            _ => (rest, None),
        };
        (!host.is_empty() && !host.contains(char::is_whitespace)).then(|| Login {
            host: host.to_string(),
            port,
            user: user.filter(|u| !u.is_empty()),
            key: None,
            jump: None,
        })
    }

    /// Facts on a node that say how its login node is reached.
    pub fn to_extra(&self, extra: &mut BTreeMap<String, String>) {
        extra.insert(keys::LOGIN_HOST.into(), self.host.clone());
        if let Some(p) = self.port {
            extra.insert(keys::LOGIN_PORT.into(), p.to_string());
        }
        if let Some(u) = &self.user {
            extra.insert(keys::LOGIN_USER.into(), u.clone());
        }
        if let Some(k) = &self.key {
            extra.insert(keys::LOGIN_KEY.into(), k.display().to_string());
        }
        if let Some(j) = &self.jump {
            extra.insert(keys::LOGIN_JUMP.into(), j.clone());
        }
    }

    /// The login node of a node, from its facts; `None`: commands run here.
    pub fn from_extra(extra: &BTreeMap<String, String>) -> Option<Login> {
        Some(Login {
            host: extra.get(keys::LOGIN_HOST)?.clone(),
            port: extra.get(keys::LOGIN_PORT).and_then(|p| p.parse().ok()),
            user: extra.get(keys::LOGIN_USER).cloned(),
            key: extra.get(keys::LOGIN_KEY).map(PathBuf::from),
            jump: extra.get(keys::LOGIN_JUMP).cloned(),
        })
    }

    /// `ssh` to the login node, options set, ready for one argument: the
    /// remote command. `ssh_dir` is gangway's (`$GANGWAY_HOME/ssh`). One
    /// master connection per login node is shared by every command
    /// (`ControlPersist` keeps it 60 s after the last one). `BatchMode`:
    /// never a prompt, so a key that needs a passphrase is an error that
    /// says so. Host keys: those in your `~/.ssh/known_hosts` are checked
    /// strictly; a host found in neither file is recorded on first contact
    /// in gangway's `ssh/known_hosts_slurm`, then checked strictly too.
    pub fn ssh(&self, ssh_dir: &std::path::Path) -> std::process::Command {
        let _ = std::fs::create_dir_all(ssh_dir.join("ctl"));
        let mut c = std::process::Command::new("ssh");
        c.args(["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"])
            .args(["-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3"])
            .args(["-o", "ControlMaster=auto", "-o", "ControlPersist=60"])
            .args(["-o", "StrictHostKeyChecking=accept-new"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}/known_hosts_slurm %d/.ssh/known_hosts",
                ssh_dir.display()
            ))
            .arg("-o")
            .arg(format!("ControlPath={}/ctl/slurm-%C", ssh_dir.display()));
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &self.user {
            c.arg("-l").arg(u);
        }
        if let Some(k) = &self.key {
            c.arg("-o").arg("IdentitiesOnly=yes").arg("-i").arg(k);
        }
        if let Some(j) = &self.jump {
            c.arg("-J").arg(j);
        }
        c.arg(&self.host);
        c
    }
}

/// Quotes a word for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `prog args...` as one command for a remote POSIX shell, with `env` set
/// for it (`exec env K=V ... prog args`).
pub fn remote_command(prog: &str, args: &[String], env: &[(String, String)]) -> String {
    let mut s = String::from("exec env ");
    for (k, v) in env {
        s.push_str(&format!("{k}={} ", sh_quote(v)));
    }
    let words: Vec<String> = std::iter::once(prog)
        .chain(args.iter().map(String::as_str))
        .map(sh_quote)
        .collect();
    s.push_str(&words.join(" "));
    s
}

/// One Slurm cluster from `$GANGWAY_HOME/slurm.yaml`.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// The name `infra: slurm/<name>` uses.
    pub name: String,
    /// The login node, when Slurm's commands are not on this machine.
    pub login: Option<Login>,
    /// `SLURM_CONF` for its client commands, if not the system's.
    pub conf: Option<PathBuf>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--time` when the task does not say.
    pub time_limit: Option<String>,
    /// Where each node's home for gangway lives (workdir, checkpoints):
    /// `<work_dir>/<cluster>/<node>`.
    pub work_dir: String,
    /// How long a launch waits for a pending allocation.
    pub max_queue_wait: Duration,
    /// Partitions gangway may use, in preference order.
    pub partitions: Vec<Partition>,
}

/// Extra keys on every Slurm node (read by the Slurm transport).
pub mod keys {
    /// The allocation's job id.
    pub const JOB: &str = "slurm.job";
    /// The node's Slurm name (what `srun -w` takes).
    pub const NODE: &str = "slurm.node";
    /// `SLURM_CONF` for the cluster, if not the system's.
    pub const CONF: &str = "slurm.conf";
    /// The login node's host (absent: Slurm's commands run locally).
    pub const LOGIN_HOST: &str = "slurm.login.host";
    /// Its port.
    pub const LOGIN_PORT: &str = "slurm.login.port";
    /// Its user.
    pub const LOGIN_USER: &str = "slurm.login.user";
    /// The key for it.
    pub const LOGIN_KEY: &str = "slurm.login.key";
    /// The jump host to it.
    pub const LOGIN_JUMP: &str = "slurm.login.jump";
}

/// Says how a launch is going (a pending job's reason and wait).
pub type Progress = Box<dyn Fn(&str) + Send + Sync>;

/// The provider.
pub struct SlurmProvider {
    clusters: Vec<Cluster>,
    ssh_dir: PathBuf,
    poll: Duration,
    progress: Progress,
    owner: Option<String>,
}

/// What gangway puts in a job's `--comment`: the launching installation's
/// owner id.
const OWNER_COMMENT: &str = "gangway-owner=";

const NAME: &str = "slurm";

fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::new(kind, NAME, location, message)
}

/// The batch job that holds a cluster's allocation.
pub fn job_name(cluster: &ClusterName) -> String {
    format!("gangway-{}", cluster.0)
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

impl SlurmProvider {
    /// A provider for these clusters; progress goes to stderr. `ssh_dir`
    /// is gangway's (`$GANGWAY_HOME/ssh`: control sockets and known hosts
    /// of login nodes).
    pub fn new(clusters: Vec<Cluster>, ssh_dir: PathBuf) -> SlurmProvider {
        SlurmProvider {
            clusters,
            ssh_dir,
            poll: Duration::from_secs(2),
            progress: Box::new(|line| eprintln!("  {line}")),
            owner: None,
        }
    }

    /// The owner id of this gangway installation: jobs whose comment names
    /// another owner (another `$GANGWAY_HOME` of the same Unix user, with a
    /// cluster of the same name) are not this provider's to reuse,
    /// describe or cancel. Without it, every job of the name is.
    pub fn with_owner(mut self, owner: impl Into<String>) -> SlurmProvider {
        self.owner = Some(owner.into());
        self
    }

    /// Whether `job` (already known to be this user's and of the right
    /// name) is this installation's: its comment names our owner id, or no
    /// owner id at all (submitted by hand, or tagged with a user name by an
    /// earlier version).
    fn owns(&self, job: &Job) -> bool {
        let Some(me) = &self.owner else { return true };
        match job.comment.strip_prefix(OWNER_COMMENT) {
            Some(theirs) => theirs == me || !gangway_provider::is_owner_id(theirs),
            None => true,
        }
    }

    /// Where progress lines go.
    pub fn with_progress(mut self, progress: Progress) -> SlurmProvider {
        self.progress = progress;
        self
    }

    /// The longest pause between two looks at a pending job (they start
    /// at 100 ms and double: quick when Slurm is, light on slurmctld when
    /// the queue is long).
    pub fn with_poll(mut self, poll: Duration) -> SlurmProvider {
        self.poll = poll;
        self
    }

    fn cluster(&self, name: &str) -> Result<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| {
                err(
                    ErrorKind::InvalidRequest,
                    name,
                    format!(
                        "no Slurm cluster '{name}' in slurm.yaml (it has: {})",
                        self.clusters
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    }

    /// Runs one of Slurm's client commands for `c`; stdout, or an error
    /// with its stderr.
    async fn slurm(&self, c: &Cluster, prog: &str, args: &[String]) -> Result<String> {
        let mut cmd = match &c.login {
            None => {
                let mut cmd = tokio::process::Command::new(prog);
                cmd.args(args);
                if let Some(conf) = &c.conf {
                    cmd.env("SLURM_CONF", conf);
                }
                cmd
            }
            Some(login) => {
                let env: Vec<(String, String)> = c
                    .conf
                    .iter()
                    .map(|conf| ("SLURM_CONF".into(), conf.display().to_string()))
                    .collect();
                let remote = remote_command(prog, args, &env);
                let mut ssh = login.ssh(&self.ssh_dir);
                ssh.arg(remote);
                tokio::process::Command::from(ssh)
            }
        };
        cmd.stdin(std::process::Stdio::null());
        cmd.kill_on_drop(true);
        let out = match tokio::time::timeout(Duration::from_secs(60), cmd.output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(err(
                    ErrorKind::Fatal,
                    &c.name,
                    format!(
                        "`{prog}` is not installed here: Slurm's client commands must be on PATH"
                    ),
                ))
            }
            Ok(Err(e)) => return Err(err(ErrorKind::Fatal, &c.name, format!("{prog}: {e}"))),
            Err(_) => {
                return Err(err(
                    ErrorKind::Transient,
                    &c.name,
                    format!("{prog} did not answer within 60 s"),
                ))
            }
        };
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let words = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let (Some(login), Some(255)) = (&c.login, out.status.code()) {
            // ssh's own failure, not the command's.
            let kind = if words.contains("Permission denied") {
                ErrorKind::Auth
            } else if words.contains("Host key verification failed")
                || words.contains("IDENTIFICATION HAS CHANGED")
            {
                ErrorKind::Fatal
            } else {
                ErrorKind::Transient
            };
            let hint = if words.contains("Host key verification failed") {
                format!(
                    " (connect once with `ssh {}` to check and record its host key)",
                    login.host
                )
            } else {
                String::new()
            };
            return Err(err(
                kind,
                &c.name,
                format!(
                    "cannot reach the login node {} over ssh: {words}{hint}",
                    login.host
                ),
            ));
        }
        Err(err(classify(&words), &c.name, format!("{prog}: {words}")))
    }

    /// Every live job of ours with this name.
    async fn find(&self, c: &Cluster, name: &str) -> Result<Vec<Job>> {
        let me = uid();
        let jobs = self.jobs(c).await?;
        Ok(jobs
            .into_iter()
            .filter(|j| j.name == name && j.uid == me && self.owns(j))
            .collect())
    }

    /// Every job the controller knows: `squeue --json` where Slurm has it,
    /// else `scontrol -o show job`.
    async fn jobs(&self, c: &Cluster) -> Result<Vec<Job>> {
        // `--me`: Slurm 22.05 ignores filters with --json (and lists every
        // job), later versions honour them; ours are filtered here anyway.
        if let Ok(text) = self
            .slurm(c, "squeue", &["--me".into(), "--json".into()])
            .await
        {
            if let Ok(jobs) = parse::jobs_from_squeue_json(&text) {
                return Ok(jobs);
            }
        }
        let text = self
            .slurm(c, "scontrol", &["-o".into(), "show".into(), "job".into()])
            .await
            .or_else(|e| {
                // An empty queue reads "No jobs in the system".
                if e.message.contains("No jobs") {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            })?;
        Ok(parse::jobs_from_scontrol(&text))
    }

    async fn nodes_of(&self, c: &Cluster, job: &Job, partition: &str) -> Result<Vec<Node>> {
        let mut list = vec!["-o".to_string(), "show".into(), "node".into()];
        list.push(job.nodes.join(","));
        let addrs = parse::node_addresses(&self.slurm(c, "scontrol", &list).await?);
        let topo = self
            .slurm(c, "scontrol", &["show".into(), "topology".into()])
            .await
            .map(|t| parse::Topology::parse(&t))
            .unwrap_or_default();
        let home = match (&c.login, c.work_dir.strip_prefix("~/")) {
            (Some(_), Some(rest)) => {
                let remote = self.slurm(c, "printenv", &["HOME".into()]).await?;
                format!("{}/{rest}", remote.trim())
            }
            _ => expand_home(&c.work_dir),
        };
        Ok(job
            .nodes
            .iter()
            .map(|n| {
                let mut extra = BTreeMap::new();
                extra.insert(keys::JOB.into(), job.id.to_string());
                extra.insert(keys::NODE.into(), n.clone());
                if let Some(conf) = &c.conf {
                    extra.insert(keys::CONF.into(), conf.display().to_string());
                }
                if let Some(login) = &c.login {
                    login.to_extra(&mut extra);
                }
                extra.insert("home".into(), format!("{home}/{}/{n}", job.name));
                Node {
                    id: gangway_provider::InstanceId(format!("{}/{n}", job.id)),
                    state: node_state(job),
                    private_ip: addrs.get(n).cloned().unwrap_or_else(|| n.clone()),
                    public_ip: None,
                    placement: Placement {
                        cloud: NAME.into(),
                        region: c.name.clone(),
                        zone: partition.to_string(),
                    },
                    topology: topo.path(n),
                    extra,
                }
            })
            .collect())
    }

    async fn cancel(&self, c: &Cluster, ids: &[u64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let args: Vec<String> = ids.iter().map(u64::to_string).collect();
        match self.slurm(c, "scancel", &args).await {
            Ok(_) => Ok(()),
            // Already gone.
            Err(e) if e.message.contains("Invalid job id") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// `~/x` in this machine's home; a login node's work dir is left for its
/// shell (`$HOME`) to expand.
fn expand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(h)) => format!("{}/{rest}", h.to_string_lossy()),
        _ => p.to_string(),
    }
}

fn node_state(job: &Job) -> NodeState {
    match job.state.as_str() {
        "RUNNING" if job.restarts == 0 => NodeState::Running,
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" if job.restarts > 0 => {
            NodeState::Preempted {
                reason: format!(
                    "Slurm requeued job {} (node failure or preemption; now {}, {})",
                    job.id, job.state, job.reason
                ),
            }
        }
        "RUNNING" => NodeState::Preempted {
            reason: format!(
                "Slurm restarted job {} after a node failure or preemption",
                job.id
            ),
        },
        "PENDING" | "CONFIGURING" => NodeState::Pending,
        "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" => NodeState::Preempted {
            reason: format!("Slurm job {}: {} ({})", job.id, job.state, job.reason),
        },
        "SUSPENDED" | "STOPPED" => NodeState::Stopped,
        _ => NodeState::Terminated,
    }
}

/// What a Slurm command's error means to the failover loop.
pub fn classify(words: &str) -> ErrorKind {
    let w = words.to_ascii_lowercase();
    if w.contains("requested node configuration is not available")
        || w.contains("node count specification invalid")
        || w.contains("requested nodes are busy")
    {
        ErrorKind::Capacity
    } else if w.contains("qosmax")
        || w.contains("assocmax")
        || w.contains("job violates accounting/qos policy")
        || w.contains("qos") && (w.contains("limit") || w.contains("exceed"))
    {
        ErrorKind::Quota
    } else if w.contains("invalid account")
        || w.contains("invalid partition")
        || w.contains("invalid qos")
        || w.contains("invalid generic resource")
        || w.contains("invalid feature")
        || w.contains("time limit")
    {
        ErrorKind::InvalidRequest
    } else if w.contains("unable to contact slurm controller")
        || w.contains("socket timed out")
        || w.contains("connection refused")
        || w.contains("try again")
    {
        ErrorKind::Transient
    } else if w.contains("munge") || w.contains("authentication") || w.contains("access denied") {
        ErrorKind::Auth
    } else {
        ErrorKind::Fatal
    }
}

/// The keys a task may set under `config.slurm`.
pub const CONFIG_KEYS: &[&str] = &["account", "qos", "time", "max_queue_wait"];

/// What is wrong with a task's `config.slurm`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// It is not a mapping.
    #[error("config.slurm must be a mapping")]
    NotAMapping,
    /// A key that is not a setting.
    #[error("config.slurm.{key} is not a setting (known: {known})", known = CONFIG_KEYS.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A setting with a value of the wrong type or form.
    #[error("config.slurm.{key}: {value} is not a valid value")]
    BadValue {
        /// The setting.
        key: String,
        /// Its value, as JSON.
        value: serde_json::Value,
    },
}

/// Refuses unknown keys and wrong types in a task's `config.slurm`.
pub fn check_config(cfg: Option<&serde_json::Value>) -> std::result::Result<(), ConfigError> {
    let Some(cfg) = cfg else { return Ok(()) };
    let Some(map) = cfg.as_object() else {
        return Err(ConfigError::NotAMapping);
    };
    for (k, v) in map {
        if !CONFIG_KEYS.contains(&k.as_str()) {
            return Err(ConfigError::UnknownKey { key: k.clone() });
        }
        let ok = match k.as_str() {
            "max_queue_wait" => {
                v.as_u64().is_some() || v.as_str().and_then(parse_duration).is_some()
            }
            _ => v.is_string(),
        };
        if !ok {
            return Err(ConfigError::BadValue {
                key: k.clone(),
                value: v.clone(),
            });
        }
    }
    Ok(())
}

/// `config.slurm.max_queue_wait`: seconds (`600`) or `10m`, `2h`, `30s`.
pub use gangway_yaml::parse_duration;

/// The Slurm provider in the core's registry: there when
/// `$GANGWAY_HOME/slurm.yaml` lists clusters (a broken file is reported
/// where the catalog is loaded).
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: NAME,
    build: |s| {
        let file = clusters::load(s.home).ok()??;
        let slurm = SlurmProvider::new(file.clusters, s.ssh_dir());
        Some(std::sync::Arc::new(match s.owner {
            Some(owner) => slurm.with_owner(owner),
            None => slurm,
        }))
    },
    capacity: |home| Ok(clusters::load(home)?.map(|c| c.capacity())),
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for SlurmProvider {
    fn name(&self) -> &str {
        NAME
    }

    /// Commands on the nodes are job steps of the allocation, started
    /// with `srun` here or on the cluster's login node.
    fn transport(
        &self,
        home: &std::path::Path,
        _cluster: &str,
    ) -> Option<Box<dyn gangway_provider::Transport>> {
        Some(Box::new(SlurmTransport::new(home)))
    }

    async fn check(&self) -> Result<CheckReport> {
        let mut usable = Vec::new();
        let mut why = Vec::new();
        for c in &self.clusters {
            match self
                .slurm(c, "sinfo", &["-h".into(), "-o".into(), "%P".into()])
                .await
            {
                Ok(_) => usable.push(c.name.clone()),
                Err(e) => why.push(e.message),
            }
        }
        Ok(CheckReport {
            ok: !usable.is_empty(),
            identity: Some(format!("uid {}", uid())),
            regions: usable,
            hint: (!why.is_empty()).then(|| why.join("; ")),
        })
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let c = self.cluster(&req.placement.region)?;
        let loc = format!("{}/{}", c.name, req.placement.zone);
        let Some(part) = c.partitions.iter().find(|p| p.name == req.placement.zone) else {
            return Err(err(
                ErrorKind::InvalidRequest,
                &loc,
                format!(
                    "cluster {} has no partition '{}' in slurm.yaml",
                    c.name, req.placement.zone
                ),
            ));
        };
        if req.use_spot {
            return Err(err(
                ErrorKind::Capacity,
                &loc,
                "Slurm partitions have no spot market",
            ));
        }
        let name = job_name(&req.cluster);
        let cfg = req.provider_config.as_ref();
        check_config(cfg).map_err(|e| err(ErrorKind::InvalidRequest, &loc, e.to_string()))?;
        let max_wait = cfg
            .and_then(|v| v.get("max_queue_wait"))
            .and_then(|v| match v {
                serde_json::Value::Number(n) => n.as_u64().map(Duration::from_secs),
                serde_json::Value::String(s) => parse_duration(s),
                _ => None,
            })
            .unwrap_or(c.max_queue_wait);
        // Reconcile: a live allocation of the right shape is reused, any
        // other is cancelled first.
        let mut existing = self.find(c, &name).await?;
        existing.retain(|j| {
            j.state == "PENDING" && j.restarts == 0
                || j.state == "RUNNING" && j.restarts == 0 && j.nodes.len() == req.count as usize
        });
        let stale: Vec<u64> = self
            .find(c, &name)
            .await?
            .iter()
            .filter(|j| !existing.iter().any(|e| e.id == j.id))
            .map(|j| j.id)
            .collect();
        self.cancel(c, &stale).await?;
        let id = match existing.first() {
            Some(j) => j.id,
            None => {
                let mut args = vec![
                    "--parsable".to_string(),
                    format!("--job-name={name}"),
                    format!("--nodes={}", req.count),
                    "--ntasks-per-node=1".into(),
                    format!("--partition={}", part.name),
                    "--output=/dev/null".into(),
                    // Nothing of this process's environment is kept in
                    // Slurm's job record (the holder needs none of it).
                    "--export=NONE".into(),
                    format!(
                        "--comment={OWNER_COMMENT}{}",
                        self.owner.as_deref().unwrap_or(&req.owner)
                    ),
                ];
                if let Some((_, n)) = req.accelerator.as_ref().filter(|(_, n)| *n >= 1.0) {
                    let n = *n as u32;
                    match &part.gres_type {
                        Some(t) => args.push(format!("--gpus-per-node={t}:{n}")),
                        None => args.push(format!("--gpus-per-node={n}")),
                    }
                }
                if part.exclusive {
                    args.push("--exclusive".into());
                }
                if let Some(a) = cfg
                    .and_then(|v| v.get("account"))
                    .and_then(|v| v.as_str())
                    .or(c.account.as_deref())
                {
                    args.push(format!("--account={a}"));
                }
                if let Some(q) = cfg
                    .and_then(|v| v.get("qos"))
                    .and_then(|v| v.as_str())
                    .or(c.qos.as_deref())
                {
                    args.push(format!("--qos={q}"));
                }
                if let Some(t) = cfg
                    .and_then(|v| v.get("time"))
                    .and_then(|v| v.as_str())
                    .or(c.time_limit.as_deref())
                {
                    args.push(format!("--time={t}"));
                }
                // The batch script only holds the allocation.
                args.push("--wrap=exec sleep 2147483647".into());
                let out = self.slurm(c, "sbatch", &args).await.map_err(|mut e| {
                    e.location = loc.clone();
                    e
                })?;
                let id = out
                    .trim()
                    .split(';')
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        err(
                            ErrorKind::Fatal,
                            &loc,
                            format!("sbatch printed '{}', not a job id", out.trim()),
                        )
                    })?;
                (self.progress)(&format!("slurm {loc}: submitted job {id} ({name})"));
                id
            }
        };
        // Wait for the allocation, saying why it waits.
        let started = Instant::now();
        let mut said = String::new();
        let mut said_at = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let job = self
                .jobs(c)
                .await?
                .into_iter()
                .find(|j| j.id == id)
                .ok_or_else(|| {
                    err(
                        ErrorKind::Fatal,
                        &loc,
                        format!("job {id} vanished from the queue"),
                    )
                })?;
            match job.state.as_str() {
                "RUNNING" if job.nodes.len() == req.count as usize => {
                    return self.nodes_of(c, &job, &part.name).await;
                }
                "PENDING" | "CONFIGURING" | "RUNNING" => {}
                other => {
                    return Err(err(
                        ErrorKind::Capacity,
                        &loc,
                        format!("job {id} ended {other} ({}) before it ran", job.reason),
                    ))
                }
            }
            let waited = started.elapsed();
            if waited >= max_wait {
                self.cancel(c, &[id]).await?;
                return Err(err(
                    ErrorKind::Capacity,
                    &loc,
                    format!(
                        "job {id} still pending after {} s ({}); cancelled (config.slurm.max_queue_wait)",
                        waited.as_secs(),
                        job.reason
                    ),
                ));
            }
            let why = format!("{} ({})", job.state, job.reason);
            if why != said || said_at.elapsed() >= Duration::from_secs(30) {
                (self.progress)(&format!(
                    "slurm {loc}: job {id} {why}, waiting {} s of at most {} s",
                    waited.as_secs(),
                    max_wait.as_secs()
                ));
                said = why;
                said_at = Instant::now();
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.poll);
        }
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let name = job_name(cluster);
        let mut out = Vec::new();
        for c in &self.clusters {
            let me = uid();
            let jobs = self.jobs(c).await?;
            // The newest job of that name says how the cluster is.
            let Some(job) = jobs
                .iter()
                .filter(|j| j.name == name && j.uid == me && self.owns(j))
                .max_by_key(|j| (j.alive(), j.id))
            else {
                continue;
            };
            let partition = job.partition.clone();
            if job.nodes.is_empty() {
                out.push(Node {
                    id: gangway_provider::InstanceId(job.id.to_string()),
                    state: node_state(job),
                    private_ip: String::new(),
                    public_ip: None,
                    placement: Placement {
                        cloud: NAME.into(),
                        region: c.name.clone(),
                        zone: partition,
                    },
                    topology: Vec::new(),
                    extra: BTreeMap::new(),
                });
            } else {
                out.extend(self.nodes_of(c, job, &partition).await?);
            }
        }
        Ok(out)
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // A cluster is one allocation (salloc/sbatch): Slurm does not grow
        // a running allocation with nodes of the same job.
        Some("a Slurm allocation cannot grow in place")
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some("a Slurm allocation cannot be stopped and started again; use --down to release it")
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        Err(err(
            ErrorKind::InvalidRequest,
            &cluster.0,
            "a Slurm allocation cannot be stopped and started again; use `gangway down`",
        ))
    }

    async fn start(
        &self,
        cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        Err(err(
            ErrorKind::InvalidRequest,
            &cluster.0,
            "a Slurm allocation cannot be stopped and started again; launch it anew",
        ))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let name = job_name(cluster);
        for c in &self.clusters {
            let ids: Vec<u64> = self
                .find(c, &name)
                .await?
                .iter()
                .filter(|j| j.alive())
                .map(|j| j.id)
                .collect();
            self.cancel(c, &ids).await?;
            // Wait until Slurm no longer holds them (COMPLETING included).
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut pause = Duration::from_millis(50);
            loop {
                let left = self
                    .find(c, &name)
                    .await?
                    .into_iter()
                    .filter(|j| j.alive())
                    .count();
                if left == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(err(
                        ErrorKind::Transient,
                        &c.name,
                        format!("{left} job(s) named {name} still in the queue 60 s after scancel"),
                    ));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(self.poll);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_errors_steer_the_failover_loop() {
        let refused = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/slurm/sbatch-too-many-gpus.refused.txt"),
        )
        .unwrap();
        assert_eq!(classify(&refused), ErrorKind::Capacity);
        assert_eq!(
            classify("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"),
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            classify("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"),
            ErrorKind::Quota
        );
        assert_eq!(
            classify("squeue: error: Unable to contact slurm controller (connect failure)"),
            ErrorKind::Transient
        );
        assert_eq!(classify("something else"), ErrorKind::Fatal);
    }

    #[test]
    fn login_nodes_parse_and_words_are_quoted_for_their_shell() {
        let l = Login::parse("me@login1:2222").unwrap();
        assert_eq!(
            (l.host.as_str(), l.port, l.user.as_deref()),
            ("login1", Some(2222), Some("me"))
        );
        let l = Login::parse("hpc-login").unwrap();
        assert_eq!((l.port, l.user), (None, None));
        assert!(Login::parse("me@").is_none());
        assert!(Login::parse("a b").is_none());
        assert!(Login::parse("host:port").is_none());
        let mut extra = BTreeMap::new();
        let mut l = Login::parse("me@login1:2222").unwrap();
        l.jump = Some("bastion".into());
        l.to_extra(&mut extra);
        assert_eq!(Login::from_extra(&extra), Some(l));
        assert_eq!(sh_quote("--jobid=12"), "--jobid=12");
        assert_eq!(sh_quote("it's $HOME"), r"'it'\''s $HOME'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(
            remote_command(
                "srun",
                &["--jobid=3".into(), "echo $HOME".into()],
                &[("SLURM_CONF".into(), "/etc/my slurm.conf".into())]
            ),
            "exec env SLURM_CONF='/etc/my slurm.conf' srun --jobid=3 'echo $HOME'"
        );
    }

    #[test]
    fn task_settings_are_checked_by_name() {
        let ok = serde_json::json!({"account": "p", "max_queue_wait": "5m"});
        assert!(check_config(Some(&ok)).is_ok());
        assert!(check_config(Some(&serde_json::json!({"max_queue_wait": 30}))).is_ok());
        let typo = serde_json::json!({"acount": "p"});
        assert!(check_config(Some(&typo))
            .unwrap_err()
            .to_string()
            .contains("acount"));
        let bad = serde_json::json!({"max_queue_wait": "soon"});
        assert_eq!(
            check_config(Some(&bad)).unwrap_err().to_string(),
            "config.slurm.max_queue_wait: \"soon\" is not a valid value"
        );
    }

    #[test]
    fn another_installations_jobs_are_not_ours() {
        let p = SlurmProvider::new(Vec::new(), PathBuf::new()).with_owner("gw-00000000000000aa");
        let with = |comment: &str| Job {
            comment: comment.into(),
            ..job("RUNNING", 0)
        };
        assert!(p.owns(&with("gangway-owner=gw-00000000000000aa")));
        assert!(!p.owns(&with("gangway-owner=gw-00000000000000bb")));
        // A user name of an earlier version, a hand-made job: ours.
        assert!(p.owns(&with("gangway-owner=ubuntu")));
        assert!(p.owns(&with("")));
        let anyone = SlurmProvider::new(Vec::new(), PathBuf::new());
        assert!(anyone.owns(&with("gangway-owner=gw-00000000000000bb")));
    }

    fn job(state: &str, restarts: u32) -> Job {
        Job {
            id: 4,
            name: "gangway-x".into(),
            uid: 0,
            state: state.into(),
            reason: "BeginTime".into(),
            restarts,
            nodes: vec![],
            partition: "gpu".into(),
            comment: String::new(),
        }
    }

    #[test]
    fn requeued_and_failed_nodes_are_preemptions() {
        assert_eq!(node_state(&job("RUNNING", 0)), NodeState::Running);
        assert_eq!(node_state(&job("PENDING", 0)), NodeState::Pending);
        assert!(matches!(
            node_state(&job("PENDING", 1)),
            NodeState::Preempted { .. }
        ));
        assert!(matches!(
            node_state(&job("RUNNING", 1)),
            NodeState::Preempted { .. }
        ));
        assert!(matches!(
            node_state(&job("NODE_FAIL", 0)),
            NodeState::Preempted { .. }
        ));
        assert!(matches!(
            node_state(&job("PREEMPTED", 0)),
            NodeState::Preempted { .. }
        ));
        assert_eq!(node_state(&job("CANCELLED", 0)), NodeState::Terminated);
    }
}
