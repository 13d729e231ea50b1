//! Refreshing the catalog from the providers' own APIs: the offerings and
//! prices of the regions asked for, and the interruption buckets a
//! provider publishes, written as the user's overlay over the shipped
//! catalog (`$GANGWAY_HOME/catalog/<cloud>.csv`, `interruptions/`).

use std::path::{Path, PathBuf};

use gangway_provider::Provider;

use crate::core::catalog::{Catalog, Date, Offering};
use crate::core::registry::Providers;
use crate::core::runtime::runtime;
use crate::Error;

/// How a note about interruption buckets that could not be refreshed starts.
pub(crate) const BUCKETS_NOT_REFRESHED: &str = "interruption buckets not refreshed";

/// What one cloud's refresh wrote.
pub(crate) struct Refreshed {
    /// The cloud.
    pub cloud: String,
    /// The regions refreshed.
    pub regions: Vec<String>,
    /// Offerings written.
    pub offerings: usize,
    /// On-demand prices from the API.
    pub on_demand: usize,
    /// Spot prices from the API.
    pub spot: usize,
    /// What the provider noted, and why buckets were not refreshed.
    pub notes: Vec<String>,
    /// The overlay written.
    pub path: PathBuf,
    /// Interruption buckets written, and where, when the provider has them.
    pub buckets: Option<(usize, PathBuf)>,
}

/// The clouds to refresh: `cloud`, or every cloud with a live price API.
pub(crate) fn clouds<'a>(
    providers: &'a Providers,
    cloud: Option<&str>,
) -> Result<Vec<&'a str>, Error> {
    let live: Vec<&str> = providers
        .all()
        .filter(|(_, p)| p.has_price_api())
        .map(|(name, _)| name)
        .collect();
    match cloud {
        Some(c) => match live.iter().find(|l| **l == c) {
            Some(l) => Ok(vec![*l]),
            None => Err(Error::usage(
                format!("'{c}' has no live price API to refresh from"),
                Some(&format!("clouds with one: {}", live.join(", "))),
            )),
        },
        None => Ok(live),
    }
}

/// The regions of cloud `c` to refresh: `asked`, each one the catalog
/// lists, or every region it lists.
pub(crate) fn regions(base: &Catalog, c: &str, asked: &[String]) -> Result<Vec<String>, Error> {
    let mut known: Vec<String> = base
        .offerings()
        .iter()
        .filter(|o| o.cloud == c)
        .map(|o| o.region.to_string())
        .collect();
    known.sort();
    known.dedup();
    if asked.is_empty() {
        return Ok(known);
    }
    for r in asked {
        if !known.contains(r) {
            return Err(Error::usage(
                format!("the catalog lists no {c} offerings in region '{r}'"),
                Some(&format!("{c} regions in the catalog: {}", known.join(", "))),
            ));
        }
    }
    Ok(asked.to_vec())
}

/// Refreshes cloud `c` over `base` for the regions `wanted` (`region_done`
/// is called after each), then its interruption buckets; writes both
/// overlays atomically under `home`.
pub(crate) fn refresh(
    home: &Path,
    base: &Catalog,
    c: &str,
    provider: &dyn Provider,
    wanted: &[String],
    region_done: &dyn Fn(&str),
) -> Result<Refreshed, Error> {
    let rt = runtime()?;
    let today = Date::today();
    let mut types: Vec<String> = base
        .offerings()
        .iter()
        .filter(|o| o.cloud == c && wanted.iter().any(|r| o.region == *r))
        .map(|o| o.instance_type.to_string())
        .collect();
    types.sort();
    types.dedup();
    let mut quotes = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for r in wanted {
        let got = rt
            .block_on(provider.prices(&types, std::slice::from_ref(r)))
            .map_err(Error::from)?;
        quotes.extend(got.quotes);
        for n in got.notes {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
        region_done(r);
    }
    let rows = base.refreshed(c, wanted, &quotes);
    let spot = quotes.iter().filter(|q| q.spot_price.is_some()).count();
    let on_demand = quotes.iter().filter(|q| q.price.is_some()).count();
    let refs: Vec<&Offering> = rows.iter().collect();
    let note = format!(
        "{c}: offerings of {} from the {c} API on {today}, with {on_demand} on-demand and {spot} spot price(s) from it; other prices as before{}",
        wanted.join(" "),
        notes
            .iter()
            .map(|n| format!(" ({})", n.replace('\n', " ")))
            .collect::<String>()
    );
    let path = home.join("catalog").join(format!("{c}.csv"));
    write_atomic(&path, Catalog::to_own_csv(&refs, today, &note).as_bytes())?;
    // The interruption buckets the provider publishes (all regions at
    // once), over the shipped table.
    let buckets = match rt.block_on(provider.interruption_buckets()) {
        Ok(Some(b)) => {
            let path = home
                .join(crate::core::context::INTERRUPTIONS_DIR)
                .join(format!("{c}.csv"));
            let text = crate::core::catalog::risk::RiskTable::to_csv(
                &b,
                today,
                &format!("the {c} API on {today}"),
            );
            write_atomic(&path, text.as_bytes())?;
            Some((b.len(), path))
        }
        Ok(None) => None,
        Err(e) => {
            notes.push(format!("{BUCKETS_NOT_REFRESHED} (kept as they were): {e}"));
            None
        }
    };
    Ok(Refreshed {
        cloud: c.to_string(),
        regions: wanted.to_vec(),
        offerings: rows.len(),
        on_demand,
        spot,
        notes,
        path,
        buckets,
    })
}

/// Writes a file whole or not at all: a temporary file beside it, synced,
/// then renamed over it.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
