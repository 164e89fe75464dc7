//! The JSON parsers of the ecosystem on `scripts/bench-limit`'s two bodies: serde_json reading
//! into `IgnoredAny` (checks the JSON, builds nothing), sonic-rs's `Value` and simd-json's tape
//! and borrowed value (SIMD; build with `RUSTFLAGS="-C target-cpu=native"` for AVX2).
//! `PODMEND_BODIES` names the directory with `typical.json` and `repair.json`
//! (`scripts/bench-limit --smoke --keep` leaves them in its working directory).

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde::de::IgnoredAny;

/// The allocator `podmend serve` runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bodies() -> PathBuf {
    let Some(dir) = std::env::var_os("PODMEND_BODIES") else {
        panic!("set PODMEND_BODIES to the directory `scripts/bench-limit --smoke --keep` left");
    };
    PathBuf::from(dir)
}

fn parsers(c: &mut Criterion) {
    for name in ["typical", "repair"] {
        let path = bodies().join(format!("{name}.json"));
        let body = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut group = c.benchmark_group(name);
        group.bench_function("serde_json_ignored_any", |b| {
            b.iter(|| serde_json::from_str::<IgnoredAny>(black_box(&body)).is_ok())
        });
        group.bench_function("sonic_rs_value", |b| {
            b.iter(|| sonic_rs::from_str::<sonic_rs::Value>(black_box(&body)).is_ok())
        });
        // simd-json parses in place: each iteration gets its own copy, made outside timing.
        let copy = || body.as_bytes().to_vec();
        group.bench_function("simd_json_tape", |b| {
            b.iter_batched_ref(
                copy,
                |buf| simd_json::to_tape(buf).is_ok(),
                BatchSize::SmallInput,
            )
        });
        group.bench_function("simd_json_borrowed_value", |b| {
            let parse = |buf: &mut Vec<u8>| simd_json::to_borrowed_value(buf).is_ok();
            b.iter_batched_ref(copy, parse, BatchSize::SmallInput)
        });
        group.finish();
    }
}

criterion_group!(benches, parsers);
criterion_main!(benches);
