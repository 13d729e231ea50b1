//! The provider registry: every provider this build has, and the one
//! place in `src/` that names a provider crate.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gangway_provider::{Provider, Registration, Setup, StoreAccess};

use crate::core::catalog::Catalog;
use crate::core::spec::SpecError;
use crate::core::state::owner;

/// Every provider this build has, one line each: adding a provider is a
/// crate exporting its [`Registration`] and a line here.
const REGISTRY: &[Registration] = &[
    gangway_local::REGISTRATION,
    gangway_ssh::REGISTRATION,
    gangway_slurm::REGISTRATION,
    #[cfg(feature = "aws")]
    gangway_aws::REGISTRATION,
    #[cfg(feature = "gcp")]
    gangway_gcp::REGISTRATION,
    #[cfg(feature = "azure")]
    gangway_azure::REGISTRATION,
    #[cfg(feature = "kubernetes")]
    gangway_kubernetes::REGISTRATION,
    #[cfg(feature = "lambda")]
    gangway_lambda::REGISTRATION,
    #[cfg(feature = "runpod")]
    gangway_runpod::REGISTRATION,
    #[cfg(feature = "vast")]
    gangway_vast::REGISTRATION,
];

/// The names of every provider this build has, whether or not it can be
/// used here.
#[cfg(test)]
pub(crate) fn registered() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|r| r.name)
}

/// The providers whose machines may host the managed-job controller
/// (`jobs.controller: <name>`).
pub(crate) fn controller_hosts() -> impl Iterator<Item = &'static str> {
    REGISTRY
        .iter()
        .filter(|r| r.hosts_controller)
        .map(|r| r.name)
}

/// The provider that serves the bucket store `scheme` in this build, by
/// name, and what its crate does for the store.
pub(crate) fn store_access(scheme: &str) -> Option<(&'static str, &'static StoreAccess)> {
    REGISTRY
        .iter()
        .find_map(|r| Some((r.name, r.stores.iter().find(|s| s.scheme == scheme)?)))
}

/// Overlays what the providers' own configuration files offer (machines
/// in ssh pools, Slurm partitions) on `catalog`; a broken file is an
/// error naming its line.
pub(crate) fn offer_capacity(catalog: &mut Catalog, home: &Path) -> Result<(), SpecError> {
    for r in REGISTRY {
        if let Some(capacity) = (r.capacity)(home)? {
            catalog.overlay(Catalog::from_capacity(r.name, capacity));
        }
    }
    Ok(())
}

/// The providers this build can use (cheap to clone: each is shared).
#[derive(Clone)]
pub(crate) struct Providers {
    map: BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    /// Every provider, with state under `home`, tagging cloud resources
    /// with this installation's owner id ([`owner`]). If the id cannot be
    /// kept, the clouds are left out (with a warning) rather than tagged
    /// with an id no later sweep would know.
    pub(crate) fn new(home: &Path) -> Providers {
        match owner(home) {
            Ok(id) => Providers::build(home, home, Some(&id), true),
            Err(e) => {
                eprintln!(
                    "gangway: warning: {e}: without this installation's owner id the cloud providers are off"
                );
                Providers::build(home, home, None, false)
            }
        }
    }

    /// Every provider, the clouds acting for the installation whose owner
    /// id (or, for resources of earlier versions, user name) is `owner`:
    /// what `down --orphans --owner` adopts with. Another owner's clouds
    /// keep their records under `home/adopted/<owner>/`, apart from this
    /// installation's clusters of the same names.
    pub(crate) fn with_owner(home: &Path, owner: &str) -> Providers {
        if self::owner(home).is_ok_and(|id| id == owner) {
            return Providers::new(home);
        }
        let dir: String = owner
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Providers::build(home, &home.join("adopted").join(dir), Some(owner), false)
    }

    /// The providers; those that tag cloud resources (with an owner only)
    /// keep their records under `clouds`, and with `legacy` find clusters
    /// an earlier version recorded there by the user name it tagged them
    /// with.
    fn build(home: &Path, clouds: &Path, owner: Option<&str>, legacy: bool) -> Providers {
        // The readable name tagged next to the id (`gangway-user`).
        let user = ["USER", "LOGNAME"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| "unknown".into());
        let setup = Setup {
            home,
            records: clouds,
            owner,
            user: &user,
            legacy_owner: if legacy { user.as_str() } else { "" },
        };
        let map = REGISTRY
            .iter()
            .filter_map(|r| Some((r.name.to_string(), (r.build)(&setup)?)))
            .collect();
        Providers { map }
    }

    /// Every provider in this build, by name.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&str, &Arc<dyn Provider>)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The provider for `cloud`.
    pub(crate) fn get(&self, cloud: &str) -> Option<Arc<dyn Provider>> {
        self.map.get(cloud).cloned()
    }

    /// The transport for the nodes of `cloud` in `cluster`: the one its
    /// provider brings, else SSH (host keys verified strictly) with the
    /// provider's notice probe. `None` without such a provider.
    pub(crate) fn transport(
        &self,
        cloud: &str,
        home: &Path,
        cluster: &str,
    ) -> Option<Box<dyn crate::core::transport::Transport>> {
        let p = self.get(cloud)?;
        if let Some(t) = p.transport(home, cluster) {
            return Some(t);
        }
        crate::core::transport::ssh::SshTransport::new(home, cluster, false)
            .ok()
            .map(|t| Box::new(t.for_provider(p)) as Box<dyn crate::core::transport::Transport>)
    }
}
