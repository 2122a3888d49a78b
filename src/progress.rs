//! Progress bars, and the process's peak memory for reports. Stopping long work is `interrupt`'s.

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-counting bar (hidden when stderr is not a terminal, as in CI logs).
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A token-counting bar (hidden when stderr is not a terminal).
pub fn token_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} tokens {per_sec} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

pub fn spinner(what: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// Peak resident memory of this process so far (VmHWM), in bytes; 0 where /proc is not available.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
