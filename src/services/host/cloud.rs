//! A managed-job controller on a cloud VM that gangway provisions:
//! `jobs.controller: aws` (or `{cloud: gcp, region: R, instance_type: T,
//! remote_identity: NAME, idle_minutes: N}`).
//!
//! The VM is an ordinary gangway cluster with a reserved name
//! ([`CloudHost::cluster_name`]), launched through the same path as any
//! (`gangway launch --provision-only`: the optimizer picks the cheapest
//! on-demand CPU type that fits, the provider tags it with the cluster,
//! owner and user, and the task's `labels` mark it as the controller).
//! Once it is up it is used exactly as an SSH host ([`Hosted`]): its
//! address, user and key come from the cluster's record.
//!
//! It runs with its own identity (`remote_identity`: an instance profile
//! or service account), which the hosted gangway finds through its SDK's
//! default chain, and with which it stops itself after `idle_minutes`
//! without jobs ([`gangway_provider::Provider::stop_this_machine`]). The
//! next command here finds the master connection gone, asks the provider,
//! and starts the VM again (or provisions a new one when it was
//! terminated behind gangway's back, saying that its state is gone).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gangway_provider::{ClusterName, NodeState, SshEndpoint, CONTROLLER_LABEL};
use serde_json::{Map, Value};

use super::{Host, Hosted};
use crate::core::registry::Providers;
use crate::core::runtime::runtime;
use crate::core::state::{ClusterStatus, ManagedState, Store};
use crate::Error;

/// The hosted gangway's variable naming the provider it stops itself with.
pub(crate) const SELF_STOP_ENV: &str = "GANGWAY_CONTROLLER_SELF_STOP";
/// How long a VM just made or started may take to answer on SSH.
const SSH_WAIT: Duration = Duration::from_secs(300);

/// `jobs.controller` naming a cloud.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CloudHost {
    /// The provider (`aws`, `gcp`).
    pub(crate) cloud: String,
    /// Region; `None`: the optimizer's cheapest.
    pub(crate) region: Option<String>,
    /// Instance type; `None`: the cheapest with `cpus` and `memory`.
    pub(crate) instance_type: Option<String>,
    /// vCPUs (a task's `cpus:`, default `2+`).
    pub(crate) cpus: String,
    /// Memory in GB (a task's `memory:`, default `4+`).
    pub(crate) memory: String,
    /// Image (a task's `image_id:`); `None`: the provider's default.
    pub(crate) image_id: Option<String>,
    /// The instance profile / service account the VM runs as.
    pub(crate) remote_identity: Option<String>,
    /// Minutes without jobs before the VM stops itself (default 10).
    pub(crate) idle_minutes: f64,
    /// More of the provider's task config (`config.<cloud>` keys).
    pub(crate) config: Map<String, Value>,
}

/// Keys of the map form.
const KEYS: &[&str] = &[
    "cloud",
    "region",
    "instance_type",
    "cpus",
    "memory",
    "image_id",
    "remote_identity",
    "idle_minutes",
    "config",
];

/// Whether `word` names a provider whose machines can host the controller
/// (one that gives them an identity of their own and lets them stop
/// themselves: not `local`, which `jobs.controller: local` means this
/// machine for, nor SSH pools, Slurm or Kubernetes).
pub(crate) fn is_cloud(word: &str) -> bool {
    word != super::THIS_MACHINE && crate::core::registry::controller_hosts().any(|n| n == word)
}

/// The providers [`is_cloud`] accepts, for messages: `aws, gcp`.
pub(crate) fn clouds() -> String {
    crate::core::registry::controller_hosts()
        .collect::<Vec<_>>()
        .join(", ")
}

impl CloudHost {
    /// `jobs.controller: aws`: every default, no identity (refused when
    /// used, with what to create).
    pub(crate) fn from_word(cloud: &str) -> Result<CloudHost, Error> {
        Ok(CloudHost {
            cloud: cloud.to_string(),
            region: None,
            instance_type: None,
            cpus: "2+".into(),
            memory: "4+".into(),
            image_id: None,
            remote_identity: None,
            idle_minutes: 10.0,
            config: Map::new(),
        })
    }

