//! Compute time on one device: each GEMM on a roofline (the device's efficiency curve for its
//! shape, bounded by HBM traffic), the attention core, and memory-bound element-wise ops.
//! Times are for one microbatch on one device of a TP group, in seconds.

use exatrain_spec::{ClusterSpec, Dtype, Framework, GemmCorrection, GemmEfficiency, Mlp, ModelSpec, ParallelConfig};

/// What a device delivers for a given number format.
#[derive(Debug, Clone)]
pub struct Device {
    /// Dense peak, FLOP/s.
    pub peak: f64,
    /// Achieved HBM bandwidth for streaming kernels, bytes/s.
    pub mem_bw: f64,
    pub gemm: GemmEfficiency,
    /// Measured GEMM efficiencies the curve is corrected toward (`DeviceSpec.gemm_table`).
    pub gemm_table: GemmCorrection,
    /// The software stack's multiplier on the GEMM curve (`ClusterSpec.stack`).
    pub stack: f64,
    /// Bytes the loss moves per logit element, forward and backward: the framework's unfused fp32
    /// cross-entropy, or the trainer's fused classifier (max, exp-sum, gradient: 3 fp32 passes)
    /// when the stack names no framework.
    pub loss_bytes: f64,
    /// The framework whose selective recomputation and fused-softmax constraints apply (None:
    /// the trainer, which recomputes as Megatron-LM does and whose softmax is always fused).
    pub framework: Option<Framework>,
    /// The stack has a fused scale-mask-softmax kernel (`StackSpec.fused_softmax`).
    pub fused_softmax: bool,
    /// The stack adds the linears' biases inside the next kernel (`StackSpec.bias_fusion`).
    pub bias_fusion: bool,
    /// The FP8 peak (FLOP/s) and FP8 GEMM curve, when the device has FP8 tensor cores.
    pub fp8: Option<(f64, GemmEfficiency)>,
}

impl Device {
    pub fn new(c: &ClusterSpec, dtype: Dtype) -> Self {
        Device {
            peak: c.device.peak_flops(dtype),
            mem_bw: c.device.hbm_gbps * 1e9 * c.device.memory_efficiency,
            gemm: c.device.gemm,
            gemm_table: GemmCorrection::new(&c.device.gemm, &c.device.gemm_table),
            stack: c.stack.compute_efficiency,
            loss_bytes: c.stack.framework.map_or(12.0, |f| f.loss_bytes_per_logit(dtype)),
            framework: c.stack.framework,
            fused_softmax: c.stack.fused_softmax,
            bias_fusion: c.stack.bias_fusion,
            fp8: c.device.fp8(),
        }
    }

    /// `batch` GEMMs of (m × k)·(k × n) with `e`-byte elements: the slower of the compute time at
    /// the shape's efficiency (times the stack's, at most the peak) and the time to stream the
    /// three matrices.
    #[inline]
    pub fn gemm(&self, batch: f64, m: f64, n: f64, k: f64, e: f64) -> f64 {
        let flops = 2.0 * batch * m * n * k;
        let t_compute = flops / (self.peak * (self.stack * self.gemm_table.efficiency(&self.gemm, m, n, k)).min(1.0));
        let t_memory = batch * (m * k + k * n + m * n) * e / self.mem_bw;
        t_compute.max(t_memory)
    }

    /// A linear layer's (m × k)·(k × n) GEMM with FP8 inputs (one byte each) and a bf16 output,
    /// on the FP8 peak and curve times the stack's efficiency (the measured `gemm_table` is the
    /// bf16 path's and is not applied). A device without FP8: the bf16 GEMM.
    #[inline]
    pub fn gemm_fp8(&self, m: f64, n: f64, k: f64) -> f64 {
        let Some((peak, curve)) = self.fp8 else {
            return self.gemm(1.0, m, n, k, 2.0);
        };
        let t_compute = 2.0 * m * n * k / (peak * (self.stack * curve.efficiency(m, n, k)).min(1.0));
        let t_memory = (m * k + k * n + 2.0 * m * n) / self.mem_bw;
        t_compute.max(t_memory)
    }

    /// A memory-bound kernel that moves `bytes`.
    #[inline]
    pub fn stream(&self, bytes: f64) -> f64 {
        bytes / self.mem_bw
    }
}

