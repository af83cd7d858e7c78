#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vhost_user_blk::fuzzing::parse_chain(data);
});
