//! Framework logs (Megatron-LM, Megatron-DeepSpeed, torchtitan) as measured runs for
//! `calibrate --fit`: the step time from the log, the model and layout from the run file
//! ([`exatrain_export::RunFile`]) next to it (`export --format exatrain` writes one: `<log stem>.toml` or `run.toml` in the log's
//! folder) or, for Megatron logs, from the argument dump they print; when both are there they
//! must agree.

use std::path::{Path, PathBuf};

use exatrain_cost::fit::Measured;
use exatrain_spec::{Dtype, ModelFile, ModelSpec, ParallelConfig, Recompute, SpecError, StackSwitches};
use exatrain_tune::logs::{self, arg_bool, arg_f64, arg_u32, FrameworkLog, LogFormat};

/// Logged iterations skipped at the start (compilation, allocator and data-loader warm-up).
pub const WARMUP: usize = 2;

/// Is this file a framework log (by extension)?
pub fn is_log(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "log" || x == "out" || x == "txt")
}

/// `files` split into (framework logs, trainer reports).
pub fn split(files: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    files.into_iter().partition(|f| is_log(f))
}

/// The run file describing `log`, if any.
fn sidecar(log: &Path) -> Option<PathBuf> {
    let own = log.with_extension("toml");
    let shared = log.parent().map(|d| d.join("run.toml"));
    [Some(own), shared].into_iter().flatten().find(|p| p.is_file())
}

