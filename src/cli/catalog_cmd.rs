//! `gangway catalog show|refresh`.

use std::path::Path;

use clap::Subcommand;
use serde_json::json;

use super::{load_catalog, print_json, table, Output};
use crate::catalog::Date;
use crate::{Error, ExitCode};

/// Catalog actions.
#[derive(Debug, Subcommand)]
pub enum CatalogAction {
    /// Where each cloud's prices come from, when they were taken, rows and warnings.
    Show,
    /// Replace prices with live ones from the providers' APIs.
    Refresh {
        /// Only this cloud.
        #[arg(long)]
        cloud: Option<String>,
    },
}

/// Runs a catalog action.
pub fn run(action: CatalogAction, dir: Option<&Path>, out: Output) -> Result<ExitCode, Error> {
    match action {
        CatalogAction::Refresh { .. } => Err(Error::NotImplemented(
            "catalog refresh (live prices arrive with the AWS and GCP providers)".into(),
        )),
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
