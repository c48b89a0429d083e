//! Megatron-DeepSpeed's `pretrain_gpt.py` and its DeepSpeed config: the stack the Frontier study
//! ran. Its flag names are Megatron-LM's of 2023 (`--num-key-value-heads`,
//! `--use-rotary-position-embeddings`, `--normalization rmsnorm`), not today's.

use exatrain_spec::{Dtype, Framework, Mlp, ModelSpec, Norm, ParallelConfig, Position, Recompute};

use super::megatron_lm::rope_base;
use super::{
    megatron_shape_flags, megatron_tail_flags, megatron_training_flags, megatron_training_placeholders, File, Job,
};

fn model_flags(m: &ModelSpec, tp: u32) -> Result<Vec<String>, String> {
    let mut f = megatron_shape_flags(m);
    if m.kv_heads != m.heads {
        f.push(format!("--num-key-value-heads {}", m.kv_heads));
    }
    if m.mlp == Mlp::Swiglu {
        f.push("--swiglu".into());
    }
    f.push(format!(
        "--normalization {}",
        if m.norm == Norm::Rmsnorm {
            "rmsnorm"
        } else {
            "layernorm"
        }
    ));
    f.push(format!("--layernorm-epsilon {}", m.norm_eps));
    if m.position == Position::Rope {
        f.push("--use-rotary-position-embeddings".into());
        f.push(format!("--rotary-position-embeddings-theta {}", rope_base(m)?));
        f.push("--no-position-embedding".into());
    }
    f.extend(megatron_tail_flags(m, tp)?);
    Ok(f)
}

fn layout_flags(c: &ParallelConfig) -> Vec<String> {
    let mut f = vec![
        format!("--tensor-model-parallel-size {}", c.tp),
        format!("--pipeline-model-parallel-size {}", c.pp),
        format!("--micro-batch-size {}", c.micro_batch),
        format!("--global-batch-size {}", c.global_batch),
    ];
    if c.sequence_parallel && c.tp > 1 {
        f.push("--sequence-parallel".into());
    }
    match c.recompute {
        Recompute::None => {}
        Recompute::Selective => f.push("--recompute-granularity selective".into()),
        Recompute::Full => {
            f.push("--checkpoint-activations".into());
            f.push("--deepspeed-activation-checkpointing".into());
        }
    }
    if c.flash_attention {
        f.push("--use-flash-attn-v2".into());
    }
    if c.dtype == Dtype::Bf16 {
        f.push("--bf16".into());
    }
    f.push("--deepspeed".into());
    f.push("--deepspeed_config ds_config.json".into());
    f.push(format!("--zero-stage {}", c.zero));
    if c.pp == 1 {
        f.push("--no-pipeline-parallel".into());
    }
    f
}

pub fn job(m: &ModelSpec, c: &ParallelConfig) -> Result<Job, String> {
    let mut flags = model_flags(m, c.tp)?;
    flags.extend(layout_flags(c));
    flags.extend(megatron_training_flags(&["$DATA_ARGS"]));
    let mut ds = serde_json::json!({
        "train_batch_size": c.global_batch,
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": c.microbatches(),
        "zero_optimization": {
            "stage": c.zero,
            "overlap_comm": c.overlap_dp,
            "contiguous_gradients": true,
        },
        "bf16": { "enabled": c.dtype == Dtype::Bf16 },
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "wall_clock_breakdown": false,
    });
    if c.dtype == Dtype::Bf16 && c.zero <= 1 {
        // DeepSpeed's BF16_Optimizer: fp32 gradient accumulation and reduction, as BLOOM ran,
        // and what the planner prices (Framework::dp_reduction) and counts (Dtype::grad_bytes)
        ds["data_types"] = serde_json::json!({ "grad_accum_dtype": "fp32" });
    }
    let mut env = Vec::new();
    if c.tp > 1 {
        env.push((
            "CUDA_DEVICE_MAX_CONNECTIONS".into(),
            "1".into(),
            "Megatron's sequence-parallel and TP overlap assume one hardware queue".into(),
        ));
    }
    let placeholders = megatron_training_placeholders(&m.name)
        + &format!(
            "\
         # PLACEHOLDER: data (Megatron-DeepSpeed has no mock data). The null tokenizer builds the\n\
         # planned vocabulary ({vocab} = --vocab-size + 1 end-of-document id) over pre-tokenized\n\
         # data; with a real tokenizer, e.g. --tokenizer-type GPT2BPETokenizer --vocab-file ... --merge-file ...\n\
         DATA_PATH=${{DATA_PATH:-/path/to/prefix_text_document}}\n\
         DATA_ARGS=${{DATA_ARGS:---data-path $DATA_PATH --split 949,50,1 --tokenizer-type NullTokenizer --vocab-size {v1}}}\n",
        vocab = m.vocab,
        v1 = m.vocab - 1,
    );
    Ok(Job {
        framework: Framework::MegatronDeepspeed,
        env,
        program: "pretrain_gpt.py".into(),
        flags,
        placeholders,
        run_from: "the root of a Megatron-DeepSpeed checkout (pretrain_gpt.py), next to ds_config.json".into(),
        job_dir_var: None,
        files: vec![File {
            name: "ds_config.json".into(),
            contents: serde_json::to_string_pretty(&ds).expect("json") + "\n",
        }],
    })
}
