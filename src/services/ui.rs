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
