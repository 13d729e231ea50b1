//! How a service talks to whoever asked for it.

use crate::core::provision::Reporter;
use crate::Error;

/// What a service tells whoever asked for it, and what it asks them: the
/// CLI renders it on a terminal, a program gets nothing, the dashboard
/// (later) its own view.
pub(crate) trait Ui: Reporter {
    /// A line for the person.
    fn line(&self, s: &str);
    /// Whether to go ahead; a UI that cannot ask says yes.
    fn confirm(&self, question: &str) -> Result<bool, Error>;
    /// Whether the person asked to stop (Ctrl-C) since the service first
    /// asked.
    fn interrupted(&self) -> bool;
}

/// How long ago `ms` (unix ms) was, for people: `42s ago`, `3h ago`.
pub(crate) fn ago(ms: i64) -> String {
    let s = ((crate::core::state::now_ms() - ms) / 1000).max(0);
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// A length of time in ms for people: `42s`, `3m07s`, `2h05m`.
pub(crate) fn duration(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}
