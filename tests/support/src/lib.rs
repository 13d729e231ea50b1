//! What gangway's tests share, as one crate every test crate takes as a
//! dev-dependency:
//!
//! * [`skip`]: the one way a test says whether it could run here
//!   (`SKIPPED <suite>: why`, `GANGWAY_REQUIRE_SUITES`, `GANGWAY_SUITE_LOG`);
//! * [`ec2_emulator`]: the EC2 emulator (`tests/emulators/ec2`), started
//!   once per test process or found through `GANGWAY_TEST_EC2_ENDPOINT`;
//! * [`gce_fake`]: the Compute Engine fake (`tests/emulators/gce`);
//! * [`gpu_fake`]: the Lambda, RunPod and Vast.ai fakes
//!   (`tests/emulators/{lambda,runpod,vast}`);
//! * [`azure_fake`]: the Azure Resource Manager fake (`tests/emulators/azure`);
//! * [`k8s`]: a Kubernetes control plane built from source, with node
//!   agents that run pods as local processes (`tests/emulators/k8s`);
//! * [`slurm`]: a throwaway Slurm cluster (`tests/emulators/slurm`);
//! * [`storage`]: the S3 and GCS emulators behind the request-logging,
//!   fault-injecting storage front (`tests/emulators/{s3,gcs,storage}`);
//! * [`contract`]: the rules every [`gangway_provider::Provider`] keeps, as
//!   checks each provider crate runs against its emulator.
//!
//! ```ignore
//! // Cargo.toml: [dev-dependencies] gangway-test = { path = "../../tests/support" }
//! use gangway_test::skip;
//! let Some(emu) = gangway_test::ec2_emulator::Ec2Emulator::shared() else { return };
//! ```
#![deny(missing_docs)]

pub mod azure_fake;
pub mod contract;
pub mod ec2_emulator;
pub mod gce_fake;
pub mod gpu_fake;
pub mod k8s;
pub mod net;
pub mod skip;
pub mod slurm;
pub mod storage;
