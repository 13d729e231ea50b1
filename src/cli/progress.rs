//! Renders provisioning events: a spinner on a terminal, plain lines
//! otherwise, nothing with `--output json`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use super::Output;
use crate::core::provision::{ProvisionEvent, Reporter};

/// The CLI's reporter.
pub(crate) struct Progress {
    mode: Mode,
    /// When a wait was last told as a line (plain output): a long wait is
    /// told at its 2nd second, then every [`CALM`].
    told: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often plain output tells a wait that goes on.
const CALM: std::time::Duration = std::time::Duration::from_secs(15);

/// Silent nodes named in full in one wait line; the rest are counted.
const NAMED: usize = 3;

/// `HH:MM:SS` UTC now, for plain lines.
fn stamp() -> String {
    let day = (crate::core::state::now_ms() / 1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", day / 3600, (day % 3600) / 60, day % 60)
}

/// What a first contact waits for: `2/4 answered; silent: rank 1 (10.0.0.2):
/// Connection refused, ...`.
fn reaching(st: &crate::core::transport::ssh::ContactState) -> String {
    let mut s = format!("{}/{} answered SSH", st.answered, st.total);
    if !st.silent.is_empty() {
        let named: Vec<String> = st
            .silent
            .iter()
            .take(NAMED)
            .map(|(who, said)| format!("{who}: {said}"))
            .collect();
        s += &format!("; still silent: {}", named.join("; "));
        if st.silent.len() > NAMED {
            s += &format!(" (and {} more)", st.silent.len() - NAMED);
        }
    }
    s
}

enum Mode {
    Quiet,
    Lines,
    Bar(ProgressBar),
}

impl Progress {
    /// Picks the mode from the output format and whether stderr is a terminal.
    pub(crate) fn new(out: Output) -> Progress {
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
        Progress {
            mode,
            told: std::sync::Mutex::new(None),
        }
    }

    /// A wait that goes on: the spinner's message on a terminal; a
    /// timestamped line now and then otherwise.
    fn waiting(&self, msg: String) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Bar(b) => b.set_message(msg),
            Mode::Lines => {
                let Ok(mut told) = self.told.lock() else {
                    return;
                };
                if told.is_none_or(|t| t.elapsed() >= CALM) {
                    *told = Some(std::time::Instant::now());
                    eprintln!("[{}] {msg}", stamp());
                }
            }
        }
    }

    /// The next wait starts afresh.
    fn wait_over(&self) {
        if let Ok(mut told) = self.told.lock() {
            *told = None;
        }
    }

    /// A line of its own (above the spinner on a terminal).
    pub(crate) fn line(&self, s: &str) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Lines => eprintln!("{s}"),
            Mode::Bar(b) if b.is_finished() => eprintln!("{s}"),
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
                self.wait_over();
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
            ProvisionEvent::Waiting(c, waited) => self.waiting(format!(
                "waiting for {}/{}/{} to start {} x {} ({}s)",
                c.cloud,
                c.region,
                c.zone,
                c.nodes,
                c.instance_type,
                waited.as_secs()
            )),
            ProvisionEvent::Reaching(c, st, waited) => {
                if let Mode::Bar(b) = &self.mode {
                    b.enable_steady_tick(std::time::Duration::from_millis(100));
                }
                self.waiting(format!(
                    "reaching {} node(s) on {}/{}/{} ({}s): {}",
                    st.total,
                    c.cloud,
                    c.region,
                    c.zone,
                    waited.as_secs(),
                    reaching(st)
                ))
            }
            ProvisionEvent::Up(c, n) => {
                self.wait_over();
                if let Mode::Bar(b) = &self.mode {
                    b.finish_and_clear();
                }
                self.line(&format!(
                    "Provisioned {n}/{} nodes on {}/{}/{}",
                    c.nodes, c.cloud, c.region, c.zone
                ))
            }
        }
    }
}

/// Shows a followed job log. On a terminal, the driver's setup lines become
/// a `setup n/N` bar; elsewhere every line is copied as it is.
pub(crate) struct LogView {
    tty: bool,
    bar: Option<ProgressBar>,
}

impl Default for LogView {
    fn default() -> Self {
        LogView::new()
    }
}

impl LogView {
    /// A view for this process's stdout and stderr.
    pub(crate) fn new() -> LogView {
        LogView {
            tty: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// One line, newline included.
    pub(crate) fn line(&mut self, line: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        if self.tty {
            let text = String::from_utf8_lossy(line);
            let text = text.trim_end_matches('\n');
            if let Some(n) = text
                .strip_prefix("gangway: setup on ")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                let bar = ProgressBar::new(n);
                bar.set_style(
                    ProgressStyle::with_template("setup {pos}/{len} nodes {wide_bar} [{elapsed}]")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                self.bar = Some(bar);
                return Ok(());
            }
            if let Some(bar) = &self.bar {
                if text.starts_with("gangway: setup done on rank ") {
                    bar.inc(1);
                    return Ok(());
                }
                if bar.position() >= bar.length().unwrap_or(0)
                    || text.starts_with("gangway: all ")
                    || text.starts_with("gangway: job ")
                {
                    bar.finish_and_clear();
                    self.bar = None;
                } else {
                    bar.println(String::from_utf8_lossy(&super::term::visible(
                        text.as_bytes(),
                    )));
                    return Ok(());
                }
            }
        }
        // Node output: control characters shown, not sent, on a terminal.
        let mut out = super::term::NodeOutput::stdout();
        out.write_all(line)?;
        out.flush()
    }

    /// Clears any bar.
    pub(crate) fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
