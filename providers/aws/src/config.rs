//! The task's `config.aws` section: what a user may tune per launch.

use serde_json::Value;

/// What is wrong with `config.aws`, or with the address SSH is opened to.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `config.aws` is not a mapping.
    #[error("config.aws must be a mapping")]
    NotAMapping,
    /// A key that is not an option.
    #[error("config.aws.{key} is not an AWS option (known: {known})", known = KEYS.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// An option of the wrong type.
    #[error("config.aws.{key} must be {expected}")]
    WrongType {
        /// The option.
        key: String,
        /// What it must be (`a string`, `true or false`, ...).
        expected: &'static str,
    },
    /// `config.aws.ssh_cidr` is not a CIDR.
    #[error("config.aws.ssh_cidr '{0}' is not an IPv4 CIDR such as 203.0.113.7/32")]
    BadCidr(String),
    /// `GANGWAY_AWS_SSH_CIDR` is not a CIDR.
    #[error("GANGWAY_AWS_SSH_CIDR '{0}' is not an IPv4 CIDR")]
    BadEnvCidr(String),
    /// Neither is set and the caller's address could not be learnt.
    #[error("{0} to open SSH to it only; set config.aws.ssh_cidr or GANGWAY_AWS_SSH_CIDR")]
    NoPublicIp(#[source] gangway_provider::PublicIpError),
    /// The lookup of the caller's address did not finish.
    #[error("looking up your public address: {0}")]
    Lookup(String),
}

/// Options read from `config.aws` (all optional).
#[derive(Clone, Debug, PartialEq)]
pub struct AwsOptions {
    /// Login user on the image (`ubuntu` for the Deep Learning AMIs).
    pub ssh_user: String,
    /// Who may reach port 22; default: the caller's public address /32.
    pub ssh_cidr: Option<String>,
    /// VPC to launch in; default: the region's default VPC.
    pub vpc_id: Option<String>,
    /// Reach nodes on their private addresses (from inside the VPC, or
    /// through `ssh_jump`).
    pub use_internal_ips: bool,
    /// Jump host (`user@host[:port]`) for nodes without public addresses.
    pub ssh_jump: Option<String>,
    /// `cluster` placement group: `None` = for multi-node GPU tasks.
    pub placement_group: Option<bool>,
    /// EFA interfaces: `None` = when the task asks `network_tier: best`.
    pub efa: Option<bool>,
    /// AMI name pattern for `DescribeImages` when no `image_id` is given.
    pub ami_name: Option<String>,
    /// Owner of those AMIs (`amazon`, an account id).
    pub ami_owner: Option<String>,
    /// Seconds to wait for every node to run before giving up on a zone.
    pub boot_timeout_s: u64,
    /// Milliseconds between state polls.
    pub poll_ms: u64,
    /// `remote_identity`: the IAM instance profile every node is launched
    /// with, by name, so its rclone reaches S3 as that role (through the
    /// metadata service) and no credentials of the user's go to it.
    pub remote_identity: Option<String>,
}

impl Default for AwsOptions {
    fn default() -> Self {
        AwsOptions {
            ssh_user: "ubuntu".into(),
            ssh_cidr: None,
            vpc_id: None,
            use_internal_ips: false,
            ssh_jump: None,
            placement_group: None,
            efa: None,
            ami_name: None,
            ami_owner: None,
            boot_timeout_s: 600,
            poll_ms: 2000,
            remote_identity: None,
        }
    }
}

/// Keys `config.aws` may hold; anything else is refused with this list.
pub const KEYS: &[&str] = &[
    "ssh_user",
    "ssh_cidr",
    "vpc_id",
    "use_internal_ips",
    "ssh_jump",
    "placement_group",
    "efa",
    "ami_name",
    "ami_owner",
    "boot_timeout_s",
    "poll_ms",
    "remote_identity",
];

