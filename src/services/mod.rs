//! Services: what a user asks for, one module each, built from the core
//! and called by the CLI (and by each other where one service is made of
//! another, never in a circle).

pub mod catalog;
pub mod cluster;
pub mod exec;
pub mod host;
pub mod jobs;
pub mod launch;

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
