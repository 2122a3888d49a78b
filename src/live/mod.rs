//! The live index: what the served models generate (and what callers add), learnt while decoding
//! goes on and searchable at once, beside the read-only reference index. Data belongs to a
//! namespace (a tenant, an agent workflow); nothing is shared between namespaces.
//!
//! Each namespace is a small log-structured store of suffix arrays. New tokens go to an in-memory
//! tail (O(1) per token, searched by looking back from a token's recent occurrences); a background
//! thread (or the owner, when it asks: a replay) freezes a full tail into a suffix-array run with
//! the index builder and merges runs level by level, so a lookup visits a logarithmic number of
//! runs however much has been learnt; runs live in the data folder and are loaded again at the
//! next start; past the token budget the oldest runs are evicted. Why this and not a suffix tree or
//! automaton: those take no deletions, so eviction would mean rebuilding anyway, and they cost tens
//! of bytes a token where a run costs the index's 6–8.
//! A kill loses at most the tail and the frozen tail, never a run (`namespace`).

mod compact;
pub mod namespace;
pub mod run;
pub mod tail;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::index::{IndexError, TokenWidth};
use namespace::{check_name, Namespace};

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
    /// A limit of the live index (namespaces, tokens per request) was reached.
    #[error("{0}")]
    Full(String),
    #[error(transparent)]
    Index(IndexError),
}

impl LiveError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        LiveError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T, E = LiveError> = std::result::Result<T, E>;

/// The token ids the live index takes: the reference index's.
#[derive(Debug, Clone, Copy)]
pub struct Vocabulary {
    pub width: TokenWidth,
    pub eos_token_id: u32,
    pub vocab_size: u64,
}

#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Where runs are kept across restarts; `None`: a temporary folder, removed when the index is
    /// dropped.
    pub data_dir: Option<PathBuf>,
    /// Tokens held over all namespaces; past it the oldest are evicted. The index's memory is about
    /// 6–12 bytes a token (runs: the tokens, their suffix array and its samples; tails: tokens and
    /// positions).
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
}

/// What the live index holds, for `Info` and the metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveStats {
    pub namespaces: usize,
    pub runs: usize,
    pub tokens: u64,
    pub tail_tokens: u64,
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
    wake: (Mutex<bool>, Condvar),
    /// Held through a compaction round: compaction assumes it alone changes the runs.
    compacting: Mutex<()>,
    /// Held while a namespace is created.
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
}

/// The data folder's lock file (never a namespace name).
pub(crate) const LOCK_FILE: &str = "LOCK";

