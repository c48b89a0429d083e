//! The training frameworks a plan is exported to, the versions exatrain targets, and which layouts
//! each can express. `study`/`tune --framework` search only what [`Framework::can_run`] accepts,
//! so the recommended layout can always be exported; `export` refuses the rest with the reason.

use std::fmt;

use crate::{Dtype, Mlp, ModelSpec, Norm, ParallelConfig, Position, RankOrder, SpecError, StackSpec};

/// A framework users launch a plan with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    MegatronLm,
    MegatronDeepspeed,
    Torchtitan,
}

impl Framework {
    pub const ALL: [Framework; 3] = [
        Framework::MegatronLm,
        Framework::MegatronDeepspeed,
        Framework::Torchtitan,
    ];

    /// Every framework's name, for messages: "megatron-lm, megatron-deepspeed, torchtitan".
    pub fn allowed() -> String {
        Framework::ALL.map(Framework::name).join(", ")
    }

    pub fn name(self) -> &'static str {
        match self {
            Framework::MegatronLm => "megatron-lm",
            Framework::MegatronDeepspeed => "megatron-deepspeed",
            Framework::Torchtitan => "torchtitan",
        }
    }

    /// The version whose argument parser and validation the exports are written (and checked) for.
    pub fn version(self) -> &'static str {
        match self {
            Framework::MegatronLm => "Megatron-LM main of 2026-08-22 (megatron-core 0.20.0, commit d98e8a6)",
            Framework::MegatronDeepspeed => {
                "Megatron-DeepSpeed main of 2025-07-16 (commit 4efb479) with DeepSpeed 0.18"
            }
            Framework::Torchtitan => "torchtitan main of 2026-08-21 (0.2.2, commit b5bcd76)",
        }
    }

    /// The end-to-end kernel efficiency this framework gets out of a device, relative to
    /// Megatron-LM's on the same device and layout (what a cluster's `[stack]` carries; see
    /// `ClusterSpec::for_framework`). Megatron-DeepSpeed: the stack factor fitted to its two
    /// published sources in `data/published-runs.csv` (BLOOM-176B on Jean Zay, MT-NLG 530B on
    /// Selene) over the one fitted to the Megatron-LM sources (Narayanan 2021, Korthikanti 2022,
    /// the H100 table, Shoeybi 2019); `tests/cli.rs` refits it from the file. It was 0.894 until
    /// `BF16_Optimizer`'s own gradient-accumulation passes were priced
    /// ([`Self::grad_accum_bytes_per_param`]): most of the gap was those passes. torchtitan:
    /// Megatron-LM's (an assumption); its own source (`torchtitan-a100`) is left unfitted, a
    /// blind check of the carry-over (its runs alone would ask ×0.982).
    pub fn compute_efficiency(self) -> f64 {
        match self {
            Framework::MegatronLm | Framework::Torchtitan => 1.0,
            Framework::MegatronDeepspeed => 0.962,
        }
    }

    /// How this framework reduces the data-parallel gradients of a layout (and, with ZeRO-1,
    /// gathers the updated weights), as exatrain's export runs it.
    /// - Megatron-LM: in buckets of `dp_bucket` or max(40 M, 1 M · dp · cp) parameters,
    ///   overlapped with backward when `overlap_dp` (`--overlap-grad-reduce`), on the wire in the
    ///   training dtype (`--grad-reduce-in-bf16`, which the export passes; in fp32 where the stack
    ///   says it was not: `StackSpec::grad_reduce_bf16`).
    /// - torchtitan: FSDP2 reduces each unit (a block; the embedding; the final norm with the
    ///   head) when its backward ends, in fp32 (`training.mixed_precision_reduce = "float32"`,
    ///   its default, which the export keeps).
    /// - Megatron-DeepSpeed in bf16 with ZeRO ≤ 1: DeepSpeed's `BF16_Optimizer` (fp32 gradient
    ///   accumulation, `data_types.grad_accum_dtype = fp32` in the exported config, as BLOOM
    ///   ran) all-reduces its fp32 gradients at the accumulation boundary — after the pipeline's
    ///   flush (`_exec_reduce_grads`) or after the last backward — then all-gathers the updated
    ///   bf16 weights; nothing overlaps compute.
    /// - Megatron-DeepSpeed otherwise: ZeRO-1 reduces at the boundary too; `overlap_comm`
    ///   overlaps ZeRO-2/3's bucket reductions (`reduce_bucket_size`, 5e8 elements unless
    ///   planned) with backward. Its ZeRO-1/2 parameter gather ends the optimizer step.
    pub fn dp_reduction(self, c: &ParallelConfig, stack: &StackSpec) -> DpReduction {
        let wire = c.dtype.bytes();
        match self {
            Framework::MegatronLm => DpReduction {
                overlapped: c.overlap_dp,
                buckets: GradBuckets::planned(c, GradBuckets::megatron_default(c.dp_cp())),
                // --overlap-param-gather, which the export passes with the distributed optimizer
                gather_hidden: c.overlap_dp,
                grad_wire_bytes: if stack.grad_reduce_bf16 {
                    wire
                } else {
                    Dtype::Fp32.bytes()
                },
                all_reduce: c.zero == 0,
            },
            Framework::Torchtitan => DpReduction {
                overlapped: c.overlap_dp,
                buckets: GradBuckets::Units,
                // each unit's parameters gathered one unit ahead of its forward
                gather_hidden: c.overlap_dp,
                grad_wire_bytes: Dtype::Fp32.bytes(),
                all_reduce: c.zero == 0,
            },
            Framework::MegatronDeepspeed if c.dtype == Dtype::Bf16 && c.zero <= 1 => DpReduction {
                overlapped: false,
                buckets: GradBuckets::Params(f64::INFINITY),
                gather_hidden: false,
                grad_wire_bytes: Dtype::Fp32.bytes(),
                all_reduce: true,
            },
            Framework::MegatronDeepspeed => DpReduction {
                overlapped: c.overlap_dp && c.zero >= 2,
                buckets: GradBuckets::planned(c, GradBuckets::DEEPSPEED_DEFAULT),
                // DeepSpeed gathers the updated parameters at the end of its optimizer step
                gather_hidden: false,
                grad_wire_bytes: wire,
                all_reduce: c.zero == 0,
            },
        }
    }

    /// Bytes of one stored gradient element (the buffer backward accumulates into, before
    /// ZeRO-2/3 sharding), as the framework runs what exatrain exports:
    /// - Megatron-LM: the training dtype where there is a reduction (dp · cp > 1). Its DDP buffer
    ///   holds `main_grad` in the reduction's dtype, and the export passes
    ///   `--grad-reduce-in-bf16` when dp · cp > 1 (NVIDIA's H100 examples do), so a bf16 parameter
    ///   costs 2 + 2 + 12 bytes before sharding; without that flag Megatron-LM accumulates in
    ///   fp32 (18 bytes, its distributed-optimizer table; `StackSpec::grad_reduce_bf16` false).
    ///   Under fp32, 4. (The trainer, no
    ///   framework, keeps fp32 gradients in both precisions.)
    /// - Megatron-DeepSpeed: fp32 (`BF16_Optimizer` accumulates every microbatch into fp32).
    /// - torchtitan: fp32 (FSDP2's sharded gradients take the fp32 `reduce_dtype`).
    pub fn grad_store_bytes(self, c: &ParallelConfig, stack: &StackSpec) -> f64 {
        match self {
            Framework::MegatronLm if c.dp_cp() > 1 && stack.grad_reduce_bf16 => c.dtype.bytes(),
            Framework::MegatronLm | Framework::MegatronDeepspeed | Framework::Torchtitan => Dtype::Fp32.bytes(),
        }
    }

    /// Bytes the framework's optimizer step moves besides the update itself (Adam's 28 + e per
    /// parameter it updates: parameter, gradient and both moments read, all but the gradient
    /// written, and the training-dtype copy written), as (per updated parameter, per held
    /// parameter):
    /// - Megatron-LM: the gradient norm (for `--clip-grad`) reads each fp32 main gradient it
    ///   updates (`get_grad_norm_fp32`, `multi_tensor_l2norm`), the copy of the updated fp32
    ///   main parameters into the model's reads them (`_copy_main_params_to_model_params`, whose
    ///   write the e counts), and the whole gradient buffer is zeroed for the next step
    ///   (`zero_grad_buffer`): 8, and the stored gradient's bytes.
    /// - Megatron-DeepSpeed (`BF16_Optimizer`): the same passes — the norm of the fp32
    ///   gradients, `update_lp_params` from the fp32 parameters, `clear_hp_grads`.
    /// - torchtitan: the norm's read (`clip_grad_norm_`): 4; its optimizer updates the fp32
    ///   sharded parameters FSDP2 gathers from (no copy), and its `zero_grad` drops the
    ///   gradients instead of zeroing them.
    pub fn optimizer_pass_bytes(self, c: &ParallelConfig, stack: &StackSpec) -> (f64, f64) {
        match self {
            Framework::MegatronLm | Framework::MegatronDeepspeed => (8.0, self.grad_store_bytes(c, stack)),
            Framework::Torchtitan => (4.0, 0.0),
        }
    }

    /// What this framework's selective recomputation redoes in backward, as shares of one
    /// block's forward ([`Recompute::Selective`]; exatrain's exports ask for exactly this).
    /// - Megatron-LM / Megatron-DeepSpeed (`--recompute-granularity selective`): the attention
    ///   core only (nothing with flash attention, which keeps no s×s tensor).
    /// - torchtitan (`SelectiveAC`, op mode): every op's output is recomputed except SDPA's and
    ///   every other matmul's, counted in call order (wq, wk, wv, wo, then w1, w3, w2 or w1, w2):
    ///   wk, wo and w3 (SwiGLU; w2 with GELU) are recomputed, their share of the block's GEMM
    ///   FLOPs, with all its element-wise ops.
    pub fn selective_recompute(self, m: &ModelSpec) -> SelectiveRecompute {
        match self {
            Framework::MegatronLm | Framework::MegatronDeepspeed => SelectiveRecompute {
                gemm: 0.0,
                core: 1.0,
                elementwise: 0.0,
            },
            Framework::Torchtitan => {
                let (h, q, kv, f) = (
                    m.hidden as f64,
                    m.q_dim() as f64,
                    m.kv_dim() as f64,
                    m.ffn_hidden as f64,
                );
                // the 2nd, 4th and 6th matmul of the block: wk, wo and the MLP's second
                let recomputed = h * kv + q * h + h * f;
                SelectiveRecompute {
                    gemm: recomputed / m.layer_matrix_params() as f64,
                    core: 0.0,
                    elementwise: 1.0,
                }
            }
        }
    }

    /// Bytes the loss moves per logit element (forward and backward), logits in `dtype`. Each
    /// framework computes the cross-entropy in fp32 with unfused PyTorch ops:
    /// - Megatron-LM / Megatron-DeepSpeed (`vocab_parallel_cross_entropy`, no
    ///   `--cross-entropy-loss-fusion`): upcast, max, subtract, exp, sum, divide; backward a
    ///   multiply and the downcast — 4 + 8 + 8 + 4 + 8 + 8 = 40 fp32 bytes, plus 2 × (e + 4) for
    ///   the casts when the logits are not fp32.
    /// - torchtitan (`cross_entropy(pred.float(), …)`): upcast, log-softmax (max, sum-exp, write:
    ///   three reads, one write), the NLL gradient (a written zero tensor), the log-softmax
    ///   backward (two reads for the sum, two reads and a write) — 16 + 4 + 20 = 40, plus the casts.
    pub fn loss_bytes_per_logit(self, dtype: Dtype) -> f64 {
        let casts = match dtype {
            Dtype::Fp32 => 0.0,
            Dtype::Bf16 => 2.0 * (dtype.bytes() + 4.0),
        };
        // the same count for the three; a framework with a fused loss would move less
        40.0 + casts
    }

    /// Pieces the last stage computes the output head and the loss in, one after the other, so
    /// that only one piece's logits are alive at a time:
    /// - torchtitan: 8 (`ChunkedLossWrapper`'s `num_chunks`, which its registered Llama 3
    ///   configs use and the export keeps; the head and loss run on 1/8 of the tokens at a time).
    /// - Megatron-LM and Megatron-DeepSpeed: 1 (the whole microbatch's logits; no
    ///   `--cross-entropy-loss-fusion`).
    pub fn loss_chunks(self) -> f64 {
        match self {
            Framework::Torchtitan => 8.0,
            Framework::MegatronLm | Framework::MegatronDeepspeed => 1.0,
        }
    }

    /// Bytes this framework's ZeRO-3 copies per parameter of the stage, per microbatch, besides
    /// the collectives: memory-bound passes on the compute stream, exposed.
    /// - torchtitan (FSDP2, `fully_shard`): each all-gather's output is copied out into the
    ///   per-parameter tensors (read and write, 2e), twice (forward, and backward after
    ///   `reshard_after_forward`), and the gradients are copied into the reduce-scatter input in
    ///   fp32 (`reduce_dtype`: read e, write 4): 5e + 4, 14 bytes in bf16.
    /// - Megatron-LM (Megatron-FSDP) and Megatron-DeepSpeed (ZeRO-3): the parameters are views of
    ///   the gathered buffer; nothing is counted.
    pub fn zero3_copy_bytes_per_param(self, dtype: Dtype) -> f64 {
        match self {
            Framework::Torchtitan => 5.0 * dtype.bytes() + 4.0,
            Framework::MegatronLm | Framework::MegatronDeepspeed => 0.0,
        }
    }

    /// Whether this framework's fused scale-mask-softmax kernel takes the attention scores of a
    /// layout (without flash attention; where it does not, the unfused chain runs). Both Megatrons
    /// need 16-bit scores and micro-batch × heads per TP rank divisible by 4 (the kernel's
    /// batches per block for s > 128, causal mask), and:
    /// - Megatron-LM (Transformer Engine's `FusedScaleMaskSoftmax`, under the exported
    ///   `--attention-backend unfused`): 16 < s < 16384, s divisible by 8;
    /// - Megatron-DeepSpeed (its own `FusedScaleMaskSoftmax.is_kernel_available`): 16 < s ≤ 4096,
    ///   s divisible by 4.
    /// - torchtitan: PyTorch's SDPA kernels take any shape.
    pub fn fused_softmax_fits(self, m: &ModelSpec, c: &ParallelConfig) -> bool {
        let s = m.seq_len;
        let batches = c.micro_batch as u64 * (m.heads / c.tp.max(1)) as u64;
        let megatron = c.dtype == Dtype::Bf16 && batches.is_multiple_of(4);
        match self {
            Framework::MegatronLm => megatron && 16 < s && s < 16384 && s.is_multiple_of(8),
            Framework::MegatronDeepspeed => megatron && 16 < s && s <= 4096 && s.is_multiple_of(4),
            Framework::Torchtitan => true,
        }
    }

    /// Bytes per token this framework's eager element-wise code moves in one block's forward
    /// beyond the fused kernels every stack is priced with (norms, rotary embedding, activation:
    /// one read and one write each), on one device of a TP group.
    /// - torchtitan (eager, its default and its published runs' `compile = false`; the version
    ///   exatrain exports): the rotary embedding goes through complex fp32 (`query.float()`, the
    ///   complex multiply, `type_as`: 16 more bytes per query and key element in bf16); the
    ///   attention output is made contiguous (a copy: 2e per query element); SiLU and the gate's
    ///   multiply are two kernels (2e more per FFN element with SwiGLU). GQA goes to SDPA as it
    ///   is (`enable_gqa`); the 2024 code of the published runs materialised keys and values at
    ///   the query width (`repeat_kv`), which is not counted.
    /// - Megatron-LM and Megatron-DeepSpeed: fused RoPE and bias-activation kernels, flash
    ///   kernels that take GQA as it is: 0 (Megatron-DeepSpeed's own unfused rotary path for
    ///   Llama models is not counted).
    pub fn eager_elementwise_bytes_per_token(self, m: &ModelSpec, c: &ParallelConfig) -> f64 {
        match self {
            Framework::Torchtitan => {
                let e = c.dtype.bytes();
                let t = c.tp.max(1) as f64;
                let (q, kv, f) = (m.q_dim() as f64, m.kv_dim() as f64, m.ffn_hidden as f64);
                let rope = match m.position {
                    Position::Rope => {
                        // cast in and out when the activations are not fp32, the complex
                        // multiply in fp32, against the fused kernel's one read and one write
                        let casts = if e < 4.0 { 2.0 * (e + 4.0) } else { 0.0 };
                        (casts + 8.0 - 2.0 * e) * (q + kv) / t
                    }
                    Position::Learned => 0.0,
                };
                let transpose = 2.0 * e * q / t;
                let gate = match m.mlp {
                    Mlp::Swiglu => 2.0 * e * f / t,
                    Mlp::Gelu => 0.0,
                };
                rope + transpose + gate
            }
            Framework::MegatronLm | Framework::MegatronDeepspeed => 0.0,
        }
    }

    /// Bytes this framework moves per parameter of a stage after each microbatch's backward to
    /// accumulate its gradients, besides the GEMMs: memory-bound passes on the compute stream.
    /// - Megatron-DeepSpeed in bf16 with ZeRO ≤ 1 (DeepSpeed's `BF16_Optimizer`, as the pipeline
    ///   engine runs it): the bf16 gradients are zeroed before each backward (`clear_lp_grads`,
    ///   write 2), autograd accumulates into them (read 2 + 2, write 2), then `update_hp_grads`
    ///   adds them into the fp32 gradients (`hp_grad.add_(lp.grad.to(fp32))`: the cast reads 2
    ///   and writes 4, the add reads 4 + 4 and writes 4): 26 bytes.
    /// - Megatron-LM: the weight-gradient GEMM accumulates into the fp32 `main_grad` itself
    ///   (`--gradient-accumulation-fusion`, on by default); torchtitan's FSDP2 reduce-scatters each
    ///   microbatch's gradients (its copies are [`Self::zero3_copy_bytes_per_param`]); DeepSpeed's
    ///   ZeRO-2/3 bucket copies are not counted: 0.
    pub fn grad_accum_bytes_per_param(self, c: &ParallelConfig) -> f64 {
        match self {
            Framework::MegatronDeepspeed if c.dtype == Dtype::Bf16 && c.zero <= 1 => 2.0 + 6.0 + (2.0 + 4.0) + 12.0,
            Framework::MegatronDeepspeed | Framework::MegatronLm | Framework::Torchtitan => 0.0,
        }
    }

    /// Whether the framework overlaps the backward tensor-parallel collectives of the two
    /// column-parallel linears (QKV, the MLP's up/gate) with their GEMMs: the input gradient's
    /// all-reduce (with sequence parallelism its reduce-scatter) runs while the weight-gradient
    /// GEMM does, and with sequence parallelism the input's re-gather while the data-gradient
    /// GEMM does (`LinearWithGradAccumulationAndAsyncCommunication`).
    /// - Megatron-LM: since September 2021, on by default (`--no-async-tensor-model-parallel-
    ///   allreduce` turned it off until it became unconditional).
    /// - Megatron-DeepSpeed (merged from Megatron-LM in 2023): its arguments turn the all-reduce's
    ///   overlap off under `--deepspeed` ("incompatible with DeepSpeed"), but the sequence-parallel
    ///   path overlaps regardless: only with sequence parallelism. The forks that trained BLOOM and
    ///   MT-NLG had neither (their runs set `StackSpec.async_tp = false`).
    /// - torchtitan: DTensor's backward reduces the input gradient after the matmul's backward
    ///   node, which computes both gradients: no overlap (its async TP needs `torch.compile`).
    pub fn overlaps_tp_backward(self, c: &ParallelConfig) -> bool {
        match self {
            Framework::MegatronLm => true,
            Framework::MegatronDeepspeed => c.sequence_parallel,
            Framework::Torchtitan => false,
        }
    }

    /// Whether the framework overlaps the pipeline's point-to-point sends and receives with the
    /// next chunk's compute, so that only the pipeline's fill and drain wait for them.
    /// - Megatron-LM: with the interleaved schedule (`--num-layers-per-virtual-pipeline-stage`),
    ///   `overlap_p2p_comm` is on by default (`--no-overlap-p2p-communication` turns it off);
    ///   `validate_args` turns it off without interleaving, where every send blocks.
    /// - Megatron-DeepSpeed: DeepSpeed's pipeline engine runs its sends and receives as
    ///   blocking instructions of its schedule.
    /// - torchtitan: not priced (exatrain exports no torchtitan pipeline schedule with overlap).
    pub fn overlaps_pp_comm(self, c: &ParallelConfig) -> bool {
        match self {
            Framework::MegatronLm => c.virtual_stages > 1,
            Framework::MegatronDeepspeed | Framework::Torchtitan => false,
        }
    }

    pub fn can_run(self, m: &ModelSpec, c: &ParallelConfig) -> Result<(), String> {
        let default_order = RankOrder::default();
        let uneven = c.stage_layers(m).is_ok_and(|s| !s.even());
        if uneven && self != Framework::MegatronLm {
            return Err(format!(
                "uneven pipeline stages (--pp {} over {} layers) are exported for Megatron-LM only (--decoder-first/last-pipeline-num-layers); {} splits the layers its own way",
                c.pp,
                m.layers,
                self.name()
            ));
        }
        if c.fp8 && self != Framework::MegatronLm {
            return Err(format!(
                "FP8 linear layers (--fp8) are exported for Megatron-LM (Transformer Engine) only; {} {}",
                self.name(),
                match self {
                    Framework::Torchtitan => "runs float8 through torchao's converter, which exatrain does not export",
                    _ => "has no FP8 training",
                }
            ));
        }
        if c.overlap_tp && self != Framework::MegatronLm {
            return Err(format!(
                "tensor-parallel communication overlap (--overlap-tp) is Megatron-LM's --tp-comm-overlap; {} has none",
                self.name()
            ));
        }
        match self {
            Framework::MegatronLm => {
                // groups tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping
                let tp_pp_dp: RankOrder = "tp-pp-dp".parse().expect("order");
                if c.order != default_order && c.order != tp_pp_dp {
                    return Err(format!(
                        "Megatron-LM places ranks tp-dp-pp, or tp-pp-dp with --use-tp-pp-dp-mapping; rank order {} cannot be expressed",
                        c.order
                    ));
                }
                if c.zero >= 2 && c.pp > 1 {
                    return Err(format!(
                        "Megatron-LM shards gradients and weights (ZeRO-{}) through Megatron-FSDP, which exatrain exports only without pipeline parallelism (--pp {}; Megatron-FSDP's documented layouts have none)",
                        c.zero, c.pp
                    ));
                }
                if c.dp_bucket == Some(0) {
                    return Err(
                        "--dp-bucket 0 (one bucket) is the trainer's; Megatron-LM's --ddp-bucket-size takes a size in parameters (at least 1)".into(),
                    );
                }
                Ok(())
            }
            Framework::MegatronDeepspeed => {
                if c.cp > 1 {
                    return Err(format!(
                        "Megatron-DeepSpeed splits sequences with DeepSpeed-Ulysses (all-to-all over heads), not the ring context parallelism exatrain plans; --cp {} needs --cp 1",
                        c.cp
                    ));
                }
                if c.order != default_order {
                    return Err(format!(
                        "DeepSpeed's topology is fixed (tp fastest, then dp, then pp); rank order {} cannot be expressed",
                        c.order
                    ));
                }
                if c.virtual_stages > 1 {
                    return Err(
                        "DeepSpeed's pipeline engine has no interleaved schedule (--virtual-stages must be 1)".into(),
                    );
                }
                if c.zero >= 2 && c.pp > 1 {
                    return Err(format!(
                        "DeepSpeed's pipeline engine supports ZeRO-1 only; --zero {} needs --pp 1",
                        c.zero
                    ));
                }
                if c.dp_bucket.is_some() {
                    return Err(
                        "Megatron-DeepSpeed reduces gradients in DeepSpeed's engine, to which exatrain exports no bucket size: --dp-bucket is Megatron-LM's --ddp-bucket-size (leave it out)".into(),
                    );
                }
                Ok(())
            }
            Framework::Torchtitan => {
                if !(m.mlp == Mlp::Swiglu
                    && m.norm == Norm::Rmsnorm
                    && m.position == Position::Rope
                    && !m.bias
                    && !m.tied_embeddings)
                {
                    return Err(format!(
                        "torchtitan builds Llama-family models (SwiGLU, RMSNorm, RoPE, no biases, untied head); {} is not one",
                        m.name
                    ));
                }
                if c.order != default_order {
                    return Err(format!(
                        "torchtitan's device mesh is pp, dp, tp (tp fastest); rank order {} cannot be expressed",
                        c.order
                    ));
                }
                if c.cp > 1 && c.zero == 0 {
                    return Err(format!(
                        "torchtitan shards the weights over the context-parallel ranks with FSDP2 whenever --cp {} > 1: use --zero 2 or 3",
                        c.cp
                    ));
                }
                if c.zero == 1 {
                    return Err(
                        "torchtitan replicates (DDP, ZeRO-0) or shards with FSDP2 (ZeRO-2 without resharding after forward, ZeRO-3 with it); it has no ZeRO-1"
                            .into(),
                    );
                }
                if c.tp > 1 && !c.sequence_parallel {
                    return Err(
                        "torchtitan's tensor parallelism always shards the norms along the sequence (--sp)".into(),
                    );
                }
                if c.dtype == Dtype::Fp32 {
                    return Err(
                        "torchtitan trains with FSDP2 mixed precision (bf16 parameters); use --dtype bf16".into(),
                    );
                }
                if !c.flash_attention {
                    return Err("torchtitan's attention is SDPA/flex (flash-style); use --flash".into());
                }
                if c.dp_bucket.is_some() {
                    return Err(
                        "torchtitan has no data-parallel bucket-size option: --dp-bucket is Megatron-LM's --ddp-bucket-size (leave it out)".into(),
                    );
                }
                Ok(())
            }
        }
    }
}

