//! Stopping long work cleanly. Two things can stop it: Ctrl-C or SIGTERM for the whole process (a
//! flag that long jobs check between steps; the server drains instead, on [`shutdown_signal`]),
//! and, in the server, a [`StopSignal`] for one request, raised when its deadline passes or its
//! client goes away. Library loops call [`interrupted`] every so often and return their
//! `Interrupted` error; they need not know which of the two it was.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C / SIGTERM handler. A second signal exits at once.
pub fn install_handler() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("interrupting: finishing the current step, then cleaning up (again to exit now)");
    });
}

/// The server's shutdown: resolves at the first Ctrl-C or SIGTERM (the server then drains instead of
/// interrupting every request); a second one exits at once.
pub async fn shutdown_signal(mut signals: Termination) {
    signals.next().await;
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
}

/// Ctrl-C and SIGTERM, caught from the moment [`Termination::listen`] returns: a listener made at
/// its first poll would leave the process to die of a signal that came before.
pub struct Termination {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Termination {
    /// Starts catching both signals; call it inside the runtime, before anything slow opens.
    #[cfg(unix)]
    pub fn listen() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal of either kind.
    #[cfg(unix)]
    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
    }

    #[cfg(not(unix))]
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {})
    }

    #[cfg(not(unix))]
    pub async fn next(&mut self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

thread_local! {
    /// The stop signal of the request this thread works for, while [`StopSignal::run`] runs.
    static CURRENT: RefCell<Option<StopSignal>> = const { RefCell::new(None) };
}

/// Whether the work on this thread should stop: the process was interrupted, or the request it
/// works for was stopped. Cheap enough to call every few thousand steps of an inner loop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
        || CURRENT.with(|c| c.borrow().as_ref().is_some_and(StopSignal::is_stopped))
}

/// The stop signal of the request this thread works for: what worker threads (rayon's) need to
/// see it, through [`run_under`].
pub fn current() -> Option<StopSignal> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Runs `work` under `signal` when there is one (a request's work handed to another thread).
pub fn run_under<T>(signal: Option<&StopSignal>, work: impl FnOnce() -> T) -> T {
    match signal {
        Some(s) => s.run(work),
        None => work(),
    }
}

/// When the request this thread works for must be answered by, if it has a deadline.
pub fn deadline() -> Option<Instant> {
    CURRENT.with(|c| c.borrow().as_ref().and_then(|s| s.0.deadline))
}

/// Why a request's work was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Its deadline passed.
    Deadline,
    /// Its caller went away (or the server is shutting down).
    Cancelled,
}

#[derive(Debug)]
struct StopState {
    /// Raised when the caller leaves: what the work's loops check (a load, where the token's
    /// own check takes a lock).
    cancelled: AtomicBool,
    /// Raised with it, for work that waits on the network to await.
    token: CancellationToken,
    deadline: Option<Instant>,
}

/// The stop signal of one request's work: shared between the task that waits for the answer (which
/// raises it when the caller leaves) and the thread that does the work (which checks it).
#[derive(Debug, Clone)]
pub struct StopSignal(Arc<StopState>);

impl StopSignal {
    pub fn new(deadline: Option<Instant>) -> Self {
        Self(Arc::new(StopState {
            cancelled: AtomicBool::new(false),
            token: CancellationToken::new(),
            deadline,
        }))
    }

    /// Asks the work to stop at its next check, and ends its waits on [`StopSignal::cancelled`].
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Relaxed);
        self.0.token.cancel();
    }

    /// Resolves once the work is asked to stop (not at its deadline: a wait bounds itself by it).
    pub async fn cancelled(&self) {
        self.0.token.cancelled().await
    }

    /// Why the work should stop, if it should.
    pub fn reason(&self) -> Option<StopReason> {
        if self.0.cancelled.load(Ordering::Relaxed) {
            Some(StopReason::Cancelled)
        } else if self.0.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(StopReason::Deadline)
        } else {
            None
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.reason().is_some()
    }

    /// Runs `work` on this thread with this signal as the one [`interrupted`] checks.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        struct Restore(Option<StopSignal>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| *c.borrow_mut() = self.0.take());
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.borrow_mut().replace(self.clone())));
        work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_signal_stops_only_the_work_it_runs() {
        let signal = StopSignal::new(None);
        assert!(!signal.run(interrupted));
        signal.cancel();
        assert!(signal.run(interrupted));
        assert_eq!(signal.reason(), Some(StopReason::Cancelled));
        // Outside `run`, and on other threads, the signal is not seen.
        assert!(!interrupted());
        let seen = std::thread::spawn(interrupted).join().unwrap();
        assert!(!seen);
    }

    #[tokio::test]
    async fn a_cancel_ends_a_wait_on_it_and_only_then() {
        let signal = StopSignal::new(None);
        let waiting = tokio::spawn({
            let signal = signal.clone();
            async move { signal.cancelled().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        signal.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ended")
            .unwrap();
    }

    #[test]
    fn a_passed_deadline_stops_the_work() {
        let signal = StopSignal::new(Some(Instant::now() - Duration::from_millis(1)));
        assert_eq!(signal.reason(), Some(StopReason::Deadline));
        assert!(signal.run(interrupted));
        let later = StopSignal::new(Some(Instant::now() + Duration::from_secs(3600)));
        assert!(!later.run(interrupted));
    }

    #[test]
    fn nested_runs_restore_the_outer_signal() {
        let outer = StopSignal::new(None);
        let inner = StopSignal::new(None);
        inner.cancel();
        outer.run(|| {
            assert!(inner.run(interrupted));
            assert!(!interrupted());
        });
    }
}
