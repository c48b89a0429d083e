//! The kernels as one interface over flat buffers, so the model's forward and backward are
//! written once and run on any device (candle's shape: a backend behind a trait, one
//! implementation per device, everything builds without an accelerator).
//!
//! A backend owns flat buffers ([`Backend::Buf`], one allocation per parameter, gradient or
//! activation buffer) and hands out views of ranges of them: [`Backend::Ref`] to read and
//! [`Backend::Mut`] to write, taken apart by [`Backend::parts`] exactly as the CPU model always
//! took its slices apart, so the offset tables (`ParamLayout`, `ActLayout`, `GradLayout`) stay
//! the one description of where every tensor lives. Every kernel pair of [`crate::kernels`] is
//! a method with the same name, argument order and semantics (`_backward` accumulates into
//! gradients). Communication stays on the host: [`Backend::with_host`] /
//! [`Backend::with_host_mut`] lend a view as a host slice (the CPU lends the memory itself, a
//! GPU copies device → host → device), which is how in-process ranks share one device through
//! the hub.
//!
//! Kernels do not return errors, as a device's launches do not: a device backend keeps the
//! first failure (CUDA's sticky error) and [`Backend::check`] reports it at the model's
//! synchronisation points, in the step's one error type.

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod plan;

use std::ops::Range;

use exatrain_parallel::comm::CommError;

pub use cpu::Cpu;
#[cfg(feature = "cuda")]
pub use cuda::Cuda;

use crate::flash::KeyValues;
use crate::optim::AdamWConfig;
use crate::Real;

/// One device's buffers and kernels. See the module documentation.
#[allow(clippy::too_many_arguments)]
pub trait Backend {
    /// The host number type: what the model's results and the communicators carry.
    type R: Real;
    /// One flat allocation.
    type Buf: Send;
    /// A read view of a range of a buffer.
    type Ref<'a>: Copy
    where
        Self: 'a;
    /// A write view of a range of a buffer (views from one [`Backend::parts`] never overlap).
    type Mut<'a>
    where
        Self: 'a;

