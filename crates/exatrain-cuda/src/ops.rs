//! The kernels as Rust calls, one per CUDA kernel (or pair), with the CPU kernels' names and
//! argument order (`exatrain_train::kernels`): outputs first, then inputs, then sizes. Buffers
//! are device addresses ([`Ptr`]) — a tensor is a range of one flat allocation, as on the CPU —
//! of the precision's storage type (`floatX`) for activations and their gradients, fp32 for
//! statistics, weight gradients and optimizer state. Launch shapes are fixed by the sizes, never
//! by the device, so every reduction runs in the same order on any GPU.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::Gpu;
use crate::kernels::Precision;
use crate::GpuError;

/// A device address (0: absent, for the optional inputs).
pub type Ptr = CUdeviceptr;

/// Threads per block of the element-wise and row kernels.
pub const THREADS: u32 = 256;
/// Rows one warp takes in layernorm's backward (its channel sums are one partial row each).
pub const LN_ROWS_PER_WARP: usize = 16;
/// The fixed grid of the global-norm reduction.
pub const NORM_BLOCKS: u32 = 512;
const WARP: u32 = 32;

fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn warp_per_row(rows: usize) -> LaunchConfig {
    let per_block = (THREADS / WARP) as usize;
    LaunchConfig {
        grid_dim: (rows.div_ceil(per_block).max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn block_per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn i(x: usize) -> i32 {
    i32::try_from(x).expect("a size the layout checks keep below 2^31")
}

/// The kernels of one precision on one device.
pub struct Ops<'g> {
    pub gpu: &'g Gpu,
    pub p: Precision,
}

macro_rules! launch {
    ($self:ident, $module:literal, $kernel:literal, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let f = $self.gpu.function($module, $kernel, $self.p)?;
        let mut b = $self.gpu.stream.launch_builder(&f);
        $( let a = $arg; b.arg(&a); )*
        // SAFETY: the arguments match the kernel's parameter list in kernels/*.cu, and the
        // caller's buffers hold the sizes given.
        unsafe { b.launch($cfg) }.map_err(|e| GpuError::new(format!("launch {}/{}: {e}", $module, $kernel)))?;
        Ok(())
    }};
}

impl Ops<'_> {
    /// out[N,C] = wte[tokens[n] − lo] + wpe[n % T]; `wte` holds `rows` vocabulary rows.
    #[allow(clippy::too_many_arguments)]
    pub fn encoder_forward(
        &self,
        out: Ptr,
        tokens: Ptr,
        wte: Ptr,
        lo: usize,
        rows: usize,
        wpe: Option<Ptr>,
        n: usize,
        t: usize,
        c: usize,
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "encoder",
            "encoder_forward",
            grid_for(n * c),
            [out, tokens, wte, i(lo), i(rows), wpe.unwrap_or(0), i(n), i(t), i(c)]
        )
    }

    /// dwte[tokens[n] − lo] += dout[n] for the tokens in the shard (grouped by token on the
    /// host, summed in position order: deterministic); dwpe[n % T] += dout[n].
    #[allow(clippy::too_many_arguments)]
    pub fn encoder_backward(
        &self,
        dwte: Ptr,
        lo: usize,
        rows: usize,
        dwpe: Option<Ptr>,
        dout: Ptr,
        tokens: &[u32],
        t: usize,
        c: usize,
    ) -> Result<(), GpuError> {
        let (uniq, off, pos) = group_by_token(tokens, lo, rows);
        if !uniq.is_empty() {
            let s = &self.gpu.stream;
            let up = |v: &[i32]| {
                s.clone_htod(v)
                    .map_err(|e| GpuError::new(format!("upload token groups: {e}")))
            };
            let (du, doff, dpos) = (up(&uniq)?, up(&off)?, up(&pos)?);
            let f = self.gpu.function("encoder", "encoder_backward_wte", self.p)?;
            let mut b = s.launch_builder(&f);
            let (lo_i, c_i) = (i(lo), i(c));
            b.arg(&dwte)
                .arg(&dout)
                .arg(&du)
                .arg(&doff)
                .arg(&dpos)
                .arg(&lo_i)
                .arg(&c_i);
            // SAFETY: as in `launch!`; the groups live until the stream is synchronised by
            // their drop.
            unsafe { b.launch(block_per_row(uniq.len())) }
                .map_err(|e| GpuError::new(format!("launch encoder_backward_wte: {e}")))?;
        }
        if let Some(dwpe) = dwpe {
            let b = tokens.len() / t;
            launch!(
                self,
                "encoder",
                "encoder_backward_wpe",
                grid_for(t * c),
                [dwpe, dout, i(b), i(t), i(c)]
            )?;
        }
        Ok(())
    }

    /// out[N,C] = (inp − mean)·rstd·w + b; mean[N], rstd[N] (fp32) kept.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_forward(
        &self,
        out: Ptr,
        mean: Ptr,
        rstd: Ptr,
        inp: Ptr,
        w: Ptr,
        b: Ptr,
        n: usize,
        c: usize,
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "layernorm",
            "layernorm_forward",
            warp_per_row(n),
            [out, mean, rstd, inp, w, b, i(n), i(c)]
        )
    }

    /// dinp += ∂L/∂inp; dw += Σ dout·norm; db += Σ dout (dw, db fp32). `scratch` holds
    /// [`Ops::layernorm_scratch`] fp32 elements.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_backward(
        &self,
        dinp: Ptr,
        dw: Ptr,
        db: Ptr,
        dout: Ptr,
        inp: Ptr,
        w: Ptr,
        mean: Ptr,
        rstd: Ptr,
        scratch: Ptr,
        n: usize,
        c: usize,
    ) -> Result<(), GpuError> {
        let groups = n.div_ceil(LN_ROWS_PER_WARP);
        launch!(
            self,
            "layernorm",
            "layernorm_backward",
            warp_per_row(groups),
            [dinp, scratch, dout, inp, w, mean, rstd, i(n), i(LN_ROWS_PER_WARP), i(c)]
        )?;
        launch!(
            self,
            "layernorm",
            "layernorm_backward_params",
            grid_for(c),
            [dw, db, scratch, i(groups), i(c)]
        )
    }

    /// The fp32 scratch layernorm's backward needs for N rows of C.
    pub fn layernorm_scratch(n: usize, c: usize) -> usize {
        n.div_ceil(LN_ROWS_PER_WARP) * 2 * c
    }

    pub fn gelu_forward(&self, out: Ptr, inp: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(self, "pointwise", "gelu_forward", grid_for(n), [out, inp, n as i64])
    }

    pub fn gelu_backward(&self, dinp: Ptr, inp: Ptr, dout: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(
            self,
            "pointwise",
            "gelu_backward",
            grid_for(n),
            [dinp, inp, dout, n as i64]
        )
    }

    pub fn residual_forward(&self, out: Ptr, a: Ptr, b: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(
            self,
            "pointwise",
            "residual_forward",
            grid_for(n),
            [out, a, b, n as i64]
        )
    }

    pub fn residual_backward(&self, da: Ptr, db: Ptr, dout: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(
            self,
            "pointwise",
            "residual_backward",
            grid_for(n),
            [da, db, dout, n as i64]
        )
    }

    /// out (floatX) = master (fp32), rounded.
    pub fn to_floatx(&self, out: Ptr, master: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(self, "pointwise", "to_floatx", grid_for(n), [out, master, n as i64])
    }

    /// out (fp32) = in (floatX).
    pub fn to_f32(&self, out: Ptr, inp: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(self, "pointwise", "to_f32", grid_for(n), [out, inp, n as i64])
    }

    pub fn scale_f32(&self, x: Ptr, s: f32, n: usize) -> Result<(), GpuError> {
        launch!(self, "pointwise", "scale_f32", grid_for(n), [x, s, n as i64])
    }

    /// In place over att[rows, Tk]: the causal softmax of each row, row r being the query at
    /// global position `r mod tq + offset` (it keeps columns ≤ that position).
    pub fn softmax_causal_forward(
        &self,
        att: Ptr,
        rows: usize,
        (tq, tk, offset): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "attention",
            "softmax_causal_forward",
            warp_per_row(rows),
            [att, rows as i64, i(tq), i(tk), i(offset)]
        )
    }

    /// In place: datt becomes the gradient at the softmax's input (rows as the forward's).
    pub fn softmax_causal_backward(
        &self,
        datt: Ptr,
        att: Ptr,
        rows: usize,
        (tq, tk, offset): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "attention",
            "softmax_causal_backward",
            warp_per_row(rows),
            [datt, att, rows as i64, i(tq), i(tk), i(offset)]
        )
    }

    /// maxes[N] (fp32) = the row max over the first `valid` of `vl` columns.
    pub fn crossentropy_max(&self, maxes: Ptr, logits: Ptr, n: usize, valid: usize, vl: usize) -> Result<(), GpuError> {
        launch!(
            self,
            "crossentropy",
            "crossentropy_max",
            block_per_row(n),
            [maxes, logits, i(valid), i(vl)]
        )
    }

    /// probs = exp(logit − max); stats[2N] (fp32) = row sums, then the target's logit − max.
    #[allow(clippy::too_many_arguments)]
    pub fn crossentropy_exp(
        &self,
        probs: Ptr,
        stats: Ptr,
        logits: Ptr,
        maxes: Ptr,
        targets: Ptr,
        lo: usize,
        n: usize,
        valid: usize,
        vl: usize,
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "crossentropy",
            "crossentropy_exp",
            block_per_row(n),
            [probs, stats, logits, maxes, targets, i(lo), i(valid), i(vl), i(n)]
        )
    }

    /// probs /= Σ; losses[N] (fp32) = ln Σ − (logit[target] − max).
    pub fn crossentropy_normalize(
        &self,
        probs: Ptr,
        losses: Ptr,
        stats: Ptr,
        n: usize,
        vl: usize,
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "crossentropy",
            "crossentropy_normalize",
            block_per_row(n),
            [probs, losses, stats, i(vl), i(n)]
        )
    }

    /// dlogits += dloss·(probs − onehot(target)).
    #[allow(clippy::too_many_arguments)]
    pub fn crossentropy_backward(
        &self,
        dlogits: Ptr,
        probs: Ptr,
        targets: Ptr,
        lo: usize,
        dloss: f32,
        n: usize,
        valid: usize,
        vl: usize,
    ) -> Result<(), GpuError> {
        launch!(
            self,
            "crossentropy",
            "crossentropy_backward",
            block_per_row(n),
            [dlogits, probs, targets, i(lo), dloss, i(valid), i(vl)]
        )
    }

    /// out[0] = mean of losses[N] (fp32).
    pub fn mean_loss(&self, out: Ptr, losses: Ptr, n: usize) -> Result<(), GpuError> {
        launch!(self, "crossentropy", "mean_loss", block_per_row(1), [out, losses, i(n)])
    }

    /// One AdamW update of `n` fp32 parameters (and their floatX copy, if any); `step` ≥ 1.
    #[allow(clippy::too_many_arguments)]
    pub fn adamw_update(
        &self,
        params: Ptr,
        params_x: Option<Ptr>,
        grads: Ptr,
        m: Ptr,
        v: Ptr,
        n: usize,
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        wd: f32,
        step: u64,
    ) -> Result<(), GpuError> {
        let ibc1 = (1.0 / (1.0 - (beta1 as f64).powi(step as i32))) as f32;
        let ibc2 = (1.0 / (1.0 - (beta2 as f64).powi(step as i32))) as f32;
        launch!(
            self,
            "optimizer",
            "adamw_update",
            grid_for(n),
            [
                params,
                params_x.unwrap_or(0),
                grads,
                m,
                v,
                n as i64,
                lr,
                beta1,
                beta2,
                ibc1,
                ibc2,
                eps,
                wd
            ]
        )
    }

    /// out[0] += Σ g² over `n` fp32 gradients; `partial` holds [`NORM_BLOCKS`] fp32.
    pub fn norm_squared(&self, out: Ptr, g: Ptr, partial: Ptr, n: usize) -> Result<(), GpuError> {
        let cfg = LaunchConfig {
            grid_dim: (NORM_BLOCKS, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "optimizer", "norm_squared_partial", cfg, [partial, g, n as i64])?;
        launch!(
            self,
            "optimizer",
            "norm_squared_finish",
            block_per_row(1),
            [out, partial, NORM_BLOCKS as i32]
        )
    }
}

