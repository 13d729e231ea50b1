//! The instance catalog: what can be rented where, and for how much.
//!
//! The embedded default ships inside the binary ([`Catalog::embedded`]).
//! [`Catalog::load_dir`] reads SkyPilot's published v8 layout
//! (`<cloud>/vms.csv`) or gangway's own (`<cloud>.csv`) and overlays it by
//! cloud. Both end up as [`Offering`]s: one instance type in one zone.

mod cache;
mod name;
pub(crate) mod risk;
mod skypilot;

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};

use gangway_provider::PriceQuote;
use serde::Serialize;

pub(crate) use name::Interner;
pub use name::Name;
pub use skypilot::load_skypilot_csv;

/// Accelerator name meaning "whatever GPU the task asks for" (local provider).
pub(crate) const ANY_ACCELERATOR: &str = "*";

/// Prices the user fetched (a refresh, a `--catalog` directory) older than
/// this many days earn a warning.
pub(crate) const STALE_AFTER_DAYS: i64 = 90;

/// The prices shipped inside the binary earn a warning after this many
/// days: they are the release's snapshot, which a new user can only
/// replace by refreshing, and list prices change a few times a year (what
/// is estimated in them is marked so, whatever its age).
pub(crate) const EMBEDDED_STALE_AFTER_DAYS: i64 = 365;

/// One instance type in one zone, with its prices.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Offering {
    /// `aws`, `gcp`, ...
    pub cloud: Name,
    /// Provider instance type (GCP N1 hosts keep their bare name).
    pub instance_type: Name,
    /// Canonical GPU name; `None` for CPU-only types.
    pub accelerator: Option<Name>,
    /// GPUs per instance.
    pub accelerator_count: f32,
    /// Memory per GPU, GiB.
    pub accelerator_memory_gib: Option<f32>,
    /// vCPUs.
    pub vcpus: f32,
    /// Memory, GiB.
    pub memory_gib: f32,
    /// Region.
    pub region: Name,
    /// Zone (AWS rows from SkyPilot catalogs carry zone ids such as `use1-az2`).
    pub zone: Name,
    /// On-demand USD/hour.
    pub price: Option<f64>,
    /// Spot USD/hour.
    pub spot_price: Option<f64>,
    /// Supports cluster placement (AWS placement group, GCP compact policy).
    pub placement: bool,
    /// Supports EFA.
    pub efa: bool,
    /// Which of the prices are estimates rather than published figures.
    pub estimated: Estimated,
}

/// Which of an offering's prices are estimated (derived by a rule, such as
/// a regional ratio or a share of on-demand) rather than published by the
/// provider. Commands say "est." next to such a figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Estimated {
    /// The on-demand price is an estimate.
    pub price: bool,
    /// The spot price is an estimate.
    pub spot: bool,
}

impl Estimated {
    /// Parses the `estimated` column: empty, `price`, `spot` or
    /// `price+spot`.
    pub(crate) fn parse(s: &str) -> Option<Estimated> {
        let mut e = Estimated::default();
        for part in s.split('+').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "price" => e.price = true,
                "spot" => e.spot = true,
                _ => return None,
            }
        }
        Some(e)
    }

    /// The column's text (see [`Estimated::parse`]).
    pub(crate) fn as_column(&self) -> &'static str {
        match (self.price, self.spot) {
            (false, false) => "",
            (true, false) => "price",
            (false, true) => "spot",
            (true, true) => "price+spot",
        }
    }

    /// Whether the price of one market is estimated.
    pub(crate) fn market(&self, spot: bool) -> bool {
        if spot {
            self.spot
        } else {
            self.price
        }
    }
}

/// Integer keys of one offering, for fast ranking and pruning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    /// Rank in (cloud, region, zone, instance type) order.
    pub(crate) rank: u32,
    /// Id of its (cloud, region).
    pub(crate) region: u32,
    /// Id of its instance type.
    pub(crate) ty: u32,
}

/// A calendar date (prices' "taken" date).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct Date {
    /// Year.
    pub(crate) y: i32,
    /// Month 1-12.
    pub(crate) m: u32,
    /// Day 1-31.
    pub(crate) d: u32,
}

impl Date {
    /// Parses `YYYY-MM-DD`.
    pub(crate) fn parse(s: &str) -> Option<Date> {
        let mut it = s.trim().splitn(3, '-');
        let y = it.next()?.parse().ok()?;
        let m = it.next()?.parse().ok()?;
        let d = it.next()?.parse().ok()?;
        ((1..=12).contains(&m) && (1..=31).contains(&d)).then_some(Date { y, m, d })
    }

    /// Days since 1970-01-01 (proleptic Gregorian).
    pub(crate) fn days(&self) -> i64 {
        let (y, m) = if self.m <= 2 {
            (self.y as i64 - 1, self.m as i64 + 9)
        } else {
            (self.y as i64, self.m as i64 - 3)
        };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * m + 2) / 5 + self.d as i64 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// Today, from the system clock (UTC).
    pub(crate) fn today() -> Date {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Date::from_days(secs.div_euclid(86_400))
    }

    /// Inverse of [`Date::days`].
    pub(crate) fn from_days(z: i64) -> Date {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let y = (yoe + era * 400 + i64::from(m <= 2)) as i32;
        Date { y, m, d }
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.y, self.m, self.d)
    }
}

/// Where one cloud's offerings came from.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Source {
    /// Cloud.
    pub(crate) cloud: String,
    /// `embedded` or a file path.
    pub(crate) origin: String,
    /// When the prices were taken, if known.
    pub(crate) taken: Option<Date>,
    /// Rows loaded.
    pub(crate) rows: usize,
}

