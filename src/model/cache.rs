//! The key/value cache of one batch of sequences: preallocated per layer and written in place, so a
//! decode step costs O(new tokens), and truncatable, so rejected draft tokens roll back for free.

use candle_core::{DType, Device, Tensor};

/// Keys and values of every layer, `(batch, kv_heads, capacity, head_dim)`; the first `len` positions
/// are valid.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    max_len: usize,
}

/// Capacity grows in steps of this many positions (then doubles), so short sequences stay small.
const INITIAL_CAPACITY: usize = 256;

impl KvCache {
    /// An empty cache for `num_layers` layers that may grow to `max_len` positions.
    pub fn new(num_layers: usize, max_len: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
            max_len,
        }
    }

    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Forgets every position from `len` on (rolling back rejected tokens); a no-op when `len` is
    /// not shorter than what is cached.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps, of the positions from `from` on, only the given offsets (increasing), moved down to
    /// `from, from + 1, ..`: the accepted path of a verified draft tree, made contiguous.
    pub fn keep(&mut self, from: usize, offsets: &[usize]) -> candle_core::Result<()> {
        let increasing = offsets.windows(2).all(|w| w[0] < w[1]);
        if !increasing || offsets.last().is_some_and(|&o| from + o >= self.len) {
            candle_core::bail!(
                "cannot keep offsets {offsets:?} after {from} of {} cached positions",
                self.len
            );
        }
        // Offsets only grow faster than their new places, so no source is overwritten before it
        // is read.
        for (k, v) in self.layers.iter().flatten() {
            for (to, &offset) in offsets.iter().enumerate().filter(|(to, &o)| o != *to) {
                for t in [k, v] {
                    let row = t.narrow(2, from + offset, 1)?.contiguous()?;
                    t.slice_set(&row, 2, from + to)?;
                }
            }
        }
        self.len = from + offsets.len();
        Ok(())
    }

    /// Marks `n` more positions valid, once every layer has written them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Writes the new keys and values of `layer` (`(batch, kv_heads, n, head_dim)`) after the cached
    /// positions and returns views of all `len + n` of them.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let n = k.dim(2)?;
        let need = self.len + n;
        if need > self.max_len {
            candle_core::bail!(
                "context of {need} positions exceeds the cache's {}",
                self.max_len
            );
        }
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| candle_core::Error::Msg(format!("no cache for layer {layer}")))?;
        let batch = k.dim(0)?;
        let (capacity, cached_batch) = match slot.as_ref() {
            Some((ck, _)) => (ck.dim(2)?, ck.dim(0)?),
            None => (0, batch),
        };
        if self.len > 0 && cached_batch != batch {
            candle_core::bail!("the cache holds {cached_batch} sequences, not {batch}");
        }
        let grown = match slot.take() {
            Some(kv) if capacity >= need && cached_batch == batch => kv,
            old => {
                let new_cap = need
                    .max(INITIAL_CAPACITY)
                    .max(capacity * 2)
                    .min(self.max_len.max(need));
                let (kh, hd) = (k.dim(1)?, k.dim(3)?);
                let fresh = |dev: &Device| Tensor::zeros((batch, kh, new_cap, hd), DType::F32, dev);
                let (nk, nv) = (fresh(k.device())?, fresh(v.device())?);
                if let Some((ok, ov)) = old.filter(|_| self.len > 0) {
                    nk.slice_set(&ok.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    nv.slice_set(&ov.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                (nk, nv)
            }
        };
        grown.0.slice_set(&k.contiguous()?, 2, self.len)?;
        grown.1.slice_set(&v.contiguous()?, 2, self.len)?;
        let views = (grown.0.narrow(2, 0, need)?, grown.1.narrow(2, 0, need)?);
        *slot = Some(grown);
        Ok(views)
    }
}
