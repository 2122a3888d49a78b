//! A sequence's live namespace: it drafts from what every sequence of the namespace generated, and
//! with `learn` its own tokens go there as a document, taken back when the sequence is cut while
//! the document is still in memory.

use std::sync::Arc;

use super::Sequence;
use crate::live::{LiveError, LiveStore};

/// The live namespace a sequence drafts from, and the live document its tokens go to when it
/// learns.
pub(super) struct LiveLink {
    pub(super) live: Arc<dyn LiveStore>,
    pub(super) namespace: String,
    learning: Option<Learning>,
}

/// The live document a learning sequence's tokens go to: it holds the sequence's tokens from
/// `start` to `held`.
struct Learning {
    doc: u64,
    start: usize,
    held: usize,
}

/// What a sequence may draft from beyond the reference index and its own tokens.
#[derive(Clone, Default)]
pub struct Extras {
    /// A live index and the namespace to draft from ("" for none).
    pub live: Option<Arc<dyn LiveStore>>,
    pub namespace: String,
    /// Add the sequence's tokens to the namespace as a document.
    pub learn: bool,
    /// Text the output is expected to resemble; ids must have been checked.
    pub reference: Vec<u32>,
}

impl Sequence {
    /// The sequence with `extras`: a live namespace (when both a live index and a namespace are
    /// given) and a reference text (when not empty).
    pub fn with_extras(self, extras: Extras) -> Result<Self, LiveError> {
        let mut seq = match (extras.live, extras.namespace.is_empty()) {
            (Some(live), false) => self.with_live(live, &extras.namespace, extras.learn)?,
            _ => self,
        };
        if !extras.reference.is_empty() {
            seq = seq.with_reference(extras.reference);
        }
        Ok(seq)
    }

    /// Drafts also from `namespace` of the live index; with `learn`, the sequence's tokens (those
    /// it has and those appended later) are added to it as a document, for every sequence of the
    /// namespace to draft from at once. Learning is best effort: refused (the namespace limit, a
    /// full disk), the sequence does without it and says why in [`Sequence::warning`].
    fn with_live(
        mut self,
        live: Arc<dyn LiveStore>,
        namespace: &str,
        learn: bool,
    ) -> Result<Self, LiveError> {
        crate::live::namespace::check_name(namespace)?;
        let learning = learn.then(|| Learning {
            doc: live.new_document(),
            start: 0,
            held: 0,
        });
        self.live = Some(LiveLink {
            live,
            namespace: namespace.to_string(),
            learning,
        });
        self.learn();
        Ok(self)
    }

    /// Sends the tokens the live document lacks. Learning is best effort: a failure (the namespace
    /// limit, a full disk) stops it for this sequence, with a warning, and never fails decoding.
    pub(super) fn learn(&mut self) {
        let Some(link) = &mut self.live else {
            return;
        };
        let Some(learning) = &mut link.learning else {
            return;
        };
        let new = &self.tokens[learning.held..];
        if new.is_empty() {
            return;
        }
        match link.live.append(&link.namespace, learning.doc, new) {
            Ok(()) => learning.held = self.tokens.len(),
            Err(e) => {
                tracing::warn!(namespace = %link.namespace, error = %e, "a sequence stopped learning into the live index");
                self.warning = Some(format!(
                    "stopped learning into namespace {:?}: {e}",
                    link.namespace
                ));
                link.learning = None;
            }
        }
    }

    /// The sequence was cut to `len` tokens: its live document lets go of the rest.
    pub(super) fn unlearn(&mut self, len: usize) {
        let Some(LiveLink {
            live,
            namespace,
            learning: Some(learning),
        }) = &mut self.live
        else {
            return;
        };
        if learning.held > len {
            // Taken back from the live document while it is in memory; once it is built into
            // a run it cannot be, and the sequence goes on in a new document from the cut.
            // Either way what the sequence teaches is at most what it appended, never its
            // kept tokens again at each cut.
            let back = learning.held - len;
            if len < learning.start || !live.retract(namespace, learning.doc, back) {
                *learning = Learning {
                    doc: live.new_document(),
                    start: len,
                    held: len,
                };
            }
            learning.held = len;
        }
    }
}