/// All offerings, with an index by accelerator for fast lookups.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    offerings: Vec<Offering>,
    /// Lower-cased accelerator name (or "" for CPU-only) -> offering indexes.
    by_accel: HashMap<String, Vec<u32>>,
    /// Per offering: its rank in (cloud, region, zone, instance type) order,
    /// the id of its (cloud, region) and of its instance type. Computed once
    /// at load so ranking and pruning compare integers, not strings.
    keys: Vec<Keys>,
    regions: usize,
    /// Where each cloud came from.
    pub(crate) sources: Vec<Source>,
    /// Rows that could not be used, as `file:line: reason`.
    pub(crate) warnings: Vec<String>,
    /// Clouds offered only to tasks that name them.
    only_when_named: Vec<String>,
    /// Spot interruption buckets.
    risk: risk::RiskTable,
}

/// Why a catalog could not be loaded at all.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The directory or a file could not be read.
    #[error("{path}: {reason}")]
    Io {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file has a layout we cannot read.
    #[error("{path}: {reason}")]
    Layout {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The shipped catalogs: cloud, rows, and whether the cloud is offered
/// only to tasks that name it (the local cloud runs on the user's own
/// machine: never picked for being cheapest).
const EMBEDDED: &[(&str, &str, bool)] = &[
    ("aws", include_str!("data/aws.csv"), false),
    ("azure", include_str!("data/azure.csv"), false),
    ("gcp", include_str!("data/gcp.csv"), false),
    ("lambda", include_str!("data/lambda.csv"), false),
    ("runpod", include_str!("data/runpod.csv"), false),
    ("vast", include_str!("data/vast.csv"), false),
    ("local", include_str!("data/local.csv"), true),
];

impl Catalog {
    /// The catalog compiled into the binary.
    pub fn embedded() -> Catalog {
        let mut c = Catalog {
            risk: risk::RiskTable::embedded(),
            ..Catalog::default()
        };
        for (cloud, text, only_when_named) in EMBEDDED {
            if *only_when_named {
                c.offer_only_when_named(cloud);
            }
            let (rows, taken, warnings) = parse_own(cloud, text, &format!("embedded {cloud}.csv"));
            debug_assert!(warnings.is_empty(), "embedded catalog: {warnings:?}");
            c.sources.push(Source {
                cloud: cloud.to_string(),
                origin: "embedded".into(),
                taken,
                rows: rows.len(),
            });
            c.offerings.extend(rows);
            c.warnings.extend(warnings);
        }
        c.reindex();
        c
    }

    /// A catalog of exactly these offerings (tests, benchmarks, refresh).
    pub fn from_offerings(offerings: Vec<Offering>) -> Catalog {
        let mut c = Catalog {
            offerings,
            ..Catalog::default()
        };
        c.reindex();
        c
    }

    /// Replaces every offering of the clouds in `other` with `other`'s.
    pub(crate) fn overlay(&mut self, other: Catalog) {
        for c in other.only_when_named {
            self.offer_only_when_named(&c);
        }
        let clouds: Vec<String> = other.sources.iter().map(|s| s.cloud.clone()).collect();
        self.offerings
            .retain(|o| !clouds.iter().any(|c| o.cloud == *c));
        self.sources.retain(|s| !clouds.contains(&s.cloud));
        if other.offerings.len() > self.offerings.len() {
            // A large overlay (a --catalog directory) keeps its vector and
            // takes the few rows kept from below after its own (ranks do
            // not depend on the order): copying 90,000 rows once more cost
            // their size again in memory and most of the load time.
            let below = std::mem::replace(&mut self.offerings, other.offerings);
            self.offerings.extend(below);
        } else {
            self.offerings.extend(other.offerings);
        }
        self.sources.extend(other.sources);
        self.warnings.extend(other.warnings);
        self.reindex();
    }

    /// Loads a directory of `<cloud>/vms.csv` (SkyPilot v8) and/or
    /// `<cloud>.csv` (gangway's format) files.
    #[cfg(test)]
    pub(crate) fn load_dir(dir: &Path) -> Result<Catalog, CatalogError> {
        Catalog::load_dir_cached(dir, None)
    }

    /// [`Catalog::load_dir`], keeping each file's parse in `cache` (a
    /// directory, created if missing; see the `cache` module): a file
    /// whose size, mtime and content are unchanged is not parsed again.
    #[cfg(test)]
    pub(crate) fn load_dir_cached(
        dir: &Path,
        cache: Option<&Path>,
    ) -> Result<Catalog, CatalogError> {
        let mut c = Catalog::load_rows(dir, cache)?;
        c.reindex();
        Ok(c)
    }

    /// Overlays the catalog in `dir` ([`Catalog::load_dir_cached`] and
    /// [`Catalog::overlay`], indexing the result once).
    pub(crate) fn overlay_dir(
        &mut self,
        dir: &Path,
        cache: Option<&Path>,
    ) -> Result<(), CatalogError> {
        let other = Catalog::load_rows(dir, cache)?;
        self.overlay(other);
        Ok(())
    }

    /// The rows of `dir`'s files, not yet indexed.
    fn load_rows(dir: &Path, cache: Option<&Path>) -> Result<Catalog, CatalogError> {
        let mut files = Vec::new();
        for (cloud, file) in catalog_files(dir)? {
            files.push(CatalogFile::read(cloud, file, cache)?);
        }
        // One vector for every row, sized once (with room for the rows an
        // overlay keeps from below: see [`Catalog::overlay`]); cached rows
        // are decoded straight into it.
        let mut c = Catalog::default();
        let total: usize = files.iter().map(|f| f.got.rows()).sum();
        c.offerings.reserve_exact(total + 1024);
        for f in files {
            c.take_file(f)?;
        }
        if c.sources.is_empty() {
            return Err(CatalogError::Layout {
                path: dir.display().to_string(),
                reason: "no catalog files found (expected <cloud>/vms.csv or <cloud>.csv)".into(),
            });
        }
        Ok(c)
    }

    /// Appends one file's rows (decoding a cache entry, or parsing the
    /// file again when the entry will not decode), its source and its
    /// warnings.
    fn take_file(&mut self, f: CatalogFile) -> Result<(), CatalogError> {
        let CatalogFile {
            cloud,
            file,
            shown,
            got,
        } = f;
        let before = self.offerings.len();
        let (taken, warnings) = match got {
            Got::Parsed(p) => {
                self.offerings.extend(p.rows);
                (p.taken, p.warnings)
            }
            Got::Cached(e, entry, key) => match e.decode_into(&mut self.offerings) {
                Some(tw) => tw,
                None => {
                    let p = parse_file(&cloud, &file, &shown)?;
                    save(&entry, &key, &p);
                    self.offerings.extend(p.rows);
                    (p.taken, p.warnings)
                }
            },
        };
        self.sources.push(Source {
            cloud,
            origin: shown,
            taken,
            rows: self.offerings.len() - before,
        });
        self.warnings.extend(warnings);
        Ok(())
    }

    /// The catalog of what a provider's configuration file offers: on
    /// demand only, taken today.
    pub(crate) fn from_capacity(cloud: &str, capacity: gangway_provider::Capacity) -> Catalog {
        let offerings: Vec<Offering> = capacity
            .offers
            .into_iter()
            .map(|o| Offering {
                cloud: cloud.into(),
                instance_type: o.instance_type.into(),
                accelerator: o.accelerator.map(Name::from),
                accelerator_count: o.accelerator_count,
                accelerator_memory_gib: None,
                vcpus: o.vcpus,
                memory_gib: o.memory_gib,
                region: o.region.into(),
                zone: o.zone.into(),
                price: Some(o.price),
                spot_price: None,
                placement: false,
                efa: false,
                estimated: Estimated::default(),
            })
            .collect();
        let rows = offerings.len();
        let mut c = Catalog::from_offerings(offerings);
        if capacity.only_when_named {
            c.offer_only_when_named(cloud);
        }
        c.sources.push(Source {
            cloud: cloud.to_string(),
            origin: capacity.origin,
            taken: Some(Date::today()),
            rows,
        });
        c
    }

    /// Offers `cloud`'s rows only to tasks that name it (`infra:`),
    /// whichever overlay its rows come from.
    pub(crate) fn offer_only_when_named(&mut self, cloud: &str) {
        if !self.only_when_named(cloud) {
            self.only_when_named.push(cloud.to_string());
        }
    }

    /// Whether `cloud` is offered only to tasks that name it.
    pub(crate) fn only_when_named(&self, cloud: &str) -> bool {
        self.only_when_named.iter().any(|c| c == cloud)
    }

    /// Rebuilds the indexes over the offerings: by accelerator, and each
    /// row's integer [`Keys`].
    fn reindex(&mut self) {
        let ids = NameIds::of(&self.offerings);
        self.by_accel = accelerator_index(&ids.accels, &ids.raw);
        // Rank in (cloud, region, zone, instance type) order: each name's
        // id becomes its place in sorted order, then rows sort by integers.
        let (c, r, z, t) = (
            ids.clouds.sorted_ranks(),
            ids.regions.sorted_ranks(),
            ids.zones.sorted_ranks(),
            ids.types.sorted_ranks(),
        );
        let (keys, regions) = row_keys(&ids.raw, [&c, &r, &z, &t]);
        self.keys = keys;
        self.regions = regions;
    }

    /// Takes the interruption buckets in `dir` over the shipped ones
    /// ([`risk::RiskTable::overlay_dir`]).
    pub(crate) fn overlay_interruptions(&mut self, dir: &std::path::Path) {
        self.risk.overlay_dir(dir);
    }

    /// How often `o` is interrupted on spot (see [`risk`]).
    pub(crate) fn interruption(&self, o: &Offering) -> risk::Interruption {
        self.risk
            .interruption(&o.cloud, &o.region, &o.instance_type)
    }

    /// Integer keys of offering `i` (see [`Keys`]).
    pub(crate) fn keys(&self, i: u32) -> Keys {
        self.keys[i as usize]
    }

    /// Number of distinct (cloud, region) pairs; region ids are below it.
    #[cfg(test)]
    pub(crate) fn region_count(&self) -> usize {
        self.regions
    }

    /// Offering by index.
    pub(crate) fn get(&self, i: u32) -> &Offering {
        &self.offerings[i as usize]
    }

    /// Indexes of offerings whose accelerator is `name` (case-insensitive),
    /// or of CPU-only ones for `""`.
    pub(crate) fn indexes_with_accelerator(&self, name: &str) -> &[u32] {
        self.by_accel
            .get(&name.to_ascii_lowercase())
            .map_or(&[], Vec::as_slice)
    }

    /// `cloud`'s offerings after a live refresh of `regions`: where the
    /// provider quoted a (type, accelerator) in a region, it is offered
    /// exactly in the quoted zones (rows for other zones go, new zones are
    /// added from a sibling row) and takes the quoted prices (a price not
    /// quoted stays as it was); one not quoted in a refreshed region is no
    /// longer sold there. Rows of one type that differ by accelerator
    /// (GCP's N1 hosts with T4 or V100 attached) are kept apart. Other
    /// regions stay as they were.
    pub(crate) fn refreshed(
        &self,
        cloud: &str,
        regions: &[String],
        quotes: &[PriceQuote],
    ) -> Vec<Offering> {
        let mut out: Vec<Offering> = Vec::new();
        let mut seen: std::collections::HashSet<(&str, Option<&str>, u32, &str)> =
            Default::default();
        for o in self.offerings.iter().filter(|o| o.cloud == cloud) {
            if !regions.iter().any(|r| o.region == *r) {
                out.push(o.clone());
                continue;
            }
            let accel = o.accelerator.as_deref();
            let count = o.accelerator_count;
            if !seen.insert((&o.instance_type, accel, count.to_bits(), &o.region)) {
                continue;
            }
            let template = o;
            let mut zones_done: Vec<Name> = Vec::new();
            for q in quotes.iter().filter(|q| {
                q.is_for(
                    &template.instance_type,
                    accel,
                    f64::from(count),
                    &template.region,
                )
            }) {
                let zone = q
                    .zone
                    .as_deref()
                    .map_or_else(|| template.zone.clone(), Name::from);
                // One row per zone: the first quote for it wins.
                if zones_done.contains(&zone) {
                    continue;
                }
                zones_done.push(zone.clone());
                let old = self.offerings.iter().find(|x| {
                    x.cloud == cloud
                        && x.instance_type == template.instance_type
                        && x.accelerator.as_deref() == accel
                        && x.accelerator_count == count
                        && x.region == template.region
                        && x.zone == zone
                });
                let mut row = old.unwrap_or(template).clone();
                row.zone = zone;
                row.price = q.price.or(row.price);
                row.spot_price = q.spot_price.or(old.and_then(|x| x.spot_price));
                // A quoted price is the provider's own figure.
                row.estimated.price &= q.price.is_none();
                row.estimated.spot = match q.spot_price {
                    Some(_) => false,
                    None => old.is_some_and(|x| x.estimated.spot),
                };
                if row.price.is_some() || row.spot_price.is_some() {
                    out.push(row);
                }
            }
        }
        out
    }

    /// `cloud`'s offerings in gangway's own CSV format, dated `taken`, with
    /// `note` as a comment line (what [`Catalog::load_dir`] reads back).
    pub(crate) fn to_own_csv(offerings: &[&Offering], taken: Date, note: &str) -> String {
        let num = |v: Option<f64>| v.map(|p| format!("{p}")).unwrap_or_default();
        let mut out = format!(
            "# taken: {taken}\n# {note}\n\
             instance_type,accelerator,accelerator_count,accelerator_memory_gib,vcpus,memory_gib,region,zone,price,spot_price,placement,efa,estimated\n"
        );
        for o in offerings {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                o.instance_type,
                o.accelerator.as_deref().unwrap_or(""),
                o.accelerator_count,
                o.accelerator_memory_gib
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
                o.vcpus,
                o.memory_gib,
                o.region,
                o.zone,
                num(o.price),
                num(o.spot_price),
                if o.placement { "cluster" } else { "" },
                o.efa,
                o.estimated.as_column()
            ));
        }
        out
    }

    /// Every offering.
    pub fn offerings(&self) -> &[Offering] {
        &self.offerings
    }

    /// Offerings whose accelerator is `name` (case-insensitive), or CPU-only
    /// ones for `""`. Local wildcard offerings are not included.
    #[cfg(test)]
    pub(crate) fn with_accelerator(&self, name: &str) -> impl Iterator<Item = &Offering> {
        self.indexes_with_accelerator(name)
            .iter()
            .map(|i| &self.offerings[*i as usize])
    }

    /// Distinct accelerator names, in their catalog spelling, sorted.
    pub(crate) fn accelerator_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .by_accel
            .values()
            .filter_map(|v| self.offerings[v[0] as usize].accelerator.clone())
            .map(String::from)
            .filter(|n| n != ANY_ACCELERATOR)
            .collect();
        names.sort();
        names
    }

    /// Sources whose prices are older than [`STALE_AFTER_DAYS`] on `today`
    /// ([`EMBEDDED_STALE_AFTER_DAYS`] for the embedded ones).
    pub(crate) fn stale_sources(&self, today: Date) -> Vec<(&Source, i64)> {
        self.sources
            .iter()
            .filter_map(|s| s.taken.map(|t| (s, today.days() - t.days())))
            .filter(|(s, age)| {
                *age > if s.origin == "embedded" {
                    EMBEDDED_STALE_AFTER_DAYS
                } else {
                    STALE_AFTER_DAYS
                }
            })
            .collect()
    }
}

