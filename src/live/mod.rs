//! The live index: what the served models generate (and what callers add), learnt while decoding
//! goes on and searchable at once, beside the read-only reference index. Data belongs to a
//! namespace (a tenant, an agent workflow); nothing is shared between namespaces.
//!
//! Each namespace is a small log-structured store of suffix arrays. New tokens go to an in-memory
//! tail (O(1) per token, searched by looking back from a token's recent occurrences); a background
//! thread (or the owner, when it asks: a replay) freezes a full tail into a suffix-array run with
//! the index builder and merges runs level by level, so a lookup visits a logarithmic number of
//! runs however much has been learnt; runs live in the data folder and are loaded again at the
//! next start; past the token budget the oldest runs of the namespace holding the most are
//! evicted. Why this and not a suffix tree or automaton: those take no deletions, so eviction would
//! mean rebuilding anyway, and they cost tens of bytes a token where a run costs the index's 6–8.
//! Every change to a tail is written to the namespace's journal before it is acknowledged and read
//! back at the next open, so a kill of the process loses nothing acknowledged; `AddDocuments` is
//! also synced to the disk, so it survives the machine (`journal`).
//!
//! What is acknowledged is kept: an append is checked whole and then added whole or not at all;
//! a tail whose build fails stays in memory until a build succeeds, and while the disk refuses
//! writes new appends are refused instead. Memory is bounded by the budget whatever the number of
//! namespaces: tails count at what they cost ([`TAIL_WEIGHT`]) and may hold a quarter of it, each
//! namespace keeping a fair share of that quarter when it is full.

mod compact;
mod folder;
mod journal;
pub mod namespace;
mod recent;
pub mod run;
pub mod tail;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::index::corpus::Corpus;
use crate::index::{IndexError, TokenWidth};
pub(crate) use folder::LOCK_FILE;
use folder::SET_ASIDE_PREFIX;
use namespace::{check_name, Namespace};
use recent::RecentRequests;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("corrupt live index: {0}")]
    Corrupt(String),
    /// A bad name, token or setting.
    #[error("{0}")]
    Invalid(String),
    /// A limit of the live index (namespaces, tokens waiting to be built, a disk that refuses
    /// writes) was reached; the same request may succeed later.
    #[error("{0}")]
    Full(String),
    #[error(transparent)]
    Index(IndexError),
}

impl LiveError {
    /// An I/O error at `path`; a disk that is full is a limit reached (the same request may
    /// succeed once it frees), not a failure of the server.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        use std::io::ErrorKind::{QuotaExceeded, StorageFull};
        if matches!(source.kind(), StorageFull | QuotaExceeded) {
            return LiveError::Full(format!(
                "the live index cannot write {} ({source}): the disk is full; what it acknowledged \
                 is kept and writes are refused until the disk takes them again",
                path.display()
            ));
        }
        LiveError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T, E = LiveError> = std::result::Result<T, E>;

/// What a token in a tail costs in memory against one in a run: a tail keeps each token (4 bytes),
/// its occurrence in the chain of the token's occurrences (12) and, for a token new to the tail,
/// its entry in the map of newest occurrences (8, in a table at most 7/8 full), in vectors and
/// tables that grow by doubling: 36 bytes a token of random ids over SmolLM2's vocabulary (500
/// tails of 2,000 tokens, measured by RssAnon), fewer for text that repeats itself, against a
/// run's 6–8. The budget counts tail tokens this many times.
pub const TAIL_WEIGHT: u64 = 5;

/// What a small run costs against the budget at least (`Inner::run_floor`).
const RUN_FLOOR_TOKENS: u64 = 4_096;

/// Longest request id kept for [`LiveStore::append_pieces`].
pub const MAX_REQUEST_ID: usize = 128;

/// The token ids the live index takes: the reference index's.
#[derive(Debug, Clone, Copy)]
pub struct Vocabulary {
    pub width: TokenWidth,
    pub eos_token_id: u32,
    pub vocab_size: u64,
}

impl Vocabulary {
    /// The vocabulary of `index`'s tokens.
    pub fn of(index: &(impl Corpus + ?Sized)) -> Self {
        Self {
            width: index.width(),
            eos_token_id: index.eos_token_id(),
            vocab_size: index.vocab_size(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Where runs are kept across restarts; `None`: a temporary folder, removed when the index is
    /// dropped. An existing folder must be empty or one the live index made.
    pub data_dir: Option<PathBuf>,
    /// Tokens held over all namespaces, tails counted [`TAIL_WEIGHT`] times and each run at least
    /// `Inner::run_floor`; past it the oldest runs of the namespace holding the most are evicted.
    /// About 8 bytes of memory a token.
    pub budget_tokens: u64,
    /// A tail this big is frozen into a run.
    pub freeze_tokens: u64,
    /// Runs of one level merged into one of the next.
    pub merge_fanout: usize,
    pub max_namespaces: usize,
    /// Time between compaction rounds when nothing wakes the compactor earlier.
    pub compact_every: Duration,
    /// Compaction in a background thread (a server); `false`: only when the owner calls
    /// [`LiveIndex::compact`], so a replay that calls it at the same points drafts the same every
    /// time.
    pub background: bool,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            budget_tokens: 50_000_000,
            freeze_tokens: 1 << 16,
            merge_fanout: 4,
            max_namespaces: 1024,
            compact_every: Duration::from_secs(1),
            background: true,
        }
    }
}

impl LiveConfig {
    pub fn check(&self) -> Result<()> {
        if self.freeze_tokens == 0 || self.merge_fanout < 2 || self.max_namespaces == 0 {
            return Err(LiveError::Invalid(
                "live: freeze_tokens and max_namespaces must be at least 1, merge_fanout at least 2"
                    .into(),
            ));
        }
        if self
            .freeze_tokens
            .checked_mul(8)
            .is_none_or(|t| self.budget_tokens < t)
        {
            return Err(LiveError::Invalid(format!(
                "live: a budget of {} tokens is less than 8 tails of {} (freeze_tokens)",
                self.budget_tokens, self.freeze_tokens
            )));
        }
        Ok(())
    }

