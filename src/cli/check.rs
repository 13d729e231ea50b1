//! `gangway check`: which clouds this machine can use, as whom, and what to
//! do about the ones it cannot.

use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::launch::{gangway_home, runtime};
use super::{print_json, table, Output};
use crate::core::registry::Providers;
use crate::{Error, ExitCode};

/// `gangway check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Only these clouds (default: every provider in this build).
    pub(crate) clouds: Vec<String>,
}

/// How long one provider may take to answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `gangway check`. Exit 0 when every cloud asked about is usable,
/// 4 (credentials) otherwise.
pub(crate) fn check(a: &CheckArgs, out: Output) -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let providers = Providers::new(&home);
    let known: Vec<&str> = providers.all().map(|(n, _)| n).collect();
    for c in &a.clouds {
        if !known.contains(&c.as_str()) {
            return Err(Error::usage(
                format!("no provider named '{c}' in this build"),
                Some(&format!("known: {}", known.join(", "))),
            ));
        }
    }
    let rt = runtime()?;
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    let mut all_ok = true;
    let mut hints: Vec<String> = Vec::new();
    for (name, p) in providers.all() {
        if !a.clouds.is_empty() && !a.clouds.iter().any(|c| c == name) {
            continue;
        }
        let report = rt.block_on(async { tokio::time::timeout(CHECK_TIMEOUT, p.check()).await });
        let (ok, identity, regions, hint) = match report {
            Ok(Ok(r)) => (r.ok, r.identity, r.regions, r.hint),
            Ok(Err(e)) => (false, None, Vec::new(), Some(e.to_string())),
            Err(_) => (
                false,
                None,
                Vec::new(),
                Some(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
            ),
        };
        all_ok &= ok;
        let shown_regions = match regions.len() {
            0 => "-".to_string(),
            n if n <= 3 => regions.join(", "),
            n => format!("{}, ... ({n})", regions[..3].join(", ")),
        };
        rows.push(vec![
            name.to_string(),
            if ok { "ok" } else { "NOT USABLE" }.to_string(),
            identity.clone().unwrap_or_else(|| "-".into()),
            shown_regions,
        ]);
        if let Some(h) = &hint {
            hints.push(format!("{name}: {h}"));
        }
        docs.push(json!({
            "cloud": name, "ok": ok, "identity": identity, "regions": regions, "hint": hint,
        }));
    }
    // Whose cloud resources this installation's are: the tag a
    // `down --orphans` sweep matches.
    let owner = crate::core::state::owner(&home)?;
    if out == Output::Json {
        print_json(&json!({ "clouds": docs, "owner": owner }))?;
    } else {
        table::print(&["CLOUD", "STATUS", "IDENTITY", "REGIONS"], &rows)?;
        for h in &hints {
            println!("\n{h}");
        }
        println!(
            "\nowner id: {owner} (in {}; tagged on every cloud resource as gangway-owner; `gangway down --orphans` sweeps only it)",
            home.join(crate::core::state::OWNER_FILE).display()
        );
    }
    Ok(if all_ok {
        ExitCode::Ok
    } else {
        ExitCode::Credentials
    })
}
