//! Renders provisioning events: a spinner on a terminal, plain lines
//! otherwise, nothing with `--output json`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use super::Output;
use crate::provision::{ProvisionEvent, Reporter};

/// The CLI's reporter.
pub struct Progress {
    mode: Mode,
}

enum Mode {
    Quiet,
    Lines,
    Bar(ProgressBar),
}

impl Progress {
    /// Picks the mode from the output format and whether stderr is a terminal.
    pub fn new(out: Output) -> Progress {
        let mode = if out == Output::Json {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            Mode::Bar(bar)
        } else {
            Mode::Lines
        };
        Progress { mode }
    }

    /// A line of its own (above the spinner on a terminal).
    pub fn line(&self, s: &str) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Lines => eprintln!("{s}"),
            Mode::Bar(b) => b.println(s),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Mode::Bar(b) = &self.mode {
            b.finish_and_clear();
        }
    }
}

impl Reporter for Progress {
    fn event(&self, e: ProvisionEvent<'_>) {
        match e {
            ProvisionEvent::Trying(c) => {
                let msg = format!(
                    "Provisioning {} x {} on {}/{}/{}{} (${:.2}/h)",
                    c.nodes,
                    c.instance_type,
                    c.cloud,
                    c.region,
                    c.zone,
                    if c.use_spot { " spot" } else { "" },
                    c.total_per_hour
                );
                match &self.mode {
                    Mode::Bar(b) => {
                        b.set_message(msg);
                        b.enable_steady_tick(std::time::Duration::from_millis(100));
                    }
                    _ => self.line(&msg),
                }
            }
            ProvisionEvent::Failed(c, why) => self.line(&format!(
                "  {}/{}/{} {}: {why}; trying the next placement",
                c.cloud, c.region, c.zone, c.instance_type
            )),
            ProvisionEvent::Retrying(c, e, d) => self.line(&format!(
                "  {}/{}/{}: {}; retrying in {:.1}s",
                c.cloud,
                c.region,
                c.zone,
                e.message,
                d.as_secs_f64()
            )),
            ProvisionEvent::Up(c, n) => {
                if let Mode::Bar(b) = &self.mode {
                    b.set_message(String::new());
                }
                self.line(&format!(
                    "Provisioned {n}/{} nodes on {}/{}/{}",
                    c.nodes, c.cloud, c.region, c.zone
                ))
            }
        }
    }
}
