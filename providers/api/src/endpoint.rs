//! How the core reaches a node over SSH, as a type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::NodeRow;

/// Where a node's sshd answers and how to log in: what the core's generic
/// SSH transport needs of a node. Providers whose nodes are reached over
/// SSH (those whose [`crate::Provider::transport`] is `None`) put one on
/// each node with [`SshEndpoint::record`]; the core reads it back with
/// [`SshEndpoint::of`].
///
/// It travels in the node's facts (`ssh.host`, `ssh.port`, `ssh.user`,
/// `ssh.key`, `ssh.jump`) because that is how nodes were stored before it
/// was a type: the rows of clusters launched by earlier versions read back
/// unchanged, with no state migration. Only this type knows those keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SshEndpoint {
    /// Host name or address; empty: the node's public, else private,
    /// address (a VM that has no public address yet when it is described).
    pub host: String,
    /// Port (22 where none is recorded).
    pub port: u16,
    /// User; empty: ssh's own default (jump hosts only; a node without a
    /// recorded user is logged into as `root`).
    pub user: String,
    /// Private key; `None`: gangway's own (`$GANGWAY_HOME/ssh/id_ed25519`).
    pub key: Option<PathBuf>,
    /// `ProxyJump` hosts, comma-separated `[user@]host[:port]`.
    pub jump: Option<String>,
}

const HOST: &str = "ssh.host";
const PORT: &str = "ssh.port";
const USER: &str = "ssh.user";
const KEY: &str = "ssh.key";
const JUMP: &str = "ssh.jump";

impl SshEndpoint {
    /// An endpoint at `host` (empty: the node's own address), port 22, as
    /// `user`.
    pub fn new(host: impl Into<String>, user: impl Into<String>) -> SshEndpoint {
        SshEndpoint {
            host: host.into(),
            port: 22,
            user: user.into(),
            key: None,
            jump: None,
        }
    }

    /// Writes it into a node's facts (what [`SshEndpoint::of`] reads).
    pub fn record(&self, extra: &mut BTreeMap<String, String>) {
        if !self.host.is_empty() {
            extra.insert(HOST.into(), self.host.clone());
        }
        extra.insert(PORT.into(), self.port.to_string());
        if !self.user.is_empty() {
            extra.insert(USER.into(), self.user.clone());
        }
        if let Some(k) = &self.key {
            extra.insert(KEY.into(), k.display().to_string());
        }
        if let Some(j) = &self.jump {
            extra.insert(JUMP.into(), j.clone());
        }
    }

    /// The endpoint of a recorded node: its facts, else its public, then
    /// private, address, port 22, user `root`.
    pub fn of(node: &NodeRow) -> SshEndpoint {
        let get = |k: &str| node.extra.get(k).filter(|v| !v.is_empty()).cloned();
        SshEndpoint {
            host: get(HOST)
                .or_else(|| node.public_ip.clone())
                .unwrap_or_else(|| node.private_ip.clone()),
            port: get(PORT).and_then(|p| p.parse().ok()).unwrap_or(22),
            user: get(USER).unwrap_or_else(|| "root".into()),
            key: get(KEY).map(PathBuf::from),
            jump: get(JUMP),
        }
    }

    /// `user@host:port` (`host:port` without a user), how messages name it.
    pub fn label(&self) -> String {
        if self.user.is_empty() {
            format!("{}:{}", self.host, self.port)
        } else {
            format!("{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(extra: BTreeMap<String, String>) -> NodeRow {
        NodeRow {
            rank: 0,
            instance_id: "i".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: Some("1.2.3.4".into()),
            zone: "z".into(),
            topology: String::new(),
            state: "running".into(),
            extra,
        }
    }

    #[test]
    fn an_endpoint_reads_back_as_recorded() {
        let e = SshEndpoint {
            host: "gpu7".into(),
            port: 2222,
            user: "ubuntu".into(),
            key: Some("/k".into()),
            jump: Some("bastion".into()),
        };
        let mut extra = BTreeMap::new();
        e.record(&mut extra);
        assert_eq!(SshEndpoint::of(&row(extra)), e);
        let mut extra = BTreeMap::new();
        SshEndpoint::new("", "").record(&mut extra);
        assert_eq!(extra.keys().collect::<Vec<_>>(), ["ssh.port"]);
        let e = SshEndpoint::of(&row(extra));
        assert_eq!(
            (e.host.as_str(), e.port, e.user.as_str()),
            ("1.2.3.4", 22, "root")
        );
        assert_eq!(e.label(), "root@1.2.3.4:22");
    }
}
