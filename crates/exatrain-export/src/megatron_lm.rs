//! Megatron-LM's `pretrain_gpt.py` (flags of `megatron/training/arguments.py`, checked by its
//! `parse_args` + `validate_args` with `scripts/check-exports.py`).

use exatrain_spec::{Dtype, Framework, Mlp, ModelSpec, Norm, ParallelConfig, Position, RankOrder, Recompute};

use super::{megatron_shape_flags, megatron_tail_flags, megatron_training_flags, megatron_training_placeholders, Job};

/// The model flags: everything Megatron needs to build exactly the planned model.
fn model_flags(m: &ModelSpec, tp: u32) -> Result<Vec<String>, String> {
    let mut f = megatron_shape_flags(m);
    if m.kv_heads != m.heads {
        f.push("--group-query-attention".into());
        f.push(format!("--num-query-groups {}", m.kv_heads));
    }
    if m.mlp == Mlp::Swiglu {
        f.push("--swiglu".into());
    }
    f.push(format!(
        "--normalization {}",
        if m.norm == Norm::Rmsnorm {
            "RMSNorm"
        } else {
            "LayerNorm"
        }
    ));
    f.push(format!("--norm-epsilon {}", m.norm_eps));
    match m.position {
        Position::Rope => {
            f.push("--position-embedding-type rope".into());
            f.push(format!("--rotary-base {}", rope_base(m)?));
        }
        Position::Learned => f.push("--position-embedding-type learned_absolute".into()),
    }
    f.extend(megatron_tail_flags(m, tp)?);
    Ok(f)
}

/// The rotary base as the integer Megatron's `--rotary-base` takes.
pub(super) fn rope_base(m: &ModelSpec) -> Result<u64, String> {
    if m.rope_base.fract() != 0.0 || m.rope_base > 1e15 {
        return Err(format!(
            "rope_base {} is not an integer, which --rotary-base needs",
            m.rope_base
        ));
    }
    Ok(m.rope_base as u64)
}

fn layout_flags(m: &ModelSpec, c: &ParallelConfig) -> Vec<String> {
    let mut f = vec![
        format!("--tensor-model-parallel-size {}", c.tp),
        format!("--pipeline-model-parallel-size {}", c.pp),
    ];
    if c.cp > 1 {
        // Transformer Engine's ring attention (the default --cp-comm-type p2p), which the
        // planner prices; CP ranks sit right outside TP (Megatron's tp-cp-ep-dp-pp)
        f.push(format!("--context-parallel-size {}", c.cp));
    }
    if let Ok(st) = c.stage_layers(m) {
        if c.virtual_stages > 1 {
            // interleaved: an even split, or (uneven) the embedding and the loss counted as layers
            if !st.even() {
                f.push("--account-for-embedding-in-pipeline-split".into());
                f.push("--account-for-loss-in-pipeline-split".into());
            }
            if let Some(slots) = st.interleave_slots() {
                f.push(format!(
                    "--num-layers-per-virtual-pipeline-stage {}",
                    slots / c.virtual_stages
                ));
            }
        } else if !st.even() {
            f.push(format!("--decoder-first-pipeline-num-layers {}", st.first));
            f.push(format!("--decoder-last-pipeline-num-layers {}", st.last));
        }
    }
    f.push(format!("--micro-batch-size {}", c.micro_batch));
    f.push(format!("--global-batch-size {}", c.global_batch));
    if c.sequence_parallel && c.tp > 1 {
        f.push("--sequence-parallel".into());
    }
    match c.recompute {
        Recompute::None => {}
        Recompute::Selective => f.push("--recompute-granularity selective".into()),
        Recompute::Full => {
            f.push("--recompute-granularity full".into());
            f.push("--recompute-method uniform".into());
            f.push("--recompute-num-layers 1".into());
        }
    }
    // the planner's flash attention is Megatron's fused-attention backend; without it, the
    // unfused core that materializes the s×s scores
    f.push(format!(
        "--attention-backend {}",
        if c.flash_attention { "flash" } else { "unfused" }
    ));
    if c.dtype == Dtype::Bf16 {
        f.push("--bf16".into());
    }
    if c.fp8 {
        // Transformer Engine's delayed-scaling recipe as NVIDIA's H100 FP8 examples run it
        // (examples/llama/train_llama3_8b_h100_fp8.sh): E4M3 forward, E5M2 gradients
        f.push("--fp8-format hybrid".into());
        f.push("--fp8-amax-history-len 1024".into());
        f.push("--fp8-amax-compute-algo max".into());
    }
    if c.order == "tp-pp-dp".parse::<RankOrder>().expect("order") {
        f.push("--use-tp-pp-dp-mapping".into());
    }
    match c.zero {
        0 => {}
        1 => f.push("--use-distributed-optimizer".into()),
        z => {
            // ZeRO-2/3: Megatron-FSDP shards gradients (+ weights) over the data-parallel ranks
            f.push("--use-megatron-fsdp".into());
            f.push(format!(
                "--data-parallel-sharding-strategy {}",
                if z == 2 { "optim_grads" } else { "optim_grads_params" }
            ));
            f.push("--ckpt-format fsdp_dtensor".into());
        }
    }
    if c.overlap_tp && c.tp > 1 {
        f.push("--tp-comm-overlap".into());
    }
    if c.dtype == Dtype::Bf16 && c.dp_cp() > 1 {
        // the planner prices the gradient reduction in the training dtype and the gradient
        // buffer in bf16 (Framework::dp_reduction, Framework::grad_store_bytes), as NVIDIA's
        // H100 examples run it; Megatron-LM's default for bf16 reduces and keeps them in fp32
        f.push("--grad-reduce-in-bf16".into());
    }
    if c.overlap_dp && c.dp_cp() > 1 {
        f.push("--overlap-grad-reduce".into());
        if c.zero >= 1 {
            f.push("--overlap-param-gather".into());
        }
        if let Some(b) = c.dp_bucket {
            f.push(format!("--ddp-bucket-size {b}"));
        }
    }
    f
}

pub fn job(m: &ModelSpec, c: &ParallelConfig) -> Result<Job, String> {
    let mut flags = model_flags(m, c.tp)?;
    flags.extend(layout_flags(m, c));
    flags.extend(megatron_training_flags(&["--log-throughput"]));
    flags.push("$DATA_ARGS".into());
    let mut env = Vec::new();
    if (c.tp > 1 || c.cp > 1) && c.zero < 2 {
        env.push((
            "CUDA_DEVICE_MAX_CONNECTIONS".into(),
            "1".into(),
            "Megatron-LM asserts it with tensor or context parallelism before Blackwell (one queue keeps TP communication ahead of compute)".into(),
        ));
    }
    let placeholders = megatron_training_placeholders(&m.name)
        + &format!(
            "\
         # PLACEHOLDER: data. The default trains on mock data with a null tokenizer of the planned\n\
         # vocabulary ({vocab}), which runs as is; for real data, e.g.\n\
         #   DATA_ARGS=\"--data-path /path/to/prefix_text_document --split 949,50,1 \\\n\
         #     --tokenizer-type HuggingFaceTokenizer --tokenizer-model /path/to/tokenizer\"\n\
         DATA_ARGS=${{DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size {vocab}}}\n",
            vocab = m.vocab,
        );
    Ok(Job {
        framework: Framework::MegatronLm,
        env,
        program: "pretrain_gpt.py".into(),
        flags,
        placeholders,
        run_from: "the root of a Megatron-LM checkout (pretrain_gpt.py)".into(),
        job_dir_var: None,
        files: Vec::new(),
    })
}
