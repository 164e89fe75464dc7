//! Manifest text through the audit's reader, the engine, every report format and `-o yaml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| podmend_fuzz::audit::check(data));
