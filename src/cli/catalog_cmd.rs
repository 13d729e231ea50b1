//! `gangway catalog show|refresh`.

use std::path::Path;

use clap::Subcommand;
use serde_json::json;

use super::{load_catalog, print_json, table, Output};
use crate::core::catalog::Date;
use crate::{Error, ExitCode};

/// Catalog actions.
#[derive(Debug, Subcommand)]
pub(crate) enum CatalogAction {
    /// Where each cloud's prices come from, when they were taken, rows and warnings.
    Show,
    /// Replace prices with live ones from the providers' APIs.
    Refresh {
        /// Only this cloud (default: every cloud with a live price API).
        #[arg(long)]
        cloud: Option<String>,
        /// Only these regions (comma-separated; default: every region the
        /// catalog lists for the cloud).
        #[arg(long, value_delimiter = ',')]
        regions: Vec<String>,
    },
}

/// Runs a catalog action.
pub(crate) fn run(
    action: CatalogAction,
    dir: Option<&Path>,
    out: Output,
) -> Result<ExitCode, Error> {
    match action {
        CatalogAction::Refresh { cloud, regions } => refresh(cloud.as_deref(), &regions, dir, out),
        CatalogAction::Show => {
            let c = load_catalog(dir)?;
            let today = Date::today();
            if out == Output::Json {
                print_json(&json!({
                    "sources": c.sources.iter().map(|s| json!({
                        "cloud": s.cloud,
                        "origin": s.origin,
                        "taken": s.taken.map(|d| d.to_string()),
                        "age_days": s.taken.map(|d| today.days() - d.days()),
                        "rows": s.rows,
                    })).collect::<Vec<_>>(),
                    "warnings": c.warnings,
                }))?;
                return Ok(ExitCode::Ok);
            }
            let rows: Vec<Vec<String>> = c
                .sources
                .iter()
                .map(|s| {
                    vec![
                        s.cloud.clone(),
                        s.rows.to_string(),
                        s.taken
                            .map(|d| d.to_string())
                            .unwrap_or_else(|| "unknown".into()),
                        s.taken
                            .map(|d| (today.days() - d.days()).to_string())
                            .unwrap_or_else(|| "-".into()),
                        s.origin.clone(),
                    ]
                })
                .collect();
            table::print(&["CLOUD", "ROWS", "TAKEN", "AGE (DAYS)", "SOURCE"], &rows)?;
            for w in &c.warnings {
                println!("skipped: {w}");
            }
            Ok(ExitCode::Ok)
        }
    }
}

/// `gangway catalog refresh`: asks each cloud's API which types its zones
/// sell and at what spot price, and writes the result as the user's
/// overlay, `$GANGWAY_HOME/catalog/<cloud>.csv`, which every later command
/// reads over the shipped catalog.
fn refresh(
    cloud: Option<&str>,
    regions: &[String],
    dir: Option<&Path>,
    out: Output,
) -> Result<ExitCode, Error> {
    use crate::core::registry::Providers;
    let home = super::launch::gangway_home()?;
    let providers = Providers::new(&home);
    // Clouds whose prices come from a live API.
    let live: Vec<&str> = providers
        .all()
        .filter(|(_, p)| p.has_price_api())
        .map(|(name, _)| name)
        .collect();
    let clouds: Vec<&str> = match cloud {
        Some(c) if live.contains(&c) => vec![c],
        Some(c) => {
            return Err(Error::usage(
                format!("'{c}' has no live price API to refresh from"),
                Some(&format!("clouds with one: {}", live.join(", "))),
            ))
        }
        None => live,
    };
    // (No "prices are old, run refresh" warning while refreshing.)
    let base = super::load_catalog_for(dir, |_| false)?;
    let rt = crate::core::runtime::runtime()?;
    let today = Date::today();
    let mut report = Vec::new();
    for c in clouds {
        let Some(provider) = providers.get(c) else {
            if cloud.is_some() {
                return Err(Error::usage(
                    format!("the {c} provider is not in this build"),
                    None,
                ));
            }
            eprintln!("{c}: skipped, the {c} provider is not in this build");
            continue;
        };
        let mut known: Vec<String> = base
            .offerings()
            .iter()
            .filter(|o| o.cloud == c)
            .map(|o| o.region.to_string())
            .collect();
        known.sort();
        known.dedup();
        let wanted: Vec<String> = if regions.is_empty() {
            known
        } else {
            for r in regions {
                if !known.contains(r) {
                    return Err(Error::usage(
                        format!("the catalog lists no {c} offerings in region '{r}'"),
                        Some(&format!("{c} regions in the catalog: {}", known.join(", "))),
                    ));
                }
            }
            regions.to_vec()
        };
        let mut types: Vec<String> = base
            .offerings()
            .iter()
            .filter(|o| o.cloud == c && wanted.iter().any(|r| o.region == *r))
            .map(|o| o.instance_type.to_string())
            .collect();
        types.sort();
        types.dedup();
        let bar = if out == Output::Table && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            indicatif::ProgressBar::new(wanted.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_prefix(c.to_string());
        let mut quotes = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for r in &wanted {
            bar.set_message(r.clone());
            let got = rt
                .block_on(provider.prices(&types, std::slice::from_ref(r)))
                .map_err(Error::from)?;
            quotes.extend(got.quotes);
            for n in got.notes {
                if !notes.contains(&n) {
                    notes.push(n);
                }
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        let rows = base.refreshed(c, &wanted, &quotes);
        let spot = quotes.iter().filter(|q| q.spot_price.is_some()).count();
        let on_demand = quotes.iter().filter(|q| q.price.is_some()).count();
        let refs: Vec<&crate::core::catalog::Offering> = rows.iter().collect();
        let note = format!(
            "{c}: offerings of {} from the {c} API on {today}, with {on_demand} on-demand and {spot} spot price(s) from it; other prices as before{}",
            wanted.join(" "),
            notes
                .iter()
                .map(|n| format!(" ({})", n.replace('\n', " ")))
                .collect::<String>()
        );
        let path = home.join("catalog").join(format!("{c}.csv"));
        write_atomic(
            &path,
            crate::core::catalog::Catalog::to_own_csv(&refs, today, &note).as_bytes(),
        )?;
        if out == Output::Table {
            println!(
                "{c}: {} offering(s) in {} region(s), {on_demand} on-demand and {spot} spot price(s) from the API; wrote {}",
                rows.len(),
                wanted.len(),
                path.display()
            );
            for n in &notes {
                println!("{c}: {n}");
            }
        }
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
                if out == Output::Table {
                    println!(
                        "{c}: {} interruption bucket(s) from the {c} API; wrote {}",
                        b.len(),
                        path.display()
                    );
                }
                b.len()
            }
            Ok(None) => 0,
            Err(e) => {
                let n = format!("interruption buckets not refreshed (kept as they were): {e}");
                if out == Output::Table {
                    println!("{c}: {n}");
                }
                notes.push(n);
                0
            }
        };
        report.push(json!({
            "cloud": c, "regions": wanted, "offerings": rows.len(),
            "on_demand_prices": on_demand, "spot_prices": spot,
            "interruption_buckets": buckets,
            "notes": notes, "path": path.display().to_string(),
        }));
    }
    if out == Output::Json {
        print_json(&json!({ "refreshed": report }))?;
    }
    Ok(ExitCode::Ok)
}

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