    /// The map form; errors name `origin` and the key.
    pub(crate) fn from_map(m: &Map<String, Value>, origin: &str) -> Result<CloudHost, String> {
        for k in m.keys() {
            if !KEYS.contains(&k.as_str()) {
                return Err(format!(
                    "{origin}: unknown key '{k}' (a cloud host takes {})",
                    KEYS.join(", ")
                ));
            }
        }
        let text = |k: &str| -> Result<Option<String>, String> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
                Some(Value::Number(n)) => Ok(Some(n.to_string())),
                Some(v) => Err(format!("{origin}.{k}: {v} is not a word")),
            }
        };
        let cloud = text("cloud")?.unwrap_or_default();
        if !is_cloud(&cloud) {
            return Err(format!(
                "{origin}.cloud: '{cloud}' is not a cloud that can host the controller ({})",
                clouds()
            ));
        }
        let mut c = CloudHost::from_word(&cloud).map_err(|e| e.to_string())?;
        c.region = text("region")?;
        c.instance_type = text("instance_type")?;
        c.image_id = text("image_id")?;
        c.remote_identity = text("remote_identity")?;
        if let Some(v) = text("cpus")? {
            c.cpus = v;
        }
        if let Some(v) = text("memory")? {
            c.memory = v;
        }
        if let Some(v) = m.get("idle_minutes") {
            c.idle_minutes = v
                .as_f64()
                .filter(|n| *n > 0.0)
                .ok_or_else(|| format!("{origin}.idle_minutes: {v} is not a positive number"))?;
        }
        match m.get("config") {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => c.config = o.clone(),
            Some(v) => {
                return Err(format!(
                    "{origin}.config: {v} is not a map of config.{cloud} keys"
                ))
            }
        }
        if c.config.contains_key("remote_identity") {
            return Err(format!(
                "{origin}.config.remote_identity: write it as {origin}.remote_identity"
            ));
        }
        Ok(c)
    }

    /// The cluster's reserved name: `gangway-controller-<cloud>[-<region>]`.
    /// Derived from the configuration alone, so any `$GANGWAY_HOME` with the
    /// same configuration and owner id names the same VM (a relaunch of the
    /// name finds it by its tags rather than making another).
    pub(crate) fn cluster_name(&self) -> String {
        match &self.region {
            Some(r) => format!("{CONTROLLER_LABEL}-{}-{r}", self.cloud),
            None => format!("{CONTROLLER_LABEL}-{}", self.cloud),
        }
    }

    /// The task the VM is launched from.
    fn task_yaml(&self, identity: &str) -> String {
        let q = |s: &str| serde_json::to_string(s).expect("a string");
        let mut r = format!(
            "name: {CONTROLLER_LABEL}\nresources:\n  infra: {}\n  cpus: {}\n  memory: {}\n  use_spot: false\n",
            q(&match &self.region {
                Some(r) => format!("{}/{r}", self.cloud),
                None => self.cloud.clone(),
            }),
            q(&self.cpus),
            q(&self.memory),
        );
        if let Some(t) = &self.instance_type {
            r.push_str(&format!("  instance_type: {}\n", q(t)));
        }
        if let Some(i) = &self.image_id {
            r.push_str(&format!("  image_id: {}\n", q(i)));
        }
        r.push_str(&format!("  labels:\n    {CONTROLLER_LABEL}: \"true\"\n"));
        let mut config = self.config.clone();
        config.insert("remote_identity".into(), Value::String(identity.into()));
        // JSON is YAML: the user's keys go through as they were written.
        r.push_str(&format!(
            "config:\n  {}: {}\nrun: \"true\"\n",
            self.cloud,
            Value::Object(config)
        ));
        r
    }

    /// What the hosted gangway runs with: the idle time, how it stops
    /// itself, and where its provider acts (never credentials).
    fn remote_env(&self, home: &Path) -> Vec<(String, String)> {
        let mut env = Providers::new(home)
            .get(&self.cloud)
            .map(|p| p.host_env())
            .unwrap_or_default();
        env.extend([
            (
                "GANGWAY_CONTROLLER_IDLE_SECONDS".into(),
                ((self.idle_minutes * 60.0).round().max(1.0) as u64).to_string(),
            ),
            (SELF_STOP_ENV.into(), self.cloud.clone()),
        ]);
        env
    }
}

