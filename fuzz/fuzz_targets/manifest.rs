//! Bytes of a checkpoint rank manifest -> `gangway::checkpoint_manifest::parse`,
//! as a restore reads what a bucket holds (anyone who can write the bucket
//! writes these). Any outcome but a panic, an abort, a hang or a blow-up in
//! memory is fine; a line that is taken must name a key that holds its own
//! path in a generation no newer than the one asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&g, rest)) = data.split_first() else {
        return;
    };
    let generation = u64::from(g);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match gangway::checkpoint_manifest::parse(text, generation) {
        Ok(lines) => {
            for l in lines {
                assert!(l.generation <= generation);
                assert!(l.key.ends_with(l.path) && l.key.starts_with("gen-"));
                assert!(!l.path.split('/').any(|s| s.is_empty() || s == ".."));
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