/// The positions of each token of the shard [lo, lo + rows), grouped by token: (distinct
/// tokens in increasing order, CSR offsets, positions ascending within each token).
pub fn group_by_token(tokens: &[u32], lo: usize, rows: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut pairs: Vec<(u32, i32)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, &t)| (lo..lo + rows).contains(&(t as usize)))
        .map(|(n, &t)| (t, n as i32))
        .collect();
    pairs.sort_unstable();
    let (mut uniq, mut off, mut pos) = (Vec::new(), Vec::new(), Vec::with_capacity(pairs.len()));
    for (k, &(t, n)) in pairs.iter().enumerate() {
        if k == 0 || pairs[k - 1].0 != t {
            uniq.push(t as i32);
            off.push(k as i32);
        }
        pos.push(n);
    }
    off.push(pairs.len() as i32);
    (uniq, off, pos)
}

/// The device address of a whole allocation (for the ops above).
pub fn ptr<T>(s: &CudaSlice<T>, gpu: &Gpu) -> Ptr {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(&gpu.stream);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_grouped_in_position_order_within_the_shard() {
        let (u, off, pos) = group_by_token(&[5, 2, 5, 9, 2, 5], 2, 6); // shard holds 2..8
        assert_eq!(u, vec![2, 5]);
        assert_eq!(off, vec![0, 2, 5]);
        assert_eq!(pos, vec![1, 4, 0, 2, 5]);
        let (u, off, pos) = group_by_token(&[1, 1], 2, 6);
        assert!(u.is_empty() && pos.is_empty());
        assert_eq!(off, vec![0]);
    }
}
