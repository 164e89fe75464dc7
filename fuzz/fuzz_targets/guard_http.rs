//! A client's byte stream through the guard's HTTP framing and container-create decision.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| podmend_fuzz::guard::check(data));
