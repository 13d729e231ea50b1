//! Bytes of a task file -> `gangway::spec::parse_bytes`, as `gangway launch
//! FILE` reads it (size limit, UTF-8 check, YAML, decoding). Any outcome but
//! a panic, an abort, a hang or a blow-up in memory is fine; errors are
//! formatted as the CLI prints them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match gangway::spec::parse_bytes(data, "fuzz.yaml") {
        Ok(task) => {
            let _ = format!("{task:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