    /// Most tokens one namespace's tails hold, and so most one request may add.
    fn max_pending_per_namespace(&self) -> u64 {
        4 * self.freeze_tokens
    }
}

/// What the live index holds and what befell it, for `Info` and the metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveStats {
    pub namespaces: usize,
    pub runs: usize,
    pub tokens: u64,
    /// Tokens in memory: tails and tails being built into runs.
    pub tail_tokens: u64,
    pub evicted_runs: u64,
    /// Builds and list writes that failed (each is tried again; nothing is dropped).
    pub failed_writes: u64,
    /// Runs that failed their checks at open and were set aside.
    pub runs_set_aside: u64,
    pub namespaces_reclaimed: u64,
    /// Why appends are refused now, if they are: the last disk write failed.
    pub write_failure: Option<String>,
}

/// The counters of [`LiveStats`].
#[derive(Default)]
struct Counters {
    evicted_runs: AtomicU64,
    failed_writes: AtomicU64,
    runs_set_aside: AtomicU64,
    namespaces_reclaimed: AtomicU64,
}

pub struct LiveIndex {
    inner: Arc<Inner>,
    /// The background compactor (none without `LiveConfig::background`); taken by the first
    /// [`LiveIndex::close`].
    compactor: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Inner {
    config: LiveConfig,
    vocab: Vocabulary,
    root: PathBuf,
    /// Whether `root` is our temporary folder, removed at drop.
    temporary: bool,
    namespaces: RwLock<HashMap<String, Arc<Namespace>>>,
    next_document: AtomicU64,
    next_freeze: AtomicU64,
    /// Tokens in every namespace's tail and frozen tail.
    pending: AtomicU64,
    /// An append was refused for room in the tails: the next round freezes them early.
    room_wanted: AtomicBool,
    /// The last disk write's error while writes fail; appends are refused meanwhile.
    write_failure: Mutex<Option<String>>,
    recent: Mutex<RecentRequests>,
    stats: Counters,
    wake: (Mutex<bool>, Condvar),
    /// Held through a compaction round: compaction assumes it alone changes the runs.
    compacting: Mutex<()>,
    /// Held while a namespace is created or reclaimed (before the map's lock and any namespace's).
    creating: Mutex<()>,
    stop: AtomicBool,
    /// Held for the index's life: one process per data folder.
    _lock: Option<std::fs::File>,
}

impl Inner {
    fn namespaces(&self) -> Vec<Arc<Namespace>> {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        map.values().cloned().collect()
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned()
    }

    fn next_document(&self) -> u64 {
        self.next_document.fetch_add(1, Ordering::Relaxed)
    }

    fn next_freeze(&self) -> u64 {
        self.next_freeze.fetch_add(1, Ordering::Relaxed)
    }

    fn wake_compactor(&self) {
        let (flag, cond) = &self.wake;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cond.notify_one();
    }

    /// Most tokens the tails hold before the biggest are frozen early and appends are held to
    /// each namespace's share: a quarter of the budget, at what tails cost.
    fn pending_cap(&self) -> u64 {
        self.config.budget_tokens / (4 * TAIL_WEIGHT)
    }

    /// Least a run costs against the budget, however few its tokens: its half-dozen memory-mapped
    /// files take whole pages each, about 32 KB, what 4,096 tokens cost in a big run (a soak over
    /// 1,000 namespaces held 2,284 runs and took twice the budget's bytes without this floor).
    /// Never more than a tail that is frozen when full.
    fn run_floor(&self) -> u64 {
        RUN_FLOOR_TOKENS.min(self.config.freeze_tokens)
    }

    /// A disk write succeeded: appends are taken again.
    fn wrote(&self) {
        let mut failure = self.write_failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.take().is_some() {
            tracing::info!(root = %self.root.display(), "the live index writes to its disk again; appends are taken");
        }
    }

    fn failed_to_write(&self, error: &LiveError) {
        self.stats.failed_writes.fetch_add(1, Ordering::Relaxed);
        *self.write_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
    }

