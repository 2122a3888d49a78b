//! One namespace of the live index: its tail, the tail being frozen, its runs, and the list of runs
//! in its folder (`runs.json`), which is the only thing that says what a namespace holds: a run is
//! built and renamed into place before the list names it, and deleted only after the list stops
//! naming it, so a kill at any moment leaves a list whose runs are all whole. Folders of runs the
//! list does not name are ours and removed at open (the folder carries the namespace's marker,
//! `folder`, so nothing in it is anyone else's). A run that fails its checks at open is set aside
//! alone (renamed, never deleted) and the namespace serves the others. What the tail holds is in
//! the namespace's journal (`journal`) until its run is listed, and is read back at open.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::folder::{self, NAMESPACE_MARKER, SET_ASIDE_PREFIX};
use super::journal::{self, is_journal_file, Journal, Record};
use super::run::{is_run_folder, Run, RunMeta};
use super::tail::Tail;
use super::{LiveError, Result, Vocabulary};

pub(super) const LIST_FILE: &str = "runs.json";
const LIST_VERSION: u32 = 1;

/// Longest suffix of a sequence matched in the live data.
pub const MAX_MATCH: usize = crate::agreement::MAX_AGREEMENT;

#[derive(Debug, Default, Serialize, Deserialize)]
struct RunList {
    version: u32,
    /// Sequence number of the next run, so a new run never reuses an old one's folder name.
    next_run: u64,
    /// Oldest first.
    runs: Vec<RunMeta>,
    /// The first journal generation whose changes are in no run (absent in lists written before
    /// the journal, 2026-11-29: they have no journal).
    #[serde(default)]
    journal_from: u64,
}

pub struct State {
    pub tail: Tail,
    /// Where the tail's changes are written before they are acknowledged.
    pub journal: Journal,
    /// The first journal generation in no listed run.
    pub journal_from: u64,
    /// A tail compaction is building into a run: still searched until the run replaces it.
    pub frozen: Option<Arc<Tail>>,
    /// The journal generation after the frozen tail's: the list's `journal_from` once its run is
    /// listed.
    pub frozen_through: u64,
    /// Oldest first.
    pub runs: Vec<Arc<Run>>,
    pub next_run: u64,
    /// Failed builds of the frozen tail in a row; it is kept and tried again, later each time.
    pub failures: u32,
    /// When the frozen tail's build may be tried again after a failure.
    pub retry_at: Option<Instant>,
    /// Reclaimed (empty, and taken out of the index): an append that finds it so looks again.
    pub retired: bool,
}

impl State {
    fn new(dir: &Path, journal_from: u64, next_journal: u64, next_run: u64) -> Self {
        Self {
            tail: Tail::default(),
            journal: Journal::new(dir, next_journal),
            journal_from,
            frozen: None,
            frozen_through: journal_from,
            runs: Vec::new(),
            next_run,
            failures: 0,
            retry_at: None,
            retired: false,
        }
    }

    /// Freezes the tail (compaction builds it into a run) and starts the journal's next
    /// generation for the new one, carrying `ids` (the request ids the namespace remembers).
    pub fn freeze_tail(&mut self, ids: &[String]) {
        self.frozen = Some(Arc::new(std::mem::take(&mut self.tail)));
        self.frozen_through = self.journal.rotate(ids);
    }

    /// Applies a change read back from the journal to the tail.
    fn replay(&mut self, record: &Record) {
        match record {
            Record::Append { pieces, .. } => {
                for (doc, tokens) in pieces {
                    self.tail.append(*doc, tokens);
                }
            }
            Record::Retract { doc, n } => {
                self.tail.retract(*doc, *n as usize);
            }
            Record::Ids(_) => {}
        }
    }

    pub fn tokens(&self) -> u64 {
        self.pending() + self.runs.iter().map(|r| r.meta.tokens).sum::<u64>()
    }

    /// Tokens in memory: the tail and the tail being frozen.
    pub fn pending(&self) -> u64 {
        let frozen = self.frozen.as_ref().map_or(0, |t| t.tokens());
        (self.tail.tokens() + frozen) as u64
    }

    /// What the runs cost against the budget: their tokens, each run at least `floor`.
    pub fn run_cost(&self, floor: u64) -> u64 {
        self.runs.iter().map(|r| r.meta.tokens.max(floor)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.tail.is_empty() && self.frozen.is_none() && self.runs.is_empty()
    }
}

/// A namespace as [`Namespace::open`] found it.
pub struct Opened {
    pub namespace: Namespace,
    /// Runs that failed their checks and were set aside.
    pub set_aside: usize,
    /// The journal's appends read back into the tail (their request ids, their documents).
    pub replayed: Vec<Record>,
}

pub struct Namespace {
    pub name: String,
    pub dir: PathBuf,
    state: RwLock<State>,
}

/// A namespace name: it names a folder, so it is kept to characters that are safe in one.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !name.eq_ignore_ascii_case(super::LOCK_FILE)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(LiveError::Invalid(format!(
            "namespace {name:?}: use 1 to 64 of A-Z a-z 0-9 . _ - (not starting with '.'; not LOCK)"
        )))
    }
}