/// Model and layout from Megatron's argument dump.
fn from_args(name: &str, log: &FrameworkLog) -> Result<(ModelSpec, ParallelConfig), SpecError> {
    let need = |k: &str| {
        arg_u32(log, k).ok_or_else(|| {
            SpecError::new(format!(
                "log {name}: no run file next to it (<name>.toml or run.toml, as `exatrain export --format exatrain` writes) and no `{k}` in a Megatron argument dump"
            ))
        })
    };
    let heads = need("num_attention_heads")?;
    let kv = if arg_bool(log, "group_query_attention") == Some(true) {
        arg_u32(log, "num_query_groups")
    } else {
        arg_u32(log, "num_key_value_heads")
    };
    let swiglu = arg_bool(log, "swiglu") == Some(true);
    let rms = log
        .args
        .get("normalization")
        .is_some_and(|v| v.eq_ignore_ascii_case("rmsnorm"));
    let rope = log.args.get("position_embedding_type").is_some_and(|v| v == "rope")
        || arg_bool(log, "use_rotary_position_embeddings") == Some(true);
    let file = ModelFile {
        name: Some(format!("{name} (from its log's arguments)")),
        layers: Some(need("num_layers")?),
        hidden: Some(need("hidden_size")?),
        heads: Some(heads),
        kv_heads: kv,
        ffn_hidden: arg_u32(log, "ffn_hidden_size"),
        seq_len: Some(need("seq_length")?),
        vocab: log.padded_vocab.or(arg_u32(log, "padded_vocab_size")),
        padded_vocab: log.padded_vocab,
        tied_embeddings: arg_bool(log, "untie_embeddings_and_output_weights").map(|u| !u),
        mlp: Some(if swiglu {
            exatrain_spec::Mlp::Swiglu
        } else {
            exatrain_spec::Mlp::Gelu
        }),
        norm: Some(if rms {
            exatrain_spec::Norm::Rmsnorm
        } else {
            exatrain_spec::Norm::Layernorm
        }),
        position: Some(if rope {
            exatrain_spec::Position::Rope
        } else {
            exatrain_spec::Position::Learned
        }),
        bias: arg_bool(log, "add_bias_linear"),
        dropout: arg_f64(log, "hidden_dropout").map(|p| p > 0.0),
        rope_base: arg_f64(log, "rotary_base").or(arg_f64(log, "rope_theta")),
        norm_eps: arg_f64(log, "norm_epsilon").or(arg_f64(log, "layernorm_epsilon")),
        ..Default::default()
    };
    let model = file.resolve(name)?;
    let tp = need("tensor_model_parallel_size")?;
    let pp = need("pipeline_model_parallel_size")?;
    let world = need("world_size")?;
    // Megatron-LM's --context-parallel-size (absent from older dumps: none)
    let cp = arg_u32(log, "context_parallel_size").unwrap_or(1);
    // Megatron-FSDP: what its sharding strategy shards (`exatrain export` writes it; its
    // default, `no_shard`, is plain data parallelism)
    let fsdp = match log.args.get("data_parallel_sharding_strategy").map(String::as_str) {
        _ if arg_bool(log, "use_megatron_fsdp") != Some(true) => None,
        Some("optim") => Some(1),
        Some("optim_grads") => Some(2),
        Some("optim_grads_params") => Some(3),
        _ => None,
    };
    let deepspeed = arg_u32(log, "zero_stage").filter(|_| arg_bool(log, "deepspeed") == Some(true));
    let zero = match (deepspeed, fsdp) {
        (Some(z), _) => z.min(3) as u8,
        (None, Some(z)) => z,
        (None, None) if arg_bool(log, "use_distributed_optimizer") == Some(true) => 1,
        (None, None) => 0,
    };
    let recompute = match log.args.get("recompute_granularity").map(String::as_str) {
        Some("full") => Recompute::Full,
        Some("selective") => Recompute::Selective,
        // Megatron-DeepSpeed (and Megatron-LM before 2022) name full recomputation
        // `--checkpoint-activations`
        _ if arg_bool(log, "checkpoint_activations") == Some(true) => Recompute::Full,
        _ => Recompute::None,
    };
    let cfg = ParallelConfig {
        zero,
        recompute,
        sequence_parallel: arg_bool(log, "sequence_parallel") == Some(true),
        flash_attention: log.args.get("attention_backend").is_some_and(|b| b.contains("flash"))
            || arg_bool(log, "use_flash_attn_v2") == Some(true),
        virtual_stages: arg_u32(log, "virtual_pipeline_model_parallel_size").unwrap_or(1),
        dtype: if arg_bool(log, "bf16") == Some(true) {
            Dtype::Bf16
        } else {
            Dtype::Fp32
        },
        // Megatron prints its FP8 format (`hybrid`, `e4m3`) or `None`
        fp8: arg_bool(log, "bf16") == Some(true) && log.args.get("fp8").is_some_and(|f| f != "None"),
        // Megatron-LM's DP overlap is off unless asked for (its default; code older than
        // `--overlap-grad-reduce` reduced after backward, and does not print it); DeepSpeed's
        // is its own config's (ZeRO ≤ 1 never overlaps: `Framework::dp_reduction`)
        overlap_dp: log.format != LogFormat::MegatronLm || arg_bool(log, "overlap_grad_reduce") == Some(true),
        overlap_tp: arg_bool(log, "tp_comm_overlap") == Some(true),
        // Megatron prints `None` when the stages are split evenly
        first_stage_layers: arg_u32(log, "decoder_first_pipeline_num_layers"),
        last_stage_layers: arg_u32(log, "decoder_last_pipeline_num_layers"),
        // `--ddp-bucket-size` (Megatron prints `None` for its default)
        dp_bucket: arg_u32(log, "ddp_bucket_size").map(u64::from),
        cp,
        ..ParallelConfig::new(
            tp,
            pp,
            world / (tp * pp * cp).max(1),
            need("micro_batch_size")?,
            need("global_batch_size")?,
        )
    };
    Ok((model, cfg))
}

