//! The CUDA backend (feature `cuda`): buffers are device allocations, views are device address
//! ranges, the element-wise, norm and loss kernels are `exatrain-cuda`'s NVRTC-compiled ones
//! (`kernels/*.cu`, the CPU kernels' names and argument order) and every product goes through
//! cuBLASLt with the CPU's accumulate-into-gradients semantics (`beta = 1`).
//!
//! - **Matmul**: `out[N, OC] = inp[N, C]·wᵀ (+ bias)`; the bias is a rank-1 product
//!   `bias ⊗ 1` written first, so the GEMM accumulates onto it; `dbias += doutᵀ·1` is a GEMM
//!   against a vector of ones (cuBLASLt's fixed reduction order, no float atomics).
//! - **Attention**: what the CPU kernel computes — scale·Q·Kᵀ into `att` [B, NH, T, T], the
//!   causal softmax in place, `att·V` — as strided batched GEMMs over the heads of one sequence
//!   (Q, K and V of head h sit HS apart in a row of `qkv` [B, T, 3C]), one call per sequence.
//!   The backward keeps one sequence's `datt` [NH, T, T] in a scratch buffer.
//! - **Precision**: the all-fp32 mode (`floatX = float`), so every buffer of the offset tables
//!   holds f32 exactly as on the CPU and the layouts carry over unchanged. bf16 activations need
//!   the norm and loss statistics kept in fp32 beside them (a second region in the activation
//!   table) and is refused here until that exists.
//! - **Errors**: a failed launch or copy is kept (the first one) and every later call does no
//!   device work; [`Backend::check`] reports it at the model's synchronisation points.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use exatrain_cuda::cudarc::driver::{result, CudaSlice};
use exatrain_cuda::device::{self, Gpu};
use exatrain_cuda::gemm::{Lt, Shape, Ty};
use exatrain_cuda::kernels::Precision;
use exatrain_cuda::ops::{self, Ops, Ptr};
use exatrain_cuda::GpuError;
use exatrain_parallel::comm::CommError;

use super::Backend;
use crate::optim::AdamWConfig;

const F: u64 = std::mem::size_of::<f32>() as u64;

/// One flat device allocation of f32 (none when empty) and its address.
pub struct DevBuf {
    /// owns the allocation `ptr` points into (freed on drop)
    _mem: Option<CudaSlice<f32>>,
    ptr: Ptr,
    len: usize,
}

/// A read view: `len` f32 from device address `ptr`, borrowed from a [`DevBuf`].
#[derive(Clone, Copy)]
pub struct DevRef<'a> {
    pub ptr: Ptr,
    pub len: usize,
    _buf: PhantomData<&'a DevBuf>,
}

/// A write view (the views of one `parts` call never overlap).
pub struct DevMut<'a> {
    pub ptr: Ptr,
    pub len: usize,
    _buf: PhantomData<&'a mut DevBuf>,
}

/// Scratch the kernels need besides the model's buffers, grown on demand.
#[derive(Default)]
struct Scratch {
    /// layernorm backward's per-warp partial sums
    ln: Option<CudaSlice<f32>>,
    /// one sequence's attention-score gradients [NH, T, T]
    datt: Option<CudaSlice<f32>>,
    /// ones, for the bias products
    ones: Option<CudaSlice<f32>>,
    /// the global norm's result and its per-block partial sums
    norm: Option<CudaSlice<f32>>,
    partial: Option<CudaSlice<f32>>,
    /// the token ids and targets of the call, as i32
    ids: Option<CudaSlice<i32>>,
}

/// One GPU as a backend, in the all-fp32 mode. Clones share the device handle, stream and
/// scratch: one rank's model chunks, used by one thread at a time. Ranks sharing a GPU each
/// open their own.
#[derive(Clone)]
pub struct Cuda(Arc<Inner>);

