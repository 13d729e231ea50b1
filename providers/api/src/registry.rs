//! How a provider is built and what its own configuration offers the
//! catalog: one [`Registration`] per provider crate, listed once by the
//! core.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Provider;

/// vCPUs assumed for a machine whose configuration does not say.
pub const DEFAULT_CPUS: f32 = 8.0;
/// Memory (GiB) assumed for a machine whose configuration does not say.
pub const DEFAULT_MEMORY_GIB: f32 = 32.0;

/// One kind of node a provider's configuration lists, offered on demand at
/// a fixed price: the catalog row of machines you already have.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    /// Instance type (the provider's own name for the shape).
    pub instance_type: String,
    /// GPU name, if any.
    pub accelerator: Option<String>,
    /// GPUs per node.
    pub accelerator_count: f32,
    /// vCPUs per node.
    pub vcpus: f32,
    /// Memory per node, GiB.
    pub memory_gib: f32,
    /// Region (a pool, a Slurm cluster).
    pub region: String,
    /// Zone (a rack, a partition).
    pub zone: String,
    /// USD per node-hour (0 for machines already paid for).
    pub price: f64,
}

/// What a provider's configuration file offers the catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Capacity {
    /// The file it was read from (the catalog names it as the source).
    pub origin: String,
    /// The offers, in file order.
    pub offers: Vec<Offer>,
    /// Offered only to tasks that name the provider in `infra:`, never
    /// picked for being cheapest: machines found without the user's say
    /// (a kubeconfig's clusters, which may be someone else's), as opposed
    /// to those a gangway configuration file lists.
    pub only_when_named: bool,
}

/// What every provider is built from.
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    /// `$GANGWAY_HOME`: configuration files, local state, gangway's key.
    pub home: &'a Path,
    /// Where providers that tag cloud resources keep their records:
    /// `home`, or `home/adopted/<owner>` when acting for another owner.
    pub records: &'a Path,
    /// The owner id (or an earlier version's user name) resources are
    /// tagged with; `None` when it cannot be kept, and providers that tag
    /// resources then stay off rather than tag with an id no later sweep
    /// would know.
    pub owner: Option<&'a str>,
    /// The launching user's readable name, tagged next to the owner.
    pub user: &'a str,
    /// A user name earlier versions tagged with, whose clusters are still
    /// found by it; empty: none.
    pub legacy_owner: &'a str,
}

impl Setup<'_> {
    /// gangway's ssh directory (`home/ssh`): its key pair, known hosts and
    /// control sockets.
    pub fn ssh_dir(&self) -> PathBuf {
        self.home.join("ssh")
    }

    /// The public half of gangway's key, which clouds install on nodes.
    pub fn public_key(&self) -> PathBuf {
        self.ssh_dir().join("id_ed25519.pub")
    }
}

/// Why a provider's configuration file was refused: located, like a task
/// file's errors.
pub type ConfigError = gangway_yaml::LocatedError;

/// A provider as the core's registry lists it: adding a provider is a new
/// crate exporting one of these, and one line in the registry.
#[derive(Clone, Copy, Debug)]
pub struct Registration {
    /// The name tasks use in `infra:`, and the catalog's cloud.
    pub name: &'static str,
    /// Builds the provider; `None` when it cannot be used at all here (no
    /// configuration file lists machines, no owner id to tag with). A
    /// broken configuration file is `None` here and an error from
    /// `capacity`, where the catalog is loaded.
    pub build: fn(&Setup<'_>) -> Option<Arc<dyn Provider>>,
    /// What the provider's configuration under `home` offers the catalog;
    /// `Ok(None)` for providers whose offers come from the shipped
    /// catalogs, or without such a file.
    pub capacity: fn(home: &Path) -> Result<Option<Capacity>, ConfigError>,
    /// Whether `jobs.controller: <name>` may put the managed-job controller
    /// on a machine of this provider's that gangway provisions: it attaches
    /// an identity of its own to the machine and implements
    /// [`crate::Provider::stop_this_machine`].
    pub hosts_controller: bool,
    /// The bucket stores this provider's cloud serves, and what its crate
    /// does for them: the core reaches a store's credentials only here.
    pub stores: &'static [StoreAccess],
}

/// What [`StoreAccess`]'s functions return: a future for the keys, or
/// why there are none.
pub type StoreFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<StoreKeys, String>> + Send + 'a>>;

/// Keys for a bucket store, as a bucket client or a node's rclone takes
/// them. `Debug` shows the key id only.
#[derive(Clone)]
pub struct StoreKeys {
    /// The access key id.
    pub key_id: String,
    /// The secret key.
    pub secret: String,
    /// The session token: set for temporary keys.
    pub token: Option<String>,
    /// When temporary keys expire, where the issuer says.
    pub expires: Option<std::time::SystemTime>,
}

impl std::fmt::Debug for StoreKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreKeys")
            .field("key_id", &self.key_id)
            .field("secret", &"<redacted>")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("expires", &self.expires)
            .finish()
    }
}

/// Mints keys for nodes: `(bucket, prefix, role)`.
pub type NodeKeysFn = for<'a> fn(&'a str, &'a str, Option<&'a str>) -> StoreFuture<'a>;

/// What a provider crate does for one bucket store (a URL scheme) of its
/// cloud. A function left `None` falls back to what the store client
/// reads from the environment by itself.
pub struct StoreAccess {
    /// The store's URL scheme (`s3`, `gs`).
    pub scheme: &'static str,
    /// The user's own keys for the store, from the cloud's usual chain.
    pub user_keys: Option<fn() -> StoreFuture<'static>>,
    /// Keys fit to leave this machine for nodes, narrowed to a bucket and
    /// a prefix; the last argument is a role the user configured for
    /// nodes to assume.
    pub node_keys: Option<NodeKeysFn>,
    /// The project (or account) new buckets are made in.
    pub project: Option<fn() -> Option<String>>,
}

impl std::fmt::Debug for StoreAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreAccess")
            .field("scheme", &self.scheme)
            .field("user_keys", &self.user_keys.is_some())
            .field("node_keys", &self.node_keys.is_some())
            .field("project", &self.project.is_some())
            .finish()
    }
}

/// For [`Registration::capacity`]: nothing beyond the shipped catalogs.
pub fn no_capacity(_home: &Path) -> Result<Option<Capacity>, ConfigError> {
    Ok(None)
}