    /// Admits an append of `n` tokens to a namespace whose tails hold `held` (of `namespaces`),
    /// counting them in `pending` when `reserve`. Refused: while the disk refuses writes; past a
    /// namespace's own limit; and past the tails' share of the budget, unless the namespace holds
    /// less than its fair part of that share (so one tenant that writes fast cannot starve the
    /// others, and the tails stay under about half the budget) or nothing at all is waiting (so
    /// any request the limits allow gets in eventually).
    fn admit(
        &self,
        namespace: &str,
        held: u64,
        n: u64,
        namespaces: usize,
        reserve: bool,
    ) -> Result<()> {
        if let Some(e) = &*self.write_failure.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(LiveError::Full(format!(
                "the live index cannot write its runs to disk under {} ({e}); what it acknowledged is kept in memory and appends are refused until the disk takes writes again",
                self.root.display()
            )));
        }
        let per_namespace = self.config.max_pending_per_namespace();
        if held + n > per_namespace {
            return Err(LiveError::Full(format!(
                "namespace {namespace:?} has {held} tokens waiting to be built into runs ({per_namespace} at most); try again shortly"
            )));
        }
        let cap = self.pending_cap();
        let share = cap / namespaces.max(1) as u64;
        let fits = |pending: u64| pending == 0 || pending + n <= cap || held + n <= share;
        let refused = |pending: u64| {
            self.room_wanted.store(true, Ordering::Relaxed);
            self.wake_compactor();
            Err(LiveError::Full(format!(
                "the live index has {pending} tokens waiting to be built into runs ({cap} at most, or {share} per namespace beyond that); try again shortly"
            )))
        };
        if !reserve {
            let pending = self.pending.load(Ordering::Relaxed);
            return if fits(pending) {
                Ok(())
            } else {
                refused(pending)
            };
        }
        let taken = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                fits(p).then_some(p + n)
            });
        match taken {
            Ok(_) => Ok(()),
            Err(pending) => refused(pending),
        }
    }

    /// Takes `ns` out of the index and removes its folder if it holds nothing. An append that held
    /// it finds it retired and looks again.
    fn reclaim(&self, ns: &Arc<Namespace>) -> Result<()> {
        let _creating = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        let mut state = ns.write();
        if state.retired || !state.is_empty() {
            return Ok(());
        }
        if !ns.remove_folder()? {
            return Ok(());
        }
        state.retired = true;
        if map.get(&ns.name).is_some_and(|m| Arc::ptr_eq(m, ns)) {
            map.remove(&ns.name);
        }
        self.stats
            .namespaces_reclaimed
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl LiveIndex {
    /// Opens the data folder (created if missing; an existing one must be empty or the live
    /// index's own) with the namespaces a previous run left, or a temporary folder; and starts the
    /// compactor.
    pub fn open(config: LiveConfig, vocab: Vocabulary) -> Result<Self> {
        config.check()?;
        let (root, temporary) = match &config.data_dir {
            Some(dir) => (dir.clone(), false),
            None => (temporary_root()?, true),
        };
        folder::adopt_root(&root)?;
        let lock = lock_folder(&root)?;
        let stats = Counters::default();
        let mut namespaces = HashMap::new();
        let mut oldest = 0;
        let mut recent = RecentRequests::default();
        let (mut pending, mut next_document) = (0, 0);
        for name in namespace_folders(&root)? {
            let ns = match Namespace::open(&root, &name, &vocab) {
                Ok(opened) => {
                    stats
                        .runs_set_aside
                        .fetch_add(opened.set_aside as u64, Ordering::Relaxed);
                    for record in &opened.replayed {
                        match record {
                            journal::Record::Append { request_id, pieces } => {
                                recent.record(&name, request_id);
                                // Ids handed out here, not a router's (high bit set), go on after
                                // these so that no new document continues a replayed one.
                                next_document = (pieces.iter())
                                    .map(|(doc, _)| doc + 1)
                                    .filter(|&d| d < 1 << 63)
                                    .fold(next_document, u64::max);
                            }
                            journal::Record::Ids(ids) => {
                                for id in ids {
                                    recent.record(&name, id);
                                }
                            }
                            journal::Record::Retract { .. } => {}
                        }
                    }
                    let ns = opened.namespace;
                    pending += ns.read().pending();
                    ns
                }
                // A full disk is not a namespace at fault (opening may copy a damaged journal
                // aside or rewrite a list): the start is refused, nothing set aside.
                Err(e @ LiveError::Full(_)) => return Err(e),
                Err(e) => {
                    set_aside(&root, &name, &e)?;
                    continue;
                }
            };
            oldest = ns
                .read()
                .runs
                .iter()
                .map(|r| r.meta.oldest + 1)
                .fold(oldest, u64::max);
            namespaces.insert(name, Arc::new(ns));
        }
        if !namespaces.is_empty() {
            tracing::info!(root = %root.display(), namespaces = namespaces.len(), tail_tokens = pending, "live index loaded (tails read back from their journals)");
        }
        let inner = Arc::new(Inner {
            config,
            vocab,
            root,
            temporary,
            namespaces: RwLock::new(namespaces),
            next_document: AtomicU64::new(next_document),
            next_freeze: AtomicU64::new(oldest),
            pending: AtomicU64::new(pending),
            room_wanted: AtomicBool::new(false),
            write_failure: Mutex::new(None),
            recent: Mutex::new(recent),
            stats,
            wake: (Mutex::new(false), Condvar::new()),
            compacting: Mutex::new(()),
            creating: Mutex::new(()),
            stop: AtomicBool::new(false),
            _lock: Some(lock),
        });
        // Namespaces that hold nothing (all evicted, or every run set aside) are not kept; one
        // whose folder cannot be removed is simply served empty.
        for ns in inner.namespaces() {
            if let Err(e) = inner.reclaim(&ns) {
                tracing::warn!(namespace = %ns.name, error = %e, "could not reclaim an empty live namespace");
            }
        }
        let compactor = match inner.config.background {
            true => {
                let inner = inner.clone();
                let thread = std::thread::Builder::new()
                    .name("live-compactor".into())
                    .spawn(move || run_compactor(&inner))
                    .map_err(|e| LiveError::io(Path::new("live-compactor thread"), e))?;
                Some(thread)
            }
            false => None,
        };
        Ok(Self {
            inner,
            compactor: Mutex::new(compactor),
        })
    }

    pub fn vocabulary(&self) -> &Vocabulary {
        &self.inner.vocab
    }

    /// Runs a compaction round now, in the caller's thread (tests); with `flush`, every tail
    /// becomes a run whatever its size.
    #[cfg(test)]
    fn compact_now(&self, flush: bool) {
        compact::round(&self.inner, flush)
    }

    /// The namespace called `name`, created if it is new and the limit allows.
    fn namespace_or_create(&self, name: &str) -> Result<Arc<Namespace>> {
        let inner = &self.inner;
        if let Some(ns) = inner.namespace(name) {
            return Ok(ns);
        }
        check_name(name)?;
        // One creator at a time, but lookups in other namespaces go on while its folder is made.
        let _creating = inner.creating.lock().unwrap_or_else(|e| e.into_inner());
        let held = {
            let map = inner.namespaces.read().unwrap_or_else(|e| e.into_inner());
            if let Some(ns) = map.get(name) {
                return Ok(ns.clone());
            }
            map.len()
        };
        if held >= inner.config.max_namespaces {
            return Err(LiveError::Full(format!(
                "the live index already holds {held} namespaces (max_namespaces); namespaces that hold nothing are reclaimed"
            )));
        }
        let ns = Arc::new(Namespace::create(&inner.root, name)?);
        let mut map = inner.namespaces.write().unwrap_or_else(|e| e.into_inner());
        map.insert(name.to_string(), ns.clone());
        Ok(ns)
    }

    /// Checks a request whole: ids, sizes, its name and id.
    fn check_pieces(&self, namespace: &str, pieces: &[Piece], request_id: &str) -> Result<u64> {
        check_name(namespace)?;
        if request_id.len() > MAX_REQUEST_ID {
            return Err(LiveError::Invalid(format!(
                "a request_id of {} bytes (at most {MAX_REQUEST_ID})",
                request_id.len()
            )));
        }
        let vocab_size = self.inner.vocab.vocab_size;
        let per_namespace = self.inner.config.max_pending_per_namespace();
        let mut total = 0u64;
        for piece in pieces {
            if let Some(bad) = piece.tokens.iter().find(|&&t| t as u64 >= vocab_size) {
                return Err(LiveError::Invalid(format!(
                    "token id {bad} is outside the vocabulary (size {vocab_size})"
                )));
            }
            total += piece.tokens.len() as u64;
        }
        if total > per_namespace {
            return Err(LiveError::Invalid(format!(
                "{total} tokens at once is more than the live index takes in one request ({per_namespace}: 4 × freeze_tokens); send them in smaller requests"
            )));
        }
        Ok(total)
    }

    pub fn stats(&self) -> LiveStats {
        let inner = &self.inner;
        let mut stats = LiveStats {
            evicted_runs: inner.stats.evicted_runs.load(Ordering::Relaxed),
            failed_writes: inner.stats.failed_writes.load(Ordering::Relaxed),
            runs_set_aside: inner.stats.runs_set_aside.load(Ordering::Relaxed),
            namespaces_reclaimed: inner.stats.namespaces_reclaimed.load(Ordering::Relaxed),
            write_failure: inner
                .write_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            ..LiveStats::default()
        };
        for ns in inner.namespaces() {
            let state = ns.read();
            stats.namespaces += 1;
            stats.runs += state.runs.len();
            stats.tokens += state.tokens();
            stats.tail_tokens += state.pending();
        }
        stats
    }
}

impl LiveIndex {
    /// Stops the compactor once the build under way is done and, with a data folder, builds the
    /// tails into runs, so a clean stop keeps everything learnt. Later appends stay in the tail
    /// (and searchable) but are no longer compacted. Dropping the index closes it too.
    pub fn close(&self) {
        // Held throughout, so a second caller returns only once the first is done.
        let mut compactor = self.compactor.lock().unwrap_or_else(|e| e.into_inner());
        if self.inner.stop.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(compactor) = compactor.take() {
            self.inner.wake_compactor();
            let _ = compactor.join();
        }
        if !self.inner.temporary {
            compact::round(&self.inner, true);
            let lost = self.inner.pending.load(Ordering::Relaxed);
            if lost > 0 {
                tracing::warn!(
                    tokens = lost,
                    "the live index closes with tokens it could not build into runs; its journals keep them for the next start"
                );
            }
        }
    }

    /// A compaction round in the caller's thread, for an index without a background compactor
    /// (`LiveConfig::background` false): full tails become runs, runs merge, the budget is kept.
    /// Nothing once the index is closed.
    pub fn compact(&self) {
        if !self.inner.stop.load(Ordering::Relaxed) {
            compact::round(&self.inner, false);
        }
    }
}

impl Drop for LiveIndex {
    fn drop(&mut self) {
        self.close();
        if self.inner.temporary {
            let _ = std::fs::remove_dir_all(&self.inner.root);
        }
    }
}

fn run_compactor(inner: &Inner) {
    let (flag, cond) = &inner.wake;
    while !inner.stop.load(Ordering::Relaxed) {
        let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compact::round(inner, false)
        }));
        if round.is_err() {
            tracing::error!("a live compaction round panicked; it is tried again");
        }
        let guard = flag.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) = cond
            .wait_timeout_while(guard, inner.config.compact_every, |w| !*w)
            .unwrap_or_else(|e| e.into_inner());
        *woken = false;
    }
}