/// The stack switches a Megatron argument dump prints (Megatron-LM's and Megatron-DeepSpeed's):
/// `masked_softmax_fusion`, the bias fusions (`bias_gelu_fusion` or, since 2023,
/// `bias_activation_fusion`, and `bias_dropout_fusion`: off if either is) and
/// `overlap_p2p_comm`; one the dump does not print stays the cluster's. And Megatron-LM's
/// `grad_reduce_in_bf16`, off unless printed on (its default: fp32 gradient buffers and
/// reductions, as every Megatron-LM before the flag ran bf16). A torchtitan log has no dump:
/// the cluster's, all of them.
fn switches_from_args(log: &FrameworkLog) -> StackSwitches {
    if log.format == LogFormat::Torchtitan {
        return StackSwitches::default();
    }
    let activation = arg_bool(log, "bias_activation_fusion").or(arg_bool(log, "bias_gelu_fusion"));
    let bias_fusion = match (activation, arg_bool(log, "bias_dropout_fusion")) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (None, None) => None,
        _ => Some(true),
    };
    StackSwitches {
        fused_softmax: arg_bool(log, "masked_softmax_fusion"),
        async_tp: None,
        bias_fusion,
        overlap_p2p: arg_bool(log, "overlap_p2p_comm"),
        grad_reduce_bf16: (log.format == LogFormat::MegatronLm)
            .then(|| arg_bool(log, "grad_reduce_in_bf16") == Some(true)),
    }
}

/// `--recompute-granularity full --recompute-method block` recomputes only the first
/// `recompute_num_layers` layers of each of the `chunks` pipeline chunks: a layout the planner
/// has no price for (`uniform`, any N, recomputes every layer: full recomputation).
fn no_partial_recompute(name: &str, log: &FrameworkLog, layers: u32, chunks: u32) -> Result<(), SpecError> {
    let block = log.args.get("recompute_granularity").is_some_and(|g| g == "full")
        && log.args.get("recompute_method").is_some_and(|m| m == "block");
    let per_chunk = layers / chunks.max(1);
    match arg_u32(log, "recompute_num_layers").filter(|&n| block && n < per_chunk) {
        Some(n) => Err(SpecError::new(format!(
            "log {name}: recompute_method block with recompute_num_layers {n} recomputes {n} of the {per_chunk} layers of each pipeline chunk; exatrain prices none, selective or full recomputation of every layer"
        ))),
        None => Ok(()),
    }
}

/// A log whose context parallelism exchanged keys and values otherwise than the ring the planner
/// prices (`--cp-comm-type p2p`, Megatron-LM's default): its all-gather or all-to-all variants
/// are refused, naming the argument.
fn ring_cp_only(name: &str, log: &FrameworkLog, cp: u32) -> Result<(), SpecError> {
    // printed as a list, one type per layer group: ['p2p']
    let other = |t: &str| {
        t.split(|ch: char| !ch.is_alphanumeric() && ch != '+' && ch != '_')
            .any(|w| !w.is_empty() && w != "p2p" && w != "None")
    };
    match log.args.get("cp_comm_type") {
        Some(t) if cp > 1 && other(t) => Err(SpecError::new(format!(
            "log {name}: cp_comm_type {t}: exatrain prices context parallelism as the p2p ring (--cp-comm-type p2p, Megatron-LM's default)"
        ))),
        _ => Ok(()),
    }
}

