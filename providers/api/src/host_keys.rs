//! SSH host keys as a provider's API publishes them: what lets gangway
//! check a new VM's key against the cloud's word instead of trusting the
//! first key that answers at its address.
//!
//! A key line is OpenSSH's public-key form, `TYPE BASE64` (no comment):
//! the type one sshd offers, the blob plain base64 of at most
//! [`MAX_BLOB`] characters. Everything else is dropped, so whatever a
//! console or an attribute holds besides keys never reaches a
//! `known_hosts` file.

/// The key types OpenSSH's sshd offers as host keys.
const TYPES: [&str; 5] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// The longest blob taken (a 16,384-bit RSA key is about 2,800
/// characters).
pub const MAX_BLOB: usize = 4096;

/// `TYPE BASE64` when `kind` is a host-key type and `blob` plain base64
/// of a sane length; `None` otherwise.
pub fn key_line(kind: &str, blob: &str) -> Option<String> {
    let base64 = |c: char| c.is_ascii_alphanumeric() || "+/=".contains(c);
    (TYPES.contains(&kind) && (16..=MAX_BLOB).contains(&blob.len()) && blob.chars().all(base64))
        .then(|| format!("{kind} {blob}"))
}

/// The host keys in a boot console's text, as cloud-init prints them
/// between `-----BEGIN SSH HOST KEY KEYS-----` and `-----END SSH HOST KEY
/// KEYS-----` (one `TYPE BASE64 COMMENT` line each, some images prefix
/// `ec2: `): those of the last whole block, the latest boot's. Empty when
/// there is none yet.
pub fn in_console_output(text: &str) -> Vec<String> {
    let mut last = Vec::new();
    let mut open: Option<Vec<String>> = None;
    for line in text.lines() {
        let line = line.trim();
        let line = line.strip_prefix("ec2:").map(str::trim).unwrap_or(line);
        if line == "-----BEGIN SSH HOST KEY KEYS-----" {
            open = Some(Vec::new());
        } else if line == "-----END SSH HOST KEY KEYS-----" {
            if let Some(block) = open.take() {
                last = block;
            }
        } else if let Some(block) = open.as_mut() {
            let mut w = line.split_whitespace();
            if let Some(k) = key_line(w.next().unwrap_or(""), w.next().unwrap_or("")) {
                block.push(k);
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIGt7rUQx5s0pQbC0CBmZ6Y8ZQm2mBqf8m3m4YB2s2bJr";

    #[test]
    fn the_last_whole_block_of_a_console_is_read_and_nothing_else() {
        let console = format!(
            "[    0.000000] Linux version 6.1\n\
             -----BEGIN SSH HOST KEY KEYS-----\n\
             ssh-ed25519 AAAAold0000000000000000000 root@old\n\
             -----END SSH HOST KEY KEYS-----\n\
             reboot\n\
             ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
             ec2: 256 SHA256:abc root@ip (ED25519)\n\
             ec2: -----END SSH HOST KEY FINGERPRINTS-----\n\
             -----BEGIN SSH HOST KEY KEYS-----\n\
             ssh-ed25519 {ED} root@ip-10-0-0-1\n\
             ssh-dss AAAAB3NzaC1kc3MAAACBAP root@ip\n\
             ssh-ed25519 AAAA;rm -rf /;AAAAAAAAAAAA x\n\
             command=\"x\" ssh-ed25519 {ED}\n\
             -----END SSH HOST KEY KEYS-----\n\
             -----BEGIN SSH HOST KEY KEYS-----\n\
             ssh-ed25519 AAAAunfinished00000000000000 root@torn\n"
        );
        assert_eq!(
            in_console_output(&console),
            vec![format!("ssh-ed25519 {ED}")]
        );
        assert!(in_console_output("no keys here\n").is_empty());
        assert!(in_console_output("").is_empty());
    }

    #[test]
    fn a_key_line_takes_host_key_types_and_plain_base64_only() {
        assert!(key_line("ssh-ed25519", ED).is_some());
        assert!(key_line("ecdsa-sha2-nistp256", ED).is_some());
        for (kind, blob) in [
            ("ssh-dss", ED),
            ("ssh-ed25519", "short"),
            ("ssh-ed25519", "AAAA AAAA AAAA AAAA"),
            ("ssh-ed25519", "AAAAAAAAAAAAAAAAAAAA\nx"),
            ("", ED),
        ] {
            assert_eq!(key_line(kind, blob), None, "{kind} {blob}");
        }
        assert_eq!(key_line("ssh-rsa", &"A".repeat(MAX_BLOB + 1)), None);
    }
}
