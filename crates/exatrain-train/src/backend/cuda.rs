//! The CUDA backend (feature `cuda`): buffers are device allocations, views are device address
//! ranges, the element-wise, norm and loss kernels are `exatrain-cuda`'s NVRTC-compiled ones
//! (`kernels/*.cu`, the CPU kernels' names and argument order) and every product goes through
//! cuBLASLt with the CPU's accumulate-into-gradients semantics (`beta = 1`).
//!
//! - **Matmul and attention** are [`plan`]s: the GEMMs in cuBLASLt's terms and the softmax
//!   kernels between them, tested on the host against the CPU kernels. The bias is a rank-1
//!   product `bias ⊗ 1` written first, so the GEMM accumulates onto it; `dbias += doutᵀ·1` is a
//!   GEMM against a vector of ones (no float atomics). Attention is strided batched GEMMs over
//!   the heads of one sequence, one call per sequence; the backward keeps one sequence's
//!   `datt` [NH, T, T] in a scratch buffer. Flash attention (`--flash-attention`) is the same
//!   plan with each sequence's probabilities in a reused scratch instead of the activations,
//!   recomputed in backward: nothing T×T kept between the passes, as the planner prices it.
//!   Context parallelism is the same plan against the gathered keys and values: each
//!   contiguous run of the rank's query positions (its two chunks) is one block against the
//!   keys before its end, the softmax kernel masking by global position.
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

use super::plan::{self, Step};
use super::Backend;
use crate::flash::KeyValues;
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
    /// flash attention: one sequence's probabilities [NH, T, T], recomputed in backward
    probs: Option<CudaSlice<f32>>,
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
    /// fp32 GEMMs in TF32
    tf32: bool,
}