/// A catalog directory's files in name order, each with its cloud:
/// `<cloud>/vms.csv` (SkyPilot's layout) or `<cloud>.csv`.
fn catalog_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, CatalogError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io_error(dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        if path.is_dir() {
            let f = path.join("vms.csv");
            if f.is_file() {
                out.push((name_of(&path), f));
            }
        } else if path.extension().is_some_and(|e| e == "csv") {
            let cloud = path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            out.push((cloud, path));
        }
    }
    Ok(out)
}

/// An unreadable catalog path.
fn io_error(path: &Path, e: std::io::Error) -> CatalogError {
    CatalogError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// One catalog file, read: its cloud, path (and as shown) and rows.
struct CatalogFile {
    cloud: String,
    file: PathBuf,
    shown: String,
    got: Got,
}

impl CatalogFile {
    /// Parses `file`, or with a `cache` directory finds its entry there
    /// (parsing and saving one when there is none).
    fn read(cloud: String, file: PathBuf, cache: Option<&Path>) -> Result<Self, CatalogError> {
        let shown = file.display().to_string();
        let got = match cache {
            None => Got::Parsed(parse_file(&cloud, &file, &shown)?),
            Some(cache) => {
                let key = cache::Key::of(&file).map_err(|e| io_error(&file, e))?;
                let entry = cache::entry_path(cache, &shown);
                match cache::read(&entry, &key) {
                    Some(e) => Got::Cached(e, entry, key),
                    None => {
                        let p = parse_file(&cloud, &file, &shown)?;
                        save(&entry, &key, &p);
                        Got::Parsed(p)
                    }
                }
            }
        };
        Ok(CatalogFile {
            cloud,
            file,
            shown,
            got,
        })
    }
}

/// A catalog file's rows: parsed now, or a cache entry to decode.
enum Got {
    Parsed(cache::Parsed),
    Cached(cache::Entry, std::path::PathBuf, cache::Key),
}

impl Got {
    fn rows(&self) -> usize {
        match self {
            Got::Parsed(p) => p.rows.len(),
            Got::Cached(e, ..) => e.rows(),
        }
    }
}

/// Writes a cache entry; a failure costs only the next parse.
fn save(entry: &Path, key: &cache::Key, p: &cache::Parsed) {
    if let Err(e) = cache::write(entry, key, p) {
        tracing::debug!("catalog cache {}: not written: {e}", entry.display());
    }
}

/// Parses one catalog file, in gangway's format or SkyPilot's.
fn parse_file(cloud: &str, file: &Path, shown: &str) -> Result<cache::Parsed, CatalogError> {
    let text = std::fs::read_to_string(file).map_err(|e| CatalogError::Io {
        path: shown.to_string(),
        reason: e.to_string(),
    })?;
    let first = text.lines().find(|l| !l.starts_with('#')).unwrap_or("");
    let (rows, taken, warnings) = if first.starts_with("instance_type,") {
        parse_own(cloud, &text, shown)
    } else {
        let (rows, warnings) = load_skypilot_csv(cloud, &text, shown)?;
        (rows, None, warnings)
    };
    Ok(cache::Parsed {
        rows,
        taken,
        warnings,
    })
}

/// The offerings' names numbered, one table per field, and per row its
/// ids: (cloud, region, zone, type, accelerator or `u32::MAX` for none).
struct NameIds {
    clouds: Ids,
    regions: Ids,
    zones: Ids,
    types: Ids,
    accels: Ids,
    raw: Vec<[u32; 5]>,
}

impl NameIds {
    /// Numbers `offerings`' names. Names are shared copies (see [`Name`]):
    /// each distinct copy is looked up once by address, so 90,000 rows
    /// cost a few thousand string hashes, and ranks compare integers.
    fn of(offerings: &[Offering]) -> Self {
        let mut ids = NameIds {
            clouds: Ids::default(),
            regions: Ids::default(),
            zones: Ids::default(),
            types: Ids::default(),
            accels: Ids::default(),
            raw: Vec::with_capacity(offerings.len()),
        };
        for o in offerings {
            let row = [
                ids.clouds.id(&o.cloud),
                ids.regions.id(&o.region),
                ids.zones.id(&o.zone),
                ids.types.id(&o.instance_type),
                o.accelerator
                    .as_ref()
                    .map_or(u32::MAX, |a| ids.accels.id(a)),
            ];
            ids.raw.push(row);
        }
        ids
    }
}

/// Row indexes by lower-cased accelerator name (case-insensitively one
/// group per name), CPU-only rows under "".
fn accelerator_index(accels: &Ids, raw: &[[u32; 5]]) -> HashMap<String, Vec<u32>> {
    let mut lower: HashMap<String, u32> = HashMap::new();
    let accel_group: Vec<u32> = accels
        .texts
        .iter()
        .map(|t| {
            let next = lower.len() as u32;
            *lower.entry(t.to_ascii_lowercase()).or_insert(next)
        })
        .collect();
    let cpu_group = {
        let next = lower.len() as u32;
        *lower.entry(String::new()).or_insert(next)
    };
    let mut groups: Vec<Vec<u32>> = vec![Vec::new(); lower.len()];
    for (i, r) in raw.iter().enumerate() {
        let g = match r[4] {
            u32::MAX => cpu_group,
            a => accel_group[a as usize],
        };
        groups[g as usize].push(i as u32);
    }
    lower
        .into_iter()
        .map(|(k, g)| (k, std::mem::take(&mut groups[g as usize])))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// Each row's [`Keys`] from its ids and the names' sorted `ranks` (see
/// [`rank_order`]), and the number of (cloud, region) pairs. Region ids
/// number (cloud, region) pairs in rank order (rows of one pair are
/// adjacent in it); type ids number types in rank order.
fn row_keys(raw: &[[u32; 5]], ranks: [&[u32]; 4]) -> (Vec<Keys>, usize) {
    let order = rank_order(raw, ranks);
    let mut regions = 0u32;
    let mut last: Option<(u32, u32)> = None;
    let mut type_ids: Vec<u32> = vec![u32::MAX; ranks[3].len()];
    let mut next_type = 0;
    let mut keys = vec![Keys::default(); raw.len()];
    for (rank, i) in order.iter().enumerate() {
        let x = &raw[*i as usize];
        if last.is_some_and(|l| l != (x[0], x[1])) {
            regions += 1;
        }
        last = Some((x[0], x[1]));
        let region = regions;
        let ty = &mut type_ids[x[3] as usize];
        if *ty == u32::MAX {
            *ty = next_type;
            next_type += 1;
        }
        keys[*i as usize] = Keys {
            rank: rank as u32,
            region,
            ty: *ty,
        };
    }
    let count = if last.is_some() {
        regions as usize + 1
    } else {
        0
    };
    (keys, count)
}

/// Row indexes sorted by the ranks of their first four ids (cloud, region,
/// zone, type), each id mapped through its `ranks` table. The four ranks
/// and the index are packed into one integer where they fit in 64 bits
/// (they do for every published catalog: a few thousand names), so the
/// sort compares single words; otherwise into 128 bits.
fn rank_order(raw: &[[u32; 5]], ranks: [&[u32]; 4]) -> Vec<u32> {
    let bits = |n: usize| usize::BITS - n.leading_zeros();
    let widths = ranks.map(|r| bits(r.len()));
    let index_bits = bits(raw.len());
    let total: u32 = widths.iter().sum::<u32>() + index_bits;
    let pack = |x: &[u32; 5]| -> u128 {
        let mut k: u128 = 0;
        for f in 0..4 {
            k = (k << widths[f]) | u128::from(ranks[f][x[f] as usize]);
        }
        k
    };
    if total <= 64 {
        let mask = (1u64 << index_bits) - 1;
        let mut keys: Vec<u64> = raw
            .iter()
            .enumerate()
            .map(|(i, x)| ((pack(x) as u64) << index_bits) | i as u64)
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|k| (k & mask) as u32).collect()
    } else {
        let mut keys: Vec<(u128, u32)> = raw
            .iter()
            .enumerate()
            .map(|(i, x)| (pack(x), i as u32))
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|(_, i)| i).collect()
    }
}

