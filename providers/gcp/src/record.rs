//! What gangway keeps on disk about each GCP cluster it launched: the
//! regions it touched (where its network resources live, found again even
//! when every VM is gone) and the VMs the last launch ended with (name,
//! numeric id, zone). GCE deletes a Spot VM whose termination action is
//! DELETE; its id is how its `compute.instances.preempted` operation is
//! told apart from one of an earlier VM of the same name.
//!
//! One file per cluster, lines `region R` and `vm NAME ID ZONE`; a bare
//! line is a region (the format before VMs were kept). Written to a
//! temporary file and renamed, so a killed process leaves the old record
//! or the new one.

use std::path::Path;

/// A VM as the record keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeptVm {
    pub name: String,
    pub id: String,
    pub zone: String,
}

/// One cluster's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Record {
    pub regions: Vec<String>,
    pub vms: Vec<KeptVm>,
}

impl Record {
    pub fn read(path: &Path) -> Record {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Record::parse(&text)
    }

    fn parse(text: &str) -> Record {
        let mut r = Record::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["region", region] | [region] => {
                    r.add_region(region);
                }
                ["vm", name, id, zone] => r.vms.push(KeptVm {
                    name: name.to_string(),
                    id: id.to_string(),
                    zone: zone.to_string(),
                }),
                _ => {} // a line from a later format: not ours to judge
            }
        }
        r
    }

    /// Adds `region` unless it is there; whether it was new.
    pub fn add_region(&mut self, region: &str) -> bool {
        if self.regions.iter().any(|r| r == region) {
            return false;
        }
        self.regions.push(region.to_string());
        true
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.regions {
            out.push_str(&format!("region {r}\n"));
        }
        for v in &self.vms {
            out.push_str(&format!("vm {} {} {}\n", v.name, v.id, v.zone));
        }
        out
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_writes_and_the_older_bare_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        assert_eq!(Record::read(&path), Record::default());
        let mut r = Record::parse("us-central1\neurope-west4\n");
        assert_eq!(r.regions, ["us-central1", "europe-west4"]);
        assert!(!r.add_region("us-central1"));
        r.vms.push(KeptVm {
            name: "gw-a-0001".into(),
            id: "42".into(),
            zone: "us-central1-a".into(),
        });
        r.write(&path).unwrap();
        assert_eq!(Record::read(&path), r);
        // A line this version does not know is skipped, not fatal.
        assert_eq!(Record::parse("policy x y z q\nregion r\n").regions, ["r"]);
    }
}
