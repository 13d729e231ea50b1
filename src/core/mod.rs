//! The core: what every service is built from. Task files ([`spec`]), the
//! [`catalog`] and the [`optimizer`], provisioning through the provider
//! registry, reaching nodes ([`transport`]), gang startup ([`gang`]),
//! buckets and checkpoints (`storage`), the state database ([`state`]) and
//! one cluster life cycle (`lifecycle`), with lost nodes replaced in
//! place (`replace`). Nothing here imports a service or
//! the CLI, and no module here imports one that imports it back.

pub mod catalog;
pub(crate) mod config;
pub mod context;
pub mod error;
pub mod gang;
pub(crate) mod lifecycle;
pub mod optimizer;
pub mod provision;
pub mod ranks;
pub(crate) mod registry;
pub(crate) mod replace;
pub(crate) mod runtime;
pub mod spec;
pub mod state;
pub(crate) mod storage;
pub mod transport;
