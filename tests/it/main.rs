//! Integration tests: the real binary, end to end. The suites of a cloud
//! are built with its feature (all three are default): `cargo test
//! --no-default-features --test it` builds and runs the rest.

#[cfg(feature = "aws")]
mod aws;
#[cfg(feature = "aws")]
mod aws_e2e;
#[cfg(feature = "azure")]
mod azure;
mod bad_specs;
#[cfg(all(feature = "aws", feature = "gcp"))]
mod buckets;
mod cli;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
mod cloud_sweep;
mod cluster_cmds;
mod common;
mod compat;
mod dashboard;
mod docs;
#[cfg(feature = "gcp")]
mod gcp;
#[cfg(any(feature = "lambda", feature = "runpod", feature = "vast"))]
mod gpu_cloud;
mod hosted;
#[cfg(all(feature = "aws", feature = "gcp"))]
mod hosted_cloud;
#[cfg(all(feature = "aws", feature = "gcp"))]
mod imds;
mod jobs;
#[cfg(feature = "kubernetes")]
mod k8s;
#[cfg(feature = "kubernetes")]
mod k8s_harness;
#[cfg(feature = "lambda")]
mod lambda;
mod launch;
mod netns;
mod reliability;
mod replace;
#[cfg(feature = "runpod")]
mod runpod;
mod sim;
mod slurm;
mod spec;
#[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
mod spot_job;
mod ssh;
mod sshd;
#[cfg(feature = "vast")]
mod vast;

// The shared test support (tests/support), under the names the modules use.
#[allow(unused_imports)] // without the cloud features, some go unused
use gangway_test::{azure_fake, ec2_emulator, gce_fake, skip};