/// Forward time of one transformer block, one microbatch, one device, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockTime {
    /// The four weight GEMMs (QKV, attention out, MLP up/gate, MLP down).
    pub gemm: f64,
    /// Of those, the two column-parallel ones, QKV and the MLP's up/gate, whose backward data- and
    /// weight-gradient GEMMs each take as long (what Megatron's asynchronous TP communication
    /// hides collectives under).
    pub column_gemms: [f64; 2],
    /// The attention core: QKᵀ, softmax, dropout, ·V (or one fused flash kernel).
    pub core: f64,
    /// The attention core's backward.
    pub core_bwd: f64,
    /// Norms, residual adds, dropouts, activation function, rotary embedding.
    pub elementwise: f64,
}

impl BlockTime {
    pub fn total(&self) -> f64 {
        self.gemm + self.core + self.elementwise
    }
}

/// Forward time of one block. Shapes per device: T = b·s tokens (s the rank's `seq_len / cp`),
/// TP shards heads and the FFN width; with sequence parallelism the norm/dropout/residual region
/// works on T/t tokens, without it every TP rank repeats that work on all T.
pub fn block_forward(m: &ModelSpec, p: &ParallelConfig, d: &Device) -> BlockTime {
    let e = p.dtype.bytes();
    let t = p.tp as f64;
    let b = p.micro_batch as f64;
    let s = p.local_seq(m) as f64;
    let cp = p.cp as f64;
    let h = m.hidden as f64;
    let tokens = b * s;
    let q = m.q_dim() as f64;
    let kv = m.kv_dim() as f64;
    let f = m.ffn_hidden as f64;
    let up = (m.mlp_matrices() - 1) as f64; // 1 for GELU, 2 for SwiGLU (gate + up)
    let heads = m.heads as f64 / t;
    let hd = m.head_dim as f64;

    // the four weight GEMMs, in FP8 when the layout says so (Transformer Engine's linears)
    let linear = |rows: f64, cols: f64, inner: f64| {
        if p.fp8 {
            d.gemm_fp8(rows, cols, inner)
        } else {
            d.gemm(1.0, rows, cols, inner, e)
        }
    };
    let qkv = linear(tokens, (q + 2.0 * kv) / t, h);
    let up_gate = linear(tokens, up * f / t, h);
    let gemm = qkv + linear(tokens, h, q / t) + up_gate + linear(tokens, h, f / t);

    let (core, core_bwd) = if p.flash_attention {
        // One fused kernel; causal masking skips half the s×s blocks; no s×s tensor in HBM. Its
        // backward is 2.5× its forward (it recomputes the scores). Context-parallel, one kernel
        // per ring step: the rank's s queries against each of the cp key/value chunks of s
        // (the causal half of the whole s × cp·s rectangle, load-balanced), each step reading
        // the queries and a chunk and rescaling the output.
        let t_flops = 0.5 * (d.gemm(b * heads * cp, s, s, hd, 0.0) + d.gemm(b * heads * cp, s, hd, s, 0.0));
        let io = cp * b * s * (q + 2.0 * kv + q) / t * e;
        let core = t_flops.max(d.stream(io));
        (core, 2.5 * core)
    } else {
        let scores = b * heads * s * s;
        let drop = if m.dropout { scores * (2.0 * e + 1.0) } else { 0.0 };
        // fused scale-mask-softmax (one read and one write of the scores), then dropout; the
        // backward twice the forward
        let fused = d.gemm(b * heads, s, s, hd, e) + d.gemm(b * heads, s, hd, s, e) + d.stream(scores * 2.0 * e + drop);
        // Without the fused kernel (the stack has none, or the layout breaks its constraints) the
        // scale, the mask and the softmax are separate passes, and a fourth (2019's mask
        // subtract; today's fp32 casts, which move more): three more read-write passes forward,
        // and the scale's and the mask's gradients (two) backward.
        let unfused = !(d.fused_softmax && d.framework.is_none_or(|f| f.fused_softmax_fits(m, p)));
        let (extra_fwd, extra_bwd) = if unfused {
            (d.stream(scores * 6.0 * e), d.stream(scores * 4.0 * e))
        } else {
            (0.0, 0.0)
        };
        (fused + extra_fwd, 2.0 * fused + extra_bwd)
    };

    let region = if p.sequence_parallel {
        tokens * h / t
    } else {
        tokens * h
    };
    let norms = 2.0 * 2.0 * region * e;
    let residual = 2.0 * (3.0 * region * e + if m.dropout { region } else { 0.0 });
    let act = match m.mlp {
        Mlp::Gelu => 2.0 * tokens * f / t * e,
        Mlp::Swiglu => 3.0 * tokens * f / t * e,
    };
    let rope = match m.position {
        exatrain_spec::Position::Rope => 2.0 * tokens * (q + kv) / t * e,
        exatrain_spec::Position::Learned => 0.0,
    };
    // Without bias fusion each bias is a read-write pass of its own — the two column-parallel
    // outputs' and, after the row-parallel reductions, the two residual sites' — and each dropout
    // one apart from its residual add.
    let unfused_bias = if d.bias_fusion {
        0.0
    } else {
        let biases = if m.bias {
            2.0 * e * (tokens * (q + 2.0 * kv + up * f) / t + 2.0 * region)
        } else {
            0.0
        };
        biases + if m.dropout { 2.0 * 2.0 * e * region } else { 0.0 }
    };
    // FP8 casts: each linear's input is written once more as FP8 and as its FP8 transpose (for
    // the weight gradient) — inside the norm kernel for QKV and the MLP's first linear, a
    // read-cast-write pass of its own for the attention output and the MLP's second linear.
    // Backward casts each output gradient the same way; `block_train_of` prices the backward's
    // element-wise work at twice the forward's, which covers it.
    let fp8_casts = if p.fp8 {
        2.0 * 2.0 * region + 4.0 * tokens * (q + f) / t
    } else {
        0.0
    };
    // the framework's own eager element-wise passes beyond these fused kernels
    let eager = d.framework.map_or(0.0, |fw| fw.eager_elementwise_bytes_per_token(m, p));
    let elementwise = d.stream(norms + residual + act + rope + unfused_bias + fp8_casts + tokens * eager);
    BlockTime {
        gemm,
        column_gemms: [qkv, up_gate],
        core,
        core_bwd,
        elementwise,
    }
}

