//! ZeRO: the data-parallel gradient buckets of a chunk, the rank's gradient and optimizer
//! shards, the reductions started during backward and finished after it, and the whole state
//! gathered back from the shards (for checkpoints).

use std::ops::Range;

use exatrain_parallel::comm::{CommError, Communicator, Metered, Started};

use super::Start;
use crate::model::{Gpt, GptShape};
use crate::optim::AdamW;

pub(super) struct Regions {
    /// (range in the chunk's buffer, shard length = ⌈len / dp⌉), in buffer order
    pub(super) regions: Vec<(Range<usize>, usize)>,
}

impl Regions {
    pub(super) fn new(model: &Gpt<f32>, dp: usize, bucket_elems: usize) -> Regions {
        let layout = &model.layout;
        let wte = layout.wte.clone();
        let mut cuts = vec![model.params.len()];
        for b in layout.blocks.iter().skip(1).rev() {
            let start = b.ln1w.start;
            if bucket_elems > 0 && cuts.last().expect("end") - start >= bucket_elems {
                cuts.push(start);
            }
        }
        cuts.push(wte.end);
        cuts.reverse();
        let rest = cuts.windows(2).map(|w| w[0]..w[1]);
        let regions = std::iter::once(wte)
            .chain(rest)
            .filter(|r| !r.is_empty())
            .map(|r| {
                let s = r.len().div_ceil(dp);
                (r, s)
            })
            .collect();
        Regions { regions }
    }

    /// Elements a reduction of region k copies out while in flight: what it sends and receives.
    pub(super) fn staged(&self, k: usize, zero: u8, dp: usize) -> usize {
        let (r, s) = &self.regions[k];
        if zero == 0 {
            2 * r.len()
        } else {
            s * dp + s
        }
    }

    /// This dp rank's piece of region k, in the chunk's buffer.
    pub(super) fn piece(&self, k: usize, dp_rank: usize) -> Range<usize> {
        let (r, s) = &self.regions[k];
        let lo = (r.start + dp_rank * s).min(r.end);
        lo..(lo + s).min(r.end)
    }
}

/// The ranges of `decayed` inside `piece`, relative to its start.
pub(super) fn decay_within(decayed: &[Range<usize>], piece: &Range<usize>) -> Vec<Range<usize>> {
    decayed
        .iter()
        .filter_map(|r| {
            let (s, e) = (r.start.max(piece.start), r.end.min(piece.end));
            (s < e).then(|| s - piece.start..e - piece.start)
        })
        .collect()
}

/// One model chunk of this rank with its optimizer and gradient shards.
pub(super) struct Chunk {
    pub(super) model: Gpt<f32>,
    /// virtual stage index
    pub(super) stage: usize,
    pub(super) regions: Regions,
    /// ZeRO ≥ 1: this rank's reduced gradient shard of each region (padded)
    pub(super) shard_grads: Vec<Vec<f32>>,
    /// one AdamW per optimized piece: the whole buffer (ZeRO-0) or each region's piece
    pub(super) opts: Vec<(Range<usize>, AdamW)>,
    /// which gradient elements this rank counts in the global norm
    pub(super) counted: Vec<bool>,
    /// the embedding is tied to another rank's chunk (first and last stage differ)
    pub(super) tied: bool,
    pub(super) slots: usize,
}

impl Chunk {
    /// Which optimizer holds element `i` of the buffer, and at which index (None: another
    /// data-parallel rank's shard).
    pub(super) fn opt_index(&self, i: usize) -> Option<(usize, usize)> {
        self.opts
            .iter()
            .position(|(p, _)| p.contains(&i))
            .map(|k| (k, i - self.opts[k].0.start))
    }

    /// Take this chunk's parameters and optimizer state from the whole model's.
    pub(super) fn restore(&mut self, shape: &GptShape, st: &Start) {
        for (l, w, n) in self.model.layout.shard_runs(shape) {
            for j in 0..n {
                self.model.params[l + j] = st.params[w + j];
                if let Some((k, at)) = self.opt_index(l + j) {
                    self.opts[k].1.m[at] = st.m[w + j];
                    self.opts[k].1.v[at] = st.v[w + j];
                }
            }
        }
        for (_, o) in &mut self.opts {
            o.step = st.opt_step;
        }
    }
}

/// The whole model's state on every rank: each element is contributed by exactly one rank (the
/// one that counts it in the norm and holds its optimizer shard), the rest add zeros, and one
/// all-reduce over the world sums them.
pub(super) fn gather_whole(
    shape: &GptShape,
    chunks: &[Chunk],
    zero: u8,
    dp_i: usize,
    step: u64,
    world: &dyn Communicator,
) -> Result<Start, CommError> {
    let n = crate::model::ParamLayout::new(shape).total;
    let mut all = vec![0.0f32; 3 * n];
    let mut opt_step = 0;
    for ch in chunks {
        for (l, w, len) in ch.model.layout.shard_runs(shape) {
            for j in 0..len {
                let i = l + j;
                let Some((k, at)) = ch.opt_index(i) else { continue };
                if !ch.counted[i] || (zero == 0 && dp_i != 0) {
                    continue;
                }
                let o = &ch.opts[k].1;
                all[w + j] = ch.model.params[i];
                all[n + w + j] = o.m[at];
                all[2 * n + w + j] = o.v[at];
            }
        }
        opt_step = ch.opts[0].1.step;
    }
    world.all_reduce(&mut all)?;
    let v = all.split_off(2 * n);
    let m = all.split_off(n);
    Ok(Start {
        step,
        opt_step,
        params: all,
        m,
        v,
        min_loss: None,
    })
}

/// Start the data-parallel reduction of bucket `k` of gradients `g`: an all-reduce (ZeRO 0) or
/// a reduce-scatter of the bucket padded to dp equal shards (ZeRO ≥ 1).
pub(super) fn start_bucket(
    regions: &Regions,
    k: usize,
    g: &[f32],
    zero: u8,
    dpm: &Metered,
) -> Result<Started, CommError> {
    let (r, s) = regions.regions[k].clone();
    if zero == 0 {
        dpm.start_all_reduce(g[r].to_vec())
    } else {
        let mut full = vec![0.0f32; s * dpm.size()];
        full[..r.len()].copy_from_slice(&g[r]);
        dpm.start_reduce_scatter(full)
    }
}

/// Wait for the pending reductions (of chunk `only`, or all) in the order started, and put
/// each result in place: the reduced bucket back into the gradients (ZeRO 0), or added to the
/// rank's shard (ZeRO ≥ 1).
pub(super) fn finish(
    pending: &mut Vec<(usize, usize, Started)>,
    only: Option<usize>,
    chunks: &mut [Chunk],
    dpm: &Metered,
    zero: u8,
) -> Result<(), CommError> {
    let (now, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|p| only.is_none_or(|c| p.0 == c));
    *pending = later;
    for (c, k, started) in now {
        let got = dpm.wait(started)?;
        let ch = &mut chunks[c];
        if zero == 0 {
            let r = ch.regions.regions[k].0.clone();
            ch.model.grads[r].copy_from_slice(&got);
        } else {
            for (a, b) in ch.shard_grads[k].iter_mut().zip(&got) {
                *a += *b;
            }
        }
    }
    Ok(())
}