impl Namespace {
    /// An empty namespace with its folder created. A folder that is already there belongs to
    /// another name (a case-insensitive file system) or to someone else: it is refused, not shared.
    pub fn create(root: &Path, name: &str) -> Result<Self> {
        check_name(name)?;
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => LiveError::Invalid(format!(
                "namespace {name:?}: its folder {} exists already (names differing only in case share one on this file system)",
                dir.display()
            )),
            _ => LiveError::io(&dir, e),
        })?;
        let ns = Self {
            name: name.to_string(),
            state: RwLock::new(State::new(&dir, 0, 0, 0)),
            dir,
        };
        // The new folder's name is durable once the data folder is synced.
        let made = folder::sync_entries(root)
            .and_then(|()| folder::mark_namespace(&ns.dir))
            .and_then(|()| ns.write_list(&[], 0, 0));
        if let Err(e) = made {
            // The folder was made just now and holds only what this call wrote: removed, so the
            // name stays free for a retry (a full disk) and a restart finds nothing half made.
            if let Err(left) = std::fs::remove_dir_all(&ns.dir) {
                tracing::warn!(dir = %ns.dir.display(), error = %left, "could not remove a namespace folder whose making failed");
            }
            return Err(e);
        }
        Ok(ns)
    }

    /// A namespace as its folder's list leaves it, without the folders of runs the list does not
    /// name (a kill left them), its tail read back from its journal; runs that fail their checks
    /// are set aside.
    pub fn open(root: &Path, name: &str, vocab: &Vocabulary) -> Result<Opened> {
        let dir = root.join(name);
        let path = dir.join(LIST_FILE);
        let list: RunList = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| LiveError::Corrupt(format!("{}: {e}", path.display())))?,
            // A kill between creating the namespace's folder and writing its first list.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RunList {
                version: LIST_VERSION,
                ..RunList::default()
            },
            Err(e) => return Err(LiveError::io(&path, e)),
        };
        if list.version != LIST_VERSION {
            return Err(LiveError::Corrupt(format!(
                "{}: version {}, this build reads {LIST_VERSION}",
                path.display(),
                list.version
            )));
        }
        if let Some(bad) = list
            .runs
            .iter()
            .find(|r| !is_run_folder(&r.name) || r.name.contains(['/', '\\']))
        {
            return Err(LiveError::Corrupt(format!(
                "{}: {:?} is not a run's folder name",
                path.display(),
                bad.name
            )));
        }
        remove_unlisted_runs(&dir, &list.runs)?;
        let listed = list.runs.len();
        let mut runs = Vec::with_capacity(listed);
        for meta in list.runs {
            match Run::open(&dir, meta.clone(), vocab, true) {
                Ok(run) => runs.push(Arc::new(run)),
                Err(e) => set_aside_run(&dir, name, &meta, &e)?,
            }
        }
        let (replayed, next_journal) = journal::replay(&dir, list.journal_from, vocab)?;
        let mut state = State::new(&dir, list.journal_from, next_journal, list.next_run);
        for record in &replayed {
            state.replay(record);
        }
        let set_aside = listed - runs.len();
        let ns = Self {
            name: name.to_string(),
            dir,
            state: RwLock::new(state),
        };
        if set_aside > 0 {
            ns.write_list(&runs, list.next_run, list.journal_from)?;
        }
        ns.write().runs = runs;
        Ok(Opened {
            namespace: ns,
            set_aside,
            replayed,
        })
    }

    /// Removes the folder of a namespace that holds nothing, if it holds only what an empty
    /// namespace has (its marker and list); returns whether it did. A folder with runs set aside
    /// is left as it is.
    pub fn remove_folder(&self) -> Result<bool> {
        let ours =
            |e: &String| e == NAMESPACE_MARKER || e.starts_with(LIST_FILE) || is_journal_file(e);
        let entries = folder::entries(&self.dir)?;
        if !entries.iter().all(ours) {
            return Ok(false);
        }
        // Journals first (a list gone before them would let them be read as the namespace's at the
        // next open), the marker last: a kill before it leaves a namespace that opens empty.
        let mut entries: Vec<&String> = entries.iter().filter(|e| *e != NAMESPACE_MARKER).collect();
        entries.sort_by_key(|e| !is_journal_file(e));
        for name in entries {
            let path = self.dir.join(name);
            std::fs::remove_file(&path).map_err(|e| LiveError::io(&path, e))?;
        }
        let marker = self.dir.join(NAMESPACE_MARKER);
        std::fs::remove_file(&marker).map_err(|e| LiveError::io(&marker, e))?;
        std::fs::remove_dir(&self.dir).map_err(|e| LiveError::io(&self.dir, e))?;
        Ok(true)
    }

    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `runs` as the namespace's list, with the first journal generation in none of
    /// them: written beside it, synced, renamed over it. Called by compaction alone, with no lock
    /// held, before the state takes the same runs.
    pub fn write_list(&self, runs: &[Arc<Run>], next_run: u64, journal_from: u64) -> Result<()> {
        let list = RunList {
            version: LIST_VERSION,
            next_run,
            runs: runs.iter().map(|r| r.meta.clone()).collect(),
            journal_from,
        };
        let path = self.dir.join(LIST_FILE);
        let temp = self.dir.join(format!("{LIST_FILE}.tmp"));
        let json =
            serde_json::to_vec_pretty(&list).map_err(|e| LiveError::Invalid(e.to_string()))?;
        folder::write_whole(&path, &temp, &json)
    }

    /// What followed the longest match of `pattern`'s end in this namespace (at most `depth` tokens
    /// each), pooled over the tail, the frozen tail and the runs that match longest; and its length.
    pub fn continuations(
        &self,
        pattern: &[u32],
        samples: usize,
        depth: usize,
    ) -> (Vec<Vec<u32>>, usize) {
        let state = self.read();
        let mut best = Pooled::default();
        best.offer(state.tail.continuations(pattern, depth));
        if let Some(frozen) = &state.frozen {
            best.offer(frozen.continuations(pattern, depth));
        }
        // The runs' matches next, newest first, each searched only from the longest match so far:
        // a run that cannot reach it costs one search, and only the runs that match longest are
        // sampled.
        let mut found = Vec::new();
        let mut longest = best.len;
        for run in state.runs.iter().rev() {
            if let Some(m) = run
                .index()
                .longest_suffix_from(pattern, longest.max(1), MAX_MATCH)
            {
                longest = m.len;
                found.push((run, m));
            }
        }
        // The runs that match longest share the samples as the parts of one index would.
        let longest_runs: Vec<_> = found.iter().filter(|(_, m)| m.len == longest).collect();
        let pooled = longest_runs.iter().map(|(_, m)| m.count()).sum();
        for (run, m) in longest_runs {
            best.offer((
                run.index().continuations_of(m, samples, depth, pooled),
                m.len,
            ));
        }
        (best.continuations, best.len)
    }
}

