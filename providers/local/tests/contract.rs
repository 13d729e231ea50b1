//! The local cloud keeps the provider contract (`gangway_test::contract`):
//! its fault file (`faults.json`, see `docs/local.md`) makes the API fail,
//! and the instance records and node directories under its root are what
//! it holds.

use std::path::{Path, PathBuf};

use gangway_local::LocalProvider;
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use serde_json::{json, Value};

struct Local {
    p: LocalProvider,
    root: PathBuf,
    _home: tempfile::TempDir,
}

impl Local {
    fn faults(&self, v: Value) {
        std::fs::write(self.root.join("faults.json"), v.to_string()).unwrap();
    }
}

/// Every instance record under the root, wherever the layout keeps it
/// (`instances/<cluster>/<id>.json`, or flat from earlier versions).
fn records(root: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let mut dirs = vec![root.join("instances")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push(serde_json::from_str(&text).unwrap());
            }
        }
    }
    out
}

impl Harness for Local {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        "gw-00000000000c0de1".into()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        contract::request(
            cluster,
            count,
            client_token,
            &self.owner(),
            placement("local", "local", "local-b"),
            "local.cpu",
        )
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<Midway, Unsupported> {
        self.faults(json!({"launch_midway": {"times": 1, "after_nodes": 1}}));
        Ok(Midway::Fails)
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let kind = match kind {
            ErrorKind::Capacity => "capacity",
            ErrorKind::Quota => "quota",
            ErrorKind::Auth => "auth",
            ErrorKind::InvalidRequest => "invalid",
            other => return Err(Unsupported(format!("{other:?} is not a rule here"))),
        };
        self.faults(json!({"launch": {"times": 1, "kind": kind}}));
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        let _ = std::fs::remove_file(self.root.join("faults.json"));
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let recs = records(&self.root);
        let mut out: Vec<Resource> = recs
            .iter()
            .filter(|r| r["cluster"] == cluster.0.as_str())
            .map(|r| Resource {
                kind: "instance".into(),
                id: r["id"].as_str().unwrap_or_default().into(),
                cluster: r["cluster"].as_str().map(String::from),
                owner: r["owner"].as_str().map(String::from),
            })
            .collect();
        // A node directory without a record belongs to nobody: a leak of
        // whichever cluster made it (this root holds only the suite's).
        let ids: Vec<&str> = recs.iter().filter_map(|r| r["id"].as_str()).collect();
        if let Ok(dir) = std::fs::read_dir(self.root.join("nodes")) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !ids.contains(&name.as_str()) {
                    out.push(Resource {
                        kind: "node directory".into(),
                        id: name,
                        cluster: None,
                        owner: None,
                    });
                }
            }
        }
        out
    }

    fn lists_clusters(&self) -> bool {
        false
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        Err(Unsupported(
            "a local cloud belongs to one $GANGWAY_HOME, which has one owner id".into(),
        ))
    }
}

#[tokio::test]
async fn the_local_cloud_keeps_the_provider_contract() {
    gangway_test::skip::ran("local");
    let home = tempfile::tempdir().unwrap();
    let root = home.path().join("local");
    let h = Local {
        p: LocalProvider::new(&root),
        root,
        _home: home,
    };
    contract::run(&h).await;
}