/// Numbers distinct names: by the address of a shared copy first (no
/// hashing of text), then by text for copies not seen before.
#[derive(Default)]
struct Ids {
    /// The last address looked up and its id: rows come in runs of one
    /// cloud, region and zone.
    last: Option<(usize, u32)>,
    by_addr: HashMap<usize, u32, BuildHasherDefault<AddrHasher>>,
    by_text: HashMap<Name, u32>,
    texts: Vec<Name>,
}

impl Ids {
    fn id(&mut self, n: &Name) -> u32 {
        let addr = n.addr();
        match self.last {
            Some((a, id)) if a == addr => return id,
            _ => {}
        }
        if let Some(id) = self.by_addr.get(&addr).copied() {
            self.last = Some((addr, id));
            return id;
        }
        let next = self.texts.len() as u32;
        let id = *self.by_text.entry(n.clone()).or_insert(next);
        if id == next {
            self.texts.push(n.clone());
        }
        // Callers pass names that all stay alive while the table is used,
        // so an address stands for one text.
        self.by_addr.insert(addr, id);
        self.last = Some((addr, id));
        id
    }

    /// Per id, its place among all the names sorted by text.
    fn sorted_ranks(&self) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..self.texts.len() as u32).collect();
        idx.sort_unstable_by(|a, b| self.texts[*a as usize].cmp(&self.texts[*b as usize]));
        let mut rank = vec![0; idx.len()];
        for (r, i) in idx.iter().enumerate() {
            rank[*i as usize] = r as u32;
        }
        rank
    }
}

