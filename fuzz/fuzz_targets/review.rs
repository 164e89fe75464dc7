//! AdmissionReview bytes through decode, the engine (three configurations, with and without
//! a cluster), the response, the API server's patch application and a second pass.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| podmend_fuzz::review::check_body(data));
