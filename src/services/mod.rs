//! Services: what a user asks for, one module each, built from the core
//! and called by the CLI (and by each other where one service is made of
//! another, never in a circle).

pub mod catalog;
pub mod cluster;
pub mod cost;
pub mod dashboard;
pub mod exec;
pub mod host;
pub mod jobs;
pub mod launch;
pub mod ui;

pub(crate) use ui::Ui;