impl AwsOptions {
    /// Reads `config.aws`; a wrong key or type is an error naming it.
    pub fn from_value(v: Option<&Value>) -> Result<AwsOptions, ConfigError> {
        let mut o = AwsOptions::default();
        let Some(v) = v else { return Ok(o) };
        let Some(map) = v.as_object() else {
            return Err(ConfigError::NotAMapping);
        };
        let wrong = |k: &str, expected| ConfigError::WrongType {
            key: k.to_string(),
            expected,
        };
        let text = |k: &str, x: &Value| -> Result<String, ConfigError> {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| wrong(k, "a string"))
        };
        let flag = |k: &str, x: &Value| -> Result<bool, ConfigError> {
            x.as_bool().ok_or_else(|| wrong(k, "true or false"))
        };
        let number = |k: &str, x: &Value| -> Result<u64, ConfigError> {
            x.as_u64().ok_or_else(|| wrong(k, "a whole number"))
        };
        for (k, x) in map {
            match k.as_str() {
                "ssh_user" => o.ssh_user = text(k, x)?,
                "ssh_cidr" => {
                    let c = text(k, x)?;
                    if !looks_like_cidr(&c) {
                        return Err(ConfigError::BadCidr(c));
                    }
                    o.ssh_cidr = Some(c)
                }
                "vpc_id" => o.vpc_id = Some(text(k, x)?),
                "use_internal_ips" => o.use_internal_ips = flag(k, x)?,
                "ssh_jump" => o.ssh_jump = Some(text(k, x)?),
                "placement_group" => o.placement_group = Some(flag(k, x)?),
                "efa" => o.efa = Some(flag(k, x)?),
                "ami_name" => o.ami_name = Some(text(k, x)?),
                "ami_owner" => o.ami_owner = Some(text(k, x)?),
                "boot_timeout_s" => o.boot_timeout_s = number(k, x)?,
                "poll_ms" => o.poll_ms = number(k, x)?.max(10),
                // The core has taken out LOCAL_CREDENTIALS (the default).
                "remote_identity" => o.remote_identity = Some(text(k, x)?),
                other => {
                    return Err(ConfigError::UnknownKey {
                        key: other.to_string(),
                    })
                }
            }
        }
        Ok(o)
    }
}

/// `a.b.c.d/n` with sane parts.
pub fn looks_like_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    ip.parse::<std::net::Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_without_a_section() {
        assert_eq!(AwsOptions::from_value(None).unwrap(), AwsOptions::default());
    }

    #[test]
    fn reads_every_key() {
        let o = AwsOptions::from_value(Some(&json!({
            "ssh_user": "ec2-user", "ssh_cidr": "10.0.0.0/8", "vpc_id": "vpc-1",
            "use_internal_ips": true, "ssh_jump": "me@bastion", "placement_group": false,
            "efa": true, "ami_name": "my-ami-*", "ami_owner": "self",
            "boot_timeout_s": 30, "poll_ms": 50, "remote_identity": "gangway-nodes"
        })))
        .unwrap();
        assert_eq!(o.remote_identity.as_deref(), Some("gangway-nodes"));
        assert_eq!(o.ssh_user, "ec2-user");
        assert_eq!(o.ssh_cidr.as_deref(), Some("10.0.0.0/8"));
        assert!(o.use_internal_ips);
        assert_eq!(o.placement_group, Some(false));
        assert_eq!(o.efa, Some(true));
        assert_eq!((o.boot_timeout_s, o.poll_ms), (30, 50));
    }

    #[test]
    fn wrong_keys_and_types_are_named() {
        let e = AwsOptions::from_value(Some(&json!({"ssh_usr": "x"})))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.aws.ssh_usr") && e.contains("ssh_user"),
            "{e}"
        );
        let e = AwsOptions::from_value(Some(&json!({"efa": "yes"})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.aws.efa must be true or false"), "{e}");
        let e = AwsOptions::from_value(Some(&json!({"ssh_cidr": "everyone"})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an IPv4 CIDR"), "{e}");
    }
}
