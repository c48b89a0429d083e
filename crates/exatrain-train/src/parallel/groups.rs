//! The communicators of one rank, split from the world by the rank grid, and the
//! tensor-parallel group as the model calls it.

use exatrain_parallel::comm::{CommError, Communicator, Metered};
use exatrain_spec::ParallelConfig;

use crate::model::TpGroup;

/// The communicators of one rank, split from the world by the rank grid.
pub(super) struct Groups {
    pub(super) tp: Box<dyn Communicator>,
    /// the context-parallel ranks of this rank's sequences (one rank without context parallelism)
    pub(super) cp: Box<dyn Communicator>,
    pub(super) pp: Box<dyn Communicator>,
    /// the ranks that hold the same weights and reduce their gradients together: dp · cp of
    /// them, rank d·cp + c
    pub(super) dp: Box<dyn Communicator>,
    /// the first and the last pipeline stage of this (tp, dp) column, for the tied embedding
    pub(super) embedding: Box<dyn Communicator>,
}

pub(super) fn split_groups(world: &dyn Communicator, pc: &ParallelConfig) -> Result<Groups, CommError> {
    let me = world.rank() as u32;
    let ((t, d, p), c) = (pc.coords(me), pc.cp_coord(me));
    // colour = the rank with this group's own coordinates at 0: the same for all members
    let tp = world.split(pc.rank_cp(0, c, d, p) as usize, t as usize)?;
    let cp = world.split(pc.rank_cp(t, 0, d, p) as usize, c as usize)?;
    let dp = world.split(pc.rank_cp(t, 0, 0, p) as usize, (d * pc.cp + c) as usize)?;
    let pp = world.split(pc.rank_cp(t, c, d, 0) as usize, p as usize)?;
    let ends = p == 0 || p == pc.pp - 1;
    let colour = if ends {
        pc.rank_cp(t, c, d, 0) as usize
    } else {
        world.size() + world.rank()
    };
    let embedding = world.split(colour, p as usize)?;
    Ok(Groups {
        tp,
        cp,
        pp,
        dp,
        embedding,
    })
}

/// The tensor-parallel group as the model uses it: activation all-reduces metered, the
/// cross-entropy's small statistics not.
pub(super) struct TpComm<'a> {
    pub(super) act: &'a Metered<'a>,
    pub(super) stats: &'a dyn Communicator,
    /// the context-parallel group's key/value exchange, metered
    pub(super) cp: &'a Metered<'a>,
}

impl TpGroup<f32> for TpComm<'_> {
    fn size(&self) -> usize {
        self.stats.size()
    }
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size() > 1 {
            self.act.all_reduce(buf)?;
        }
        Ok(())
    }
    fn all_gather(&self, mine: &[f32], full: &mut [f32]) -> Result<(), CommError> {
        self.act.all_gather(mine, full)
    }
    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        self.act.reduce_scatter(full, mine)
    }
    fn max_stats(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let n = self.size();
        if n > 1 {
            let mut all = vec![0.0f32; n * buf.len()];
            self.stats.all_gather(buf, &mut all)?;
            let len = buf.len();
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (0..n).map(|r| all[r * len + i]).fold(f32::NEG_INFINITY, f32::max);
            }
        }
        Ok(())
    }
    fn sum_stats(&self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size() > 1 {
            self.stats.all_reduce(buf)?;
        }
        Ok(())
    }
    fn cp_all_gather(&self, mine: &[f32], full: &mut [f32]) -> Result<(), CommError> {
        self.cp.all_gather(mine, full)
    }
    fn cp_reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        self.cp.reduce_scatter(full, mine)
    }
}
