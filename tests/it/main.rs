//! Integration tests: the real binary, end to end.

mod bad_specs;
mod cli;
mod common;
mod compat;
mod spec;
