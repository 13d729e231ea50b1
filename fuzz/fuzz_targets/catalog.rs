//! Text of a SkyPilot v8 `vms.csv` -> offerings, as `--catalog DIR` loads
//! it (`load_dir` reads the file as UTF-8, then this loader), then indexed
//! into a catalog as the optimizer sees it. The input's length picks the
//! cloud (AWS marks placement/EFA; GCP-style GPU rows are joined to hosts
//! for every cloud).
#![no_main]

use gangway::catalog::{load_skypilot_csv, Catalog};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cloud = if data.len() % 2 == 0 { "gcp" } else { "aws" };
    match load_skypilot_csv(cloud, text, "fuzz/vms.csv") {
        Ok((offerings, warnings)) => {
            let c = Catalog::from_offerings(offerings);
            let _ = (c.offerings().len(), warnings.len());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