impl std::ops::Deref for Cuda {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// What a [`Cuda`] backend holds.
pub struct Inner {
    gpu: Gpu,
    lt: Mutex<Lt>,
    scratch: Mutex<Scratch>,
    failed: Mutex<Option<String>>,
}

// the host side of the backend is used by one thread at a time (one model per rank)
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cuda {
    /// Open GPU `ordinal` in precision `p`: a clear error without a driver, a device or the
    /// libraries, never a panic.
    pub fn open(ordinal: usize, p: Precision) -> Result<Cuda, GpuError> {
        if p != Precision::Fp32 {
            return Err(GpuError::new(
                "--precision bf16: the trainer's bf16 mode is not built yet (the kernels are; the activation \
                 table does not yet keep the fp32 statistics apart); use --precision fp32",
            ));
        }
        let gpu = device::open(ordinal)?;
        let lt = Lt::new(gpu.stream.clone())?;
        Ok(Cuda(Arc::new(Inner {
            gpu,
            lt: Mutex::new(lt),
            scratch: Mutex::new(Scratch::default()),
            failed: Mutex::new(None),
        })))
    }
}

impl Inner {
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Run `f` unless an earlier call failed; keep its error.
    fn run(&self, f: impl FnOnce(&Ops<'_>) -> Result<(), GpuError>) {
        let mut failed = lock(&self.failed);
        if failed.is_some() {
            return;
        }
        // the calling thread may be a rank's own (the device was opened on another)
        if let Err(e) = self.gpu.ctx.bind_to_thread() {
            *failed = Some(format!("cannot make the GPU's context current: {e}"));
            return;
        }
        let o = Ops {
            gpu: &self.gpu,
            p: Precision::Fp32,
        };
        if let Err(e) = f(&o) {
            *failed = Some(e.0);
        }
    }

    fn failed(&self) -> bool {
        lock(&self.failed).is_some()
    }

    /// C = alpha·op(A)·op(B) + beta·C in f32 (see [`Shape`] for the column-major terms).
    fn gemm(&self, s: Shape, alpha: f32, a: Ptr, b: Ptr, beta: f32, c: Ptr) {
        self.run(|_| {
            // SAFETY: every caller passes views of live buffers that hold the shape's extent.
            unsafe { lock(&self.lt).gemm(&s, alpha, a, b, beta, c) }
        });
    }

    /// A scratch buffer of at least `n` f32 from `pick(scratch)`, filled with `fill` when grown.
    fn scratch(&self, n: usize, pick: fn(&mut Scratch) -> &mut Option<CudaSlice<f32>>, fill: f32) -> Ptr {
        let mut s = lock(&self.scratch);
        let slot = pick(&mut s);
        if slot.as_ref().is_none_or(|b| b.len() < n) {
            *slot = None;
            match self.gpu.stream.clone_htod(&vec![fill; n.max(1)]) {
                Ok(b) => *slot = Some(b),
                Err(e) => {
                    *lock(&self.failed) = Some(format!("scratch of {n} floats: {e}"));
                    return 0;
                }
            }
        }
        ops::ptr(slot.as_ref().expect("set above"), &self.gpu)
    }

    /// `ids` as i32 on the device (the token ids or targets of one call).
    fn ids(&self, ids: &[u32]) -> Ptr {
        let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
        let mut s = lock(&self.scratch);
        match self.gpu.stream.clone_htod(&v) {
            Ok(b) => {
                let p = ops::ptr(&b, &self.gpu);
                s.ids = Some(b);
                p
            }
            Err(e) => {
                *lock(&self.failed) = Some(format!("upload of {} token ids: {e}", ids.len()));
                0
            }
        }
    }

    fn sync(&self) {
        self.run(|o| {
            o.gpu
                .stream
                .synchronize()
                .map_err(|e| GpuError::new(format!("synchronize: {e}")))
        });
    }
}

/// A packed f32 GEMM in column-major terms, `batch` times with the given strides.
#[allow(clippy::too_many_arguments)]
fn shape(m: usize, n: usize, k: usize, ta: bool, tb: bool, lda: usize, ldb: usize, ldc: usize) -> Shape {
    let mut s = Shape::plain(m as u64, n as u64, k as u64, Ty::F32, Ty::F32);
    (s.transa, s.transb) = (ta, tb);
    (s.lda, s.ldb, s.ldc) = (lda as i64, ldb as i64, ldc as i64);
    s
}

fn batched(mut s: Shape, batch: usize, sa: usize, sb: usize, sc: usize) -> Shape {
    s.batch = batch as i32;
    (s.stride_a, s.stride_b, s.stride_c) = (sa as i64, sb as i64, sc as i64);
    s
}

/// The address `off` f32 past `p`.
fn at(p: Ptr, off: usize) -> Ptr {
    p + off as u64 * F
}

impl Backend for Cuda {
    type R = f32;
    type Buf = DevBuf;
    type Ref<'a> = DevRef<'a>;
    type Mut<'a> = DevMut<'a>;

