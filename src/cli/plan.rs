//! `gangway optimize` and `gangway launch --dry-run`.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;

use super::{est, load_catalog_for, print_json, table, OptimizeArgs, Output};
use crate::core::catalog::Catalog;
use crate::core::optimizer::{self, Blocklist, Candidate, Options};
use crate::core::spec::{self, Choice, OverrideError, Overrides, ResourceSpec, Task};
use crate::{Error, ExitCode};

/// A task file and the flags that override it.
#[derive(Debug, Args)]
pub(crate) struct TaskArgs {
    /// The task file (YAML).
    #[arg(value_name = "TASK.yaml")]
    pub(crate) task: PathBuf,
    /// Where to run: cloud[/region[/zone]], `*` for any part.
    #[arg(long)]
    pub(crate) infra: Option<String>,
    /// GPUs per node, e.g. A100:8 (replaces the task's accelerators).
    #[arg(long)]
    pub(crate) gpus: Option<String>,
    /// vCPUs per node, e.g. 8 or 8+.
    #[arg(long)]
    pub(crate) cpus: Option<String>,
    /// Memory per node in GiB, e.g. 64+.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Exact instance type.
    #[arg(long)]
    pub(crate) instance_type: Option<String>,
    /// Number of nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) num_nodes: Option<u32>,
    /// Use spot instances.
    #[arg(long)]
    pub(crate) use_spot: bool,
    /// Set an env value: KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub(crate) env: Vec<String>,
    /// Read env values from a dotenv file.
    #[arg(long, value_name = "FILE")]
    pub(crate) env_file: Option<PathBuf>,
    /// Set a secret: KEY=VALUE, or KEY alone to take the value of KEY from
    /// gangway's own environment, off the command line (repeatable; never
    /// printed).
    #[arg(long = "secret", value_name = "KEY[=VALUE]")]
    pub(crate) secret: Vec<String>,
    /// Read secrets from a file of KEY=VALUE lines (`#` comments, optional
    /// `export `); --secret values win.
    #[arg(long, value_name = "FILE")]
    pub(crate) secret_file: Option<PathBuf>,
}

impl TaskArgs {
    /// Loads the task and applies every override. Missing env values are
    /// left as they are; see [`Task::missing_values`].
    pub(crate) fn load(&self) -> Result<Task, Error> {
        // Flags first: a wrong flag is reported before the file is read.
        let overrides = self.overrides();
        overrides.check().map_err(override_error)?;
        let mut task = spec::load(&self.task)?;
        let mut envs = Vec::new();
        if let Some(f) = &self.env_file {
            envs.extend(spec::read_env_file(f).map_err(|e| Error::usage(e, None))?);
        }
        for e in &self.env {
            envs.push(
                spec::parse_assignment(e).map_err(|m| {
                    Error::usage(format!("--env: {m}"), Some("write --env KEY=VALUE"))
                })?,
            );
        }
        task.set_envs(&envs);
        let mut secrets = Vec::new();
        if let Some(f) = &self.secret_file {
            secrets.extend(spec::read_secret_file(f).map_err(|e| Error::usage(e, None))?);
        }
        for s in &self.secret {
            secrets.push(secret_arg(s)?);
        }
        task.set_secrets(&secrets);
        overrides.apply(&mut task).map_err(override_error)?;
        Ok(task)
    }

    /// The resource flags, as data a managed job keeps.
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            infra: self.infra.clone(),
            gpus: self.gpus.clone(),
            cpus: self.cpus.clone(),
            memory: self.memory.clone(),
            instance_type: self.instance_type.clone(),
            num_nodes: self.num_nodes,
            use_spot: self.use_spot,
        }
    }
}

fn override_error(e: OverrideError) -> Error {
    Error::Usage {
        message: e.to_string(),
        hint: e.hint,
    }
}

/// One `--secret`: `KEY=VALUE`, or `KEY` to read it from gangway's own
/// environment. Errors never echo a value.
pub(crate) fn secret_arg(s: &str) -> Result<(String, String), Error> {
    let name = s.split('=').next().unwrap_or("");
    if !crate::core::spec::valid_env_name(name) {
        return Err(Error::usage(
            format!("--secret {name}: not a valid environment variable name"),
            Some("letters, digits and _, not starting with a digit: --secret KEY or --secret KEY=VALUE"),
        ));
    }
    if !s.contains('=') {
        return match std::env::var(name) {
            Ok(v) => Ok((name.to_string(), v)),
            Err(_) => Err(Error::usage(
                format!("--secret {name}: {name} is not set in gangway's environment"),
                Some(&format!(
                    "export {name} first, or use --secret-file FILE (keeps it off the command line)"
                )),
            )),
        };
    }
    spec::parse_assignment(s).map_err(|_| {
        Error::usage(
            format!("--secret {name}=...: expected KEY=VALUE with a valid name"),
            Some("write --secret KEY=VALUE, or --secret KEY to take it from your environment"),
        )
    })
}

/// The clouds a task is pinned to, if every alternative pins one.
fn pinned_clouds(task: &Task) -> Option<Vec<String>> {
    let specs: Vec<ResourceSpec> = match &task.resources.choice {
        Choice::AnyOf(items) | Choice::Ordered(items) => {
            items.iter().map(|i| i.over(&task.resources.base)).collect()
        }
        _ => vec![task.resources.base.clone()],
    };
    specs.iter().map(|s| s.infra.cloud.clone()).collect()
}

