//! gangway: a multi-cloud GPU launcher for training runs.
//!
//! The flow is `spec` (task files) → `optimizer` (catalog × resources →
//! ranked failover plan) → provisioning and gang startup (later issues).
//! Logic never prints; the `cli` module renders.
#![deny(missing_docs)]

pub mod catalog;
pub mod cli;
mod config;
pub mod context;
pub mod error;
pub mod gang;
pub mod jobs;
#[cfg(test)]
mod laptop_portable;
#[cfg(test)]
mod no_provider_names;
pub mod optimizer;
pub mod provision;
pub mod spec;
pub mod state;
mod storage;
/// Checkpoint manifests as a restore reads them (public for the fuzzer).
pub use storage::manifest as checkpoint_manifest;

pub use error::{Error, ExitCode};
