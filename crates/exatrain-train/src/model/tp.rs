//! The tensor-parallel group as the model sees it, and Megatron's f / g mappings over it (with
//! and without sequence parallelism).

use std::ops::Range;

use exatrain_parallel::comm::CommError;

use crate::backend::Backend;
use crate::Real;

/// The tensor-parallel group as the model sees it. Megatron's conjugate operators are the two
/// places `all_reduce` is called: **g** after a row-parallel layer (forward: all-reduce the
/// partial sums, backward: identity) and **f** before a column-parallel one (forward: identity,
/// backward: all-reduce the input gradient).
pub trait TpGroup<R: Copy> {
    fn size(&self) -> usize;
    /// Sum over the group, in place (activation traffic: the planner's TP bytes).
    fn all_reduce(&self, buf: &mut [R]) -> Result<(), CommError>;
    /// `full` [size · mine.len()] ends as every rank's `mine` in rank order (sequence parallel:
    /// forward of f, backward of g).
    fn all_gather(&self, mine: &[R], full: &mut [R]) -> Result<(), CommError>;
    /// `mine` ends as this rank's chunk of the sum of `full` (sequence parallel: forward of g,
    /// backward of f).
    fn reduce_scatter(&self, full: &[R], mine: &mut [R]) -> Result<(), CommError>;
    /// Elementwise max over the group (the cross-entropy's row max: N values, not metered).
    fn max_stats(&self, buf: &mut [R]) -> Result<(), CommError>;
    /// Sum of the cross-entropy's per-row statistics (2N values, not metered).
    fn sum_stats(&self, buf: &mut [R]) -> Result<(), CommError>;
    /// The context-parallel group's key/value exchange, forward: `full` [cp · mine.len()] ends
    /// as every CP rank's keys and values in rank order (the planner's CP bytes). The identity
    /// without context parallelism.
    fn cp_all_gather(&self, mine: &[R], full: &mut [R]) -> Result<(), CommError> {
        full.copy_from_slice(mine);
        Ok(())
    }
    /// Backward of [`TpGroup::cp_all_gather`]: `mine` ends as this CP rank's chunk of the sum of
    /// the ranks' `full` (every rank's queries saw every rank's keys).
    fn cp_reduce_scatter(&self, full: &[R], mine: &mut [R]) -> Result<(), CommError> {
        mine.copy_from_slice(full);
        Ok(())
    }
}

/// No tensor parallelism: every collective is the identity.
pub struct Alone;

