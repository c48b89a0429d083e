//! torchtitan: a Python recipe module (`exatrain_recipe.py`) that derives the layout from the
//! registered Llama 3 configuration of the same model, run with `-m torchtitan.train --module
//! exatrain_recipe --config exatrain_run` (torchtitan's configurations are Python functions; its
//! command-line options are frozen). Models that are not a registered flavor are refused.

use exatrain_spec::{Framework, ModelSpec, ParallelConfig, Recompute};

use super::{File, Job};

/// A Llama 3 shape: (layers, hidden, heads, kv heads, ffn, vocab).
type Dims = (u32, u32, u32, u32, u32, u32);

/// torchtitan's registered Llama 3 flavors: their shape, the configuration function that builds
/// it and its `model_registry` flavor.
const FLAVORS: [(Dims, &str, &str); 3] = [
    ((32, 4096, 32, 8, 14336, 128256), "llama3_8b", "8B"),
    ((80, 8192, 64, 8, 28672, 128256), "llama3_70b", "70B"),
    ((126, 16384, 128, 8, 53248, 128256), "llama3_405b", "405B"),
];

pub fn job(m: &ModelSpec, c: &ParallelConfig) -> Result<Job, String> {
    let dims = (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab);
    let (base, flavor) = FLAVORS.iter().find(|(d, _, _)| *d == dims).map(|(_, f, v)| (*f, *v)).ok_or_else(|| {
        format!(
            "torchtitan builds only its registered Llama 3 flavors (8B, 70B, 405B); {} ({} layers × {}, {} heads) is none of them",
            m.name, m.layers, m.hidden, m.heads
        )
    })?;
    let (replicate, shard, reshard) = match c.zero {
        0 => (c.dp, 1, None),
        2 => (1, c.dp, Some("never")),
        _ => (1, c.dp, Some("always")),
    };
    let mut py = format!(
        "# exatrain_recipe.py: {name} on {gpus} GPUs ({grid}), exported by exatrain for\n\
         # {version}.\n\
         # torchtitan takes its configuration as a Python function: this one starts from the registered\n\
         # {base}() and sets the planned layout. Run with\n\
         #   torchrun ... -m torchtitan.train --module exatrain_recipe --config exatrain_run\n\
         import os\n\n\
         from torchtitan.config import CompileConfig\n\
         from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC\n\
         from torchtitan.models.llama3 import model_registry\n\
         from torchtitan.models.llama3.config_registry import {base}\n\n\n\
         def exatrain_run():\n\
         \x20   config = {base}()\n\
         \x20   # bf16 linear layers in eager mode, as planned ({base}() may convert them to float8\n\
         \x20   # and compile the model, which the plan does not price)\n\
         \x20   config.model_spec = model_registry(\"{flavor}\")\n\
         \x20   config.compile = CompileConfig()\n\
         \x20   p = config.parallelism\n\
         \x20   p.tensor_parallel_degree = {tp}\n\
         \x20   p.enable_sequence_parallel = {sp}\n\
         \x20   p.pipeline_parallel_degree = {pp}\n\
         \x20   p.data_parallel_replicate_degree = {replicate}\n\
         \x20   p.data_parallel_shard_degree = {shard}\n\
         {cp}",
        cp = if c.cp > 1 {
            // the head-tail load balancer (2·cp chunks) is torchtitan's default for SDPA
            format!("    p.context_parallel_degree = {}\n", c.cp)
        } else {
            String::new()
        },
        name = m.name,
        gpus = c.gpus(),
        tp = c.tp,
        pp = c.pp,
        grid = c.grid(),
        version = Framework::Torchtitan.version(),
        sp = if c.tp > 1 { "True" } else { "False" },
    );
    if let Some(r) = reshard {
        py.push_str(&format!(
            "    p.fsdp_reshard_after_forward = \"{r}\"  # ZeRO-{}\n",
            c.zero
        ));
    }
    if c.pp > 1 {
        let schedule = if c.virtual_stages > 1 {
            "Interleaved1F1B"
        } else {
            "1F1B"
        };
        py.push_str(&format!(
            "    p.pipeline_parallel_schedule = \"{schedule}\"\n    p.pipeline_parallel_layers_per_stage = {}\n    p.num_pp_microbatches = {}\n",
            m.layers / (c.pp * c.virtual_stages),
            c.microbatches()
        ));
    }
    py.push_str(&format!(
        "    t = config.training\n\
         \x20   t.num_tokens_per_microbatch_per_dp_rank = {mb} * {seq}  # micro-batch {mb}\n\
         \x20   t.num_tokens_per_train_step = {gb} * {seq}  # global batch {gb}\n\
         \x20   t.max_context_length = {seq}\n\
         \x20   t.mixed_precision_param = \"bfloat16\"\n\
         \x20   t.mixed_precision_reduce = \"float32\"  # FSDP's gradient reduction, as planned\n\
         \x20   t.steps = int(os.environ.get(\"TRAIN_ITERS\", \"100\"))  # PLACEHOLDER: iterations\n\
         \x20   config.dump_folder = os.environ.get(\"CKPT_DIR\", \"outputs/{name}\")  # PLACEHOLDER: checkpoints, logs\n\
         \x20   # PLACEHOLDER: data, tokenizer and learning rate are {base}()'s (C4 through Hugging Face\n\
         \x20   # datasets, the tokenizer under config.hf_assets_path): change them here.\n",
        mb = c.micro_batch,
        gb = c.global_batch,
        seq = m.seq_len,
        name = m.name,
    ));
    py.push_str(match c.recompute {
        Recompute::None => "    config.activation_checkpoint = None\n",
        Recompute::Selective => "    config.activation_checkpoint = SelectiveAC.Config()\n",
        Recompute::Full => "    config.activation_checkpoint = FullAC.Config()\n",
    });
    py.push_str("    return config\n");
    Ok(Job {
        framework: Framework::Torchtitan,
        env: vec![(
            "PYTHONPATH".into(),
            "$RECIPE_DIR${PYTHONPATH:+:$PYTHONPATH}".into(),
            "so that torchtitan imports exatrain_recipe.py".into(),
        )],
        program: "-m torchtitan.train --module exatrain_recipe --config exatrain_run".into(),
        flags: Vec::new(),
        placeholders: format!(
            "TRAIN_ITERS=${{TRAIN_ITERS:-100}}        # PLACEHOLDER: iterations of this run\n\
             CKPT_DIR=${{CKPT_DIR:-outputs/{}}}  # PLACEHOLDER: checkpoints and logs\n\
             export TRAIN_ITERS CKPT_DIR\n",
            m.name
        ),
        run_from: "the root of a torchtitan checkout".into(),
        job_dir_var: Some("RECIPE_DIR"),
        files: vec![File {
            name: "exatrain_recipe.py".into(),
            contents: py,
        }],
    })
}
