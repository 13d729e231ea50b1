//! Integration tests: the real binary, end to end.

mod cli;
mod common;
mod compat;
