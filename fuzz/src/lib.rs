//! The libFuzzer side of the fuzz targets: the shared harness (`harness/`, also replayed on stable by
//! the integration tests), a folder for the targets' fixtures removed when libFuzzer exits, and an
//! allocator that turns an outsized allocation into a crash with a backtrace.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[path = "../harness/mod.rs"]
pub mod harness;

pub use libfuzzer_sys;

/// A target whose fixture is made at the first input: `fuzz_harness!(protocol);` is the whole of
/// `fuzz_targets/protocol.rs` (after `#![no_main]`).
#[macro_export]
macro_rules! fuzz_harness {
    ($target:ident) => {
        $crate::libfuzzer_sys::fuzz_target!(|input: &[u8]| {
            static FIXTURE: ::std::sync::OnceLock<$crate::harness::$target::Fixture> =
                ::std::sync::OnceLock::new();
            FIXTURE
                .get_or_init(|| $crate::harness::$target::Fixture::new($crate::fixture_dir()))
                .run(input)
        });
    };
}

static FIXTURE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// A fresh folder for this process's fixtures, removed at exit (libFuzzer ends with
/// `exit`; a crash leaves it behind, next to the crash's artifact).
pub fn fixture_dir() -> &'static Path {
    FIXTURE_DIR.get_or_init(|| {
        // Memory-backed where there is one: a run of `index_files` writes a dozen files.
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("infini-sidecar-fuzz-")
            .tempdir_in(parent)
            .expect("a temporary folder")
            .keep();
        // SAFETY: registers a plain function; atexit has no other precondition.
        unsafe { libc::atexit(remove_fixture_dir) };
        dir
    })
}

extern "C" fn remove_fixture_dir() {
    if let Some(dir) = FIXTURE_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Largest single allocation a target may make. libFuzzer's `-malloc_limit_mb` needs a sanitizer's
/// allocator hooks, which `--sanitizer none` builds lack; `-rss_limit_mb` still bounds the total.
const MAX_ALLOCATION: usize = 2 << 30;

struct CappedAllocator;

fn refuse(size: usize) -> ! {
    eprintln!(
        "==fuzz== allocation of {size} bytes exceeds the fuzzing limit of {MAX_ALLOCATION}\n{}",
        std::backtrace::Backtrace::force_capture()
    );
    std::process::abort()
}

// SAFETY: every call is forwarded unchanged to the system allocator, or the process aborts.
unsafe impl GlobalAlloc for CappedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOCATION {
            refuse(layout.size());
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOCATION {
            refuse(layout.size());
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOCATION {
            refuse(new_size);
        }
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: CappedAllocator = CappedAllocator;
