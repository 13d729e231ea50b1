//! `gangway catalog show|refresh`.

use std::path::Path;

use clap::Subcommand;
use serde_json::json;

use super::{load_catalog, print_json, table, Output};
use crate::core::catalog::Date;
use crate::services;
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
    let home = super::launch::gangway_home()?;
    let providers = crate::core::registry::Providers::new(&home);
    let clouds = services::catalog::clouds(&providers, cloud)?;
    // (No "prices are old, run refresh" warning while refreshing.)
    let base = super::load_catalog_for(dir, |_| false)?;
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
        let wanted = services::catalog::regions(&base, c, regions)?;
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
        let done = services::catalog::refresh(&home, &base, c, provider.as_ref(), &wanted, &|r| {
            bar.set_message(r.to_string());
            bar.inc(1);
        });
        bar.finish_and_clear();
        let done = done?;
        if out == Output::Table {
            say(&done);
        }
        report.push(json!({
            "cloud": c, "regions": done.regions, "offerings": done.offerings,
            "on_demand_prices": done.on_demand, "spot_prices": done.spot,
            "interruption_buckets": done.buckets.as_ref().map_or(0, |b| b.0),
            "notes": done.notes, "path": done.path.display().to_string(),
        }));
    }
    if out == Output::Json {
        print_json(&json!({ "refreshed": report }))?;
    }
    Ok(ExitCode::Ok)
}

/// What a cloud's refresh wrote, for a person.
fn say(done: &services::catalog::Refreshed) {
    let c = &done.cloud;
    println!(
        "{c}: {} offering(s) in {} region(s), {} on-demand and {} spot price(s) from the API; wrote {}",
        done.offerings,
        done.regions.len(),
        done.on_demand,
        done.spot,
        done.path.display()
    );
    for n in &done.notes {
        if !n.starts_with(services::catalog::BUCKETS_NOT_REFRESHED) {
            println!("{c}: {n}");
        }
    }
    if let Some((count, path)) = &done.buckets {
        println!(
            "{c}: {count} interruption bucket(s) from the {c} API; wrote {}",
            path.display()
        );
    }
    for n in &done.notes {
        if n.starts_with(services::catalog::BUCKETS_NOT_REFRESHED) {
            println!("{c}: {n}");
        }
    }
}
