//! What the provider keeps on disk per cluster: the regions it touched and
//! how its nodes are reached. Written before anything is created in a
//! region, so a crash at any point still says where to look; everything
//! else (instances, groups, keys) is found by tag.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One cluster's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Every region a launch attempt of this cluster touched.
    pub regions: BTreeSet<String>,
    /// Login user on the nodes.
    #[serde(default)]
    pub ssh_user: Option<String>,
    /// Reach nodes on their private addresses.
    #[serde(default)]
    pub use_internal_ips: bool,
    /// Jump host for them.
    #[serde(default)]
    pub ssh_jump: Option<String>,
    /// The owner tag the cluster's resources carry. Records of versions
    /// before owner ids have none: theirs carry the user's name.
    #[serde(default)]
    pub owner: Option<String>,
}

/// The records under one directory.
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// Records under `dir` (created on first write).
    pub fn new(dir: PathBuf) -> Records {
        Records { dir }
    }

    fn path(&self, cluster: &str) -> PathBuf {
        // Cluster names are checked by the caller; anything odd is encoded
        // so a name can never leave the directory.
        let safe: String = cluster
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c.to_string()
                } else {
                    format!("%{:02x}", c as u32)
                }
            })
            .collect();
        self.dir.join(format!("{safe}.json"))
    }

    /// The record, or an empty one.
    pub fn get(&self, cluster: &str) -> std::io::Result<Record> {
        match fs::read(self.path(cluster)) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(e) => Err(e),
        }
    }

    /// Updates the record atomically (write + fsync + rename).
    pub fn update(&self, cluster: &str, f: impl FnOnce(&mut Record)) -> std::io::Result<Record> {
        let mut r = self.get(cluster)?;
        let before = r.clone();
        f(&mut r);
        if r != before {
            write_atomic(&self.path(cluster), &serde_json::to_vec_pretty(&r)?)?;
        }
        Ok(r)
    }

    /// Forgets the cluster.
    pub fn remove(&self, cluster: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path(cluster)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("records live in a directory");
    fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_accumulate_and_remove_forgets() {
        let dir = std::env::temp_dir().join(format!("gw-aws-rec-{}", std::process::id()));
        let r = Records::new(dir.clone());
        assert_eq!(r.get("c").unwrap(), Record::default());
        r.update("c", |x| {
            x.regions.insert("us-east-1".into());
        })
        .unwrap();
        let got = r
            .update("c", |x| {
                x.regions.insert("us-west-2".into());
            })
            .unwrap();
        assert_eq!(got.regions.len(), 2);
        assert_eq!(r.get("c").unwrap(), got);
        r.remove("c").unwrap();
        r.remove("c").unwrap();
        assert_eq!(r.get("c").unwrap(), Record::default());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn odd_names_stay_inside_the_directory() {
        let r = Records::new(PathBuf::from("/x"));
        assert_eq!(
            r.path("../etc/passwd"),
            PathBuf::from("/x/..%2fetc%2fpasswd.json")
        );
    }
}