/// The namespaces of a data folder the live index adopted. Its own files and what it set aside
/// are passed over; a folder with a namespace's name holding nothing but the start of its marker
/// is what a kill between creating a namespace's folder and marking it leaves, and is removed;
/// anything else is refused by name.
fn namespace_folders(root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for name in folder::entries(root)? {
        let path = root.join(&name);
        let own_file = [folder::ROOT_MARKER, LOCK_FILE].contains(&name.as_str());
        if own_file || (name.starts_with(SET_ASIDE_PREFIX) && path.is_dir()) {
            continue;
        }
        if path.is_dir() && check_name(&name).is_ok() {
            if folder::is_namespace(&path)? {
                names.push(name);
                continue;
            }
            if folder::remove_if_begun(&path)? {
                continue;
            }
        }
        return Err(LiveError::Invalid(format!(
            "[live] data_dir {}: {name:?} is not one of the live index's namespaces (no {}); \
             the live index leaves it alone and will not start beside it: move it elsewhere",
            root.display(),
            folder::NAMESPACE_MARKER
        )));
    }
    Ok(names)
}

const TEMPORARY_PREFIX: &str = "infini-sidecar-live-";

/// A folder of our own under the system's temporary folder. Those of processes that are gone (a
/// kill leaves them) are removed first.
fn temporary_root() -> Result<PathBuf> {
    remove_orphaned_temporaries();
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| LiveError::Invalid(format!("no randomness: {e}")))?;
    Ok(std::env::temp_dir().join(format!(
        "{TEMPORARY_PREFIX}{}-{}",
        std::process::id(),
        hex::encode(nonce)
    )))
}

fn remove_orphaned_temporaries() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(TEMPORARY_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid.is_some_and(|pid| {
            (unsafe { libc::kill(pid, 0) }) != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        });
        if gone && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::info!(path = %entry.path().display(), "removed the temporary live index of a process that is gone");
        }
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Renames a namespace that cannot be opened out of the way (to `.bad-NAME-SECONDS`, which no
/// namespace name can be), so the sidecar starts with the others; nothing is deleted.
fn set_aside(root: &Path, name: &str, error: &LiveError) -> Result<()> {
    let to = root.join(format!("{SET_ASIDE_PREFIX}{name}-{}", unix_seconds()));
    std::fs::rename(root.join(name), &to).map_err(|e| LiveError::io(&to, e))?;
    tracing::error!(namespace = name, moved_to = %to.display(), error = %error, "a live namespace could not be opened and was set aside");
    Ok(())
}

/// Takes the data folder's lock file (advisory, released when the process ends, however it ends).
fn lock_folder(root: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = root.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| LiveError::io(&path, e))?;
    // SAFETY: flock on a descriptor we own, for as long as `file` lives.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(LiveError::Invalid(format!(
            "{}: the live data folder is in use by another process",
            root.display()
        )));
    }
    Ok(file)
}

/// Tokens for one live document.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    pub doc: u64,
    pub tokens: &'a [u32],
}

/// How far an append is kept before it is acknowledged. Either way it is in the namespace's
/// journal, which a kill of the process does not lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the journal (a sequence's learnt tokens: a step costs a microsecond or two).
    Written,
    /// Written and synced to the disk, so it survives the machine (documents a caller adds:
    /// about 0.2 ms here).
    Synced,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Added,
    /// Its request id had been seen: nothing was added again.
    Repeated,
}

/// Where sequences with a namespace learn and draft from: a live index here, or behind a router
/// the live index of the namespace's owner shard server, so every router's sequences learn into
/// one place and draft from what all of them generated.
pub trait LiveStore: Send + Sync {
    /// A new document's id, for [`LiveStore::append_pieces`].
    fn new_document(&self) -> u64;

    /// Appends each piece to its document of `namespace` (created at its first append), all or
    /// none: the request is checked whole first, so a refused one changes nothing and creates no
    /// namespace. A non-empty `request_id` seen lately for this namespace adds nothing again.
    fn append_pieces(
        &self,
        namespace: &str,
        pieces: &[Piece],
        request_id: &str,
        durability: Durability,
    ) -> Result<Appended>;

    /// Appends `tokens` to document `doc` of `namespace`.
    fn append(&self, namespace: &str, doc: u64, tokens: &[u32]) -> Result<()> {
        self.append_pieces(namespace, &[Piece { doc, tokens }], "", Durability::Written)
            .map(|_| ())
    }

    /// Adds whole documents to `namespace`, all or none, synced to the disk.
    fn add_documents(
        &self,
        namespace: &str,
        docs: &[Vec<u32>],
        request_id: &str,
    ) -> Result<Appended> {
        let pieces: Vec<Piece> = docs
            .iter()
            .map(|d| Piece {
                doc: self.new_document(),
                tokens: d,
            })
            .collect();
        self.append_pieces(namespace, &pieces, request_id, Durability::Synced)
    }

    /// Takes the last `n` tokens of document `doc` back, if they are still in memory; returns
    /// whether it did (otherwise they stay, and the caller goes on in a new document).
    fn retract(&self, _namespace: &str, _doc: u64, _n: usize) -> bool {
        false
    }

