//! How often spot offers are interrupted, and what that does to their cost.
//!
//! AWS publishes, per region and instance type, a bucket of how often its
//! spot instances were interrupted over the last month (the Spot Instance
//! Advisor feed: `<5%`, `5-10%`, `10-15%`, `15-20%`, `>20%`). The shipped
//! table (`data/aws-interruption.csv`) holds the buckets of the shipped AWS
//! types. Other clouds publish nothing comparable: their offers get
//! [`DEFAULT_BUCKET`], marked as a default (Azure shows eviction-rate
//! buckets only to a subscription, through Azure Resource Graph; with no
//! public copy to ship, Azure offers get the default too), and the
//! interruptible markets (RunPod, Vast.ai) the worst bucket,
//! [`MARKET_DEFAULT_BUCKET`], also marked as a default.
//!
//! A bucket becomes an hourly interruption rate through [`HOURLY_RATE`].
//! The feed's "share interrupted per month" read literally gives rates
//! near 0.0004 per hour, a thousand times below what the public preemption
//! traces show (0.2 to 1.3 interruptions per spot hour for AWS instances in
//! bucket `>20%`); the rates here are scaled so that `>20%` matches those
//! traces, the other buckets in proportion to their midpoints
//! (docs/catalog.md, "Spot risk", has the comparison with `gangway sim`).
//!
//! The expected cost of an hour of useful work on spot is the price over
//! the share of billed time that makes progress: each interruption costs
//! the restart overhead plus, on average, half a checkpoint interval.

use std::collections::HashMap;

/// The advisor's bucket labels, by bucket.
pub(crate) const BUCKETS: [&str; 5] = ["<5%", "5-10%", "10-15%", "15-20%", ">20%"];

/// Interruptions per spot-instance hour assumed for each bucket (see the
/// module docs for where they come from).
pub(crate) const HOURLY_RATE: [f64; 5] = [0.042, 0.125, 0.208, 0.292, 0.5];

/// The bucket of offers with no published one (GCP, other clouds, AWS
/// types the feed does not list): the middle one.
pub(crate) const DEFAULT_BUCKET: u8 = 2;

/// The clouds whose spot is a market of interruptible machines (RunPod's
/// interruptible pods, Vast.ai's bids, either taken by a higher bid) with
/// no published interruption rates: their offers get the worst bucket,
/// [`MARKET_DEFAULT_BUCKET`], marked as a default, so that a plan never
/// counts on them being steadier than AWS's worst.
pub(crate) const MARKET_CLOUDS: [&str; 2] = ["runpod", "vast"];

/// The conservative default of [`MARKET_CLOUDS`]: `>20%`.
pub(crate) const MARKET_DEFAULT_BUCKET: u8 = 4;

/// An offer's interruption bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Interruption {
    /// 0 (`<5%`) to 4 (`>20%`).
    pub(crate) bucket: u8,
    /// Whether it is [`DEFAULT_BUCKET`] for want of a published one.
    pub(crate) default: bool,
}

impl Interruption {
    /// The bucket's label, with `default` marked.
    pub(crate) fn label(&self) -> String {
        let l = BUCKETS[self.bucket.min(4) as usize];
        if self.default {
            format!("{l}?")
        } else {
            l.to_string()
        }
    }

    /// Interruptions per hour.
    pub(crate) fn hourly_rate(&self) -> f64 {
        HOURLY_RATE[self.bucket.min(4) as usize]
    }
}

/// The expected cost of one hour of useful work at `price` per hour, with
/// `rate` interruptions per hour, each losing `restart_h` plus half of
/// `checkpoint_h`. `None` when interruptions would leave no progress.
pub(crate) fn expected_cost(
    price: f64,
    rate: f64,
    restart_h: f64,
    checkpoint_h: f64,
) -> Option<f64> {
    let lost = rate * (restart_h + checkpoint_h / 2.0);
    (lost < 1.0).then(|| price / (1.0 - lost))
}

/// Interruption buckets by (cloud, region, instance type).
#[derive(Clone, Debug, Default)]
pub(crate) struct RiskTable {
    buckets: HashMap<(String, String, String), u8>,
    /// When the shipped buckets were taken.
    pub(crate) taken: Option<super::Date>,
}

const EMBEDDED_AWS: &str = include_str!("data/aws-interruption.csv");

impl RiskTable {
    /// The shipped table.
    pub(crate) fn embedded() -> RiskTable {
        let mut t = RiskTable::default();
        t.read("aws", EMBEDDED_AWS);
        t
    }