/// The fields of the argument dump that must equal the run file's.
fn check_agrees(name: &str, log: &FrameworkLog, m: &ModelSpec, c: &ParallelConfig) -> Result<(), SpecError> {
    // as `exatrain export` passes them: only where the group they act on has more than one rank
    // (the gradients are reduced over dp · cp)
    for (arg, want) in [
        ("overlap_grad_reduce", c.overlap_dp && c.dp_cp() > 1),
        ("tp_comm_overlap", c.overlap_tp && c.tp > 1),
        ("sequence_parallel", c.sequence_parallel && c.tp > 1),
    ] {
        if let Some(got) = arg_bool(log, arg) {
            if got != want {
                return Err(SpecError::new(format!(
                    "log {name}: ran with {arg} = {}, but its run file says {want}: the log is not of the layout it is filed with",
                    if got { "True" } else { "False" }
                )));
            }
        }
    }
    for (arg, want) in [
        ("tensor_model_parallel_size", c.tp),
        ("pipeline_model_parallel_size", c.pp),
        ("context_parallel_size", c.cp),
        ("world_size", c.gpus()),
        ("micro_batch_size", c.micro_batch),
        ("global_batch_size", c.global_batch),
        ("num_layers", m.layers),
        ("hidden_size", m.hidden),
        ("seq_length", m.seq_len),
    ] {
        if let Some(got) = arg_u32(log, arg) {
            if got != want {
                return Err(SpecError::new(format!(
                    "log {name}: ran with {arg} = {got}, but its run file says {want}: the log is not of the layout it is filed with"
                )));
            }
        }
    }
    if let Some(gb) = log.iterations.iter().find_map(|i| i.global_batch) {
        if gb != c.global_batch {
            return Err(SpecError::new(format!(
                "log {name}: its iterations have global batch size {gb}, its layout {}",
                c.global_batch
            )));
        }
    }
    Ok(())
}

/// A log as a measured run (the median step time after [`WARMUP`] iterations).
pub fn measured(path: &Path, model_filter: Option<&str>) -> Result<(Measured, FrameworkLog), SpecError> {
    let name = path
        .file_stem()
        .map_or("log".into(), |s| s.to_string_lossy().into_owned());
    let bytes = std::fs::read(path).map_err(|e| SpecError::new(format!("{}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    let log = logs::parse(&text).map_err(|e| SpecError::new(format!("log {}: {e}", path.display())))?;
    let (model, layout) = match sidecar(path) {
        Some(f) => {
            let t = std::fs::read_to_string(&f).map_err(|e| SpecError::new(format!("{}: {e}", f.display())))?;
            let r = exatrain_export::RunFile::parse(&t).map_err(|e| SpecError::new(format!("{}: {e}", f.display())))?;
            check_agrees(&name, &log, &r.model, &r.parallel)?;
            (r.model, r.parallel)
        }
        None if log.format != LogFormat::Torchtitan => from_args(&name, &log)?,
        None => {
            return Err(SpecError::new(format!(
                "log {name}: a torchtitan log names no layout: put the run file (`exatrain export --format exatrain`) next to it as {}.toml or run.toml",
                name
            )))
        }
    };
    // what the dump says the run did beyond any layout, whichever file gave the layout
    no_partial_recompute(&name, &log, model.layers, layout.pp * layout.virtual_stages)?;
    ring_cp_only(&name, &log, layout.cp)?;
    layout
        .check(&model, layout.gpus())
        .map_err(|e| SpecError::new(format!("log {name}: {e}")))?;
    if let Some(m) = model_filter {
        if model.name != m {
            return Err(SpecError::new(format!(
                "log {name}: is a run of model `{}`, not `{m}` as --model says",
                model.name
            )));
        }
    }
    let tokens = layout.global_batch as f64 * model.seq_len as f64;
    let steps = log.step_times(WARMUP, tokens, layout.gpus());
    if steps.is_empty() {
        return Err(SpecError::new(format!(
            "log {name}: no step times in its iteration lines"
        )));
    }
    let step = exatrain_tune::median(&steps);
    Ok((
        Measured {
            name,
            model,
            layout,
            time_s: Default::default(),
            step_s: Some(step),
            switches: switches_from_args(&log),
            stack: exatrain_cost::fit::RunStack::Framework(match log.format {
                exatrain_tune::logs::LogFormat::MegatronLm => exatrain_spec::Framework::MegatronLm,
                exatrain_tune::logs::LogFormat::MegatronDeepspeed => exatrain_spec::Framework::MegatronDeepspeed,
                exatrain_tune::logs::LogFormat::Torchtitan => exatrain_spec::Framework::Torchtitan,
            }),
        },
        log,
    ))
}
