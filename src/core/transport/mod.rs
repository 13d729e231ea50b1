//! Reaching nodes: the [`Transport`] contract (from `providers/api`) and
//! the generic SSH transport every provider without its own uses.

pub mod ssh;

pub(crate) use gangway_provider::{NodeCommand, Transport, TransportError};
