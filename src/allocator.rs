//! The allocator the binary and the benchmarks run on: mimalloc, with its arenas committed as they
//! are used and freed memory purged after 100 ms.
//!
//! A `Batch` step allocates and frees thousands of small buffers (each part's request, evidence and
//! answer), built on rayon's threads and freed on tokio's; glibc's malloc took those frees slowly
//! (eval/SERVICE.md, 2026-12-02). With mimalloc's defaults (arenas committed when reserved, a purge
//! delay of 1 s), though, the live soak's resident set grew 268–327 MB against its 141 MB bound;
//! with the purge delay alone at 0, 238 MB; with only the eager commit off, 134 MB; with both (a
//! 10 ms delay), 112–126 MB; as set here, 116–131 MB. `MIMALLOC_ARENA_EAGER_COMMIT` and
//! `MIMALLOC_PURGE_DELAY` in the environment still win.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering};

use libmimalloc_sys::{mi_option_set_default, mi_option_t};
use mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` in mimalloc.h (v3), which libmimalloc-sys does not name.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
/// `mi_option_purge_delay` in mimalloc.h (v3), in milliseconds.
const PURGE_DELAY: mi_option_t = 15;

/// mimalloc, its options set at the first allocation, before it reserves an arena. Set at the top
/// of `main` instead, they did not take effect: the soak's resident set grew as with the defaults.
pub struct Allocator;

static TUNED: AtomicBool = AtomicBool::new(false);

/// Tunes mimalloc unless it has been.
#[inline]
fn tuned() {
    if !TUNED.load(Ordering::Relaxed) {
        tune();
    }
}

/// Sets mimalloc's options as defaults, which its environment variables override.
#[cold]
fn tune() {
    // SAFETY: setting an option's default reads and writes one entry of mimalloc's option table
    // and allocates nothing. The table is mimalloc's alone, and calls racing here (two threads'
    // first allocations) write the same values, which mimalloc's options code allows.
    unsafe {
        mi_option_set_default(ARENA_EAGER_COMMIT, 0);
        mi_option_set_default(PURGE_DELAY, 100);
    }
    TUNED.store(true, Ordering::Relaxed);
}

// SAFETY: every block is mimalloc's, which upholds `GlobalAlloc`'s contract; `tune` allocates
// nothing.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tuned();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        tuned();
        // SAFETY: as in `alloc`.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is mimalloc's.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    /// A block to resize was allocated here, so `tune` has run.
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `dealloc`.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    /// mimalloc's two options as it reads them now.
    fn options() -> (std::ffi::c_long, std::ffi::c_long) {
        // SAFETY: reading an option has no precondition.
        unsafe {
            (
                mi_option_get(ARENA_EAGER_COMMIT),
                mi_option_get(PURGE_DELAY),
            )
        }
    }

    /// The two option numbers are mimalloc's own: its defaults for them (2 and 1000) are unlike
    /// those of their neighbours in its table (1, 1 and 1, 0), and this process never tunes.
    #[test]
    fn option_numbers_are_mimallocs() {
        assert_eq!(
            options(),
            (2, 1000),
            "mimalloc's option table moved, or one of MIMALLOC_ARENA_EAGER_COMMIT, \
             MIMALLOC_PURGE_DELAY (or their old names, MIMALLOC_EAGER_REGION_COMMIT and \
             MIMALLOC_RESET_DELAY) is set"
        );
    }

    /// Tuning sets both options, and leaves them to the environment where it names them: a child
    /// process of this test, run with and without the variables, checks what it sees. That the
    /// binary tunes before its first arena is the live soak's to show (tests/integration).
    #[test]
    fn tuning_sets_defaults_the_environment_overrides() {
        if let Some(expected) = std::env::var_os("ALLOCATOR_TEST_EXPECT") {
            tune();
            assert_eq!(format!("{:?}", options()), expected.to_string_lossy());
            return;
        }
        let me = std::env::current_exe().unwrap();
        for (env, expected) in [
            (vec![], "(0, 100)"),
            (vec![("MIMALLOC_PURGE_DELAY", "7")], "(0, 7)"),
            (vec![("MIMALLOC_ARENA_EAGER_COMMIT", "1")], "(1, 100)"),
        ] {
            let child = std::process::Command::new(&me)
                .args([
                    "--exact",
                    "allocator::tests::tuning_sets_defaults_the_environment_overrides",
                ])
                .env("ALLOCATOR_TEST_EXPECT", expected)
                .env_remove("MIMALLOC_PURGE_DELAY")
                .env_remove("MIMALLOC_ARENA_EAGER_COMMIT")
                .envs(env)
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&child.stdout);
            // A test of another name runs nothing and passes: one must have run.
            assert!(
                child.status.success() && out.contains("1 passed"),
                "expected {expected}: {out}{}",
                String::from_utf8_lossy(&child.stderr)
            );
        }
    }
}