    fn upload(&self, host: Vec<f32>) -> DevBuf {
        let len = host.len();
        if len == 0 || self.failed() {
            return DevBuf {
                _mem: None,
                ptr: 0,
                len,
            };
        }
        match self.gpu.stream.clone_htod(&host) {
            Ok(mem) => {
                let ptr = ops::ptr(&mem, &self.gpu);
                DevBuf {
                    _mem: Some(mem),
                    ptr,
                    len,
                }
            }
            Err(e) => {
                *lock(&self.failed) = Some(format!("allocating {} MiB on the GPU: {e}", len as u64 * F >> 20));
                DevBuf {
                    _mem: None,
                    ptr: 0,
                    len,
                }
            }
        }
    }
    fn alloc(&self, n: usize) -> DevBuf {
        if n == 0 || self.failed() {
            return DevBuf {
                _mem: None,
                ptr: 0,
                len: n,
            };
        }
        match self.gpu.stream.alloc_zeros::<f32>(n) {
            Ok(mem) => {
                let ptr = ops::ptr(&mem, &self.gpu);
                DevBuf {
                    _mem: Some(mem),
                    ptr,
                    len: n,
                }
            }
            Err(e) => {
                *lock(&self.failed) = Some(format!("allocating {} MiB on the GPU: {e}", n as u64 * F >> 20));
                DevBuf {
                    _mem: None,
                    ptr: 0,
                    len: n,
                }
            }
        }
    }
    fn download(&self, buf: &DevBuf) -> Vec<f32> {
        let mut out = vec![0.0; buf.len];
        self.with_host(Self::view(buf, &(0..buf.len)), |x| out.copy_from_slice(x));
        out
    }
    fn len(buf: &DevBuf) -> usize {
        buf.len
    }
    fn view<'a>(buf: &'a DevBuf, r: &Range<usize>) -> DevRef<'a> {
        assert!(r.start <= r.end && r.end <= buf.len, "a view inside its buffer");
        DevRef {
            ptr: at(buf.ptr, r.start),
            len: r.len(),
            _buf: PhantomData,
        }
    }
    fn parts<'a, const K: usize>(buf: &'a mut DevBuf, ranges: [&Range<usize>; K]) -> [DevMut<'a>; K] {
        let mut sorted: Vec<&Range<usize>> = ranges.to_vec();
        sorted.sort_by_key(|r| (r.start, r.end));
        for w in sorted.windows(2) {
            assert!(w[0].end <= w[1].start, "overlapping ranges");
        }
        ranges.map(|r| {
            assert!(r.end <= buf.len, "a view inside its buffer");
            DevMut {
                ptr: at(buf.ptr, r.start),
                len: r.len(),
                _buf: PhantomData,
            }
        })
    }
    fn read<'a>(m: &'a DevMut<'_>) -> DevRef<'a> {
        DevRef {
            ptr: m.ptr,
            len: m.len,
            _buf: PhantomData,
        }
    }
    fn reborrow<'a>(m: &'a mut DevMut<'_>) -> DevMut<'a> {
        DevMut {
            ptr: m.ptr,
            len: m.len,
            _buf: PhantomData,
        }
    }

    fn sub<'a>(r: DevRef<'a>, range: &Range<usize>) -> DevRef<'a>
    where
        Self: 'a,
    {
        assert!(range.start <= range.end && range.end <= r.len, "a view inside its view");
        DevRef {
            ptr: at(r.ptr, range.start),
            len: range.len(),
            _buf: PhantomData,
        }
    }
    fn sub_mut<'a>(m: &'a mut DevMut<'_>, range: &Range<usize>) -> DevMut<'a> {
        assert!(range.start <= range.end && range.end <= m.len, "a view inside its view");
        DevMut {
            ptr: at(m.ptr, range.start),
            len: range.len(),
            _buf: PhantomData,
        }
    }

    fn zero(&self, buf: &mut DevBuf, r: &Range<usize>) {
        let [m] = Self::parts(buf, [r]);
        if m.len == 0 {
            return;
        }
        self.run(|o| {
            // SAFETY: the view lies inside a live allocation.
            unsafe { result::memset_d8_async(m.ptr, 0, m.len * F as usize, o.gpu.stream.cu_stream()) }
                .map_err(|e| GpuError::new(format!("memset: {e}")))
        });
    }
    fn copy(&self, dst: DevMut<'_>, src: DevRef<'_>) {
        assert_eq!(dst.len, src.len, "copy between views of one length");
        if dst.len == 0 {
            return;
        }
        self.run(|o| {
            // SAFETY: both views lie inside live allocations and do not overlap.
            unsafe { result::memcpy_dtod_async(dst.ptr, src.ptr, dst.len * F as usize, o.gpu.stream.cu_stream()) }
                .map_err(|e| GpuError::new(format!("device copy: {e}")))
        });
    }
    fn with_host<T>(&self, r: DevRef<'_>, f: impl FnOnce(&[f32]) -> T) -> T {
        let mut host = vec![0.0f32; r.len];
        if r.len > 0 {
            self.run(|o| {
                // SAFETY: the view lies inside a live allocation; the host slice has its length;
                // the stream is synchronised before the host reads it.
                unsafe { result::memcpy_dtoh_async(&mut host, r.ptr, o.gpu.stream.cu_stream()) }
                    .map_err(|e| GpuError::new(format!("device → host: {e}")))
            });
            self.sync();
        }
        // after a failure the host sees zeros: collectives stay matched across ranks, and
        // `check` reports the failure at the next synchronisation point
        f(&host)
    }
    fn with_host_mut<T>(&self, m: DevMut<'_>, f: impl FnOnce(&mut [f32]) -> T) -> T {
        let mut host = vec![0.0f32; m.len];
        if m.len > 0 {
            self.run(|o| {
                // SAFETY: as in `with_host`.
                unsafe { result::memcpy_dtoh_async(&mut host, m.ptr, o.gpu.stream.cu_stream()) }
                    .map_err(|e| GpuError::new(format!("device → host: {e}")))
            });
            self.sync();
        }
        let out = f(&mut host);
        if m.len > 0 {
            self.run(|o| {
                // SAFETY: the view lies inside a live allocation; `host` lives until the
                // synchronisation below.
                unsafe { result::memcpy_htod_async(m.ptr, &host, o.gpu.stream.cu_stream()) }
                    .map_err(|e| GpuError::new(format!("host → device: {e}")))
            });
            self.sync();
        }
        out
    }
    fn check(&self) -> Result<(), CommError> {
        self.sync();
        match lock(&self.failed).clone() {
            None => Ok(()),
            Some(e) => Err(CommError(format!("GPU {}: {e}", self.gpu.info.ordinal))),
        }
    }

    fn sum_squares(&self, x: DevRef<'_>) -> f64 {
        let out = self.scratch(1, |s| &mut s.norm, 0.0);
        let partial = self.scratch(ops::NORM_BLOCKS as usize, |s| &mut s.partial, 0.0);
        self.run(|o| {
            // SAFETY: `out` holds one f32.
            unsafe { result::memset_d8_async(out, 0, F as usize, o.gpu.stream.cu_stream()) }
                .map_err(|e| GpuError::new(format!("memset: {e}")))?;
            o.norm_squared(out, x.ptr, partial, x.len)
        });
        let one = DevRef {
            ptr: out,
            len: 1,
            _buf: PhantomData,
        };
        self.with_host(one, |v| v[0] as f64)
    }
    fn scale(&self, x: DevMut<'_>, s: f32) {
        self.run(|o| o.scale_f32(x.ptr, s, x.len));
    }
    fn adamw(
        &self,
        params: DevMut<'_>,
        grads: DevRef<'_>,
        m: DevMut<'_>,
        v: DevMut<'_>,
        c: &AdamWConfig,
        lr: f64,
        wd: f64,
        step: u64,
    ) {
        let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
        let n = params.len;
        self.run(|o| {
            o.adamw_update(
                params.ptr, None, grads.ptr, m.ptr, v.ptr, n, lr as f32, b1, b2, eps, wd as f32, step,
            )
        });
    }

    fn encoder_forward(
        &self,
        out: DevMut<'_>,
        tokens: &[u32],
        wte: DevRef<'_>,
        lo: usize,
        wpe: Option<DevRef<'_>>,
        t: usize,
        c: usize,
    ) {
        let ids = self.ids(tokens);
        let (rows, n) = (wte.len / c, out.len / c);
        self.run(|o| o.encoder_forward(out.ptr, ids, wte.ptr, lo, rows, wpe.map(|w| w.ptr), n, t, c));
    }
    fn encoder_backward(
        &self,
        dwte: DevMut<'_>,
        lo: usize,
        dwpe: Option<DevMut<'_>>,
        dout: DevRef<'_>,
        tokens: &[u32],
        t: usize,
        c: usize,
    ) {
        let rows = dwte.len / c;
        self.run(|o| o.encoder_backward(dwte.ptr, lo, rows, dwpe.map(|w| w.ptr), dout.ptr, tokens, t, c));
    }
    fn layernorm_forward(
        &self,
        out: DevMut<'_>,
        mean: DevMut<'_>,
        rstd: DevMut<'_>,
        inp: DevRef<'_>,
        w: DevRef<'_>,
        b: DevRef<'_>,
        c: usize,
    ) {
        let n = inp.len / c;
        self.run(|o| o.layernorm_forward(out.ptr, mean.ptr, rstd.ptr, inp.ptr, w.ptr, b.ptr, n, c));
    }
    fn layernorm_backward(
        &self,
        dinp: DevMut<'_>,
        dw: DevMut<'_>,
        db: DevMut<'_>,
        dout: DevRef<'_>,
        inp: DevRef<'_>,
        w: DevRef<'_>,
        mean: DevRef<'_>,
        rstd: DevRef<'_>,
        c: usize,
    ) {
        let n = inp.len / c;
        let scratch = self.scratch(Ops::layernorm_scratch(n, c), |s| &mut s.ln, 0.0);
        self.run(|o| {
            o.layernorm_backward(
                dinp.ptr, dw.ptr, db.ptr, dout.ptr, inp.ptr, w.ptr, mean.ptr, rstd.ptr, scratch, n, c,
            )
        });
    }
    fn matmul_forward(
        &self,
        out: DevMut<'_>,
        inp: DevRef<'_>,
        w: DevRef<'_>,
        bias: Option<DevRef<'_>>,
        c: usize,
        oc: usize,
    ) {
        let n = inp.len / c;
        let beta = match bias {
            Some(bias) => {
                // out = bias ⊗ 1: column-major outᵀ[OC, N] = bias[OC, 1]·1[1, N]
                let ones = self.scratch(n, |s| &mut s.ones, 1.0);
                self.gemm(
                    shape(oc, n, 1, false, false, oc, 1, oc),
                    1.0,
                    bias.ptr,
                    ones,
                    0.0,
                    out.ptr,
                );
                1.0
            }
            None => 0.0,
        };
        // outᵀ[OC, N] = (w stored as [C, OC] column-major)ᵀ · inpᵀ[C, N]
        self.gemm(
            shape(oc, n, c, true, false, c, c, oc),
            1.0,
            w.ptr,
            inp.ptr,
            beta,
            out.ptr,
        );
    }
    fn matmul_backward(
        &self,
        dinp: DevMut<'_>,
        dw: DevMut<'_>,
        dbias: Option<DevMut<'_>>,
        dout: DevRef<'_>,
        inp: DevRef<'_>,
        w: DevRef<'_>,
        c: usize,
        oc: usize,
    ) {
        let n = inp.len / c;
        // dinpᵀ[C, N] += w[C, OC] · doutᵀ[OC, N]
        self.gemm(
            shape(c, n, oc, false, false, c, oc, c),
            1.0,
            w.ptr,
            dout.ptr,
            1.0,
            dinp.ptr,
        );
        // dwᵀ[C, OC] += inpᵀ[C, N] · dout[N, OC]
        self.gemm(
            shape(c, oc, n, false, true, c, oc, c),
            1.0,
            inp.ptr,
            dout.ptr,
            1.0,
            dw.ptr,
        );
        if let Some(db) = dbias {
            // dbias[OC] += doutᵀ[OC, N] · 1[N]
            let ones = self.scratch(n, |s| &mut s.ones, 1.0);
            self.gemm(
                shape(oc, 1, n, false, false, oc, n, oc),
                1.0,
                dout.ptr,
                ones,
                1.0,
                db.ptr,
            );
        }
    }
    fn attention_forward(
        &self,
        out: DevMut<'_>,
        att: DevMut<'_>,
        qkv: DevRef<'_>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let hs = c / nh;
        let scale = 1.0 / (hs as f32).sqrt();
        for bi in 0..b {
            let q = at(qkv.ptr, bi * t * 3 * c);
            let a = at(att.ptr, bi * nh * t * t);
            // att_hᵀ[T, T] = K_h · Q_hᵀ: K_hᵀ and Q_hᵀ are [HS, T] column-major with ld 3C
            let s = batched(shape(t, t, hs, true, false, 3 * c, 3 * c, t), nh, hs, hs, t * t);
            self.gemm(s, scale, at(q, c), q, 0.0, a);
            // y_hᵀ[HS, T] = V_hᵀ[HS, T] · att_hᵀ[T, T]
            let s = batched(shape(hs, t, t, false, false, 3 * c, t, c), nh, hs, t * t, hs);
            // the softmax first, over this sequence's heads
            self.run(|o| o.softmax_causal_forward(a, nh * t, t));
            self.gemm(s, 1.0, at(q, 2 * c), a, 0.0, at(out.ptr, bi * t * c));
        }
    }
    fn attention_backward(
        &self,
        dqkv: DevMut<'_>,
        dout: DevRef<'_>,
        qkv: DevRef<'_>,
        att: DevRef<'_>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let hs = c / nh;
        let scale = 1.0 / (hs as f32).sqrt();
        let datt = self.scratch(nh * t * t, |s| &mut s.datt, 0.0);
        for bi in 0..b {
            let (q, dq) = (at(qkv.ptr, bi * t * 3 * c), at(dqkv.ptr, bi * t * 3 * c));
            let (a, dy) = (at(att.ptr, bi * nh * t * t), at(dout.ptr, bi * t * c));
            // datt_hᵀ[T, T] = V_h · dY_hᵀ (V_hᵀ [HS, T] ld 3C transposed; dY_hᵀ [HS, T] ld C)
            let s = batched(shape(t, t, hs, true, false, 3 * c, c, t), nh, hs, hs, t * t);
            self.gemm(s, 1.0, at(q, 2 * c), dy, 0.0, datt);
            // dV_hᵀ[HS, T] += dY_hᵀ[HS, T] · att_h[T, T]
            let s = batched(shape(hs, t, t, false, true, c, t, 3 * c), nh, hs, t * t, hs);
            self.gemm(s, 1.0, dy, a, 1.0, at(dq, 2 * c));
            // datt becomes the gradient at the scaled scores
            self.run(|o| o.softmax_causal_backward(datt, a, nh * t, t));
            // dQ_hᵀ[HS, T] += scale · K_hᵀ[HS, T] · dS_hᵀ[T, T]
            let s = batched(shape(hs, t, t, false, false, 3 * c, t, 3 * c), nh, hs, t * t, hs);
            self.gemm(s, scale, at(q, c), datt, 1.0, dq);
            // dK_hᵀ[HS, T] += scale · Q_hᵀ[HS, T] · dS_h[T, T]
            let s = batched(shape(hs, t, t, false, true, 3 * c, t, 3 * c), nh, hs, t * t, hs);
            self.gemm(s, scale, q, datt, 1.0, at(dq, c));
        }
    }
    fn gelu_forward(&self, out: DevMut<'_>, inp: DevRef<'_>) {
        self.run(|o| o.gelu_forward(out.ptr, inp.ptr, out.len));
    }
    fn gelu_backward(&self, dinp: DevMut<'_>, inp: DevRef<'_>, dout: DevRef<'_>) {
        self.run(|o| o.gelu_backward(dinp.ptr, inp.ptr, dout.ptr, dinp.len));
    }
    fn residual_forward(&self, out: DevMut<'_>, a: DevRef<'_>, b: DevRef<'_>) {
        self.run(|o| o.residual_forward(out.ptr, a.ptr, b.ptr, out.len));
    }
    fn residual_backward(&self, da: DevMut<'_>, db: DevMut<'_>, dout: DevRef<'_>) {
        self.run(|o| o.residual_backward(da.ptr, db.ptr, dout.ptr, da.len));
    }
    fn crossentropy_max(&self, maxes: DevMut<'_>, logits: DevRef<'_>, valid: usize, vl: usize) {
        self.run(|o| o.crossentropy_max(maxes.ptr, logits.ptr, maxes.len, valid, vl));
    }
    fn crossentropy_exp(
        &self,
        probs: DevMut<'_>,
        stats: DevMut<'_>,
        logits: DevRef<'_>,
        maxes: DevRef<'_>,
        targets: &[u32],
        lo: usize,
        valid: usize,
        vl: usize,
    ) {
        let ids = self.ids(targets);
        let n = maxes.len;
        self.run(|o| o.crossentropy_exp(probs.ptr, stats.ptr, logits.ptr, maxes.ptr, ids, lo, n, valid, vl));
    }
    fn crossentropy_normalize(&self, probs: DevMut<'_>, losses: DevMut<'_>, stats: DevRef<'_>, vl: usize) {
        self.run(|o| o.crossentropy_normalize(probs.ptr, losses.ptr, stats.ptr, losses.len, vl));
    }
    fn crossentropy_backward(
        &self,
        dlogits: DevMut<'_>,
        probs: DevRef<'_>,
        targets: &[u32],
        lo: usize,
        dloss: f32,
        valid: usize,
        vl: usize,
    ) {
        let ids = self.ids(targets);
        let n = targets.len();
        self.run(|o| o.crossentropy_backward(dlogits.ptr, probs.ptr, ids, lo, dloss, n, valid, vl));
    }
}