/// Hasher for addresses: one multiply (they are already unique).
#[derive(Default)]
struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// Parses gangway's own catalog format. Returns rows, taken date, warnings.
fn parse_own(cloud: &str, text: &str, shown: &str) -> (Vec<Offering>, Option<Date>, Vec<String>) {
    let mut names = Interner::default();
    let cloud = names.get(cloud);
    let mut taken = None;
    let mut rows = Vec::new();
    let mut warnings = Vec::new();
    let mut header_seen = false;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = line.trim_end_matches('\r');
        if let Some(c) = line.strip_prefix('#') {
            if let Some(d) = c.trim().strip_prefix("taken:") {
                taken = Date::parse(d);
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        if !header_seen {
            header_seen = true;
            continue;
        }
        match parse_own_row(&cloud, line, &mut names) {
            Ok(o) => rows.push(o),
            Err(e) => warnings.push(format!("{shown}:{lineno}: {e}")),
        }
    }
    (rows, taken, warnings)
}

/// The largest number a catalog field may hold (a price in $/h, a count,
/// GiB): anything larger is refused like NaN, so no sum or product of
/// prices overflows (the cache keeps some as f32, whose largest is 3.4e38).
pub(crate) const MAX_FIELD: f64 = 1_000_000.0;

/// Whether `v` is a number a catalog field may hold.
pub(crate) fn in_range(v: f64) -> bool {
    v.is_finite() && (0.0..=MAX_FIELD).contains(&v)
}

/// Why a row of gangway's own catalog format was skipped (a warning that
/// names the file and line).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
enum RowError {
    #[error("expected 12 or 13 fields, found {0}")]
    Fields(usize),
    #[error("estimated: '{0}' is not one of price, spot, price+spot")]
    Estimated(String),
    #[error("{field}: '{value}' is not a number (0 to 1,000,000)")]
    NotANumber { field: &'static str, value: String },
    #[error("instance_type, region and zone are required")]
    Missing,
    #[error("accelerator_count must be positive for a GPU type")]
    NoAcceleratorCount,
    #[error("no price and no spot_price")]
    NoPrice,
}

fn parse_own_row(cloud: &Name, line: &str, names: &mut Interner) -> Result<Offering, RowError> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 12 && f.len() != 13 {
        return Err(RowError::Fields(f.len()));
    }
    let estimated = match f.get(12) {
        Some(e) => Estimated::parse(e).ok_or_else(|| RowError::Estimated(e.to_string()))?,
        None => Estimated::default(),
    };
    let num = |i: usize, field: &'static str| -> Result<Option<f64>, RowError> {
        if f[i].is_empty() {
            return Ok(None);
        }
        f[i].parse::<f64>()
            .ok()
            .filter(|v| in_range(*v))
            .map(Some)
            .ok_or_else(|| RowError::NotANumber {
                field,
                value: f[i].to_string(),
            })
    };
    if f[0].is_empty() || f[6].is_empty() || f[7].is_empty() {
        return Err(RowError::Missing);
    }
    let accelerator = (!f[1].is_empty()).then(|| names.get(f[1]));
    let count = num(2, "accelerator_count")?.unwrap_or(0.0) as f32;
    if accelerator.is_some() && count <= 0.0 {
        return Err(RowError::NoAcceleratorCount);
    }
    let price = num(8, "price")?;
    let spot_price = num(9, "spot_price")?;
    if price.is_none() && spot_price.is_none() {
        return Err(RowError::NoPrice);
    }
    Ok(Offering {
        cloud: cloud.clone(),
        instance_type: names.get(f[0]),
        accelerator,
        accelerator_count: count,
        accelerator_memory_gib: num(3, "accelerator_memory_gib")?.map(|v| v as f32),
        vcpus: num(4, "vcpus")?.unwrap_or(0.0) as f32,
        memory_gib: num(5, "memory_gib")?.unwrap_or(0.0) as f32,
        region: names.get(f[6]),
        zone: names.get(f[7]),
        price,
        spot_price,
        placement: !f[10].is_empty(),
        efa: f[11].eq_ignore_ascii_case("true"),
        estimated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_keeps_offered_zones_adds_new_ones_and_prices_spot() {
        let row = |zone: &str, spot: Option<f64>| Offering {
            cloud: "aws".into(),
            instance_type: "p4d.24xlarge".into(),
            accelerator: Some("A100".into()),
            accelerator_count: 8.0,
            accelerator_memory_gib: Some(40.0),
            vcpus: 96.0,
            memory_gib: 1152.0,
            region: zone[..zone.len() - 1].into(),
            zone: zone.into(),
            price: Some(32.77),
            spot_price: spot,
            placement: true,
            efa: true,
            estimated: Estimated::default(),
        };
        let c = Catalog::from_offerings(vec![
            row("us-east-1a", Some(12.0)),
            row("us-east-1b", Some(13.0)),
            row("us-west-2a", Some(14.0)),
        ]);
        let quote = |zone: &str, spot: Option<f64>| PriceQuote {
            instance_type: "p4d.24xlarge".into(),
            region: "us-east-1".into(),
            zone: Some(zone.into()),
            price: None,
            spot_price: spot,
            accelerator: None,
            accelerator_count: None,
        };
        // 1a is offered with a new spot price, 1b no longer, 1c is new.
        let quotes = [quote("us-east-1a", Some(9.5)), quote("us-east-1c", None)];
        let got = c.refreshed("aws", &["us-east-1".to_string()], &quotes);
        let zones: Vec<(&str, Option<f64>, Option<f64>)> = got
            .iter()
            .map(|o| (o.zone.as_str(), o.price, o.spot_price))
            .collect();
        assert_eq!(
            zones,
            vec![
                ("us-east-1a", Some(32.77), Some(9.5)),
                ("us-east-1c", Some(32.77), None),
                ("us-west-2a", Some(32.77), Some(14.0)),
            ]
        );
        // The CSV form reads back the same.
        let refs: Vec<&Offering> = got.iter().collect();
        let text = Catalog::to_own_csv(&refs, Date::parse("2026-12-02").unwrap(), "test");
        let (back, taken, warnings) = parse_own("aws", &text, "test");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(taken, Date::parse("2026-12-02"));
        assert_eq!(back, got);
        // A type with no quotes in a refreshed region is gone from it.
        let gone = c.refreshed("aws", &["us-east-1".to_string()], &[]);
        assert!(gone.iter().all(|o| o.region == "us-west-2"));
    }

    #[test]
    fn a_refresh_keeps_rows_of_one_type_apart_by_accelerator() {
        // GCP's N1 hosts take T4 or V100: one type, two offerings per zone.
        let row = |accel: &str, zone: &str, price: f64| Offering {
            cloud: "gcp".into(),
            instance_type: "n1-standard-8".into(),
            accelerator: Some(accel.into()),
            accelerator_count: 1.0,
            accelerator_memory_gib: None,
            vcpus: 8.0,
            memory_gib: 30.0,
            region: "us-central1".into(),
            zone: zone.into(),
            price: Some(price),
            spot_price: None,
            placement: true,
            efa: false,
            estimated: Estimated::default(),
        };
        let mut four = row("T4", "us-central1-a", 2.0);
        four.accelerator_count = 4.0;
        // (No quote for four T4s: that row goes, whatever one T4 does.)
        let c = Catalog::from_offerings(vec![
            row("T4", "us-central1-a", 0.73),
            four,
            row("V100", "us-central1-a", 2.86),
            row("V100", "us-central1-b", 2.86),
        ]);
        let quote = |accel: Option<&str>, zone: &str, price: f64| PriceQuote {
            instance_type: "n1-standard-8".into(),
            region: "us-central1".into(),
            zone: Some(zone.into()),
            price: Some(price),
            spot_price: Some(price / 3.0),
            accelerator: accel.map(str::to_string),
            accelerator_count: accel.map(|_| 1.0),
        };
        // T4 is now also in -b; V100 only in -b; a quote for another
        // accelerator touches neither.
        let quotes = [
            quote(Some("T4"), "us-central1-a", 0.70),
            quote(Some("t4"), "us-central1-b", 0.71),
            quote(Some("V100"), "us-central1-b", 2.80),
            quote(Some("P100"), "us-central1-c", 1.9),
        ];
        let got = c.refreshed("gcp", &["us-central1".to_string()], &quotes);
        let rows: Vec<(&str, &str, Option<f64>)> = got
            .iter()
            .map(|o| (o.accelerator.as_deref().unwrap(), o.zone.as_str(), o.price))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("T4", "us-central1-a", Some(0.70)),
                ("T4", "us-central1-b", Some(0.71)),
                ("V100", "us-central1-b", Some(2.80)),
            ]
        );
        // A type-wide quote (no accelerator) applies to both.
        let wide = [quote(None, "us-central1-c", 1.0)];
        let got = c.refreshed("gcp", &["us-central1".to_string()], &wide);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got.iter().all(|o| o.zone == "us-central1-c"));
    }

    #[test]
    fn integer_keys_follow_the_text_order_whatever_copies_the_names_are() {
        // Rows from two sources: names interned in one, fresh copies in
        // the other (a capacity overlay), one type in both.
        let mut rows = Catalog::embedded().offerings().to_vec();
        let fresh = |s: &str| Name::from(s.to_string());
        for (i, zone) in ["z-b", "z-a", "z-c", "z-a"].iter().enumerate() {
            let mut o = rows[i].clone();
            o.cloud = fresh("zzz");
            o.region = fresh(if i % 2 == 0 { "r2" } else { "r1" });
            o.zone = fresh(zone);
            o.instance_type = fresh(&rows[0].instance_type);
            rows.push(o);
        }
        let c = Catalog::from_offerings(rows);
        let n = c.offerings().len() as u32;
        let text = |i: u32| {
            let o = c.get(i);
            (
                o.cloud.to_string(),
                o.region.to_string(),
                o.zone.to_string(),
                o.instance_type.to_string(),
            )
        };
        let mut order: Vec<u32> = (0..n).collect();
        order.sort_by_key(|i| text(*i));
        for w in order.windows(2) {
            let (a, b) = (c.keys(w[0]), c.keys(w[1]));
            // Ranks follow the text order (ties in any order).
            if text(w[0]) != text(w[1]) {
                assert!(a.rank < b.rank, "{:?} {:?}", text(w[0]), text(w[1]));
            }
        }
        // Ids are equal exactly when the texts are.
        let texts: Vec<_> = (0..n).map(text).collect();
        for i in 0..n {
            for j in 0..n {
                let (a, b) = (c.keys(i), c.keys(j));
                let (x, y) = (&texts[i as usize], &texts[j as usize]);
                assert_eq!(a.region == b.region, (&x.0, &x.1) == (&y.0, &y.1));
                assert_eq!(a.ty == b.ty, x.3 == y.3);
            }
        }
        let regions: std::collections::HashSet<_> =
            (0..n).map(|i| (text(i).0, text(i).1)).collect();
        assert_eq!(c.region_count(), regions.len());
        assert!((0..n).all(|i| (c.keys(i).region as usize) < c.region_count()));
    }

    #[test]
    fn dates_round_trip_and_age() {
        let d = Date::parse("2026-11-30").unwrap();
        assert_eq!(Date::from_days(d.days()), d);
        assert_eq!(Date::parse("2026-12-02").unwrap().days() - d.days(), 2);
        assert_eq!(
            Date {
                y: 1970,
                m: 1,
                d: 1
            }
            .days(),
            0
        );
        assert_eq!(
            Date::parse("2024-03-01").unwrap().days() - Date::parse("2024-02-28").unwrap().days(),
            2
        );
        assert!(Date::parse("2026-13-01").is_none());
    }

    #[test]
    fn embedded_catalog_loads_cleanly_with_a_date() {
        let c = Catalog::embedded();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        for cloud in ["aws", "azure", "gcp", "lambda", "runpod", "vast", "local"] {
            let s = c.sources.iter().find(|s| s.cloud == cloud).unwrap();
            assert!(s.rows > 0, "{cloud} has no rows");
            assert!(s.taken.is_some(), "{cloud} has no taken date");
        }
        let names = c.accelerator_names();
        for gpu in [
            "H200",
            "H100",
            "A100-80GB",
            "A100",
            "L40S",
            "L4",
            "A10G",
            "T4",
            "V100",
            // The consumer and workstation GPUs of Lambda, RunPod and
            // Vast.ai, under the names nvidia-smi's become (gang::gpus).
            "RTX4090",
            "RTX5090",
            "A6000",
            "RTX6000Ada",
        ] {
            assert!(
                names.iter().any(|n| n == gpu),
                "{gpu} missing from {names:?}"
            );
        }
        assert!(c
            .with_accelerator(ANY_ACCELERATOR)
            .all(|o| o.cloud == "local"));
    }

    #[test]
    fn staleness_is_reported_after_90_days() {
        let mut c = Catalog::default();
        c.sources.push(Source {
            cloud: "aws".into(),
            origin: "x".into(),
            taken: Date::parse("2026-01-01"),
            rows: 1,
        });
        assert!(c
            .stale_sources(Date::parse("2026-03-31").unwrap())
            .is_empty());
        let stale = c.stale_sources(Date::parse("2026-04-02").unwrap());
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].1, 91);
    }

    #[test]
    fn bad_rows_in_own_format_are_reported_with_line() {
        let text = "# taken: 2026-01-01\ninstance_type,accelerator,accelerator_count,accelerator_memory_gib,vcpus,memory_gib,region,zone,price,spot_price,placement,efa\nx1,T4,1,16,4,16,r,r-a,0.5,,,false\nx2,T4,1,16,4,16,r,r-a,abc,,,false\nx3,T4\n";
        let (rows, taken, warnings) = parse_own("aws", text, "t.csv");
        assert_eq!(rows.len(), 1);
        assert_eq!(taken, Date::parse("2026-01-01"));
        assert_eq!(warnings.len(), 2);
        assert!(
            warnings[0].starts_with("t.csv:4: price: 'abc'"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1].starts_with("t.csv:5: expected 12 or 13 fields"),
            "{}",
            warnings[1]
        );
    }
}
