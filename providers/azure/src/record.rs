//! What the provider keeps on disk per cluster: the locations it touched
//! (written before anything is made there, so a crash at any point still
//! says where to look), how nodes are reached, and the VMs a launch
//! returned (so that a VM that Azure evicted, and with the `Delete`
//! eviction policy removed, is still reported, as preempted).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A VM a launch returned.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    /// Location.
    pub location: String,
    /// Zone, or the location when not zonal.
    pub zone: String,
    /// Size.
    pub size: String,
    /// Spot.
    pub spot: bool,
    /// Private address.
    pub private_ip: String,
    /// Public address.
    pub public_ip: Option<String>,
}

/// One cluster's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The owner tag the cluster's resources carry.
    #[serde(default)]
    pub owner: Option<String>,
    /// Every location a launch attempt touched (one resource group each).
    #[serde(default)]
    pub locations: BTreeSet<String>,
    /// Login user on the nodes.
    #[serde(default)]
    pub ssh_user: Option<String>,
    /// The VMs launches returned, by name.
    #[serde(default)]
    pub vms: BTreeMap<String, VmRecord>,
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
        // Anything odd in a name is encoded, so it never leaves the directory.
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

    /// Changes the record and writes it atomically (temporary file, fsync,
    /// rename).
    pub fn update(&self, cluster: &str, f: impl FnOnce(&mut Record)) -> std::io::Result<Record> {
        let mut r = self.get(cluster)?;
        let before = r.clone();
        f(&mut r);
        if r != before {
            fs::create_dir_all(&self.dir)?;
            let path = self.path(cluster);
            let tmp = path.with_extension("json.tmp");
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(&r)?)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
        }
        Ok(r)
    }

    /// Forgets the cluster (after Azure confirmed everything is gone).
    pub fn remove(&self, cluster: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path(cluster)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