    /// Adds `cloud`'s buckets from `text` (`# taken: DATE`, then
    /// `region,instance_type,bucket` lines); returns how many.
    fn read(&mut self, cloud: &str, text: &str) -> usize {
        let mut n = 0;
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("# taken:") {
                self.taken = super::Date::parse(d);
                continue;
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if let [region, ty, bucket] = f[..] {
                if let Ok(b) = bucket.parse::<u8>() {
                    if b <= 4 {
                        self.buckets
                            .insert((cloud.into(), region.into(), ty.into()), b);
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Replaces the buckets of each cloud that has a `<cloud>.csv` in `dir`
    /// (what `catalog refresh` wrote: `$GANGWAY_HOME/interruptions`) with
    /// the file's. A file that lists nothing usable changes nothing.
    pub(crate) fn overlay_dir(&mut self, dir: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let (Some(cloud), Some("csv")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let mut fresh = RiskTable::default();
            if fresh.read(cloud, &text) > 0 {
                self.buckets.retain(|(c, _, _), _| c != cloud);
                self.buckets.extend(fresh.buckets);
                self.taken = fresh.taken.or(self.taken);
            }
        }
    }

    /// `rows` (region, instance type, bucket) as a file [`overlay_dir`]
    /// reads, dated `taken`, with `source` in a comment.
    pub(crate) fn to_csv(
        rows: &[(String, String, u8)],
        taken: super::Date,
        source: &str,
    ) -> String {
        let mut out = format!(
            "# taken: {taken}\n# interruption buckets from {source}: 0 <5%, 1 5-10%, 2 10-15%, 3 15-20%, 4 >20% of spot instances interrupted a month\nregion,instance_type,bucket\n"
        );
        for (region, ty, b) in rows {
            out.push_str(&format!("{region},{ty},{b}\n"));
        }
        out
    }

    /// The bucket of `ty` in `cloud`/`region`.
    pub(crate) fn interruption(&self, cloud: &str, region: &str, ty: &str) -> Interruption {
        match self
            .buckets
            .get(&(cloud.to_string(), region.to_string(), ty.to_string()))
        {
            Some(b) => Interruption {
                bucket: *b,
                default: false,
            },
            None => Interruption {
                bucket: if MARKET_CLOUDS.contains(&cloud) {
                    MARKET_DEFAULT_BUCKET
                } else {
                    DEFAULT_BUCKET
                },
                default: true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_loads_and_unknown_offers_get_the_default() {
        let t = RiskTable::embedded();
        assert_eq!(t.taken, super::super::Date::parse("2024-02-28"));
        // Facts from the 2024-02-28 advisor feed.
        let p4d = t.interruption("aws", "us-east-1", "p4d.24xlarge");
        assert_eq!((p4d.bucket, p4d.default), (4, false));
        assert_eq!(p4d.label(), ">20%");
        let g5 = t.interruption("aws", "us-east-1", "g5.xlarge");
        assert_eq!((g5.bucket, g5.default), (1, false));
        let gcp = t.interruption("gcp", "us-central1", "a2-highgpu-8g");
        assert_eq!((gcp.bucket, gcp.default), (DEFAULT_BUCKET, true));
        assert_eq!(gcp.label(), "10-15%?");
        let azure = t.interruption("azure", "eastus", "Standard_ND96amsr_A100_v4");
        assert_eq!((azure.bucket, azure.default), (DEFAULT_BUCKET, true));
        // No published rates for the interruptible markets: the worst
        // bucket, said to be a default.
        for cloud in ["runpod", "vast"] {
            let m = t.interruption(cloud, "US", "1x_RTX_4090");
            assert_eq!((m.bucket, m.default), (MARKET_DEFAULT_BUCKET, true));
            assert_eq!(m.label(), ">20%?");
        }
    }

    #[test]
    fn expected_cost_grows_with_rate_overhead_and_checkpoint_interval() {
        assert_eq!(expected_cost(10.0, 0.0, 0.5, 1.0), Some(10.0));
        // Half an hour lost per interruption, one an hour: half the time
        // makes progress.
        assert_eq!(expected_cost(10.0, 1.0, 0.25, 0.5), Some(20.0));
        let a = expected_cost(10.0, 0.5, 0.05, 0.5).unwrap();
        let b = expected_cost(10.0, 0.5, 0.05, 1.0).unwrap();
        assert!(a < b && a > 10.0, "{a} {b}");
        assert_eq!(expected_cost(10.0, 2.0, 0.5, 0.0), None);
    }
}
