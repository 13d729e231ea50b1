//! What the provider keeps on disk per cluster: how its nodes are logged
//! into and the placement they were asked for. Everything on the cloud's
//! side (instances, pods, keys) is found by tag, label or name.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One cluster's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Login user on the nodes.
    #[serde(default)]
    pub ssh_user: Option<String>,
    /// The region asked for.
    #[serde(default)]
    pub region: Option<String>,
    /// The zone asked for (the catalog's: a data center, or the region
    /// where a cloud has no zones).
    #[serde(default)]
    pub zone: Option<String>,
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

    /// Updates the record atomically (write, fsync, rename).
    pub fn update(&self, cluster: &str, f: impl FnOnce(&mut Record)) -> std::io::Result<Record> {
        let mut r = self.get(cluster)?;
        let before = r.clone();
        f(&mut r);
        if r != before {
            fs::create_dir_all(&self.dir)?;
            let path = self.path(cluster);
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(&r)?)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_odd_names_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::new(dir.path().join("c"));
        assert_eq!(r.get("x").unwrap(), Record::default());
        r.update("x", |x| x.ssh_user = Some("root".into())).unwrap();
        assert_eq!(r.get("x").unwrap().ssh_user.as_deref(), Some("root"));
        r.remove("x").unwrap();
        r.remove("x").unwrap();
        assert!(r.path("../e").starts_with(dir.path().join("c")));
    }
}