/// The continuations of the longest match among those offered; ties pool.
#[derive(Default)]
struct Pooled {
    continuations: Vec<Vec<u32>>,
    len: usize,
}

impl Pooled {
    /// A match with nothing after it (it ends a document) drafts nothing: a shorter one may.
    fn offer(&mut self, (mut conts, len): (Vec<Vec<u32>>, usize)) {
        conts.retain(|c| !c.is_empty());
        if conts.is_empty() {
            return;
        }
        if len > self.len {
            *self = Pooled {
                continuations: conts,
                len,
            };
        } else if len == self.len && len > 0 {
            self.continuations.extend(conts);
        }
    }
}

/// Renames a run that failed its checks at open out of the way (to `.bad-RUN-SECONDS` in its
/// namespace's folder), with a log line; the namespace goes on without it.
fn set_aside_run(dir: &Path, namespace: &str, meta: &RunMeta, error: &LiveError) -> Result<()> {
    let to = dir.join(format!(
        "{SET_ASIDE_PREFIX}{}-{}",
        meta.name,
        super::unix_seconds()
    ));
    let from = dir.join(&meta.name);
    std::fs::rename(&from, &to).map_err(|e| LiveError::io(&to, e))?;
    tracing::error!(namespace, run = %meta.name, tokens = meta.tokens, moved_to = %to.display(), error = %error, "a live run failed its checks at open and was set aside; the namespace is served without it");
    Ok(())
}

/// Removes the folders of runs (and of builds of runs) that `listed` does not name.
fn remove_unlisted_runs(dir: &Path, listed: &[RunMeta]) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| LiveError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LiveError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_run_folder(&name) && !listed.iter().any(|r| r.name == name) {
            let path = entry.path();
            tracing::warn!(path = %path.display(), "removing a run the namespace's list does not name (left by a kill)");
            std::fs::remove_dir_all(&path).map_err(|e| LiveError::io(&path, e))?;
        }
    }
    Ok(())
}