impl<R: Real> TpGroup<R> for Alone {
    fn size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
    fn all_gather(&self, mine: &[R], full: &mut [R]) -> Result<(), CommError> {
        full.copy_from_slice(mine);
        Ok(())
    }
    fn reduce_scatter(&self, full: &[R], mine: &mut [R]) -> Result<(), CommError> {
        mine.copy_from_slice(full);
        Ok(())
    }
    fn max_stats(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
    fn sum_stats(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
}

/// Context parallelism, forward: the whole sequence's keys and values `kv` [B, cp·T, 2Cl], in
/// global order, from every CP rank's K and V rows of its `qkv` [B, T, 3Cl] (rank r's rows sit at
/// `cp_positions(cp·T, cp, r)`).
pub(super) fn kv_gather<B: Backend>(
    be: &B,
    g: &dyn TpGroup<B::R>,
    (b, t, cl, cp): (usize, usize, usize, usize),
    qkv: B::Ref<'_>,
    kv: B::Mut<'_>,
) -> Result<(), CommError> {
    let w = 2 * cl;
    let mut mine = vec![<B::R as num_traits::Zero>::zero(); b * t * w];
    be.with_host(qkv, |q| {
        for (n, row) in mine.chunks_mut(w).enumerate() {
            row.copy_from_slice(&q[n * 3 * cl + cl..(n + 1) * 3 * cl]);
        }
    });
    let mut all = vec![<B::R as num_traits::Zero>::zero(); cp * mine.len()];
    g.cp_all_gather(&mine, &mut all)?;
    be.with_host_mut(kv, |kv| {
        for (ranked, global) in rank_rows(b, t, cp) {
            kv[global * w..(global + 1) * w].copy_from_slice(&all[ranked * w..(ranked + 1) * w]);
        }
    });
    Ok(())
}

/// (row in rank order, row in global order) of every key/value row of a microbatch under
/// context parallelism: rank r's row (b, i) is row r·B·T + b·T + i of the gathered buffer and
/// row b·cp·T + `cp_positions(cp·T, cp, r)[i]` of the sequence.
fn rank_rows(b: usize, t: usize, cp: usize) -> impl Iterator<Item = (usize, usize)> {
    let tk = cp * t;
    (0..cp).flat_map(move |r| {
        let pos = crate::flash::cp_positions(tk, cp, r);
        (0..b).flat_map(move |bi| {
            let pos = pos.clone();
            (0..t).map(move |i| (r * b * t + bi * t + i, bi * tk + pos[i]))
        })
    })
}

/// Context parallelism, backward: every rank's gradients of the whole sequence's keys and
/// values `dkv` [B, cp·T, 2Cl] summed over the group, this rank's rows added into the K and V
/// parts of its `dqkv` [B, T, 3Cl].
pub(super) fn kv_scatter<B: Backend>(
    be: &B,
    g: &dyn TpGroup<B::R>,
    (b, t, cl, cp): (usize, usize, usize, usize),
    dkv: B::Ref<'_>,
    dqkv: B::Mut<'_>,
) -> Result<(), CommError> {
    let w = 2 * cl;
    let mut all = vec![<B::R as num_traits::Zero>::zero(); cp * b * t * w];
    be.with_host(dkv, |d| {
        for (ranked, global) in rank_rows(b, t, cp) {
            all[ranked * w..(ranked + 1) * w].copy_from_slice(&d[global * w..(global + 1) * w]);
        }
    });
    let mut mine = vec![<B::R as num_traits::Zero>::zero(); b * t * w];
    g.cp_reduce_scatter(&all, &mut mine)?;
    be.with_host_mut(dqkv, |dq| {
        for (n, row) in mine.chunks(w).enumerate() {
            for (x, y) in dq[n * 3 * cl + cl..(n + 1) * 3 * cl].iter_mut().zip(row) {
                *x = *x + *y;
            }
        }
    });
    Ok(())
}

/// Megatron's f before a column-parallel region, forward (and g's backward): under sequence
/// parallelism all-gather the rows, else the rows are already whole (a copy).
pub(super) fn seq_gather<B: Backend>(
    be: &B,
    tp: &dyn TpGroup<B::R>,
    sp: bool,
    mine: B::Ref<'_>,
    full: B::Mut<'_>,
) -> Result<(), CommError> {
    if sp {
        be.with_host(mine, |m| be.with_host_mut(full, |f| tp.all_gather(m, f)))
    } else {
        be.copy(full, mine);
        Ok(())
    }
}

/// Megatron's g after a row-parallel region, forward (and f's backward): sum the partial
/// results over the group — reduce-scattered to this rank's rows under sequence parallelism,
/// all-reduced otherwise.
pub(super) fn seq_reduce<B: Backend>(
    be: &B,
    tp: &dyn TpGroup<B::R>,
    sp: bool,
    mut full: B::Mut<'_>,
    mine: B::Mut<'_>,
) -> Result<(), CommError> {
    if sp {
        be.with_host(B::read(&full), |f| be.with_host_mut(mine, |m| tp.reduce_scatter(f, m)))
    } else {
        if tp.size() > 1 {
            be.with_host_mut(B::reborrow(&mut full), |f| tp.all_reduce(f))?;
        }
        be.copy(mine, B::read(&full));
        Ok(())
    }
}

/// Sequence parallel: the norms' gradients (ranges of `g`) before a microbatch's backward
/// reaches them; nothing without sequence parallelism.
pub(super) fn norm_grads_before<B: Backend>(
    be: &B,
    g: &B::Buf,
    sp: bool,
    ranges: &[Range<usize>],
) -> Vec<(Range<usize>, Vec<B::R>)> {
    ranges
        .iter()
        .filter(|r| sp && !r.is_empty())
        .map(|r| (r.clone(), be.with_host(B::view(g, r), |x| x.to_vec())))
        .collect()
}

/// Sequence parallel: the norms saw only this rank's rows, so sum this microbatch's share of
/// their gradients over the tp group (what was accumulated before stays as it is).
pub(super) fn sum_norm_grads<B: Backend>(
    be: &B,
    tp: &dyn TpGroup<B::R>,
    g: &mut B::Buf,
    before: &[(Range<usize>, Vec<B::R>)],
) -> Result<(), CommError> {
    for (r, was) in before {
        let [gr] = B::parts(g, [r]);
        be.with_host_mut(gr, |gr| {
            let mut delta: Vec<B::R> = gr.iter().zip(was).map(|(x, y)| *x - *y).collect();
            tp.sum_stats(&mut delta)?;
            for ((x, y), dl) in gr.iter_mut().zip(was).zip(&delta) {
                *x = *y + *dl;
            }
            Ok::<(), CommError>(())
        })?;
    }
    Ok(())
}