/// The refusal when no identity is named: what to create, and where to
/// name it. Nothing is provisioned.
fn no_identity(c: &CloudHost) -> Error {
    Error::usage(
        format!(
            "jobs.controller: {} needs remote_identity: the identity the controller host runs as \
             (an AWS instance profile, a GCP service account email); gangway never copies this \
             machine's keys to it",
            c.cloud
        ),
        Some(&format!(
            "create one with the permissions listed in docs/managed-jobs.md (\"The cloud host's \
             identity\": launch, describe, stop, start and terminate instances, pass the role to the \
             jobs' nodes if they have one, and nothing else), then write in config.yaml \
             jobs: {{controller: {{cloud: {}, remote_identity: NAME}}}}",
            c.cloud
        )),
    )
}

/// Set for the `gangway launch` of the controller host: the one launch
/// that may take a `gangway-controller...` name.
const LAUNCHING_ENV: &str = "GANGWAY_LAUNCHING_CONTROLLER_HOST";

/// Whether this process launches the controller host (see [`LAUNCHING_ENV`]).
pub(crate) fn launching_controller() -> bool {
    std::env::var_os(LAUNCHING_ENV).is_some()
}

/// Runs this gangway with `args` (same `$GANGWAY_HOME`), its output on
/// our stderr (the command's own stdout is the host's answer).
fn run_self(args: &[&str]) -> Result<i32, Error> {
    let err = std::io::stderr().as_fd().try_clone_to_owned()?;
    let status = Command::new(std::env::current_exe()?)
        .env(LAUNCHING_ENV, "1")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(err))
        .status()?;
    Ok(status.code().unwrap_or(128 + 2))
}

/// What the provider says of the host's VM.
enum Seen {
    Running,
    Stopped,
    Pending,
    Gone,
}

fn provider(
    home: &Path,
    cloud: &str,
) -> Result<std::sync::Arc<dyn gangway_provider::Provider>, Error> {
    Providers::new(home).get(cloud).ok_or_else(|| {
        Error::usage(
            format!("this gangway has no provider '{cloud}' for the controller host"),
            None,
        )
    })
}

fn describe(home: &Path, cloud: &str, name: &str) -> Result<Seen, Error> {
    let p = provider(home, cloud)?;
    let nodes = runtime()?.block_on(p.describe(&ClusterName(name.to_string())))?;
    let live: Vec<&NodeState> = nodes
        .iter()
        .map(|n| &n.state)
        .filter(|s| !matches!(s, NodeState::Terminated | NodeState::Preempted { .. }))
        .collect();
    Ok(if live.is_empty() {
        Seen::Gone
    } else if live.iter().all(|s| matches!(s, NodeState::Running)) {
        Seen::Running
    } else if live.iter().any(|s| matches!(s, NodeState::Stopped)) {
        Seen::Stopped
    } else {
        Seen::Pending
    })
}

/// The host as the cluster's record has it: its head's SSH endpoint,
/// gangway's own key unless the provider recorded another.
fn hosted_of(home: &Path, c: &CloudHost, store: &Store, name: &str) -> Result<Hosted, Error> {
    Ok(host_of_record(home, store, name, c.remote_env(home))?.reached_by(home, c))
}

/// Where this machine keeps the controller host `name`'s SSH host keys,
/// under the name `name` (ssh's `HostKeyAlias`: the VM's address changes
/// at every start, its keys do not).
fn known_hosts(home: &Path, name: &str) -> PathBuf {
    home.join("ssh").join(format!("known_hosts_{name}"))
}

