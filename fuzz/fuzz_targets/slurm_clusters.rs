//! Text of `$GANGWAY_HOME/slurm.yaml` -> the clusters, then the catalog
//! every launch builds from them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match gangway_slurm::clusters::parse(text, "slurm.yaml") {
        Ok(s) => {
            let _ = s.capacity();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