    /// What followed the longest match of `pattern`'s end in `namespace`, and the match's length
    /// (nothing when the namespace holds nothing, or cannot be reached: drafting is best effort).
    fn continuations(
        &self,
        namespace: &str,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize);

    /// What the live index holds, where it is in this process.
    fn stats(&self) -> Option<LiveStats> {
        None
    }

    /// Keeps what was learnt and stops background work (at shutdown).
    fn close(&self) {}
}

impl LiveStore for LiveIndex {
    fn new_document(&self) -> u64 {
        self.inner.next_document()
    }

    fn append_pieces(
        &self,
        namespace: &str,
        pieces: &[Piece],
        request_id: &str,
        durability: Durability,
    ) -> Result<Appended> {
        let n = self.check_pieces(namespace, pieces, request_id)?;
        let inner = &self.inner;
        let existing = inner.namespace(namespace);
        if existing.is_none() {
            if n == 0 {
                // Nothing to add, and no namespace made for it; its id is kept all the same.
                let mut recent = inner.recent.lock().unwrap_or_else(|e| e.into_inner());
                if recent.seen(namespace, request_id) {
                    return Ok(Appended::Repeated);
                }
                recent.record(namespace, request_id);
                return Ok(Appended::Added);
            }
            // A request refused for want of room creates nothing.
            let namespaces = inner.namespaces.read().map_or(0, |m| m.len()) + 1;
            inner.admit(namespace, 0, n, namespaces, false)?;
        }
        let mut ns = match existing {
            Some(ns) => ns,
            None => self.namespace_or_create(namespace)?,
        };
        let full = loop {
            // Read before the namespace's lock: `reclaim` takes the map's lock, then a namespace's.
            let namespaces = inner.namespaces.read().map_or(1, |m| m.len());
            let mut state = ns.write();
            if state.retired {
                drop(state);
                ns = self.namespace_or_create(namespace)?;
                continue;
            }
            // The namespace's lock orders appends to it, so its ids need no other lock held
            // through the journal's write (a sync of AddDocuments would hold back every namespace).
            let seen = (inner.recent.lock().unwrap_or_else(|e| e.into_inner()))
                .seen(namespace, request_id);
            if seen {
                return Ok(Appended::Repeated);
            }
            let sync = durability == Durability::Synced;
            let taken = inner
                .admit(namespace, state.pending(), n, namespaces, true)
                .and_then(|()| {
                    // Counted in `pending` by `admit`: given back if the journal refuses it.
                    state
                        .journal
                        .append(request_id, pieces, sync)
                        .inspect_err(|_| {
                            inner.pending.fetch_sub(n, Ordering::Relaxed);
                        })
                });
            if let Err(e) = taken {
                let empty = state.is_empty();
                drop(state);
                if empty {
                    inner.reclaim(&ns)?;
                }
                return Err(e);
            }
            for piece in pieces {
                state.tail.append(piece.doc, piece.tokens);
            }
            (inner.recent.lock().unwrap_or_else(|e| e.into_inner())).record(namespace, request_id);
            break state.tail.tokens() as u64 >= inner.config.freeze_tokens;
        };
        if full && inner.config.background {
            inner.wake_compactor();
        }
        Ok(Appended::Added)
    }

    fn retract(&self, namespace: &str, doc: u64, n: usize) -> bool {
        let Some(ns) = self.inner.namespace(namespace) else {
            return false;
        };
        let mut state = ns.write();
        if state.tail.held(doc) < n {
            return false;
        }
        // Written first: a retraction the journal does not hold is not made (the caller goes on in
        // a new document), or the next start would read the tokens back inside the document.
        if let Err(e) = state.journal.retract(doc, n as u64) {
            tracing::warn!(namespace, error = %e, "could not journal a retraction; the tokens stay");
            return false;
        }
        let retracted = state.tail.retract(doc, n);
        if retracted {
            self.inner.pending.fetch_sub(n as u64, Ordering::Relaxed);
        }
        retracted
    }

    fn continuations(
        &self,
        namespace: &str,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize) {
        let from = pattern.len().saturating_sub(namespace::MAX_MATCH);
        self.inner
            .namespace(namespace)
            .map_or((Vec::new(), 0), |ns| {
                ns.continuations(&pattern[from..], samples, depth)
            })
    }

    fn stats(&self) -> Option<LiveStats> {
        Some(LiveIndex::stats(self))
    }

