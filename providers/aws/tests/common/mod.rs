//! What the AWS test binaries (`emulator`, `contract`) set up alike: the
//! SDK pointed at the EC2 emulator, and a provider of their own on it.

use std::path::Path;

use gangway_aws::AwsProvider;
use gangway_test::ec2_emulator::Ec2Emulator;

/// The SDK configuration for `emu` in `region`: its test credentials, and
/// no retries (an injected fault comes back at once).
pub async fn sdk_config(emu: &Ec2Emulator, region: &'static str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&emu.endpoint)
        .region(aws_config::Region::new(region))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(1))
        .load()
        .await
}

/// A provider for `owner` with its records under `dir/aws` and a key pair
/// of its own (`dir/id_ed25519`, made with ssh-keygen), on `conf`.
pub fn provider(dir: &Path, owner: &str, conf: &aws_config::SdkConfig) -> AwsProvider {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("id_ed25519");
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen");
    assert!(st.success());
    AwsProvider::new(dir.join("aws"), owner, key.with_extension("pub"))
        .with_sdk_config(conf.clone())
        .with_user("tester")
}
