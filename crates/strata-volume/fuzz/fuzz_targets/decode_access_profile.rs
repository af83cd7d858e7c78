#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_volume::format::fuzzing::decode_access_profile(data);
});