/// Shares of one block's forward that selective recomputation runs again
/// ([`Framework::selective_recompute`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectiveRecompute {
    /// of the block's weight GEMMs (by FLOPs)
    pub gemm: f64,
    /// of the attention core (QKᵀ, softmax, ·V) when it is not flash attention
    pub core: f64,
    /// of the norms, activation, residual and rotary ops
    pub elementwise: f64,
}

/// How a data-parallel gradient reduction runs ([`Framework::dp_reduction`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpReduction {
    /// Bucketed and overlapped with backward (the exposed part is the last bucket); false: it
    /// starts when the last microbatch's backward ends, and the ZeRO weight gather waits for it.
    pub overlapped: bool,
    /// How the overlapped reduction groups the gradients.
    pub buckets: GradBuckets,
    /// ZeRO-1/2's gather of the updated parameters runs under the next step's first forward
    /// (all but its first bucket); false: when the optimizer step ends, in the open.
    pub gather_hidden: bool,
    /// Bytes of one gradient element on the wire.
    pub grad_wire_bytes: f64,
    /// Every rank receives the whole sum (all-reduce) rather than its shard (reduce-scatter),
    /// even when the optimizer is sharded (DeepSpeed's `BF16_Optimizer`).
    pub all_reduce: bool,
}

