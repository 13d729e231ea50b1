//! Services: what a user asks for, one module each, built from the core
//! and called by the CLI (and by each other where one service is made of
//! another, never in a circle).

pub mod host;
pub mod jobs;
