//! A layout as what users launch: a Megatron-LM command, a Megatron-DeepSpeed command with its
//! DeepSpeed config, a Slurm batch script, or a TOML run file for exatrain's own trainer.

use exatrain_spec::{
    ClusterSpec, Dtype, Mlp, ModelSpec, Norm, ParallelConfig, Position, RankOrder, Recompute, SpecError,
};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    MegatronLm,
    MegatronDeepspeed,
    Slurm,
    Exatrain,
}

impl std::str::FromStr for Format {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "megatron-lm" => Ok(Format::MegatronLm),
            "megatron-deepspeed" => Ok(Format::MegatronDeepspeed),
            "slurm" => Ok(Format::Slurm),
            "exatrain" => Ok(Format::Exatrain),
            _ => Err(SpecError::new(format!(
                "--format {s} is not known (allowed: megatron-lm, megatron-deepspeed, slurm, exatrain)"
            ))),
        }
    }
}

/// One file of an export.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub name: String,
    pub contents: String,
}

fn model_flags(m: &ModelSpec) -> Vec<String> {
    let mut f = vec![
        format!("--num-layers {}", m.layers),
        format!("--hidden-size {}", m.hidden),
        format!("--num-attention-heads {}", m.heads),
        format!("--ffn-hidden-size {}", m.ffn_hidden),
        format!("--seq-length {}", m.seq_len),
        format!("--max-position-embeddings {}", m.seq_len),
    ];
    if m.head_dim * m.heads != m.hidden {
        f.push(format!("--kv-channels {}", m.head_dim));
    }
    if m.kv_heads != m.heads {
        f.push(format!("--group-query-attention --num-query-groups {}", m.kv_heads));
    }
    if m.mlp == Mlp::Swiglu {
        f.push("--swiglu".into());
    }
    if m.norm == Norm::Rmsnorm {
        f.push("--normalization RMSNorm".into());
    }
    if m.position == Position::Rope {
        f.push("--position-embedding-type rope".into());
    }
    if !m.tied_embeddings {
        f.push("--untie-embeddings-and-output-weights".into());
    }
    if !m.bias {
        f.push("--disable-bias-linear".into());
    }
    if !m.dropout {
        f.push("--attention-dropout 0 --hidden-dropout 0".into());
    }
    f
}

fn layout_flags(m: &ModelSpec, c: &ParallelConfig) -> Vec<String> {
    let mut f = vec![
        format!("--tensor-model-parallel-size {}", c.tp),
        format!("--pipeline-model-parallel-size {}", c.pp),
    ];
    if c.virtual_stages > 1 {
        f.push(format!(
            "--num-layers-per-virtual-pipeline-stage {}",
            m.layers / (c.pp * c.virtual_stages)
        ));
    }
    f.push(format!("--micro-batch-size {}", c.micro_batch));
    f.push(format!("--global-batch-size {}", c.global_batch));
    if c.sequence_parallel {
        f.push("--sequence-parallel".into());
    }
    match c.recompute {
        Recompute::None => {}
        Recompute::Selective => f.push("--recompute-granularity selective".into()),
        Recompute::Full => {
            f.push("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1".into())
        }
    }
    if c.flash_attention {
        f.push("--use-flash-attn".into());
    }
    f.push(match c.dtype {
        Dtype::Bf16 => "--bf16".into(),
        Dtype::Fp32 => "--fp32-residual-connection".into(),
    });
    f
}

fn command(prog: &str, flags: &[String]) -> String {
    let mut s = prog.to_string();
    for f in flags {
        s.push_str(" \\\n    ");
        s.push_str(f);
    }
    s.push('\n');
    s
}

fn megatron_lm(m: &ModelSpec, c: &ParallelConfig) -> Result<Vec<String>, SpecError> {
    if c.zero >= 2 {
        return Err(SpecError::new(format!(
            "--format megatron-lm: Megatron-LM shards only the optimizer state (ZeRO-1, --use-distributed-optimizer); --zero {} needs --format megatron-deepspeed",
            c.zero
        )));
    }
    // Megatron-LM's groups are tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping
    let tp_pp_dp: RankOrder = "tp-pp-dp".parse()?;
    if c.order != RankOrder::default() && c.order != tp_pp_dp {
        return Err(SpecError::new(format!(
            "--format megatron-lm: Megatron-LM places ranks tp-dp-pp, or tp-pp-dp with --use-tp-pp-dp-mapping; rank order {} cannot be expressed",
            c.order
        )));
    }
    let mut f = model_flags(m);
    f.extend(layout_flags(m, c));
    if c.order == tp_pp_dp {
        f.push("--use-tp-pp-dp-mapping".into());
    }
    if c.zero == 1 {
        f.push("--use-distributed-optimizer".into());
    }
    if c.overlap_dp {
        f.push("--overlap-grad-reduce".into());
    }
    Ok(f)
}

