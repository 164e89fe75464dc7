//! The process's allocator: mimalloc, entered through its plain `mi_malloc` for the
//! alignments every mimalloc block has anyway. The `mimalloc` crate's own `MiMalloc` asks
//! `mi_malloc_aligned` for every allocation; that path checks the alignment and looks for a
//! small block that happens to be aligned before it allocates. A review allocates a few hundred
//! small objects (JSON trees, typed pod specs, patches): entered plainly, a repair costs 2.5 %
//! fewer instructions (BENCHMARKS.md, issue 17, twenty-fourth pass).
//!
//! Shared by the binary (`main.rs`) and the engine's benchmark, which include this file; the
//! library forbids `unsafe` and has no allocator of its own.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The alignment every block mimalloc hands out has: block sizes are whole words, and each
/// page starts its first block on 16 bytes (`MI_PAGE_MIN_START_BLOCK_ALIGN`). Up to it,
/// `mi_malloc` is as aligned as `mi_malloc_aligned`.
const EVERY_BLOCK_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc, through `mi_malloc` for alignments up to [`EVERY_BLOCK_ALIGN`] (nearly all:
/// strings, vectors, maps) and through its aligned entry points above.
pub struct Mimalloc;

// SAFETY: every method hands the layout's size (and, above `EVERY_BLOCK_ALIGN`, its alignment)
// to the mimalloc function that allocates, zeroes, reallocates or frees accordingly. Blocks up
// to that alignment come from `mi_malloc`/`mi_zalloc`/`mi_realloc`, which return blocks at
// least that aligned, or null on failure as `GlobalAlloc` expects; `mi_free` frees a block from
// any of them.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's.
        unsafe {
            if layout.align() <= EVERY_BLOCK_ALIGN {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's.
        unsafe {
            if layout.align() <= EVERY_BLOCK_ALIGN {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl's; `ptr` came from this allocator with `layout`.
        unsafe {
            if layout.align() <= EVERY_BLOCK_ALIGN {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    // Full paths, no `use`: the engine's benchmark includes this file with `cfg(test)` set but
    // its tests left out.
    #[test]
    fn blocks_have_the_alignment_asked_of_them_whatever_their_size() {
        use std::alloc::{GlobalAlloc as _, Layout};
        let allocator = super::Mimalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 3, 8, 12, 24, 40, 100, 1000, 5000, 70_000] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                let Ok(grown_layout) = Layout::from_size_align(size * 3, align) else {
                    continue;
                };
                // SAFETY: layouts of non-zero size; each block is freed with the layout it
                // has, and read only within its size. Several blocks are held at once, so
                // that they are not all one block given back and taken again.
                unsafe {
                    let blocks: Vec<*mut u8> = (0..8).map(|_| allocator.alloc(layout)).collect();
                    for &block in &blocks {
                        assert!(!block.is_null());
                        assert_eq!(block as usize % align, 0, "size {size}, align {align}");
                        block.write_bytes(0xAB, size);
                    }
                    for block in blocks {
                        let grown = allocator.realloc(block, layout, grown_layout.size());
                        assert_eq!(
                            grown as usize % align,
                            0,
                            "grown: size {size}, align {align}"
                        );
                        assert_eq!(*grown.add(size - 1), 0xAB);
                        allocator.dealloc(grown, grown_layout);
                    }
                    let zeroed = allocator.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0);
                    assert!((0..size).all(|i| *zeroed.add(i) == 0));
                    allocator.dealloc(zeroed, layout);
                }
            }
        }
    }
}