/// Builds the plan for a task.
pub(crate) fn plan(
    args: &TaskArgs,
    catalog_dir: Option<&Path>,
    types_per_region: usize,
) -> Result<(Task, Vec<Candidate>), Error> {
    plan_with_catalog(args, catalog_dir, types_per_region).map(|(t, p, _)| (t, p))
}

/// [`plan`], handing back the catalog it planned with.
fn plan_with_catalog(
    args: &TaskArgs,
    catalog_dir: Option<&Path>,
    types_per_region: usize,
) -> Result<(Task, Vec<Candidate>, Catalog), Error> {
    let task = args.load()?;
    // Stale prices matter only for the clouds the task may land on.
    let pinned = pinned_clouds(&task);
    let catalog = load_catalog_for(catalog_dir, |cloud| {
        pinned.as_ref().is_none_or(|p| p.iter().any(|c| c == cloud))
    })?;
    let opts = Options {
        types_per_region: types_per_region.max(1),
        ..Options::default()
    };
    tracing::info!(
        offerings = catalog.offerings().len(),
        clouds = catalog.sources.len(),
        "catalog loaded"
    );
    let started = std::time::Instant::now();
    let result = optimizer::optimize(&task, &catalog, &Blocklist::default(), &opts);
    tracing::info!(
        candidates = result.as_ref().map_or(0, Vec::len),
        elapsed_us = started.elapsed().as_micros() as u64,
        "optimized"
    );
    let plan = result.map_err(|why| Error::NoResources {
        task: task.display_name(&args.task),
        why,
    })?;
    Ok((task, plan, catalog))
}

/// `gangway optimize`.
pub(crate) fn optimize(
    a: &OptimizeArgs,
    catalog_dir: Option<&Path>,
    out: Output,
    limit: usize,
) -> Result<ExitCode, Error> {
    let (task, plan, catalog) = plan_with_catalog(&a.task, catalog_dir, a.types_per_region)?;
    // The process ends after this command: freeing a 90,000-row catalog
    // row by row cost 2 ms of a 25 ms `optimize --catalog`; the kernel
    // reclaims it at exit in one go.
    std::mem::forget(catalog);
    render(&task, &a.task.task, &plan, out, limit)?;
    Ok(ExitCode::Ok)
}

/// Refuses a task whose required env or secret values were not given.
pub(crate) fn require_values(task: &Task, path: &Path) -> Result<(), Error> {
    let missing = task.missing_values();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::usage(
        format!("{}: no value for {}", path.display(), missing.join(", ")),
        Some("give each with --env KEY=VALUE or --secret KEY=VALUE, or list them in --env-file"),
    ))
}

/// Prints a plan.
pub(crate) fn render(
    task: &Task,
    path: &Path,
    plan: &[Candidate],
    out: Output,
    limit: usize,
) -> Result<(), Error> {
    if out == Output::Json {
        return print_json(&json!({ "plan": plan }));
    }
    let missing = task.missing_values();
    if !missing.is_empty() {
        eprintln!(
            "note: {} must be given with --env/--secret before launch",
            missing.join(", ")
        );
    }
    let best = &plan[0];
    println!(
        "Plan for '{}': {} node{}, {} candidate{}; cheapest {} {} at ${:.2}/h",
        task.display_name(path),
        task.num_nodes,
        if task.num_nodes == 1 { "" } else { "s" },
        plan.len(),
        if plan.len() == 1 { "" } else { "s" },
        best.cloud,
        best.instance_type,
        best.total_per_hour
    );
    let shown = if limit == 0 {
        plan.len()
    } else {
        limit.min(plan.len())
    };
    let spot = plan[..shown].iter().any(|c| c.use_spot);
    let rows: Vec<Vec<String>> = plan[..shown]
        .iter()
        .map(|c| {
            let mut row = vec![
                c.cloud.clone(),
                c.region.clone(),
                c.zone.clone(),
                c.instance_type.clone(),
                match &c.accelerator {
                    Some(a) => format!("{a}:{}", c.accelerator_count),
                    None => "-".into(),
                },
                if c.use_spot { "yes" } else { "no" }.into(),
                format!("{:.4}{}", c.price_per_node_hour, est(c.price_estimated)),
                format!("{:.4}{}", c.total_per_hour, est(c.price_estimated)),
            ];
            if spot {
                row.push(c.interruption.clone().unwrap_or_else(|| "-".into()));
                row.push(
                    c.expected_cost_per_node_hour
                        .map_or_else(|| "-".into(), |e| format!("{e:.4}")),
                );
            }
            row
        })
        .collect();
    let mut headers = vec![
        "CLOUD",
        "REGION",
        "ZONE",
        "INSTANCE TYPE",
        "GPUS",
        "SPOT",
        "$/H PER NODE",
        "$/H TOTAL",
    ];
    if spot {
        // Interrupted share per month (AWS Spot Advisor; `?`: a default),
        // and the expected cost of a node's useful hour.
        headers.extend(["INTERRUPTED/MO", "EXPECTED $/H"]);
    }
    table::print(&headers, &rows)?;
    if shown < plan.len() {
        println!("... and {} more (--limit 0 shows all)", plan.len() - shown);
    }
    if plan[..shown].iter().any(|c| c.price_estimated) {
        println!("{}", super::EST_NOTE);
    }
    Ok(())
}
