//! gangway: a multi-cloud GPU launcher for training runs.
//!
//! Four layers, each a folder, each calling only the ones below it
//! (docs/design.md draws them; `src/layers.rs` enforces it):
//! - [`cli`]: clap, rendering, exit codes.
//! - [`services`]: what a user asks for (launch, managed jobs, the
//!   controller host), one module each.
//! - [`core`]: task files, catalog, optimizer, provisioning, gang startup,
//!   storage, state.
//! - the provider crates under `providers/`, behind `providers/api`.
#![deny(missing_docs)]

pub mod cli;
pub mod core;
#[cfg(test)]
mod laptop_portable;
#[cfg(test)]
mod layers;
#[cfg(test)]
mod no_provider_names;
pub mod services;

// The core's public parts under their short names, for the binary, the
// integration tests, the benchmarks and the fuzzers.
pub use crate::core::error::{Error, ExitCode};
pub use crate::core::storage::manifest as checkpoint_manifest;
pub use crate::core::{
    catalog, context, error, gang, optimizer, provision, ranks, spec, state, transport,
};
pub use crate::services::jobs;
