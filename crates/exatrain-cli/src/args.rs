//! Flags shared by the subcommands, named as in Megatron-LM where one exists.

use clap::Args;
use exatrain_spec::{load, ClusterSpec, Dtype, ModelSpec, ParallelConfig, RankOrder, Recompute, SpecError};

/// `--model` and `--cluster`.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Model preset name or TOML/JSON file (Calculon model JSON accepted).
    #[arg(long, default_value = "gpt-175b")]
    pub model: String,
    /// Cluster preset name or TOML/JSON file.
    #[arg(long, default_value = "frontier")]
    pub cluster: String,
}

impl SpecArgs {
    pub fn load(&self) -> Result<(ModelSpec, ClusterSpec), SpecError> {
        Ok((load::model(&self.model)?, load::cluster(&self.cluster)?))
    }
}

/// The layout flags of `plan` (and later `train`): one `ParallelConfig`.
#[derive(Args, Clone, Debug)]
pub struct LayoutArgs {
    /// Total devices (GPUs / GCDs).
    #[arg(long, default_value_t = 1024)]
    pub gpus: u32,
    /// Tensor-parallel size (--tensor-model-parallel-size).
    #[arg(long, default_value_t = 4)]
    pub tp: u32,
    /// Pipeline-parallel size (--pipeline-model-parallel-size).
    #[arg(long, default_value_t = 16)]
    pub pp: u32,
    /// Context-parallel size (--context-parallel-size): each sequence split over this many
    /// ranks, keys and values passed around a ring; needs --flash-attention and seq_len divisible
    /// by 2·cp. Gradients are reduced, and ZeRO shards, over dp·cp ranks.
    #[arg(long, default_value_t = 1)]
    pub cp: u32,
    /// Data-parallel size; default gpus / (tp·cp·pp).
    #[arg(long)]
    pub dp: Option<u32>,
    /// Sequences per microbatch per data-parallel rank.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u32,
    /// Sequences per optimizer step.
    #[arg(long, default_value_t = 1024)]
    pub global_batch: u32,
    /// ZeRO stage 0-3 (1 = Megatron's --use-distributed-optimizer).
    #[arg(long, default_value_t = 1)]
    pub zero: u8,
    /// Activation recomputation: none, selective or full.
    #[arg(long, default_value = "selective")]
    pub recompute: String,
    /// Megatron sequence parallelism (needs --tp > 1).
    #[arg(long)]
    pub sequence_parallel: bool,
    /// Model chunks per pipeline stage (interleaved 1F1B); 1 = plain 1F1B.
    #[arg(long, default_value_t = 1)]
    pub virtual_stages: u32,
    /// Layers of the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers); the
    /// inner stages split the rest evenly. Default: --pp need not divide the layers, they are
    /// spread as evenly as possible.
    #[arg(long)]
    pub first_stage_layers: Option<u32>,
    /// Layers of the last pipeline stage (--decoder-last-pipeline-num-layers).
    #[arg(long)]
    pub last_stage_layers: Option<u32>,
    /// Data-parallel gradient buckets of at least this many parameters (Megatron-LM's
    /// --ddp-bucket-size; 0: one bucket, reduced when backward ends). Default: the framework's
    /// (Megatron-LM: max(40 M, 1 M × dp × cp)).
    #[arg(long)]
    pub dp_bucket: Option<u64>,
    /// Use fused blockwise (flash) attention.
    #[arg(long)]
    pub flash_attention: bool,
    /// bf16 (mixed precision) or fp32.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Run the transformer blocks' linear layers in FP8 (Transformer Engine's hybrid E4M3 /
    /// E5M2 format, Megatron-LM's --fp8-format hybrid) inside bf16 mixed precision; needs a device
    /// with FP8 tensor cores (H100, H200: the cluster's `device.peak_tflops_fp8`).
    #[arg(long)]
    pub fp8: bool,
    /// Do not overlap the data-parallel reduction with backward.
    #[arg(long)]
    pub no_overlap_dp: bool,
    /// Overlap tensor-parallel communication with the GEMMs (Megatron-LM's --tp-comm-overlap;
    /// needs --sequence-parallel).
    #[arg(long)]
    pub overlap_tp: bool,
    /// Rank order, innermost first (a permutation of tp, dp, pp).
    #[arg(long, default_value = "tp-dp-pp")]
    pub order: String,
}

impl LayoutArgs {
    /// The config, checked against the model.
    pub fn config(&self, model: &ModelSpec) -> Result<ParallelConfig, SpecError> {
        for (v, flag) in [(self.gpus, "gpus"), (self.tp, "tp"), (self.pp, "pp"), (self.cp, "cp")] {
            if v == 0 {
                return Err(exatrain_spec::Invalid::ZeroSize(flag).into());
            }
        }
        let cells = self.tp as u64 * self.cp as u64 * self.pp as u64;
        let dp = match self.dp {
            Some(d) => d,
            None if cells > 0 && (self.gpus as u64).is_multiple_of(cells) => (self.gpus as u64 / cells) as u32,
            None => {
                let cp = if self.cp > 1 {
                    format!(" × --cp {}", self.cp)
                } else {
                    String::new()
                };
                return Err(SpecError::new(format!(
                    "--gpus {} is not divisible by --tp {}{cp} × --pp {}",
                    self.gpus, self.tp, self.pp
                )));
            }
        };
        let cfg = ParallelConfig {
            tp: self.tp,
            pp: self.pp,
            dp,
            cp: self.cp,
            micro_batch: self.micro_batch,
            global_batch: self.global_batch,
            zero: self.zero,
            recompute: self.recompute.parse::<Recompute>()?,
            sequence_parallel: self.sequence_parallel,
            virtual_stages: self.virtual_stages,
            flash_attention: self.flash_attention,
            dtype: self.dtype.parse::<Dtype>()?,
            fp8: self.fp8,
            overlap_dp: !self.no_overlap_dp,
            overlap_tp: self.overlap_tp,
            order: self.order.parse::<RankOrder>()?,
            first_stage_layers: self.first_stage_layers,
            last_stage_layers: self.last_stage_layers,
            dp_bucket: self.dp_bucket,
        };
        cfg.check(model, self.gpus)?;
        Ok(cfg)
    }
}