impl LiveIndex {
    /// Opens the data folder (created if missing) with the namespaces a previous run left, or a
    /// temporary folder; and starts the compactor.
    pub fn open(config: LiveConfig, vocab: Vocabulary) -> Result<Self> {
        config.check()?;
        let (root, temporary) = match &config.data_dir {
            Some(dir) => (dir.clone(), false),
            None => (temporary_root()?, true),
        };
        std::fs::create_dir_all(&root).map_err(|e| LiveError::io(&root, e))?;
        let lock = lock_folder(&root)?;
        let mut namespaces = HashMap::new();
        let mut oldest = 0;
        let entries = std::fs::read_dir(&root).map_err(|e| LiveError::io(&root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| LiveError::io(&root, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.path().is_dir() || check_name(&name).is_err() {
                continue;
            }
            let ns = match Namespace::open(&root, &name, &vocab) {
                Ok(ns) => ns,
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
            tracing::info!(root = %root.display(), namespaces = namespaces.len(), "live index loaded");
        }
        let inner = Arc::new(Inner {
            config,
            vocab,
            root,
            temporary,
            namespaces: RwLock::new(namespaces),
            next_document: AtomicU64::new(0),
            next_freeze: AtomicU64::new(oldest),
            wake: (Mutex::new(false), Condvar::new()),
            compacting: Mutex::new(()),
            creating: Mutex::new(()),
            stop: AtomicBool::new(false),
            _lock: Some(lock),
        });
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

    pub fn stats(&self) -> LiveStats {
        let mut stats = LiveStats::default();
        for ns in self.inner.namespaces() {
            let state = ns.read();
            stats.namespaces += 1;
            stats.runs += state.runs.len();
            stats.tokens += state.tokens();
            stats.tail_tokens += state.tail.tokens() as u64;
        }
        stats
    }

    /// Runs a compaction round now, in the caller's thread (tests); with `flush`, every tail
    /// becomes a run whatever its size.
    #[cfg(test)]
    fn compact_now(&self, flush: bool) {
        compact::round(&self.inner, flush)
    }

    fn namespace_or_create(&self, name: &str) -> Result<Arc<Namespace>> {
        let inner = &self.inner;
        if let Some(ns) = inner
            .namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(ns.clone());
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
                "the live index already holds {held} namespaces (max_namespaces)"
            )));
        }
        let ns = Arc::new(Namespace::create(&inner.root, name)?);
        let mut map = inner.namespaces.write().unwrap_or_else(|e| e.into_inner());
        map.insert(name.to_string(), ns.clone());
        Ok(ns)
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

/// Renames a namespace that cannot be opened out of the way (to `.bad-NAME-SECONDS`, which no
/// namespace name can be), so the sidecar starts with the others; nothing is deleted.
fn set_aside(root: &Path, name: &str, error: &LiveError) -> Result<()> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let to = root.join(format!(".bad-{name}-{secs}"));
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

/// Where sequences with a namespace learn and draft from: a live index here, or behind a router
/// the live index of the namespace's owner shard server, so every router's sequences learn into
/// one place and draft from what all of them generated.
pub trait LiveStore: Send + Sync {
    /// A new document's id, for [`LiveStore::append`].
    fn new_document(&self) -> u64;

    /// Appends `tokens` to document `doc` of `namespace` (created at its first append). The ids
    /// are checked first, so a bad one changes nothing.
    fn append(&self, namespace: &str, doc: u64, tokens: &[u32]) -> Result<()>;

    /// Adds whole documents to `namespace`.
    fn add_documents(&self, namespace: &str, docs: &[Vec<u32>]) -> Result<()>;

    /// What followed the longest match of `pattern`'s end in `namespace`, and the match's length
    /// (nothing when the namespace holds nothing, or cannot be reached: drafting is best effort).
    fn continuations(
        &self,
        namespace: &str,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize);

    /// Keeps what was learnt and stops background work (at shutdown).
    fn close(&self) {}
}

impl LiveStore for LiveIndex {
    fn new_document(&self) -> u64 {
        self.inner.next_document()
    }

    fn append(&self, namespace: &str, doc: u64, tokens: &[u32]) -> Result<()> {
        if let Some(bad) = tokens
            .iter()
            .find(|&&t| t as u64 >= self.inner.vocab.vocab_size)
        {
            return Err(LiveError::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.inner.vocab.vocab_size
            )));
        }
        let ns = self.namespace_or_create(namespace)?;
        let full = {
            let mut state = ns.write();
            // Compaction far behind (or failing): refuse rather than grow without bound.
            let behind = 4 * self.inner.config.freeze_tokens;
            if tokens.len() as u64 > behind {
                return Err(LiveError::Invalid(format!(
                    "{} tokens at once is more than the live index takes in one piece ({behind}: 4 × freeze_tokens)",
                    tokens.len()
                )));
            }
            if (state.tail.tokens() + tokens.len()) as u64 > behind {
                return Err(LiveError::Full(format!(
                    "namespace {namespace:?} has {} tokens waiting to be compacted; try again shortly",
                    state.tail.tokens()
                )));
            }
            state.tail.append(doc, tokens);
            state.tail.tokens() as u64 >= self.inner.config.freeze_tokens
        };
        if full && self.inner.config.background {
            self.inner.wake_compactor();
        }
        Ok(())
    }

    fn add_documents(&self, namespace: &str, docs: &[Vec<u32>]) -> Result<()> {
        for doc in docs {
            self.append(namespace, self.new_document(), doc)?;
        }
        Ok(())
    }