/// Forward + backward (+ recomputation) time of one block, one microbatch. Backward GEMMs cost
/// twice the forward (data and weight gradients have the forward's dimensions); element-wise
/// backward moves about twice the bytes; the attention core's backward is [`BlockTime::core_bwd`].
pub fn block_train(m: &ModelSpec, p: &ParallelConfig, d: &Device) -> f64 {
    block_train_of(m, p, d, &block_forward(m, p, d))
}

/// [`block_train`] of a block whose forward ([`block_forward`]) is already priced.
pub fn block_train_of(m: &ModelSpec, p: &ParallelConfig, d: &Device, fwd: &BlockTime) -> f64 {
    let bwd = 2.0 * fwd.gemm + fwd.core_bwd + 2.0 * fwd.elementwise;
    let recompute = match p.recompute {
        exatrain_spec::Recompute::None => 0.0,
        exatrain_spec::Recompute::Selective => {
            let r = d.framework.unwrap_or(Framework::MegatronLm).selective_recompute(m);
            // flash attention keeps no s×s tensor: its core is never recomputed
            let core = if p.flash_attention { 0.0 } else { r.core * fwd.core };
            r.gemm * fwd.gemm + core + r.elementwise * fwd.elementwise
        }
        exatrain_spec::Recompute::Full => fwd.total(),
    };
    fwd.total() + bwd + recompute
}

/// Forward + backward of the input embedding (first stage), one microbatch.
pub fn embedding_train(m: &ModelSpec, p: &ParallelConfig, d: &Device) -> f64 {
    let tokens = p.micro_batch as f64 * p.local_seq(m) as f64;
    let h = m.hidden as f64;
    let e = p.dtype.bytes();
    // gather rows (+ add positions), then the scatter-add of their gradients: ~3 passes each way
    d.stream(3.0 * tokens * h * e) * 3.0
}

/// Forward + backward of the final norm, output head and cross-entropy (last stage), one
/// microbatch. Logits are vocabulary-parallel (V/t per rank); the loss works in fp32.
pub fn head_train(m: &ModelSpec, p: &ParallelConfig, d: &Device) -> f64 {
    let tokens = p.micro_batch as f64 * p.local_seq(m) as f64;
    let h = m.hidden as f64;
    let v = m.padded_vocab as f64 / p.tp as f64;
    let e = p.dtype.bytes();
    let logits = d.gemm(1.0, tokens, v, h, e);
    let ce = d.stream(tokens * v * d.loss_bytes);
    let norm = d.stream(2.0 * tokens * h * e);
    3.0 * (logits + norm) + ce
}
