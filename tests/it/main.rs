//! Integration tests: the real binary, end to end.

mod aws;
mod aws_e2e;
mod bad_specs;
mod buckets;
mod cli;
mod cloud_sweep;
mod cluster_cmds;
mod common;
mod compat;
mod docs;
mod gcp;
mod hosted;
mod hosted_cloud;
mod imds;
mod jobs;
mod k8s;
mod k8s_harness;
mod launch;
mod netns;
mod reliability;
mod sim;
mod slurm;
mod spec;
mod ssh;
mod sshd;

// The shared test support (tests/support), under the names the modules use.
use gangway_test::{ec2_emulator, gce_fake, skip};