    /// A buffer holding `host` (moved, where the backend is the host).
    fn upload(&self, host: Vec<Self::R>) -> Self::Buf;
    /// A buffer of `n` zeros.
    fn alloc(&self, n: usize) -> Self::Buf {
        self.upload(vec![<Self::R as num_traits::Zero>::zero(); n])
    }
    /// A copy of a buffer on the host.
    fn download(&self, buf: &Self::Buf) -> Vec<Self::R>;
    fn len(buf: &Self::Buf) -> usize;
    /// `buf[r]` to read.
    fn view<'a>(buf: &'a Self::Buf, r: &Range<usize>) -> Self::Ref<'a>;
    /// Disjoint write views of `buf` at `ranges` (which must not overlap).
    fn parts<'a, const K: usize>(buf: &'a mut Self::Buf, ranges: [&Range<usize>; K]) -> [Self::Mut<'a>; K];
    /// A write view read.
    fn read<'a>(m: &'a Self::Mut<'_>) -> Self::Ref<'a>;
    /// A write view lent again for a shorter while.
    fn reborrow<'a>(m: &'a mut Self::Mut<'_>) -> Self::Mut<'a>;
    /// `r[range]` (range relative to the view).
    fn sub<'a>(r: Self::Ref<'a>, range: &Range<usize>) -> Self::Ref<'a>
    where
        Self: 'a;
    /// `m[range]` lent for a shorter while (range relative to the view).
    fn sub_mut<'a>(m: &'a mut Self::Mut<'_>, range: &Range<usize>) -> Self::Mut<'a>;

    /// `buf[r] = 0`.
    fn zero(&self, buf: &mut Self::Buf, r: &Range<usize>);
    /// `dst = src` (same lengths).
    fn copy(&self, dst: Self::Mut<'_>, src: Self::Ref<'_>);
    /// `f` over the view's values on the host.
    fn with_host<T>(&self, r: Self::Ref<'_>, f: impl FnOnce(&[Self::R]) -> T) -> T;
    /// `f` over the view's values on the host; what it writes is the view's new value.
    fn with_host_mut<T>(&self, m: Self::Mut<'_>, f: impl FnOnce(&mut [Self::R]) -> T) -> T;
    /// The first device failure since the last check, if any.
    fn check(&self) -> Result<(), CommError> {
        Ok(())
    }

    /// Σ x² over the view, on the host in f64 (a fixed-order reduction).
    fn sum_squares(&self, x: Self::Ref<'_>) -> f64;
    /// `x *= s`.
    fn scale(&self, x: Self::Mut<'_>, s: Self::R);
    /// One AdamW update of a run of parameters (decoupled decay `wd`, bias correction at
    /// `step` ≥ 1), as [`crate::optim::adamw_update`] computes it.
    fn adamw(
        &self,
        params: Self::Mut<'_>,
        grads: Self::Ref<'_>,
        m: Self::Mut<'_>,
        v: Self::Mut<'_>,
        c: &AdamWConfig,
        lr: f64,
        wd: f64,
        step: u64,
    );

    fn encoder_forward(
        &self,
        out: Self::Mut<'_>,
        tokens: &[u32],
        wte: Self::Ref<'_>,
        lo: usize,
        wpe: Option<Self::Ref<'_>>,
        t: usize,
        c: usize,
    );
    fn encoder_backward(
        &self,
        dwte: Self::Mut<'_>,
        lo: usize,
        dwpe: Option<Self::Mut<'_>>,
        dout: Self::Ref<'_>,
        tokens: &[u32],
        t: usize,
        c: usize,
    );
    fn layernorm_forward(
        &self,
        out: Self::Mut<'_>,
        mean: Self::Mut<'_>,
        rstd: Self::Mut<'_>,
        inp: Self::Ref<'_>,
        w: Self::Ref<'_>,
        b: Self::Ref<'_>,
        c: usize,
    );
    fn layernorm_backward(
        &self,
        dinp: Self::Mut<'_>,
        dw: Self::Mut<'_>,
        db: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        inp: Self::Ref<'_>,
        w: Self::Ref<'_>,
        mean: Self::Ref<'_>,
        rstd: Self::Ref<'_>,
        c: usize,
    );
    fn matmul_forward(
        &self,
        out: Self::Mut<'_>,
        inp: Self::Ref<'_>,
        w: Self::Ref<'_>,
        bias: Option<Self::Ref<'_>>,
        c: usize,
        oc: usize,
    );
    fn matmul_backward(
        &self,
        dinp: Self::Mut<'_>,
        dw: Self::Mut<'_>,
        dbias: Option<Self::Mut<'_>>,
        dout: Self::Ref<'_>,
        inp: Self::Ref<'_>,
        w: Self::Ref<'_>,
        c: usize,
        oc: usize,
    );
    fn attention_forward(
        &self,
        out: Self::Mut<'_>,
        att: Self::Mut<'_>,
        qkv: Self::Ref<'_>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    fn attention_backward(
        &self,
        dqkv: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        qkv: Self::Ref<'_>,
        att: Self::Ref<'_>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// Flash attention over the qkv buffer, or (with `kv`, context parallelism) against a
    /// gathered key/value buffer: [`crate::flash`]'s kernel pair.
    fn flash_attention_forward(
        &self,
        out: Self::Mut<'_>,
        lse: Self::Mut<'_>,
        qkv: Self::Ref<'_>,
        kv: Option<Self::Ref<'_>>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    );
    fn flash_attention_backward(
        &self,
        dqkv: Self::Mut<'_>,
        dkv: Option<Self::Mut<'_>>,
        dout: Self::Ref<'_>,
        out: Self::Ref<'_>,
        lse: Self::Ref<'_>,
        qkv: Self::Ref<'_>,
        kv: Option<Self::Ref<'_>>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    );
    fn gelu_forward(&self, out: Self::Mut<'_>, inp: Self::Ref<'_>);
    fn gelu_backward(&self, dinp: Self::Mut<'_>, inp: Self::Ref<'_>, dout: Self::Ref<'_>);
    fn residual_forward(&self, out: Self::Mut<'_>, a: Self::Ref<'_>, b: Self::Ref<'_>);
    fn residual_backward(&self, da: Self::Mut<'_>, db: Self::Mut<'_>, dout: Self::Ref<'_>);
    fn crossentropy_max(&self, maxes: Self::Mut<'_>, logits: Self::Ref<'_>, valid: usize, vl: usize);
    fn crossentropy_exp(
        &self,
        probs: Self::Mut<'_>,
        stats: Self::Mut<'_>,
        logits: Self::Ref<'_>,
        maxes: Self::Ref<'_>,
        targets: &[u32],
        lo: usize,
        valid: usize,
        vl: usize,
    );
    fn crossentropy_normalize(&self, probs: Self::Mut<'_>, losses: Self::Mut<'_>, stats: Self::Ref<'_>, vl: usize);
    fn crossentropy_backward(
        &self,
        dlogits: Self::Mut<'_>,
        probs: Self::Ref<'_>,
        targets: &[u32],
        lo: usize,
        dloss: Self::R,
        valid: usize,
        vl: usize,
    );
}
