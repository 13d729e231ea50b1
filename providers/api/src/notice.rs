//! Spot notice watchers: shell scripts run on a node over the core's
//! connection (nothing of gangway is installed there), each a cloud's part
//! (how to ask its metadata service for a notice, and how to read the
//! answer) before the loop they all share (`templates/notice-watch.sh`:
//! `--once`, or polling until a notice, then reporting it).

use crate::{sh_quote, NodeRow, NOTICE_MARK};

/// The loop every watcher shares, run after a cloud's part; its header says
/// what that part sets and defines (`DEFAULT_POLL_S`, `UNREACHABLE`,
/// `check`).
pub const WATCH_LOOP: &str = include_str!("../templates/notice-watch.sh");

/// One cloud's spot notice watcher.
#[derive(Clone, Copy, Debug)]
pub struct Watcher {
    /// Its name (the script's `$0`), e.g. `aws-spot-watch`.
    pub name: &'static str,
    /// The cloud's part: its endpoint, headers and `check`, which asks once
    /// and reads the answer.
    pub check: &'static str,
    /// The variable that points it at another metadata service; a node's
    /// `env.<VAR>` fact (tests) is passed on to it.
    pub endpoint_var: &'static str,
    /// What the notice is called in a probe's answer, e.g.
    /// `spot/instance-action`.
    pub notice: &'static str,
}

impl Watcher {
    /// The whole script: the cloud's part, then [`WATCH_LOOP`].
    pub fn script(&self) -> String {
        format!("{}\n{WATCH_LOOP}", self.check)
    }

    /// The command that runs the watcher with `--once` on `node` (printing
    /// `<notice>: <what it printed>` after [`NOTICE_MARK`] when a notice is
    /// posted), or `None` for a node that is not spot, which has none to
    /// ask: a [`crate::Provider::notice_probe`].
    pub fn probe(&self, node: &NodeRow) -> Option<String> {
        if node.fact("market") != "spot" {
            return None;
        }
        let endpoint = node
            .extra
            .get(&format!("env.{}", self.endpoint_var))
            .map(|e| format!("{}={} ", self.endpoint_var, sh_quote(e)))
            .unwrap_or_default();
        // Exit 1 (no notice) and 2 (no metadata service) both print nothing.
        Some(format!(
            "n=$({endpoint}sh -c {} {} --once 2>/dev/null) && \
             printf '%s%s\\n' {NOTICE_MARK} \"{}: $n\"; true",
            sh_quote(&self.script()),
            self.name,
            self.notice,
        ))
    }
}

#[cfg(test)]
mod tests;
