//! Command-line interface: clap definitions, dispatch, and output.
//!
//! Each command returns `Result<ExitCode, Error>`; `main` prints errors.

mod catalog_cmd;
mod check;
mod cluster;
mod cost;
mod dashboard;
mod gpus;
mod interrupts;
mod jobs;
mod launch;
mod plan;
mod progress;
mod sim;
mod table;
mod term;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::core::catalog::{Catalog, Date};
use crate::{Error, ExitCode};

pub(crate) use plan::TaskArgs;

/// Multi-cloud GPU launcher for training runs.
#[derive(Debug, Parser)]
#[command(name = "gangway", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG also works.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,

    /// Load a catalog directory (SkyPilot v8 `<cloud>/vms.csv` or gangway `<cloud>.csv`)
    /// over the embedded one.
    #[arg(long, global = true, env = "GANGWAY_CATALOG_DIR", value_name = "DIR")]
    pub(crate) catalog: Option<PathBuf>,

    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Human-readable tables and lines.
    Table,
    /// One JSON document on stdout.
    Json,
}

/// gangway's commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Launch a task: optimize, provision, set up and run.
    Launch(LaunchArgs),
    /// Run a task or command on an existing cluster.
    Exec(cluster::ExecArgs),
    /// Show clusters.
    Status(cluster::StatusArgs),
    /// Show a cluster's job queue.
    Queue(cluster::QueueArgs),
    /// Show or follow a job's logs.
    Logs(cluster::LogsArgs),
    /// Cancel a job on a cluster.
    Cancel(cluster::CancelArgs),
    /// Tear clusters down (terminate every node).
    Down(cluster::DownArgs),
    /// Stop a cluster (keep disks).
    Stop(cluster::NamesArgs),
    /// Start a stopped cluster.
    Start(cluster::NamesArgs),
    /// Stop or tear down a cluster after it is idle.
    Autostop(cluster::AutostopArgs),
    /// Managed jobs that survive preemption.
    Jobs {
        /// What to do.
        #[command(subcommand)]
        action: jobs::JobsCommand,
    },
    /// Check credentials and which clouds can be used.
    Check(check::CheckArgs),
    /// What clusters and managed jobs cost (node-hours by market, at the plan's prices).
    CostReport(cost::CostReportArgs),
    /// Clusters, managed jobs, costs and events in the browser (127.0.0.1, with a token).
    Dashboard(dashboard::DashboardArgs),
    /// GPU types, counts and cheapest prices by cloud.
    #[command(name = "show-gpus")]
    ShowGpus(gpus::ShowGpusArgs),
    /// Print the ranked failover plan for a task without launching.
    Optimize(OptimizeArgs),
    /// Replay spot-availability traces: what spot/on-demand policies cost against a deadline.
    Sim(sim::SimArgs),
    /// Inspect or refresh the price catalog.
    Catalog {
        /// What to do.
        #[command(subcommand)]
        action: catalog_cmd::CatalogAction,
    },
    /// Print shell completions.
    Completions {
        /// Shell.
        shell: clap_complete::Shell,
    },
    /// Internal: drive a job (started detached by launch and exec).
    #[command(name = "__drive", hide = true)]
    Drive {
        /// Job id.
        job: i64,
    },
    /// Internal: the managed-job controller (started on demand).
    #[command(name = "__jobs-controller", hide = true)]
    JobsController,
    /// Internal, on a controller host: keeps the controller running.
    #[command(name = "__controller-supervisor", hide = true)]
    ControllerSupervisor,
    /// Internal, on a controller host: stops its supervisor and controller.
    #[command(name = "__controller-stop", hide = true)]
    ControllerStop,
    /// Internal: wait for a cluster to be idle, then stop it.
    #[command(name = "__autostop", hide = true)]
    AutostopWatch {
        /// Cluster.
        cluster: String,
    },
}

/// `gangway optimize`.
#[derive(Debug, Args)]
pub(crate) struct OptimizeArgs {
    /// The task and overrides.
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    /// Rows shown in the table (0: all). JSON always has every row.
    #[arg(long, default_value_t = 20)]
    pub(crate) limit: usize,
    /// Instance types kept per cloud and region.
    #[arg(long, default_value_t = crate::core::optimizer::DEFAULT_TYPES_PER_REGION)]
    pub(crate) types_per_region: usize,
}