    fn close(&self) {
        LiveIndex::close(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: Vocabulary = Vocabulary {
        width: TokenWidth::U16,
        eos_token_id: 0,
        vocab_size: 2_000,
    };

    /// A small deterministic generator (xorshift), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Documents over a vocabulary of 300 ids in 1..=300 (none is eos), each with a phrase of a few
    /// shared ones so that long matches exist.
    fn documents(rng: &mut Rng, n: usize) -> Vec<Vec<u32>> {
        let phrases: Vec<Vec<u32>> = (0..8)
            .map(|_| (0..12).map(|_| 1 + rng.below(300) as u32).collect())
            .collect();
        (0..n)
            .map(|_| {
                let mut doc: Vec<u32> = (0..20).map(|_| 1 + rng.below(300) as u32).collect();
                let at = rng.below(doc.len() as u64) as usize;
                let phrase = &phrases[rng.below(8) as usize];
                doc.splice(at..at, phrase.iter().copied());
                doc
            })
            .collect()
    }

    /// Brute force: the longest suffix of `pattern` (at most `MAX_MATCH`) that occurs in a document
    /// with a token after it, and every continuation (of at most `depth`) after its occurrences.
    fn oracle(docs: &[Vec<u32>], pattern: &[u32], depth: usize) -> (usize, Vec<Vec<u32>>) {
        for len in (1..=pattern.len().min(namespace::MAX_MATCH)).rev() {
            let suffix = &pattern[pattern.len() - len..];
            let conts: Vec<Vec<u32>> = docs
                .iter()
                .flat_map(|d| {
                    (0..d.len().saturating_sub(len))
                        .filter(move |&i| &d[i..i + len] == suffix)
                        .map(move |i| d[i + len..d.len().min(i + len + depth)].to_vec())
                })
                .collect();
            if !conts.is_empty() {
                return (len, conts);
            }
        }
        (0, Vec::new())
    }

    fn config(data_dir: Option<PathBuf>) -> LiveConfig {
        LiveConfig {
            data_dir,
            budget_tokens: 1 << 20,
            freeze_tokens: 200,
            merge_fanout: 2,
            // Compaction runs when the test says, not on a timer.
            compact_every: Duration::from_secs(3600),
            ..LiveConfig::default()
        }
    }

    /// Checks lookups of patterns cut from `docs` (and a few random ones) against the oracle.
    fn check_lookups(live: &LiveIndex, ns: &str, docs: &[Vec<u32>], rng: &mut Rng) {
        for _ in 0..200 {
            let d = &docs[rng.below(docs.len() as u64) as usize];
            let end = 1 + rng.below(d.len() as u64 - 1) as usize;
            let start = end.saturating_sub(1 + rng.below(20) as usize);
            let mut pattern = vec![1 + rng.below(300) as u32];
            pattern.extend_from_slice(&d[start..end]);
            let (conts, len) = live.continuations(ns, &pattern, 1_000, 4);
            let (want_len, want) = oracle(docs, &pattern, 4);
            assert_eq!(len, want_len, "match length of {pattern:?}");
            assert!(!conts.is_empty(), "{pattern:?} has continuations");
            for c in &conts {
                assert!(want.contains(c), "{c:?} does not follow {pattern:?}");
            }
        }
    }

    #[test]
    fn lookups_agree_with_brute_force_in_the_tail_in_runs_and_across_both() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let live = LiveIndex::open(config(None), VOCAB).unwrap();
        let docs = documents(&mut rng, 60);
        // Most documents become runs (merged over two levels), the last ones stay in the tail.
        for chunk in docs[..50].chunks(10) {
            live.add_documents("a", chunk, "").unwrap();
            live.compact_now(false);
        }
        let stats = live.stats();
        assert!(stats.runs >= 2, "{stats:?}");
        live.add_documents("a", &docs[50..], "").unwrap();
        check_lookups(&live, "a", &docs, &mut rng);
        live.compact_now(true);
        assert_eq!(live.stats().tail_tokens, 0);
        check_lookups(&live, "a", &docs, &mut rng);
        assert_eq!(
            live.stats().tokens,
            docs.iter().map(|d| d.len() as u64).sum::<u64>()
        );
    }

    /// Tails frozen small, one after another (as when the tails are full and each is frozen
    /// early), leave at most one run under the floor in their namespace, and every document
    /// still answers as brute force says.
    #[test]
    fn small_runs_of_a_namespace_merge_into_one_whatever_their_number() {
        let mut rng = Rng(11);
        let live = LiveIndex::open(config(None), VOCAB).unwrap();
        let docs = documents(&mut rng, 40);
        for doc in &docs {
            live.add_documents("a", std::slice::from_ref(doc), "")
                .unwrap();
            live.compact_now(true);
            let ns = live.inner.namespace("a").unwrap();
            let state = ns.read();
            let floor = live.inner.run_floor();
            let small = state.runs.iter().filter(|r| r.meta.tokens < floor).count();
            assert!(small <= 1, "{small} runs under {floor} tokens");
        }
        check_lookups(&live, "a", &docs, &mut rng);
    }

    #[test]
    fn without_a_background_compactor_runs_are_built_only_when_asked() {
        let mut rng = Rng(5);
        let dir = tempfile::tempdir().unwrap();
        let inline = LiveConfig {
            background: false,
            ..config(Some(dir.path().to_path_buf()))
        };
        let docs = documents(&mut rng, 25);
        let live = LiveIndex::open(inline.clone(), VOCAB).unwrap();
        // 320 tokens: past the freeze size, and nothing compacts them until asked.
        live.add_documents("a", &docs[..10], "").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!((live.stats().runs, live.stats().tail_tokens), (0, 320));
        live.compact();
        assert_eq!(live.stats().tail_tokens, 0);
        assert!(live.stats().runs >= 1);
        live.add_documents("a", &docs[10..20], "").unwrap();
        live.compact();
        // 160 tokens, under the freeze size: they stay in the tail.
        live.add_documents("a", &docs[20..], "").unwrap();
        live.compact();
        assert_eq!(live.stats().tail_tokens, 160);
        check_lookups(&live, "a", &docs, &mut rng);
        // A clean close builds the tail into a run; nothing compacts after it, and what is
        // appended after it stays in the tail, kept by the journal alone.
        live.close();
        live.add_documents("a", &docs[..10], "").unwrap();
        live.compact();
        assert_eq!(live.stats().tail_tokens, 320);
        drop(live);
        let reopened = LiveIndex::open(inline, VOCAB).unwrap();
        assert_eq!(reopened.stats().tail_tokens, 320);
        assert_eq!(reopened.stats().tokens, 35 * 32);
        check_lookups(&reopened, "a", &docs, &mut rng);
    }

    #[test]
    fn runs_that_tie_share_the_samples_as_one_index_would() {
        let mut rng = Rng(11);
        // Runs never merge here, whenever compaction runs: three batches leave three runs at least.
        let unmerged = LiveConfig {
            merge_fanout: 64,
            ..config(None)
        };
        let live = LiveIndex::open(unmerged, VOCAB).unwrap();
        let doc = documents(&mut rng, 1).remove(0);
        // The same document in every run: each ties for the longest match of its head.
        for _ in 0..3 {
            live.add_documents("a", &vec![doc.clone(); 10], "").unwrap();
            live.compact_now(true);
        }
        let runs = live.stats().runs;
        assert!(runs >= 3, "{:?}", live.stats());
        let pattern = &doc[..6];
        let (want_len, want) = oracle(std::slice::from_ref(&doc), pattern, 4);
        let samples = 8;
        let (conts, len) = live.continuations("a", pattern, samples, 4);
        assert_eq!(len, want_len);
        // Each run takes its share of the samples, at least one: never `samples` each.
        assert!(
            (samples..samples + runs).contains(&conts.len()),
            "{} continuations from {runs} runs",
            conts.len()
        );
        assert!(conts.iter().all(|c| want.contains(c)), "{conts:?}");
    }

    #[test]
    fn namespaces_never_see_each_other() {
        let mut rng = Rng(7);
        let live = LiveIndex::open(config(None), VOCAB).unwrap();
        let docs = documents(&mut rng, 10);
        live.add_documents("a", &docs, "").unwrap();
        let pattern = &docs[0][..5];
        assert!(live.continuations("a", pattern, 64, 4).1 > 0);
        assert_eq!(live.continuations("b", pattern, 64, 4), (Vec::new(), 0));
        live.compact_now(false);
        live.add_documents("b", &documents(&mut Rng(8), 10), "")
            .unwrap();
        let (conts, _) = live.continuations("b", pattern, 64, 4);
        let (_, want) = oracle(&documents(&mut Rng(8), 10), pattern, 4);
        assert!(conts.iter().all(|c| want.contains(c)));
    }

    #[test]
    fn runs_survive_a_restart_and_what_a_kill_left_is_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(11);
        let docs = documents(&mut rng, 40);
        {
            let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
            for chunk in docs.chunks(10) {
                live.add_documents("team-1", chunk, "").unwrap();
                live.compact_now(false);
            }
            // A second process may not use the folder while this one does.
            let again = LiveIndex::open(config(Some(dir.path().into())), VOCAB);
            assert!(matches!(again, Err(LiveError::Invalid(_))));
        }
        // What a kill during compaction leaves: a run no list names, a builder's work folder.
        let ns = dir.path().join("team-1");
        std::fs::create_dir(ns.join("run-99999999")).unwrap();
        std::fs::create_dir(ns.join("run-99999998.partial-1")).unwrap();
        // And what a kill while a namespace was being made leaves: its folder with its marker
        // half written, or nothing in it yet.
        let begun = dir.path().join("team-2");
        std::fs::create_dir(&begun).unwrap();
        std::fs::write(begun.join("namespace.json.partial"), "{\"for").unwrap();
        std::fs::create_dir(dir.path().join("team-3")).unwrap();
        let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
        assert!(!ns.join("run-99999999").exists());
        assert!(!ns.join("run-99999998.partial-1").exists());
        assert!(!begun.exists() && !dir.path().join("team-3").exists());
        assert_eq!(live.stats().namespaces, 1);
        assert_eq!(
            live.stats().tokens,
            docs.iter().map(|d| d.len() as u64).sum::<u64>()
        );
        check_lookups(&live, "team-1", &docs, &mut rng);
    }

