//! ZeRO: the data-parallel gradient buckets of a chunk, the rank's gradient and optimizer
//! shards, the reductions started during backward and finished after it, and the whole state
//! gathered back from the shards (for checkpoints).

use std::ops::Range;

use exatrain_parallel::comm::{CommError, Communicator, Metered, Started};

use super::Start;
use crate::backend::Backend;
use crate::model::{GptShape, Model, ParamLayout};
use crate::optim::AdamW;

pub(super) struct Regions {
    /// (range in the chunk's buffer, shard length = ⌈len / dp⌉), in buffer order
    pub(super) regions: Vec<(Range<usize>, usize)>,
}

impl Regions {
    pub(super) fn new(layout: &ParamLayout, dp: usize, bucket_elems: usize) -> Regions {
        let wte = layout.wte.clone();
        let mut cuts = vec![layout.total];
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

/// One model chunk of this rank with its optimizer and gradient shards, on backend `B`.
pub(super) struct Chunk<B: Backend<R = f32>> {
    pub(super) model: Model<B>,
    /// virtual stage index
    pub(super) stage: usize,
    pub(super) regions: Regions,
    /// ZeRO ≥ 1: this rank's reduced gradient shard of each region (padded)
    pub(super) shard_grads: Vec<B::Buf>,
    /// one AdamW per optimized piece: the whole buffer (ZeRO-0) or each region's piece
    pub(super) opts: Vec<(Range<usize>, AdamW<B>)>,
    /// which gradient elements this rank counts in the global norm
    pub(super) counted: Vec<bool>,
    /// the embedding is tied to another rank's chunk (first and last stage differ)
    pub(super) tied: bool,
    pub(super) slots: usize,
}

impl<B: Backend<R = f32>> Chunk<B> {
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
        let be = &self.model.be;
        let mut params = be.download(&self.model.params);
        let mut m: Vec<Vec<f32>> = self.opts.iter().map(|(_, o)| be.download(&o.m)).collect();
        let mut v: Vec<Vec<f32>> = self.opts.iter().map(|(_, o)| be.download(&o.v)).collect();
        for (l, w, n) in self.model.layout.shard_runs(shape) {
            for j in 0..n {
                params[l + j] = st.params[w + j];
                if let Some((k, at)) = self.opt_index(l + j) {
                    m[k][at] = st.m[w + j];
                    v[k][at] = st.v[w + j];
                }
            }
        }
        self.model.params = be.upload(params);
        for ((_, o), (m, v)) in self.opts.iter_mut().zip(m.into_iter().zip(v)) {
            o.m = be.upload(m);
            o.v = be.upload(v);
            o.step = st.opt_step;
        }
    }
}

/// The whole model's state on every rank: each element is contributed by exactly one rank (the
/// one that counts it in the norm and holds its optimizer shard), the rest add zeros, and one
/// all-reduce over the world sums them.
pub(super) fn gather_whole<B: Backend<R = f32>>(
    shape: &GptShape,
    chunks: &[Chunk<B>],
    zero: u8,
    dp_i: usize,
    step: u64,
    world: &dyn Communicator,
) -> Result<Start, CommError> {
    let n = crate::model::ParamLayout::new(shape).total;
    let mut all = vec![0.0f32; 3 * n];
    let mut opt_step = 0;
    for ch in chunks {
        let be = &ch.model.be;
        let params = be.download(&ch.model.params);
        let mv: Vec<(Vec<f32>, Vec<f32>)> = ch
            .opts
            .iter()
            .map(|(_, o)| (be.download(&o.m), be.download(&o.v)))
            .collect();
        for (l, w, len) in ch.model.layout.shard_runs(shape) {
            for j in 0..len {
                let i = l + j;
                let Some((k, at)) = ch.opt_index(i) else { continue };
                if !ch.counted[i] || (zero == 0 && dp_i != 0) {
                    continue;
                }
                let (m, v) = &mv[k];
                all[w + j] = params[i];
                all[n + w + j] = m[at];
                all[2 * n + w + j] = v[at];
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
pub(super) fn start_bucket<B: Backend<R = f32>>(
    be: &B,
    regions: &Regions,
    k: usize,
    g: &B::Buf,
    zero: u8,
    dpm: &Metered,
) -> Result<Started, CommError> {
    let (r, s) = regions.regions[k].clone();
    be.with_host(B::view(g, &r), |g| {
        if zero == 0 {
            dpm.start_all_reduce(g.to_vec())
        } else {
            let mut full = vec![0.0f32; s * dpm.size()];
            full[..r.len()].copy_from_slice(g);
            dpm.start_reduce_scatter(full)
        }
    })
}

/// Wait for the pending reductions (of chunk `only`, or all) in the order started, and put
/// each result in place: the reduced bucket back into the gradients (ZeRO 0), or added to the
/// rank's shard (ZeRO ≥ 1).
pub(super) fn finish<B: Backend<R = f32>>(
    pending: &mut Vec<(usize, usize, Started)>,
    only: Option<usize>,
    chunks: &mut [Chunk<B>],
    dpm: &Metered,
    zero: u8,
) -> Result<(), CommError> {
    let (now, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|p| only.is_none_or(|c| p.0 == c));
    *pending = later;
    for (c, k, started) in now {
        let got = dpm.wait(started)?;
        let ch = &mut chunks[c];
        let be = &ch.model.be;
        if zero == 0 {
            let r = ch.regions.regions[k].0.clone();
            let [g] = B::parts(&mut ch.model.grads, [&r]);
            be.with_host_mut(g, |g| g.copy_from_slice(&got));
        } else {
            let shard = &mut ch.shard_grads[k];
            let all = 0..B::len(shard);
            let [s] = B::parts(shard, [&all]);
            be.with_host_mut(s, |s| {
                for (a, b) in s.iter_mut().zip(&got) {
                    *a += *b;
                }
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Regions;
    use crate::model::{GptShape, ParamLayout, Part};
    use exatrain_spec::{presets, ParallelConfig};

    /// The planner prices the trainer's data-parallel buckets by counting what this cut rule
    /// makes (`exatrain_cost::trainer_buckets`): for every stage of a few layouts and bucket
    /// sizes, the buckets here are as many as it counts, and the share reduced only when
    /// backward ends (the vocabulary table's bucket and the first blocks') is the share it
    /// prices, over the parameters it counts for the stage (which are the buffer's).
    #[test]
    fn the_planner_counts_the_buckets_and_the_exposed_share_this_cut_rule_makes() {
        let m = presets::model("bench").expect("preset");
        let shape = GptShape::from_spec(&m).expect("GPT-2 shape");
        for (tp, pp) in [(1, 1), (2, 1), (1, 2), (2, 3), (1, 6)] {
            let p = ParallelConfig::new(tp, pp, 1, 1, 1);
            let st = p.stage_layers(&m).expect("stages");
            let (first_p, mid_p, last_p) = exatrain_cost::memory::stage_params(&m, &p, &st);
            let block_p = exatrain_cost::memory::block_params(&m, &p);
            for s in 0..pp {
                let layers = st.range(s);
                let part = Part {
                    layers: layers.start as usize..layers.end as usize,
                    embed: s == 0,
                    head: s == pp - 1,
                    tp: tp as usize,
                    ..Part::whole(&shape)
                };
                let layout = ParamLayout::of_part(&shape, &part);
                let params = match s {
                    0 => first_p,
                    s if s == pp - 1 => last_p,
                    _ => mid_p,
                };
                assert_eq!(layout.total as f64, params, "tp {tp} pp {pp} stage {s}: parameters");
                let block_len = layout.blocks[0].fcprojb.end - layout.blocks[0].ln1w.start;
                assert_eq!(block_len as f64, block_p, "tp {tp} pp {pp} stage {s}: block");
                let table = part.embed || part.head;
                let blocks = layers.len() as u32;
                let norm = layout.lnfw.len() + layout.lnfb.len();
                for bucket in [
                    0,
                    1,
                    block_len - 1,
                    block_len,
                    block_len + 1,
                    block_len + norm + 1,
                    3 * block_len,
                    layout.total,
                ] {
                    let regions = Regions::new(&layout, 2, bucket).regions;
                    let planned = if bucket == 0 { f64::INFINITY } else { bucket as f64 };
                    let (tail, count) =
                        exatrain_cost::trainer_buckets(blocks, block_p, norm as f64, params, planned, table);
                    let what = format!("tp {tp} pp {pp} stage {s} bucket {bucket}");
                    assert_eq!(regions.len() as f64, count, "{what}: buckets");
                    // the table's region (first in the buffer) and the first blocks' are last
                    let last_ready = if table { 2 } else { 1 };
                    let exposed: usize = regions.iter().take(last_ready).map(|(r, _)| r.len()).sum();
                    let want = exposed as f64 / layout.total as f64;
                    assert!(
                        (tail - want).abs() <= 1e-12,
                        "{what}: exposed share planned {tail}, cut {want}"
                    );
                }
            }
        }
    }
}