/// `gangway launch`.
#[derive(Debug, Args)]
pub(crate) struct LaunchArgs {
    /// The task and overrides.
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    /// Only print the plan.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Cluster name.
    #[arg(short = 'c', long)]
    pub(crate) cluster: Option<String>,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Return once the run has started.
    #[arg(short = 'd', long)]
    pub(crate) detach: bool,
    /// Tear the cluster down after the run.
    #[arg(long)]
    pub(crate) down: bool,
    /// Provision the nodes and stop: no setup, no run, no SSH yet (run
    /// later with `exec`; the first command meets the nodes).
    #[arg(long, conflicts_with_all = ["detach", "down"])]
    pub(crate) provision_only: bool,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    let out = cli.output;
    match cli.command {
        Command::Optimize(a) => plan::optimize(&a, cli.catalog.as_deref(), out, a.limit),
        Command::Launch(a) => launch::launch(&a, cli.catalog.as_deref(), out),
        Command::ShowGpus(a) => gpus::show_gpus(&a, cli.catalog.as_deref(), out),
        Command::Sim(a) => sim::sim(&a, out),
        Command::Catalog { action } => catalog_cmd::run(action, cli.catalog.as_deref(), out),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            let mut stdout = std::io::stdout().lock();
            clap_complete::generate(shell, &mut cmd, "gangway", &mut stdout);
            stdout.flush()?;
            Ok(ExitCode::Ok)
        }
        Command::Exec(a) => cluster::exec(&a, out),
        Command::Status(a) => cluster::status(&a, out),
        Command::Queue(a) => cluster::queue(&a, out),
        Command::Logs(a) => cluster::logs(&a),
        Command::Cancel(a) => cluster::cancel(&a, out),
        Command::Down(a) => cluster::down(&a, out),
        Command::Stop(a) => cluster::stop(&a, out),
        Command::Start(a) => cluster::start(&a, out),
        Command::Autostop(a) => cluster::autostop(&a, out),
        Command::Drive { job } => launch::drive(job),
        Command::AutostopWatch { cluster } => cluster::autostop_watch(&cluster),
        Command::Jobs { action } => jobs::run(action, cli.catalog.as_deref(), out),
        Command::JobsController => jobs::controller_main(),
        Command::ControllerSupervisor => jobs::supervisor_main(),
        Command::ControllerStop => jobs::controller_stop_main(),
        Command::Check(a) => check::check(&a, out),
        Command::CostReport(a) => cost::cost_report(&a, out),
        Command::Dashboard(a) => dashboard::dashboard(&a, out),
    }
}

/// The embedded catalog, overlaid with `dir` if given; warns on stderr
/// about stale prices and skipped rows.
pub(crate) fn load_catalog(dir: Option<&std::path::Path>) -> Result<Catalog, Error> {
    load_catalog_for(dir, |_| true)
}

/// Like [`load_catalog`], but only warns about stale prices of the clouds
/// `relevant` picks (a launch on `local` need not hear about GCP's prices).
pub(crate) fn load_catalog_for(
    dir: Option<&std::path::Path>,
    relevant: impl Fn(&str) -> bool,
) -> Result<Catalog, Error> {
    let home = launch::gangway_home().ok();
    let c = crate::core::context::load_catalog(home.as_deref(), dir)?;
    let today = Date::today();
    let stale: Vec<_> = c
        .stale_sources(today)
        .into_iter()
        .filter(|(s, _)| relevant(&s.cloud))
        .collect();
    let clouds: Vec<&str> = stale.iter().map(|(s, _)| s.cloud.as_str()).collect();
    let due = stale_warnings_due(home.as_deref(), &clouds, today);
    for (s, age) in stale {
        if !due.iter().any(|c| *c == s.cloud) {
            continue;
        }
        eprintln!(
            "warning: {} prices from {} were taken on {} ({age} days ago); \
             run `gangway catalog refresh --cloud {}` or pass --catalog DIR with newer prices",
            s.cloud,
            s.origin,
            s.taken.map(|d| d.to_string()).unwrap_or_default(),
            s.cloud
        );
    }
    if let Some(first) = c.warnings.first() {
        eprintln!(
            "warning: skipped {} catalog row(s) that could not be used (first: {first}); \
             `gangway catalog show` lists them all",
            c.warnings.len()
        );
    }
    Ok(c)
}