// the host side of the backend is used by one thread at a time (one model per rank)
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cuda {
    /// Open GPU `ordinal` in precision `p`, its fp32 products in TF32 on the tensor cores when
    /// `tf32` (else in full fp32, as the tests against the CPU need): a clear error without a
    /// driver, a device or the libraries, never a panic.
    pub fn open(ordinal: usize, p: Precision, tf32: bool) -> Result<Cuda, GpuError> {
        if p != Precision::Fp32 {
            return Err(GpuError::new(
                "bf16: the trainer's bf16 mode is not built yet (the kernels are; the activation table does not \
                 yet keep the fp32 statistics apart); the CUDA backend trains in fp32 (TF32 products)",
            ));
        }
        let gpu = device::open(ordinal)?;
        let lt = Lt::new(gpu.stream.clone())?;
        Ok(Cuda(Arc::new(Inner {
            gpu,
            lt: Mutex::new(lt),
            scratch: Mutex::new(Scratch::default()),
            failed: Mutex::new(None),
            tf32,
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

    /// Run a plan (see [`plan`]): its GEMMs through cuBLASLt, its softmax steps as kernels.
    fn exec(&self, steps: Vec<Step>) {
        for s in steps {
            match s {
                Step::Gemm(g) => {
                    let mut sh = Shape::plain(g.m as u64, g.n as u64, g.k as u64, Ty::F32, Ty::F32);
                    (sh.transa, sh.transb) = (g.transa, g.transb);
                    (sh.lda, sh.ldb, sh.ldc) = (g.lda as i64, g.ldb as i64, g.ldc as i64);
                    sh.batch = g.batch as i32;
                    sh.tf32 = self.tf32;
                    (sh.stride_a, sh.stride_b, sh.stride_c) = (g.stride_a as i64, g.stride_b as i64, g.stride_c as i64);
                    self.run(|_| {
                        // SAFETY: the plans address views of live buffers within their extents
                        // (tested on the host against the CPU kernels).
                        unsafe { lock(&self.lt).gemm(&sh, g.alpha, g.a, g.b, g.beta, g.c) }
                    });
                }
                Step::SoftmaxForward { att, rows, mask } => {
                    self.run(|o| o.softmax_causal_forward(att, rows, (mask.tq, mask.tk, mask.offset)))
                }
                Step::SoftmaxBackward { datt, att, rows, mask } => {
                    self.run(|o| o.softmax_causal_backward(datt, att, rows, (mask.tq, mask.tk, mask.offset)))
                }
            }
        }
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

    /// `len` f32 from device address `ptr`, copied to the host (zeros after a failure).
    fn to_host(&self, ptr: Ptr, len: usize) -> Vec<f32> {
        let mut host = vec![0.0f32; len];
        if len > 0 {
            self.run(|o| {
                // SAFETY: the address range lies inside a live allocation; the host vector has
                // its length; the stream is synchronised before the host reads it.
                unsafe { result::memcpy_dtoh_async(&mut host, ptr, o.gpu.stream.cu_stream()) }
                    .map_err(|e| GpuError::new(format!("device → host: {e}")))
            });
            self.sync();
        }
        host
    }

    /// A buffer of `len` f32 from `make` (none when empty or after a failure; a failed
    /// allocation is kept as the backend's error).
    fn device_buf(
        &self,
        len: usize,
        make: impl FnOnce() -> Result<CudaSlice<f32>, exatrain_cuda::cudarc::driver::DriverError>,
    ) -> DevBuf {
        let none = DevBuf {
            _mem: None,
            ptr: 0,
            len,
        };
        if len == 0 || self.failed() {
            return none;
        }
        match make() {
            Ok(mem) => DevBuf {
                ptr: ops::ptr(&mem, &self.gpu),
                _mem: Some(mem),
                len,
            },
            Err(e) => {
                *lock(&self.failed) = Some(format!("allocating {} MiB on the GPU: {e}", (len as u64 * F) >> 20));
                none
            }
        }
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

/// The address `off` f32 past `p`.
fn at(p: Ptr, off: usize) -> Ptr {
    plan::at(p, off)
}

impl Backend for Cuda {
    type R = f32;
    type Buf = DevBuf;
    type Ref<'a> = DevRef<'a>;
    type Mut<'a> = DevMut<'a>;

    fn upload(&self, host: Vec<f32>) -> DevBuf {
        self.device_buf(host.len(), || self.gpu.stream.clone_htod(&host))
    }
    fn alloc(&self, n: usize) -> DevBuf {
        self.device_buf(n, || self.gpu.stream.alloc_zeros::<f32>(n))
    }
    fn download(&self, buf: &DevBuf) -> Vec<f32> {
        self.to_host(buf.ptr, buf.len)
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
        // after a failure the host sees zeros: collectives stay matched across ranks, and
        // `check` reports the failure at the next synchronisation point
        f(&self.to_host(r.ptr, r.len))
    }
    fn with_host_mut<T>(&self, m: DevMut<'_>, f: impl FnOnce(&mut [f32]) -> T) -> T {
        let mut host = self.to_host(m.ptr, m.len);
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
        let ones = if bias.is_some() {
            self.scratch(n, |s| &mut s.ones, 1.0)
        } else {
            0
        };
        self.exec(plan::matmul_forward(
            out.ptr,
            inp.ptr,
            w.ptr,
            bias.map(|b| b.ptr),
            ones,
            n,
            c,
            oc,
        ));
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
        let ones = if dbias.is_some() {
            self.scratch(n, |s| &mut s.ones, 1.0)
        } else {
            0
        };
        let db = dbias.map(|d| d.ptr);
        self.exec(plan::matmul_backward(
            dinp.ptr, dw.ptr, db, dout.ptr, inp.ptr, w.ptr, ones, n, c, oc,
        ));
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
        self.exec(plan::attention_forward(out.ptr, att.ptr, qkv.ptr, b, t, c, nh));
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
        let datt = self.scratch(nh * t * t, |s| &mut s.datt, 0.0);
        self.exec(plan::attention_backward(
            dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, datt, b, t, c, nh,
        ));
    }
    /// Each sequence's probabilities (each run of the rank's query positions against the keys
    /// before its end, under context parallelism) in a reused scratch; `lse` is the host
    /// kernel's and stays unwritten, as backward recomputes the probabilities whole.
    fn flash_attention_forward(
        &self,
        out: DevMut<'_>,
        _lse: DevMut<'_>,
        qkv: DevRef<'_>,
        kv: Option<DevRef<'_>>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    ) {
        let probs = self.scratch(nh * at.pos.len() * at.tk, |s| &mut s.probs, 0.0);
        let kv = kv.map_or(qkv.ptr, |k| k.ptr);
        self.exec(plan::flash_attention_forward(out.ptr, probs, qkv.ptr, kv, at, b, c, nh));
    }
    fn flash_attention_backward(
        &self,
        dqkv: DevMut<'_>,
        dkv: Option<DevMut<'_>>,
        dout: DevRef<'_>,
        _out: DevRef<'_>,
        _lse: DevRef<'_>,
        qkv: DevRef<'_>,
        kv: Option<DevRef<'_>>,
        at: &KeyValues,
        b: usize,
        c: usize,
        nh: usize,
    ) {
        let n = nh * at.pos.len() * at.tk;
        let probs = self.scratch(n, |s| &mut s.probs, 0.0);
        let datt = self.scratch(n, |s| &mut s.datt, 0.0);
        let (kv, dkv) = (kv.map_or(qkv.ptr, |k| k.ptr), dkv.map_or(dqkv.ptr, |d| d.ptr));
        self.exec(plan::flash_attention_backward(
            dqkv.ptr,
            dkv,
            dout.ptr,
            qkv.ptr,
            kv,
            (probs, datt),
            at,
            b,
            c,
            nh,
        ));
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