/// `launch.sh`: a shell script with a header naming what it launches.
fn launch_script(m: &ModelSpec, cl: &ClusterSpec, c: &ParallelConfig, body: String) -> File {
    File {
        name: "launch.sh".into(),
        contents: format!(
            "#!/bin/bash\n# {} on {} × {}: exported by exatrain\n{body}",
            m.name,
            c.gpus(),
            cl.device.name
        ),
    }
}

/// Export a layout.
pub fn export(m: &ModelSpec, cl: &ClusterSpec, c: &ParallelConfig, format: Format) -> Result<Vec<File>, SpecError> {
    c.check(m, c.gpus())?;
    let nodes = c.gpus().div_ceil(cl.node.devices);
    let per_node = c.gpus().min(cl.node.devices);
    let launcher = format!(
        "torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 pretrain_gpt.py"
    );
    match format {
        Format::MegatronLm => Ok(vec![launch_script(m, cl, c, command(&launcher, &megatron_lm(m, c)?))]),
        Format::MegatronDeepspeed => {
            if c.zero >= 2 && c.pp > 1 {
                return Err(SpecError::new(format!(
                    "--format megatron-deepspeed: DeepSpeed's pipeline engine supports ZeRO-1 only; --zero {} needs --pp 1",
                    c.zero
                )));
            }
            let mut f = model_flags(m);
            f.extend(layout_flags(m, c));
            f.push("--deepspeed --deepspeed_config ds_config.json".into());
            f.push(format!("--zero-stage {}", c.zero));
            if c.pp == 1 {
                f.push("--no-pipeline-parallel".into());
            }
            if c.recompute == Recompute::Full {
                f.push("--deepspeed-activation-checkpointing".into());
            }
            let ds = serde_json::json!({
                "train_batch_size": c.global_batch,
                "train_micro_batch_size_per_gpu": c.micro_batch,
                "gradient_accumulation_steps": c.microbatches(),
                "zero_optimization": { "stage": c.zero, "overlap_comm": c.overlap_dp },
                "bf16": { "enabled": c.dtype == Dtype::Bf16 },
                "gradient_clipping": 1.0,
                "steps_per_print": 10,
                "wall_clock_breakdown": false,
            });
            Ok(vec![
                launch_script(m, cl, c, command(&launcher, &f)),
                File {
                    name: "ds_config.json".into(),
                    contents: serde_json::to_string_pretty(&ds).expect("json") + "\n",
                },
            ])
        }
        Format::Slurm => {
            let flags = megatron_lm(m, c)?;
            let bind = if cl.name == "frontier" || cl.name == "lumi" {
                "--gpu-bind=closest"
            } else {
                "--gpus-per-task=1"
            };
            let mut s = format!(
                "#!/bin/bash\n# {} on {} × {} ({} nodes): exported by exatrain\n#SBATCH --job-name=exatrain-{}\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={per_node}\n#SBATCH --gpus-per-node={per_node}\n#SBATCH --time=02:00:00\n\nexport MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\nexport MASTER_PORT=29500\n",
                m.name, c.gpus(), cl.device.name, nodes, m.name
            );
            s.push_str(&command(
                &format!(
                    "srun --ntasks={} --ntasks-per-node={per_node} {bind} --cpu-bind=closest python pretrain_gpt.py",
                    c.gpus()
                ),
                &flags,
            ));
            Ok(vec![File {
                name: "job.sbatch".into(),
                contents: s,
            }])
        }
        Format::Exatrain => {
            #[derive(serde::Serialize)]
            struct Run<'a> {
                model: &'a ModelSpec,
                cluster: &'a str,
                parallel: &'a ParallelConfig,
            }
            let text = toml::to_string(&Run {
                model: m,
                cluster: &cl.name,
                parallel: c,
            })
            .map_err(|e| SpecError::new(format!("--format exatrain: {e}")))?;
            Ok(vec![File {
                name: "run.toml".into(),
                contents: format!("# {} on {} GPUs: exported by exatrain\n{text}", m.name, c.gpus()),
            }])
        }
    }
}