/// Of `clouds` (whose prices are stale), those not yet warned about today
/// in this `$GANGWAY_HOME`, recording them as warned: each cloud's warning
/// comes at most once a day (per cloud, so a command that touches another
/// cloud still hears about it). Without a home, or one that cannot be
/// written, every warning is due.
fn stale_warnings_due<'a>(
    home: Option<&std::path::Path>,
    clouds: &[&'a str],
    today: Date,
) -> Vec<&'a str> {
    let Some(home) = home.filter(|_| !clouds.is_empty()) else {
        return clouds.to_vec();
    };
    let file = home.join("cache").join("stale-warned");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    // One `cloud YYYY-MM-DD` line per cloud warned about.
    let mut warned: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(c, d)| (c.to_string(), d.trim().to_string()))
        .collect();
    let today_s = today.to_string();
    let due: Vec<&str> = clouds
        .iter()
        .copied()
        .filter(|c| !warned.iter().any(|(w, d)| w == c && *d == today_s))
        .collect();
    if due.is_empty() {
        return due;
    }
    warned.retain(|(c, _)| !due.contains(&c.as_str()));
    warned.extend(due.iter().map(|c| (c.to_string(), today_s.clone())));
    let body: String = warned.iter().map(|(c, d)| format!("{c} {d}\n")).collect();
    let saved =
        std::fs::create_dir_all(home.join("cache")).and_then(|_| std::fs::write(&file, body));
    if let Err(e) = saved {
        tracing::debug!("{}: {e}", file.display());
    }
    due
}

/// What the mark means, printed under a table that has one.
pub(crate) const EST_NOTE: &str = "est. = an estimate, not a published price \
     (src/core/catalog/data/SOURCES.md says how; `gangway catalog refresh` replaces it)";

/// The mark after an estimated price in tables (see
/// [`crate::core::catalog::Estimated`]).
pub(crate) fn est(estimated: bool) -> &'static str {
    if estimated {
        " est."
    } else {
        ""
    }
}

/// A moment as `HH:MM:SS UTC`, with how far away it is.
pub(crate) fn clock_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let day = secs.rem_euclid(86_400);
    let delta = (ms - crate::core::state::now_ms()) / 1000;
    let rel = match delta {
        d if d <= 0 => "now".to_string(),
        d if d < 60 => format!("in {d}s"),
        d if d < 3600 => format!("in {}m{:02}s", d / 60, d % 60),
        d => format!("in {}h{:02}m", d / 3600, (d % 3600) / 60),
    };
    format!(
        "{:02}:{:02}:{:02} UTC ({rel})",
        day / 3600,
        (day % 3600) / 60,
        day % 60
    )
}

pub(crate) fn print_json(v: &serde_json::Value) -> Result<(), Error> {
    // Buffered: stdout is line-buffered, and a pretty document has many lines.
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    serde_json::to_writer_pretty(&mut stdout, v).map_err(std::io::Error::from)?;
    writeln!(stdout)?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn output_flag_parses_and_rejects_unknown() {
        let c = Cli::try_parse_from(["gangway", "optimize", "t.yaml", "--output", "json"]).unwrap();
        assert_eq!(c.output, Output::Json);
        assert!(Cli::try_parse_from(["gangway", "optimize", "t.yaml", "-o", "xml"]).is_err());
    }

    #[test]
    fn verbose_counts() {
        let c = Cli::try_parse_from(["gangway", "-vv", "show-gpus"]).unwrap();
        assert_eq!(c.verbose, 2);
    }

    #[test]
    fn launch_flags_parse() {
        let c = Cli::try_parse_from([
            "gangway",
            "launch",
            "t.yaml",
            "-c",
            "x",
            "--gpus",
            "A100:8",
            "--num-nodes",
            "2",
            "--use-spot",
            "--env",
            "A=1",
            "-y",
            "-d",
            "--down",
            "--dry-run",
        ])
        .unwrap();
        let Command::Launch(a) = c.command else {
            panic!("not launch")
        };
        assert!(a.dry_run && a.yes && a.detach && a.down);
        assert_eq!(a.cluster.as_deref(), Some("x"));
        assert_eq!(a.task.gpus.as_deref(), Some("A100:8"));
        assert_eq!(a.task.num_nodes, Some(2));
        assert!(a.task.use_spot);
        assert_eq!(a.task.env, vec!["A=1"]);
    }

    #[test]
    fn num_nodes_must_be_positive() {
        assert!(
            Cli::try_parse_from(["gangway", "optimize", "t.yaml", "--num-nodes", "0"]).is_err()
        );
    }
}
