//! One context for the CLI, the job driver and the managed-job controller:
//! the state store, the providers and the catalog, each built one way, so
//! that what one of them plans with is what the others would.

use std::path::{Path, PathBuf};

use crate::core::catalog::Catalog;
use crate::core::registry::Providers;
use crate::core::state::{StateError, Store};
use crate::Error;

/// The catalog, with every overlay in one order: what shipped inside the
/// binary, then what `gangway catalog refresh` saved under
/// `$GANGWAY_HOME/catalog`, then a `--catalog DIR` (or
/// `GANGWAY_CATALOG_DIR`), then the machines the user already has (SSH
/// pools, Slurm clusters), offered at no cost. Each overlay replaces only
/// the clouds it holds. Catalog files are parsed once per content: their
/// parse is cached under `$GANGWAY_HOME/cache/catalog`.
/// Where `catalog refresh` writes the interruption buckets a provider
/// publishes, one `<cloud>.csv` each, under `$GANGWAY_HOME`.
pub(crate) const INTERRUPTIONS_DIR: &str = "interruptions";

pub(crate) fn load_catalog(home: Option<&Path>, dir: Option<&Path>) -> Result<Catalog, Error> {
    let mut c = Catalog::embedded();
    let cache = home.map(|h| h.join("cache").join("catalog"));
    if let Some(home) = home {
        let refreshed = home.join("catalog");
        if refreshed.is_dir() {
            c.overlay_dir(&refreshed, cache.as_deref())?;
        }
    }
    if let Some(dir) = dir {
        c.overlay_dir(dir, cache.as_deref())?;
    }
    if let Some(home) = home {
        crate::core::registry::offer_capacity(&mut c, home)?;
        // Interruption buckets a `catalog refresh` fetched.
        c.overlay_interruptions(&home.join(INTERRUPTIONS_DIR));
    }
    Ok(c)
}

/// What a command works with, for one `$GANGWAY_HOME`: its state store and
/// providers. The catalog is [`load_catalog`]'s, with the caller's
/// `--catalog` (the controller keeps one per job's directory).
pub(crate) struct Context {
    home: PathBuf,
    store: Store,
    providers: Providers,
}

impl Context {
    /// Opens the state under `home` and builds the providers.
    pub(crate) fn open(home: &Path) -> Result<Context, StateError> {
        Ok(Context {
            home: home.to_path_buf(),
            store: Store::open(home)?,
            providers: Providers::new(home),
        })
    }

    /// `$GANGWAY_HOME`.
    pub(crate) fn home(&self) -> &Path {
        &self.home
    }

    /// The state store.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Every provider of this build.
    pub(crate) fn providers(&self) -> &Providers {
        &self.providers
    }
}