/// What an overlapped data-parallel reduction starts while backward runs: whatever is left when
/// backward ends is the exposed tail.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradBuckets {
    /// Buckets of at least this many parameters, filled from the last layer back; the one that
    /// holds the first layers is reduced when backward ends (`f64::INFINITY`: one bucket).
    Params(f64),
    /// FSDP2 units: each block, the embedding, and the final norm with the head, each reduced
    /// when its backward ends; the first block's and the embedding's are left at the end.
    Units,
}

impl GradBuckets {
    /// Megatron-LM's DDP default bucket: max(40 M, 1 M · dp · cp) parameters (its `bucket_size`
    /// resolved in `resolve_ddp_bucket_size`), so buckets keep the ring's bandwidth at scale.
    pub fn megatron_default(dp_cp: u32) -> f64 {
        40e6_f64.max(1e6 * dp_cp as f64)
    }

    /// DeepSpeed's ZeRO `reduce_bucket_size` default, elements (5e8).
    pub const DEEPSPEED_DEFAULT: f64 = 5e8;

    /// A planned `dp_bucket` (0: one bucket), else `default`.
    pub fn planned(c: &ParallelConfig, default: f64) -> GradBuckets {
        GradBuckets::Params(
            c.dp_bucket
                .map_or(default, |b| if b == 0 { f64::INFINITY } else { b as f64 }),
        )
    }
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Framework {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Framework::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            SpecError::new(format!(
                "--framework {s} is not known (allowed: {})",
                Framework::allowed()
            ))
        })
    }
}
