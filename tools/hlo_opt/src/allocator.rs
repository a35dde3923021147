//! hlo-opt's global allocator: mimalloc, called through its plain entry
//! points for the usual alignments. The passes allocate and free many
//! small vectors and strings, where mimalloc is about 1.6x faster than the
//! system allocator, and its plain `mi_malloc` is shorter than the aligned
//! entry point the `mimalloc` crate always takes.
//!
//! Invariant: a block from `mi_malloc` is at least word (8-byte) aligned,
//! so only alignments above 8 go through the `*_aligned` entry points.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every mimalloc block has.
const WORD_ALIGNMENT: usize = 8;

pub struct Mimalloc;

// SAFETY: every entry point returns a block of at least `layout.size()`
// bytes aligned to `layout.align()` (mimalloc aligns every block to the
// word, and the aligned entry points to any power of two), or null.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD_ALIGNMENT {
            mi_malloc(layout.size()) as *mut u8
        } else {
            mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD_ALIGNMENT {
            mi_zalloc(layout.size()) as *mut u8
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi_free(ptr as *mut c_void);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD_ALIGNMENT {
            mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_asked_alignment_and_keep_their_contents() {
        for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1usize, 3, 8, 15, 16, 17, 100, 5000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let zeroed = Mimalloc.alloc_zeroed(layout);
                    assert!(!zeroed.is_null());
                    assert_eq!(zeroed as usize % align, 0, "size {size} align {align}");
                    assert!((0..size).all(|i| *zeroed.add(i) == 0));
                    for i in 0..size {
                        *zeroed.add(i) = i as u8;
                    }
                    let grown = Mimalloc.realloc(zeroed, layout, size * 3);
                    assert_eq!(
                        grown as usize % align,
                        0,
                        "realloc size {size} align {align}"
                    );
                    assert!((0..size).all(|i| *grown.add(i) == i as u8));
                    Mimalloc.dealloc(grown, Layout::from_size_align(size * 3, align).unwrap());
                    let plain = Mimalloc.alloc(layout);
                    assert_eq!(plain as usize % align, 0);
                    Mimalloc.dealloc(plain, layout);
                }
            }
        }
    }
}
