//! Objects built from the rules' vocabulary (see `src/structured.rs`), reviewed like `review`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| podmend_fuzz::structured::check(data));