/// Whether `known` holds a key of `name`.
fn has_keys(known: &Path, name: &str) -> bool {
    std::fs::read_to_string(known)
        .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().next() == Some(name)))
}

/// Writes `path` whole (through a new file renamed over it), readable by
/// its owner only.
fn write_owner_only(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("new-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Pins the controller host `name`'s SSH host keys before this machine
/// first connects to it (the host gets every job's secrets): the keys its
/// provider published for the VM (EC2's console output, GCE's guest
/// attributes), waited for while the VM boots. Where the provider
/// publishes none (or none came within `limit`, or it could not be
/// asked), the key the host offers at first contact is kept instead, with
/// a warning; either way no other key is accepted for it afterwards.
fn pin_host_keys(home: &Path, cloud: &str, name: &str, limit: Duration) -> Result<(), Error> {
    let known = known_hosts(home, name);
    if has_keys(&known, name) {
        return Ok(());
    }
    let p = provider(home, cloud)?;
    let rt = runtime()?;
    let cluster = ClusterName(name.to_string());
    let deadline = std::time::Instant::now() + limit;
    let why = loop {
        let nodes = rt.block_on(p.describe(&cluster))?;
        if let Some(head) = nodes.iter().find(|n| n.state == NodeState::Running) {
            match rt.block_on(p.host_keys(head)) {
                Ok(None) => break format!("{cloud} publishes no SSH host keys"),
                Ok(Some(keys)) if !keys.is_empty() => {
                    let text: String = keys.iter().map(|k| format!("{name} {k}\n")).collect();
                    write_owner_only(&known, text.as_bytes())?;
                    return Ok(());
                }
                Ok(Some(_)) => {}
                Err(e) => break format!("asking {cloud} for its SSH host keys failed: {e}"),
            }
        }
        if std::time::Instant::now() >= deadline {
            break format!(
                "{cloud} published no SSH host keys of it within {} s of its start",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    eprintln!(
        "gangway: WARNING: {why}: the controller host '{name}' is trusted by the key it offers at \
         first contact (kept in {}), and only by that key after",
        known.display()
    );
    Ok(())
}

/// The host of a controller cluster's record, as an SSH host whose
/// commands get `env`.
fn host_of_record(
    home: &Path,
    store: &Store,
    name: &str,
    env: Vec<(String, String)>,
) -> Result<Hosted, Error> {
    let nodes = store.nodes(name)?;
    let head = nodes.iter().min_by_key(|n| n.rank).ok_or_else(|| {
        Error::usage(
            format!("the controller host's cluster '{name}' has no nodes on record"),
            Some(&format!("`gangway down {name}` and run the command again")),
        )
    })?;
    let e = SshEndpoint::of(head);
    let host = Host {
        host: e.host,
        user: (!e.user.is_empty()).then_some(e.user),
        port: Some(e.port),
        identity_file: Some(e.key.unwrap_or_else(|| home.join("ssh").join("id_ed25519"))),
        binary: None,
    };
    Ok(Hosted::new(home, host)?.for_cluster(name, known_hosts(home, name), env))
}

/// The managed jobs not finished on the controller host `name` (a
/// cluster of this machine's): 0 when it is not up (a host stops itself
/// only without jobs).
pub(crate) fn unfinished_jobs(home: &Path, store: &Store, name: &str) -> Result<usize, Error> {
    let Some(row) = store.cluster(name)? else {
        return Ok(0);
    };
    if row.status != ClusterStatus::Up {
        return Ok(0);
    }
    let hosted = host_of_record(home, store, name, Vec::new())?;
    if !hosted.master_alive() {
        let cloud = row.cloud.clone().unwrap_or_default();
        if !matches!(describe(home, &cloud, name)?, Seen::Running) {
            return Ok(0);
        }
    }
    let args: Vec<String> = ["jobs", "queue", "-o", "json"].map(String::from).into();
    let (code, answer) = hosted.output(&args, super::Input::Nothing)?;
    let v: Value = serde_json::from_slice(&answer).unwrap_or_default();
    if code != 0 || !v["jobs"].is_array() {
        return Err(Error::usage(
            format!("the controller host '{name}' did not list its jobs (exit {code})"),
            Some("pass --yes to remove it anyway"),
        ));
    }
    let ended = |j: &Value| {
        j["state"]
            .as_str()
            .and_then(ManagedState::parse)
            .is_some_and(ManagedState::is_terminal)
    };
    Ok(v["jobs"]
        .as_array()
        .map(|l| l.iter().filter(|j| !ended(j)).count())
        .unwrap_or(0))
}

/// Cancels every job on the controller host `name` and waits (two
/// minutes at most) until they have ended and their clusters are down.
pub(crate) fn cancel_all(home: &Path, store: &Store, name: &str) -> Result<(), Error> {
    let hosted = host_of_record(home, store, name, Vec::new())?;
    let args: Vec<String> = ["jobs", "cancel", "--all"].map(String::from).into();
    hosted.output(&args, super::Input::Nothing)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while unfinished_jobs(home, store, name)? > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// The controller's cloud host, up and reachable: provisioned when there
/// is none, started when it stopped itself, provisioned again (with a
/// note that its jobs and ledger are gone) when it was terminated.
/// Costs nothing but a local check while this machine's master
/// connection to it is open; one provider call otherwise.
pub(crate) fn reach(home: &Path, c: &CloudHost) -> Result<Hosted, Error> {
    let Some(identity) = c.remote_identity.clone() else {
        return Err(no_identity(c));
    };
    let name = c.cluster_name();
    let store = Store::open(home)?;
    let known = known_hosts(home, &name);
    for _ in 0..6 {
        let row = store.cluster(&name)?;
        match row.as_ref().map(|r| r.status) {
            Some(ClusterStatus::Up) => {
                let hosted = hosted_of(home, c, &store, &name)?;
                if hosted.master_alive() {
                    return Ok(hosted);
                }
                match describe(home, &c.cloud, &name)? {
                    Seen::Running => {
                        pin_host_keys(home, &c.cloud, &name, SSH_WAIT)?;
                        hosted.wait_reachable(SSH_WAIT)?;
                        return Ok(hosted);
                    }
                    Seen::Pending => std::thread::sleep(Duration::from_secs(2)),
                    Seen::Stopped => {
                        eprintln!(
                            "gangway: the controller host '{name}' is stopped (idle); starting it"
                        );
                        // The record says UP: it stopped itself.
                        store.set_status(&name, ClusterStatus::Stopped, None)?;
                        start(&name)?;
                    }
                    Seen::Gone => {
                        eprintln!(
                            "gangway: the controller host '{name}' is gone (terminated outside \
                             gangway): its jobs, logs and ledger went with it; provisioning a new one"
                        );
                        down(&name)?;
                    }
                }
            }
            Some(ClusterStatus::Stopped) => {
                eprintln!("gangway: the controller host '{name}' is stopped; starting it");
                start(&name)?;
            }
            Some(_) if store.cluster_locked(&name) => {
                return Err(Error::usage(
                    format!("the controller host '{name}' is being launched or torn down by another gangway"),
                    Some("run the command again when it is done"),
                ));
            }
            Some(_) => down(&name)?,
            None => {
                let dir = home.join("controller");
                std::fs::create_dir_all(&dir)?;
                let task = dir.join(format!("{name}.yaml"));
                std::fs::write(&task, c.task_yaml(&identity))?;
                let _ = std::fs::remove_file(&known);
                eprintln!(
                    "gangway: provisioning the managed-job controller host '{name}' on {} (on-demand, runs as {identity})",
                    c.cloud
                );
                let task = task.display().to_string();
                let code = run_self(&["launch", "--provision-only", "-y", "-c", &name, &task])?;
                if code != 0 {
                    return Err(Error::usage(
                        format!("provisioning the controller host '{name}' failed (exit {code})"),
                        Some("the lines above say why; nothing of it is left unless they say so"),
                    ));
                }
                let hosted = hosted_of(home, c, &store, &name)?;
                pin_host_keys(home, &c.cloud, &name, SSH_WAIT)?;
                hosted.wait_reachable(SSH_WAIT)?;
                return Ok(hosted);
            }
        }
    }
    Err(Error::usage(
        format!("the controller host '{name}' did not come up"),
        Some(&format!("see `gangway status {name} --refresh`")),
    ))
}

fn start(name: &str) -> Result<(), Error> {
    match run_self(&["start", name])? {
        0 => Ok(()),
        code => Err(Error::usage(
            format!("starting the controller host '{name}' failed (exit {code})"),
            Some("the lines above say why"),
        )),
    }
}

fn down(name: &str) -> Result<(), Error> {
    match run_self(&["down", "-y", name])? {
        0 => Ok(()),
        code => Err(Error::usage(
            format!("removing what is left of the controller host '{name}' failed (exit {code})"),
            Some("the lines above say why"),
        )),
    }
}

/// Whether `name` is a controller host's cluster.
pub(crate) fn is_controller(name: &str) -> bool {
    name.starts_with(CONTROLLER_LABEL)
}

// The words name clouds this build must have.
#[cfg(all(test, feature = "aws", feature = "gcp"))]
mod tests {
    use super::*;

    #[test]
    fn a_cloud_host_is_read_from_the_word_or_the_map() {
        let c = CloudHost::from_word("aws").unwrap();
        assert_eq!(c.cluster_name(), "gangway-controller-aws");
        assert_eq!((c.idle_minutes, c.remote_identity), (10.0, None));
        let m: Map<String, Value> = serde_json::from_str(
            r#"{"cloud": "gcp", "region": "us-central1", "remote_identity": "ctl@p.iam.gserviceaccount.com",
                "idle_minutes": 0.5, "config": {"project_id": "p"}}"#,
        )
        .unwrap();
        let c = CloudHost::from_map(&m, "jobs.controller").unwrap();
        assert_eq!(c.cluster_name(), "gangway-controller-gcp-us-central1");
        let home = tempfile::tempdir().unwrap();
        let env = c.remote_env(home.path());
        assert!(
            env.contains(&("GANGWAY_CONTROLLER_IDLE_SECONDS".into(), "30".into())),
            "{env:?}"
        );
        let t = c.task_yaml("ctl@p.iam.gserviceaccount.com");
        assert!(t.contains("infra: \"gcp/us-central1\""), "{t}");
        assert!(
            t.contains("use_spot: false") && t.contains("gangway-controller: \"true\""),
            "{t}"
        );
        assert!(
            t.contains(r#""remote_identity":"ctl@p.iam.gserviceaccount.com""#),
            "{t}"
        );
        let bad: Map<String, Value> =
            serde_json::from_str(r#"{"cloud": "aws", "idle": 3}"#).unwrap();
        let e = CloudHost::from_map(&bad, "jobs.controller").unwrap_err();
        assert!(e.contains("'idle'"), "{e}");
        let bad: Map<String, Value> = serde_json::from_str(r#"{"cloud": "nimbus"}"#).unwrap();
        assert!(CloudHost::from_map(&bad, "x").is_err());
        assert!(!is_cloud("local") && is_cloud("aws"));
        // Machines that cannot stop themselves or carry an identity of
        // their own are no cloud host, and the message says which are.
        for word in ["ssh", "slurm", "kubernetes"] {
            assert!(!is_cloud(word), "{word}");
            let m: Map<String, Value> =
                serde_json::from_str(&format!(r#"{{"cloud": "{word}"}}"#)).unwrap();
            let e = CloudHost::from_map(&m, "jobs.controller").unwrap_err();
            assert!(
                e.contains("can host the controller (") && e.contains("aws"),
                "{e}"
            );
        }
    }
}
