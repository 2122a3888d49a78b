//! The fuzz targets, shared by the libFuzzer binaries (`fuzz/fuzz_targets`, nightly) and the replay of
//! the kept corpus on stable (`tests/integration/fuzz_replay.rs`), so both run the same code.
//!
//! Each target is a module with a `Fixture` (what is built once: a tiny index, a service) made in a
//! folder the caller owns, and `Fixture::run(&self, input)`, which must neither panic nor allocate
//! without bound whatever the input. `seeds()` gives the inputs the kept corpus started from.

pub mod compressed_file;
pub mod index_files;
pub mod live;
pub mod protocol;
pub mod rpc;
pub mod shard_answers;
pub mod tiny;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Panics since the process started counting them. Panics on tokio's worker threads become
/// INTERNAL statuses or ended streams and never reach the caller, so the replay counts them here;
/// under libFuzzer the hook it chains to aborts, which is the crash libFuzzer reports.
pub fn panics() -> usize {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
    PANICS.load(Ordering::SeqCst)
}
