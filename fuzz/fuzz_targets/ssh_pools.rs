//! Text of `$GANGWAY_HOME/ssh_pools.yaml` -> the inventory, then what every
//! launch makes of it: the pools for the ssh provider and their catalog.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match gangway_ssh::inventory::parse(text, "ssh_pools.yaml") {
        Ok(inv) => {
            let _ = inv.pools();
            let _ = inv.capacity();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