    fn continuations(
        &self,
        namespace: &str,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize) {
        let ns = {
            let map = self
                .inner
                .namespaces
                .read()
                .unwrap_or_else(|e| e.into_inner());
            map.get(namespace).cloned()
        };
        let from = pattern.len().saturating_sub(namespace::MAX_MATCH);
        ns.map_or((Vec::new(), 0), |ns| {
            ns.continuations(&pattern[from..], samples, depth)
        })
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
            live.add_documents("a", chunk).unwrap();
            live.compact_now(false);
        }
        let stats = live.stats();
        assert!(stats.runs >= 2, "{stats:?}");
        live.add_documents("a", &docs[50..]).unwrap();
        check_lookups(&live, "a", &docs, &mut rng);
        live.compact_now(true);
        assert_eq!(live.stats().tail_tokens, 0);
        check_lookups(&live, "a", &docs, &mut rng);
        assert_eq!(
            live.stats().tokens,
            docs.iter().map(|d| d.len() as u64).sum::<u64>()
        );
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
        live.add_documents("a", &docs[..10]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!((live.stats().runs, live.stats().tail_tokens), (0, 320));
        live.compact();
        assert_eq!(live.stats().tail_tokens, 0);
        assert!(live.stats().runs >= 1);
        live.add_documents("a", &docs[10..20]).unwrap();
        live.compact();
        // 160 tokens, under the freeze size: they stay in the tail.
        live.add_documents("a", &docs[20..]).unwrap();
        live.compact();
        assert_eq!(live.stats().tail_tokens, 160);
        check_lookups(&live, "a", &docs, &mut rng);
        // A clean close builds the tail into a run; nothing compacts after it, and what is
        // appended after it stays in the tail and is not kept.
        live.close();
        live.add_documents("a", &docs[..10]).unwrap();
        live.compact();
        assert_eq!(live.stats().tail_tokens, 320);
        drop(live);
        let reopened = LiveIndex::open(inline, VOCAB).unwrap();
        assert_eq!(reopened.stats().tail_tokens, 0);
        assert_eq!(reopened.stats().tokens, 25 * 32);
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
            live.add_documents("a", &vec![doc.clone(); 10]).unwrap();
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
        live.add_documents("a", &docs).unwrap();
        let pattern = &docs[0][..5];
        assert!(live.continuations("a", pattern, 64, 4).1 > 0);
        assert_eq!(live.continuations("b", pattern, 64, 4), (Vec::new(), 0));
        live.compact_now(false);
        live.add_documents("b", &documents(&mut Rng(8), 10))
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
                live.add_documents("team-1", chunk).unwrap();
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
        let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
        assert!(!ns.join("run-99999999").exists());
        assert!(!ns.join("run-99999998.partial-1").exists());
        assert_eq!(
            live.stats().tokens,
            docs.iter().map(|d| d.len() as u64).sum::<u64>()
        );
        check_lookups(&live, "team-1", &docs, &mut rng);
    }

    #[test]
    fn a_namespace_whose_list_disagrees_with_its_runs_is_set_aside_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let docs = documents(&mut Rng(3), 20);
        {
            let live = LiveIndex::open(config(Some(dir.path().into())), VOCAB).unwrap();
            live.add_documents("a", &docs[..10]).unwrap();
            live.add_documents("b", &docs[10..]).unwrap();
        }
        // The clean stop above froze both tails into runs.
        let list = dir.path().join("a").join("runs.json");
        let text = std::fs::read_to_string(&list).unwrap();
        assert!(text.contains("run-"), "{text}");
        std::fs::write(&list, text.replace("\"tokens\": ", "\"tokens\": 1")).unwrap();
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
            live.add_documents("a", std::slice::from_ref(&doc)),
            Err(LiveError::Invalid(_))
        ));
        live.add_documents("a", &[doc[..800].to_vec()]).unwrap();
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
            live.add_documents("a", chunk).unwrap();
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

    /// Namespace a's second run arrives over the budget. Merged first with a's first run (the
    /// oldest of all), it would be evicted with it; evicted first, the first run goes alone.
    #[test]
    fn eviction_drops_the_oldest_run_before_merging_could_fold_newer_ones_into_it() {
        let mut rng = Rng(17);
        let cfg = LiveConfig {
            budget_tokens: 2_000,
            background: false,
            ..config(None)
        };
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let docs = documents(&mut rng, 63);
        let add = |ns: &str, chunk: &[Vec<u32>]| {
            live.add_documents(ns, chunk).unwrap();
            live.compact_now(false);
        };
        add("a", &docs[..7]);
        for chunk in docs[7..56].chunks(7) {
            add("b", chunk);
        }
        assert_eq!(live.stats().tokens, 1_792);
        add("a", &docs[56..]);
        assert_eq!(live.stats().tokens, 1_792, "{:?}", live.stats());
        assert_eq!(live.continuations("a", &docs[62][..10], 64, 4).1, 10);
        assert!(live.continuations("a", &docs[0][..10], 64, 4).1 < 5);
    }

    #[test]
    fn past_the_budget_the_oldest_documents_go_first() {
        let mut rng = Rng(5);
        let mut cfg = config(None);
        cfg.budget_tokens = 8 * cfg.freeze_tokens;
        let live = LiveIndex::open(cfg.clone(), VOCAB).unwrap();
        let docs = documents(&mut rng, 200);
        for chunk in docs.chunks(10) {
            live.add_documents("a", chunk).unwrap();
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
