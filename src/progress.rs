//! Progress bars (on a terminal, or as lines in the log), and the process's peak memory for
//! reports. Stopping long work is `interrupt`'s.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// How often a bar drawn into the log (stderr not a terminal) writes a line; work shorter than
/// this writes none.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// A bar on stderr's terminal, or, when stderr is not one (a service's log, CI), a line in the
/// log every `LOG_EVERY`.
fn new_bar(total: Option<u64>) -> ProgressBar {
    let bar = match total {
        Some(total) => ProgressBar::new(total),
        None => ProgressBar::new_spinner(),
    };
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::term_like_with_hz(
            Box::new(LogLines::every(LOG_EVERY)),
            1,
        ));
    }
    bar
}

/// A terminal for indicatif that writes what it draws to the log as plain lines, at most one
/// every `LOG_EVERY`.
#[derive(Debug)]
struct LogLines {
    every: Duration,
    last: Mutex<Instant>,
}

impl LogLines {
    fn every(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::new(Instant::now()),
        }
    }
}

impl TermLike for LogLines {
    fn width(&self) -> u16 {
        100
    }

    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn write_line(&self, line: &str) -> std::io::Result<()> {
        self.write_str(line)
    }

    fn write_str(&self, text: &str) -> std::io::Result<()> {
        let text = text.trim();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if !text.is_empty() && last.elapsed() >= self.every {
            *last = Instant::now();
            tracing::info!("{text}");
        }
        Ok(())
    }

    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A byte-counting bar, or a hidden one unless `shown`.
pub fn bytes_bar(total: u64, what: &str, shown: bool) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let bar = new_bar(Some(total));
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A token-counting bar.
pub fn token_bar(total: u64, what: &str) -> ProgressBar {
    let bar = new_bar(Some(total));
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} tokens {per_sec} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A spinner that ticks on a thread of its own while it lives, or a hidden bar (no thread) unless
/// `shown`.
pub fn spinner(what: String, shown: bool) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let bar = new_bar(None);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What `f` logs, as text.
    fn logged(f: impl FnOnce()) -> String {
        let buffer = std::sync::Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buffer = buffer.clone();
            move || Capture(buffer.clone())
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Capture(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_bar_off_a_terminal_logs_a_line_once_its_period_has_passed_and_no_sooner() {
        let due = LogLines::every(Duration::ZERO);
        let log = logged(|| {
            due.write_str("  tokenize [=====>    ] 1.0 GiB/4.1 GiB  ")
                .unwrap();
            due.write_str("   ").unwrap();
        });
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(
            log.contains("tokenize [=====>    ] 1.0 GiB/4.1 GiB"),
            "{log}"
        );
        let early = LogLines::every(Duration::from_secs(3600));
        assert_eq!(logged(|| early.write_line("tokenize").unwrap()), "");
    }
}
