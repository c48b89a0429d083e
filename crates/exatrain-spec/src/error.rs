use std::fmt;

/// A problem with user input: one line naming the field and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl SpecError {
    pub fn new(msg: impl Into<String>) -> Self {
        SpecError(msg.into())
    }
}

/// Why a parallel layout cannot run a model. A value, not a panic: the tuner counts these by kind
/// and formats them only when a user asks. Each variant keeps the numbers needed for its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Invalid {
    ZeroSize(&'static str),
    Product {
        tp: u32,
        pp: u32,
        dp: u32,
        cp: u32,
        gpus: u32,
    },
    TpHeads {
        tp: u32,
        heads: u32,
    },
    TpKvHeads {
        tp: u32,
        kv_heads: u32,
    },
    TpFfn {
        tp: u32,
        ffn: u32,
    },
    PpLayers {
        pp: u32,
        layers: u32,
        first: Option<u32>,
        last: Option<u32>,
    },
    InterleaveUneven {
        pp: u32,
        layers: u32,
    },
    /// TP communication overlap without sequence parallelism.
    OverlapTpNeedsSp,
    /// FP8 linear layers on a training dtype other than bf16.
    Fp8NeedsBf16,
    /// FP8 linear layers on a device without FP8 tensor cores (`device.peak_tflops_fp8` unset).
    Fp8Unsupported,
    VirtualStages {
        virtual_stages: u32,
        layers_per_stage: u32,
    },
    VirtualNeedsPp,
    InterleaveMicrobatches {
        microbatches: u32,
        pp: u32,
    },
    Batch {
        global_batch: u32,
        micro_batch: u32,
        dp: u32,
    },
    Zero {
        zero: u8,
    },
    SequenceParallelTp1,
    SeqTp {
        seq_len: u32,
        tp: u32,
    },
    /// tp · cp · pp · dp beyond any device count (u32).
    TooManyDevices {
        product: u64,
    },
    /// Context parallelism without flash attention (Transformer Engine's and PyTorch's
    /// context-parallel attention are fused kernels).
    CpNeedsFlash,
    /// The sequence does not split into `2·cp` equal chunks (the load-balanced causal split).
    SeqCp {
        seq_len: u32,
        cp: u32,
    },
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Invalid::ZeroSize(field) => write!(f, "--{field} must be a positive integer"),
            Invalid::Product { tp, pp, dp, cp: 1, gpus } => write!(
                f,
                "--tp {tp} × --pp {pp} × --dp {dp} = {} does not equal --gpus {gpus}",
                tp as u64 * pp as u64 * dp as u64
            ),
            Invalid::Product { tp, pp, dp, cp, gpus } => write!(
                f,
                "--tp {tp} × --cp {cp} × --pp {pp} × --dp {dp} = {} does not equal --gpus {gpus}",
                tp as u64 * cp as u64 * pp as u64 * dp as u64
            ),
            Invalid::TpHeads { tp, heads } => write!(f, "--tp {tp} does not divide {heads} heads"),
            Invalid::TpKvHeads { tp, kv_heads } => {
                write!(f, "--tp {tp} does not divide {kv_heads} kv heads")
            }
            Invalid::TpFfn { tp, ffn } => write!(f, "--tp {tp} does not divide ffn_hidden {ffn}"),
            Invalid::PpLayers { pp, layers, first: None, last: None } => write!(
                f,
                "--pp {pp} is more than the {layers} layers (allowed: 1..={layers})"
            ),
            Invalid::PpLayers { pp, layers, first, last } => write!(
                f,
                "--first-stage-layers {} / --last-stage-layers {} leave no even split of {layers} layers over the other stages of --pp {pp} (each stage at least one layer; the inner stages equal)",
                first.map_or("-".into(), |x| x.to_string()),
                last.map_or("-".into(), |x| x.to_string())
            ),
            Invalid::OverlapTpNeedsSp => write!(
                f,
                "--overlap-tp needs --sequence-parallel (Megatron-LM's --tp-comm-overlap overlaps its all-gathers and reduce-scatters)"
            ),
            Invalid::Fp8NeedsBf16 => write!(
                f,
                "--fp8 needs --dtype bf16 (FP8 linear layers run inside bf16 mixed precision)"
            ),
            Invalid::Fp8Unsupported => write!(
                f,
                "--fp8: the cluster's device has no FP8 tensor cores (`device.peak_tflops_fp8` is not set; A100, V100 and MI250X have none)"
            ),
            Invalid::InterleaveUneven { pp, layers } => write!(
                f,
                "--virtual-stages needs equal stages, or inner stages one layer longer than the first and the last (the embedding and the loss counted as layers): --pp {pp} over {layers} layers is neither"
            ),
            Invalid::VirtualStages {
                virtual_stages,
                layers_per_stage,
            } => write!(
                f,
                "--virtual-stages {virtual_stages} does not divide the {layers_per_stage} layers of each pipeline stage"
            ),
            Invalid::VirtualNeedsPp => {
                write!(
                    f,
                    "--virtual-stages > 1 needs --pp > 1 (interleaving splits pipeline stages)"
                )
            }
            Invalid::InterleaveMicrobatches { microbatches, pp } => write!(
                f,
                "interleaved 1F1B needs the {microbatches} microbatches per step to be a multiple of --pp {pp}"
            ),
            Invalid::Batch {
                global_batch,
                micro_batch,
                dp,
            } => write!(
                f,
                "--global-batch {global_batch} is not divisible by --micro-batch {micro_batch} × --dp {dp} = {}",
                micro_batch as u64 * dp as u64
            ),
            Invalid::Zero { zero } => write!(f, "--zero {zero} is not a ZeRO stage (allowed: 0, 1, 2, 3)"),
            Invalid::SequenceParallelTp1 => {
                write!(
                    f,
                    "--sequence-parallel needs --tp > 1 (it shards activations over the TP group)"
                )
            }
            Invalid::SeqTp { seq_len, tp } => {
                write!(f, "--sequence-parallel: --tp {tp} does not divide seq_len {seq_len}")
            }
            Invalid::TooManyDevices { product } => write!(
                f,
                "--tp × --cp × --pp × --dp = {product} devices: more than any machine (at most {})",
                u32::MAX
            ),
            Invalid::CpNeedsFlash => write!(
                f,
                "--cp above 1 needs --flash-attention (context-parallel attention is a fused kernel in Transformer Engine and PyTorch)"
            ),
            Invalid::SeqCp { seq_len, cp } => write!(
                f,
                "--cp {cp}: seq_len {seq_len} does not split into 2 × {cp} equal chunks (the load-balanced causal split; allowed: cp with seq_len divisible by 2·cp)"
            ),
        }
    }
}

impl From<Invalid> for SpecError {
    fn from(e: Invalid) -> Self {
        SpecError(e.to_string())
    }
}
