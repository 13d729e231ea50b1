//! Integration tests: the real binary, end to end.

mod aws;
mod bad_specs;
mod cli;
mod cloud_sweep;
mod cluster_cmds;
mod common;
mod compat;
#[path = "../support/ec2_emulator.rs"]
mod ec2_emulator;
#[path = "../support/gce_fake.rs"]
mod gce_fake;
mod gcp;
mod imds;
mod jobs;
mod launch;
mod netns;
mod reliability;
mod sim;
#[path = "../support/skip.rs"]
mod skip;
mod slurm;
mod spec;
mod ssh;
mod sshd;
