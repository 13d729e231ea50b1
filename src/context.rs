//! One context for the CLI, the job driver and the managed-job controller:
//! the state store, the providers and the catalog, each built one way, so
//! that what one of them plans with is what the others would.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use crate::catalog::Catalog;
use crate::provision::Providers;
use crate::state::{StateError, Store};
use crate::Error;

/// The catalog, with every overlay in one order: what shipped inside the
/// binary, then what `gangway catalog refresh` saved under
/// `$GANGWAY_HOME/catalog`, then a `--catalog DIR` (or
/// `GANGWAY_CATALOG_DIR`), then the machines the user already has (SSH
/// pools, Slurm clusters), offered at no cost. Each overlay replaces only
/// the clouds it holds.
pub fn load_catalog(home: Option<&Path>, dir: Option<&Path>) -> Result<Catalog, Error> {
    let mut c = Catalog::embedded();
    if let Some(home) = home {
        let refreshed = home.join("catalog");
        if refreshed.is_dir() {
            c.overlay(Catalog::load_dir(&refreshed)?);
        }
    }
    if let Some(dir) = dir {
        c.overlay(Catalog::load_dir(dir)?);
    }
    if let Some(home) = home {
        crate::provision::offer_capacity(&mut c, home)?;
    }
    Ok(c)
}

/// What a command works with, for one `$GANGWAY_HOME`.
pub struct Context {
    home: PathBuf,
    catalog_dir: Option<PathBuf>,
    store: Store,
    providers: Providers,
    catalog: OnceCell<Catalog>,
}

impl Context {
    /// Opens the state under `home` and builds the providers; the catalog
    /// (`catalog_dir` overlaid) is loaded on first use.
    pub fn open(home: &Path, catalog_dir: Option<&Path>) -> Result<Context, StateError> {
        Ok(Context {
            home: home.to_path_buf(),
            catalog_dir: catalog_dir.map(Path::to_path_buf),
            store: Store::open(home)?,
            providers: Providers::new(home),
            catalog: OnceCell::new(),
        })
    }

    /// `$GANGWAY_HOME`.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The state store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Every provider of this build.
    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    /// The catalog ([`load_catalog`]), loaded once.
    pub fn catalog(&self) -> Result<&Catalog, Error> {
        if let Some(c) = self.catalog.get() {
            return Ok(c);
        }
        let c = load_catalog(Some(&self.home), self.catalog_dir.as_deref())?;
        Ok(self.catalog.get_or_init(|| c))
    }
}
