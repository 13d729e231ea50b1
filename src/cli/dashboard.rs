//! `gangway dashboard`: the web page, served until Ctrl-C.

use clap::Args;

use super::launch::gangway_home;
use super::Output;
use crate::services::dashboard;
use crate::{Error, ExitCode};

/// `gangway dashboard`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Port on 127.0.0.1 (0: any free one).
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// Open the page in the default browser.
    #[arg(long)]
    pub(crate) open: bool,
}

/// Serves the dashboard until Ctrl-C.
pub(crate) fn dashboard(a: &DashboardArgs, out: Output) -> Result<ExitCode, Error> {
    let home = gangway_home()?;
    let bound = dashboard::bind(&home, a.port)?;
    let url = bound.url();
    if out == Output::Json {
        super::print_json(&serde_json::json!({ "url": url }))?;
    } else {
        println!("Dashboard at {url}");
        println!("Only this address opens it (it carries the token); Ctrl-C stops it.");
    }
    {
        use std::io::Write;
        std::io::stdout().flush()?;
    }
    if a.open {
        open_browser(&url);
    }
    let rt = crate::core::runtime::runtime()?;
    rt.block_on(async {
        tokio::select! {
            r = bound.serve() => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })?;
    Ok(ExitCode::Ok)
}

/// Asks the desktop to open `url`; says so when it cannot (the address is
/// printed above either way).
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match started {
        // Reaped beside the server, so it leaves no zombie.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => eprintln!(
            "gangway: could not start {opener} to open the page ({e}); open the address above"
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    #[test]
    fn dashboard_flags_parse() {
        let c = Cli::try_parse_from(["gangway", "dashboard", "--port", "8080", "--open"]).unwrap();
        let Command::Dashboard(a) = c.command else {
            panic!("not the dashboard")
        };
        assert_eq!((a.port, a.open), (8080, true));
        let c = Cli::try_parse_from(["gangway", "dashboard"]).unwrap();
        let Command::Dashboard(a) = c.command else {
            panic!("not the dashboard")
        };
        assert_eq!((a.port, a.open), (0, false));
        assert!(Cli::try_parse_from(["gangway", "dashboard", "--port", "70000"]).is_err());
        assert!(Cli::try_parse_from(["gangway", "dashboard", "--port", "x"]).is_err());
    }
}
