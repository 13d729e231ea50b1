//! What every harness writes the same way: its launch requests, and the
//! failures it sets up for the next launch and takes back after it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use gangway_provider::{ClusterName, LaunchRequest, Placement};

/// `cloud/region/zone`.
pub fn placement(cloud: &str, region: &str, zone: &str) -> Placement {
    Placement {
        cloud: cloud.into(),
        region: region.into(),
        zone: zone.into(),
    }
}

/// Writes `dir/id.pub`, an OpenSSH ed25519 public key line no machine is
/// ever reached with (for providers that put a key on what they make but
/// are never logged into here), and returns its path.
pub fn public_key(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("the key's directory");
    let key = dir.join("id.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests gangway\n",
    )
    .expect("write the public key");
    key
}

/// The suite's request for `count` nodes of `cluster` with `client_token`
/// (what [`Harness::request`](super::Harness::request) is given), by
/// `owner`, of `instance_type` at `placement`: on demand, with no
/// accelerator, disk size, image, provider options, network tier, price
/// cap, ports or labels. A harness sets on top what its provider needs:
///
/// ```ignore
/// LaunchRequest {
///     disk_size_gib: Some(50),
///     ..contract::request(cluster, count, client_token, &self.owner,
///         contract::placement("aws", "us-east-1", "us-east-1c"), "m5.xlarge")
/// }
/// ```
pub fn request(
    cluster: &ClusterName,
    count: u32,
    client_token: &str,
    owner: &str,
    placement: Placement,
    instance_type: impl Into<String>,
) -> LaunchRequest {
    LaunchRequest {
        cluster: cluster.clone(),
        owner: owner.into(),
        placement,
        instance_type: instance_type.into(),
        count,
        use_spot: false,
        accelerator: None,
        disk_size_gib: None,
        image_id: None,
        client_token: client_token.into(),
        provider_config: None,
        network_tier: None,
        max_price: None,
        ports: Vec::new(),
        labels: Default::default(),
    }
}

/// What the next request asks for instead of the harness's usual (where a
/// failure is a request the provider refuses: a shape no node has, a
/// partition that does not exist): set by
/// [`Harness::fail_with`](super::Harness::fail_with), taken by the next
/// [`Harness::request`](super::Harness::request), dropped by
/// [`Harness::clear_failures`](super::Harness::clear_failures) when no
/// request took it.
pub struct Next<T>(Mutex<Option<T>>);

impl<T> Default for Next<T> {
    fn default() -> Self {
        Next(Mutex::new(None))
    }
}

impl<T> Next<T> {
    /// The next request asks for `value`.
    pub fn set(&self, value: T) {
        *self.0.lock().unwrap() = Some(value);
    }

    /// What the next request asks for, if it is set; unset after.
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap().take()
    }
}

/// Something a harness did to its place to make launches fail (nodes
/// cordoned or drained, a quota put on) that
/// [`Harness::clear_failures`](super::Harness::clear_failures) undoes:
/// raised when done, taken (and lowered) when undone.
#[derive(Default)]
pub struct Flag(AtomicBool);

impl Flag {
    /// It is done.
    pub fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether it was done, lowering it: true once per [`Flag::raise`].
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}
