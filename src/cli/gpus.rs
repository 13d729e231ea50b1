//! `gangway show-gpus`.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Args;
use serde::Serialize;
use serde_json::json;

use super::{load_catalog_for, print_json, table, Output};
use crate::core::catalog::risk::expected_cost;
use crate::core::catalog::{Catalog, Offering, ANY_ACCELERATOR};
use crate::core::spec::SpotRisk;
use crate::{Error, ExitCode};

/// `gangway show-gpus [NAME]`.
#[derive(Debug, Args)]
pub(crate) struct ShowGpusArgs {
    /// Only this GPU (case-insensitive), e.g. H100.
    pub(crate) name: Option<String>,
    /// Only this cloud.
    #[arg(long)]
    pub(crate) cloud: Option<String>,
}

/// The cheapest place for one market.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct Cheapest {
    /// USD per instance-hour.
    pub(crate) price: f64,
    /// Instance type.
    pub(crate) instance_type: String,
    /// Region.
    pub(crate) region: String,
    /// The price is the catalog's estimate, not a published figure.
    pub(crate) estimated: bool,
    /// Spot only: the offer's interruption bucket (see `optimize`).
    pub(crate) interruption: Option<String>,
    /// Spot only: expected cost of an hour of useful work, with the
    /// default restart overhead and checkpoint interval (see `optimize`).
    pub(crate) expected_cost: Option<f64>,
}

/// One row: a GPU, a count, a cloud.
#[derive(Debug, Serialize)]
pub(crate) struct GpuRow {
    /// GPU name.
    pub(crate) accelerator: String,
    /// GPUs per instance.
    pub(crate) count: f32,
    /// Memory per GPU, GiB.
    pub(crate) memory_gib: Option<f32>,
    /// Cloud.
    pub(crate) cloud: String,
    /// Cheapest on-demand.
    pub(crate) on_demand: Option<Cheapest>,
    /// Cheapest spot.
    pub(crate) spot: Option<Cheapest>,
}

fn better(
    cur: &mut Option<Cheapest>,
    price: Option<f64>,
    estimated: bool,
    risk: Option<(String, Option<f64>)>,
    o: &Offering,
) {
    if let Some(p) = price {
        if cur.as_ref().is_none_or(|c| p < c.price) {
            *cur = Some(Cheapest {
                price: p,
                instance_type: o.instance_type.to_string(),
                region: o.region.to_string(),
                estimated,
                interruption: risk.as_ref().map(|r| r.0.clone()),
                expected_cost: risk.and_then(|r| r.1),
            });
        }
    }
}

/// Groups the catalog by (GPU, count, cloud) with the cheapest prices.
pub(crate) fn gpu_rows(catalog: &Catalog, name: Option<&str>, cloud: Option<&str>) -> Vec<GpuRow> {
    let offerings = catalog.offerings();
    let mut rows: BTreeMap<(String, u32, String), GpuRow> = BTreeMap::new();
    for o in offerings {
        let Some(acc) = o.accelerator.as_deref() else {
            continue;
        };
        if acc == ANY_ACCELERATOR
            || name.is_some_and(|n| !n.eq_ignore_ascii_case(acc))
            || cloud.is_some_and(|c| c != o.cloud)
        {
            continue;
        }
        let key = (
            acc.to_string(),
            (o.accelerator_count * 100.0) as u32,
            o.cloud.to_string(),
        );
        let row = rows.entry(key).or_insert_with(|| GpuRow {
            accelerator: acc.to_string(),
            count: o.accelerator_count,
            memory_gib: o.accelerator_memory_gib,
            cloud: o.cloud.to_string(),
            on_demand: None,
            spot: None,
        });
        better(&mut row.on_demand, o.price, o.estimated.price, None, o);
        if let Some(spot) = o.spot_price {
            let i = catalog.interruption(o);
            let expected = expected_cost(
                spot,
                i.hourly_rate(),
                SpotRisk::DEFAULT_RESTART_MINUTES / 60.0,
                SpotRisk::DEFAULT_CHECKPOINT_MINUTES / 60.0,
            );
            let risk = Some((i.label(), expected));
            better(&mut row.spot, o.spot_price, o.estimated.spot, risk, o);
        }
    }
    rows.into_values().collect()
}

/// `gangway show-gpus`.
pub(crate) fn show_gpus(
    a: &ShowGpusArgs,
    catalog_dir: Option<&Path>,
    out: Output,
) -> Result<ExitCode, Error> {
    // Stale prices matter only for the clouds the listing shows.
    let catalog = load_catalog_for(catalog_dir, |c| a.cloud.as_deref().is_none_or(|x| x == c))?;
    let rows = gpu_rows(&catalog, a.name.as_deref(), a.cloud.as_deref());
    if rows.is_empty() {
        let names = catalog.accelerator_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let hint = a
            .name
            .as_deref()
            .and_then(|n| crate::core::spec::closest_name(n, &refs))
            .map(|n| format!("did you mean '{n}'?"))
            .unwrap_or_else(|| format!("known GPUs: {}", names.join(", ")));
        return Err(Error::Usage {
            message: format!(
                "no GPU offering matches {}{}",
                a.name.as_deref().unwrap_or("any GPU"),
                a.cloud
                    .as_deref()
                    .map(|c| format!(" on {c}"))
                    .unwrap_or_default()
            ),
            hint: Some(hint),
        });
    }
    if out == Output::Json {
        print_json(&json!({ "gpus": rows }))?;
        return Ok(ExitCode::Ok);
    }
    let price = |c: &Option<Cheapest>| match c {
        Some(c) => format!(
            "{:.2}{} ({}, {}{})",
            c.price,
            super::est(c.estimated),
            c.instance_type,
            c.region,
            match (&c.interruption, c.expected_cost) {
                (Some(i), Some(e)) => format!(", interrupted {i}/mo, expected {e:.2}"),
                (Some(i), None) => format!(", interrupted {i}/mo"),
                _ => String::new(),
            }
        ),
        None => "-".into(),
    };
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.accelerator.clone(),
                format!("{}", r.count),
                r.memory_gib
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "-".into()),
                r.cloud.clone(),
                price(&r.on_demand),
                price(&r.spot),
            ]
        })
        .collect();
    table::print(
        &[
            "GPU",
            "COUNT",
            "GIB/GPU",
            "CLOUD",
            "CHEAPEST ON-DEMAND $/H",
            "CHEAPEST SPOT $/H",
        ],
        &table_rows,
    )?;
    let estimated = |c: &Option<Cheapest>| c.as_ref().is_some_and(|c| c.estimated);
    if rows
        .iter()
        .any(|r| estimated(&r.on_demand) || estimated(&r.spot))
    {
        println!("{}", super::EST_NOTE);
    }
    Ok(ExitCode::Ok)
}