    #[test]
    fn a_namespace_whose_list_cannot_be_read_is_set_aside_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let docs = documents(&mut Rng(3), 20);
        {
            let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
            live.add_documents("a", &docs[..10], "").unwrap();
            live.add_documents("b", &docs[10..], "").unwrap();
        }
        // The clean stop above froze both tails into runs.
        let list = dir.path().join("a").join("runs.json");
        let text = std::fs::read_to_string(&list).unwrap();
        assert!(text.contains("run-"), "{text}");
        std::fs::write(&list, &text[..text.len() / 2]).unwrap();
        let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
        // "b" is served; "a" was moved aside whole, not deleted.
        assert_eq!(live.stats().namespaces, 1);
        assert!(live.continuations("b", &docs[15][..8], 64, 4).1 >= 8);
        assert_eq!(live.continuations("a", &docs[5][..8], 64, 4).1, 0);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".bad-a-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert!(dir.path().join(&aside[0]).join("runs.json").exists());
    }

    #[test]
    fn oversized_pieces_bad_names_and_bad_ids_are_refused() {
        let live = LiveIndex::open(config(None), VOCAB).unwrap();
        let doc: Vec<u32> = (1..=801).collect();
        assert!(matches!(
            live.add_documents("a", std::slice::from_ref(&doc), ""),
            Err(LiveError::Invalid(_))
        ));
        live.add_documents("a", &[doc[..800].to_vec()], "").unwrap();
        let long = "n".repeat(65);
        for bad in ["", "LOCK", "lock", ".x", "a/b", "..", long.as_str()] {
            assert!(
                matches!(live.append(bad, 0, &[1]), Err(LiveError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            live.append("a", 0, &[2_000]),
            Err(LiveError::Invalid(_))
        ));
    }

    /// Runs of 224 tokens merge four at a time (896), and two of those into one of 1,792 at once,
    /// since a third would not fit under a quarter of the budget (2,000): 6,048 tokens are held in
    /// six runs, where waiting for four of that level would leave nine. Past the budget, eviction
    /// drops one run at a time (never more than a quarter of the budget), the oldest first.
    #[test]
    fn merges_fill_runs_up_to_a_quarter_of_the_budget_and_eviction_drops_no_more() {
        let mut rng = Rng(11);
        let cfg = LiveConfig {
            budget_tokens: 8_000,
            merge_fanout: 4,
            background: false,
            ..config(None)
        };
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let docs = documents(&mut rng, 700);
        let (mut added, mut counted) = (0, false);
        for chunk in docs.chunks(7) {
            live.add_documents("a", chunk, "").unwrap();
            live.compact_now(false);
            added += chunk.iter().map(|d| d.len() as u64).sum::<u64>();
            let stats = live.stats();
            if added == 6_048 {
                assert_eq!((stats.tokens, stats.runs), (added, 6), "{stats:?}");
                counted = true;
            }
            if added > cfg.budget_tokens {
                assert!(stats.tokens <= cfg.budget_tokens, "{stats:?}");
                assert!(stats.tokens > cfg.budget_tokens * 3 / 4, "{stats:?}");
            }
        }
        assert!(counted && added > 2 * cfg.budget_tokens);
        let newest = docs.last().unwrap();
        assert_eq!(live.continuations("a", &newest[..10], 64, 4).1, 10);
        assert!(live.continuations("a", &docs[0][..10], 64, 4).1 < 5);
    }

    /// Eviction takes from the namespace that holds the most, its oldest run first, and comes
    /// before merging (so a namespace's oldest run goes alone, not merged with newer ones first):
    /// namespace b writing on and on pushes out its own oldest documents, never a's.
    #[test]
    fn eviction_takes_the_oldest_run_of_the_namespace_that_holds_the_most() {
        let mut rng = Rng(17);
        let cfg = LiveConfig {
            budget_tokens: 2_000,
            background: false,
            ..config(None)
        };
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let docs = documents(&mut rng, 140);
        let add = |ns: &str, chunk: &[Vec<u32>]| {
            live.add_documents(ns, chunk, "").unwrap();
            live.compact_now(false);
        };
        add("a", &docs[..7]);
        for chunk in docs[7..].chunks(7) {
            add("b", chunk);
            let stats = live.stats();
            assert!(stats.tokens <= cfg.budget_tokens, "{stats:?}");
        }
        assert!(live.stats().evicted_runs > 0);
        for d in &docs[..7] {
            assert_eq!(
                live.continuations("a", &d[..10], 64, 4).1,
                10,
                "a lost a document"
            );
        }
        assert_eq!(live.continuations("b", &docs[139][..10], 64, 4).1, 10);
        let oldest_kept = (docs[7..21].iter())
            .filter(|d| live.continuations("b", &d[..10], 64, 4).1 == 10)
            .count();
        assert!(
            oldest_kept <= 2,
            "{oldest_kept} of b's 14 oldest documents kept"
        );
    }

    /// What the probe did (F7): a run's token bytes overwritten on disk were served, drafting ids
    /// outside the vocabulary. Now its checksums are verified at open and the run alone is set
    /// aside (renamed, not deleted); the namespace serves its other runs.
    #[test]
    fn a_run_whose_bytes_changed_is_set_aside_alone_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let docs = documents(&mut Rng(23), 20);
        let unmerged = LiveConfig {
            merge_fanout: 64,
            background: false,
            ..config(Some(dir.path().into()))
        };
        {
            let live = LiveIndex::open(unmerged.clone(), VOCAB).unwrap();
            live.add_documents("a", &docs[..10], "").unwrap();
            live.compact_now(true);
            live.add_documents("a", &docs[10..], "").unwrap();
        }
        let run = dir.path().join("a").join(run::folder_name(0));
        let tokens = run.join("tokenized.0");
        let mut bytes = std::fs::read(&tokens).unwrap();
        let middle = (bytes.len() / 2) & !1;
        bytes[middle..middle + 8].fill(0xff);
        std::fs::write(&tokens, bytes).unwrap();
        let live = LiveIndex::open(unmerged, VOCAB).unwrap();
        let stats = live.stats();
        assert_eq!((stats.runs_set_aside, stats.runs), (1, 1), "{stats:?}");
        assert!(!run.exists());
        let aside = std::fs::read_dir(dir.path().join("a"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with(".bad-run-00000000-")
            })
            .count();
        assert_eq!(aside, 1);
        assert_eq!(live.continuations("a", &docs[15][..10], 64, 4).1, 10);
        for d in &docs {
            let (conts, _) = live.continuations("a", &d[..6], 64, 4);
            assert!(conts
                .iter()
                .flatten()
                .all(|&t| (t as u64) < VOCAB.vocab_size));
        }
        // The reopened list names only the good run: a second open sets nothing aside.
        drop(live);
        let again = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
        assert_eq!(again.stats().runs_set_aside, 0);
    }

    /// F5: tails were bounded by `max_namespaces × 4 × freeze_tokens`, not by the budget: two
    /// clients writing over 800 namespaces held 150 M tokens in memory at a 0.5 M budget. Now the
    /// tails hold at most about half the budget at what they cost, whatever the number of
    /// namespaces, and each namespace keeps its share.
    #[test]
    fn tails_stay_within_the_budget_whatever_the_number_of_namespaces() {
        let cfg = LiveConfig {
            budget_tokens: 48_000,
            freeze_tokens: 2_000,
            max_namespaces: 1_000,
            background: false,
            ..config(None)
        };
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let doc: Vec<u32> = (1..=300).collect();
        let cap = cfg.budget_tokens / (4 * TAIL_WEIGHT);
        let (mut taken, mut refused) = (0, 0);
        for round in 0..4 {
            for ns in 0..400 {
                match live.append(&format!("n{ns}"), (round * 1000 + ns) as u64, &doc) {
                    Ok(()) => taken += 1,
                    Err(LiveError::Full(_)) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
                let held = live.stats().tail_tokens;
                assert!(held <= 2 * cap + 300, "{held} tokens in tails");
            }
            live.compact_now(false);
            let stats = live.stats();
            let weighed = stats.tokens + (TAIL_WEIGHT - 1) * stats.tail_tokens;
            assert!(weighed <= cfg.budget_tokens, "{stats:?}");
        }
        assert!(taken > 0 && refused > 0, "{taken} taken, {refused} refused");
        // A namespace that holds nothing waiting is never refused for room while others hold more.
        assert!(live.append("newcomer", 99_999, &doc[..10]).is_ok());
    }

    /// Appends, retractions that empty a namespace, lookups and compaction rounds that reclaim it,
    /// all at once: they take the map's and the namespaces' locks in one order. (An append once read
    /// the map while holding its namespace's lock, and a reclaim held the map while waiting for the
    /// namespace: the soak hung on it.)
    #[test]
    fn appends_and_reclaims_at_once_never_deadlock() {
        let live = Arc::new(LiveIndex::open(config(None), VOCAB).unwrap());
        let until = std::time::Instant::now() + Duration::from_secs(2);
        let (done, finished) = std::sync::mpsc::channel();
        let workers: Vec<_> = (0..4u64)
            .map(|w| {
                let (live, done) = (Arc::clone(&live), done.clone());
                std::thread::spawn(move || {
                    let mut doc = w << 32;
                    while std::time::Instant::now() < until {
                        doc += 1;
                        let ns = ["x", "y"][(doc % 2) as usize];
                        match w % 2 {
                            0 => {
                                if live.append(ns, doc, &[1, 2, 3]).is_ok() {
                                    live.retract(ns, doc, 3);
                                }
                                live.continuations(ns, &[1, 2], 4, 2);
                            }
                            _ => live.compact_now(false),
                        }
                    }
                    let _ = done.send(());
                })
            })
            .collect();
        for _ in &workers {
            finished
                .recv_timeout(Duration::from_secs(30))
                .expect("a worker is stuck: the live index deadlocked");
        }
        for w in workers {
            w.join().unwrap();
        }
    }

    /// F6: a namespace that holds nothing (its tokens taken back, or all evicted) is reclaimed:
    /// its folder goes, and it no longer counts against `max_namespaces`, now or after a restart.
    #[test]
    fn empty_namespaces_are_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LiveConfig {
            max_namespaces: 2,
            background: false,
            ..config(Some(dir.path().into()))
        };
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        live.append("a", 1, &[1, 2, 3]).unwrap();
        live.append("b", 2, &[4, 5]).unwrap();
        assert!(matches!(live.append("c", 3, &[6]), Err(LiveError::Full(_))));
        assert!(
            !dir.path().join("c").exists(),
            "a refused append creates nothing"
        );
        assert!(live.retract("b", 2, 2));
        live.compact();
        assert!(!dir.path().join("b").exists());
        live.append("c", 3, &[6]).unwrap();
        assert_eq!(live.stats().namespaces_reclaimed, 1);
        drop(live);
        let live = LiveIndex::open(cfg, VOCAB).unwrap();
        assert_eq!(live.stats().namespaces, 2);
        assert_eq!(live.continuations("a", &[1, 2], 8, 4), (vec![vec![3]], 2));
    }

    #[test]
    fn past_the_budget_the_oldest_documents_go_first() {
        let mut rng = Rng(5);
        let mut cfg = config(None);
        cfg.budget_tokens = 8 * cfg.freeze_tokens;
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let docs = documents(&mut rng, 200);
        for chunk in docs.chunks(10) {
            live.add_documents("a", chunk, "").unwrap();
            live.compact_now(false);
            assert!(live.stats().tokens <= cfg.budget_tokens);
        }
        // The newest document is held whole; the oldest is gone (its random head matches nothing
        // longer than a token or two by chance).
        let newest = docs.last().unwrap();
        assert_eq!(live.continuations("a", &newest[..10], 64, 4).1, 10);
        assert!(live.continuations("a", &docs[0][..10], 64, 4).1 < 5);
    }
}
