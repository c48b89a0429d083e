//! Export to Hugging Face `transformers`' GPT-2 format: `config.json` + `model.safetensors` that
//! `GPT2LMHeadModel.from_pretrained` loads. HF's GPT-2 uses `Conv1D` layers whose weight is
//! stored [in, out], the transpose of our [out, in]; the embedding keeps only the first V rows
//! (HF's vocab_size = V); the head is tied to the embedding, so no `lm_head.weight` is written.

use std::path::Path;

use exatrain_spec::SpecError;

use crate::checkpoint::write_tensors;
use crate::model::{GptShape, ParamLayout};

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// Write `dir/config.json` and `dir/model.safetensors` for parameters `p` of `shape`.
pub fn export(shape: &GptShape, p: &[f32], eot_token: Option<u32>, dir: &Path) -> Result<(), SpecError> {
    let err = |e: std::io::Error| SpecError::new(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(err)?;
    let l = ParamLayout::new(shape);
    let (c, f, v) = (shape.channels, shape.ffn, shape.vocab);
    let mut owned: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        (
            "transformer.wte.weight".into(),
            vec![v, c],
            p[l.wte.start..l.wte.start + v * c].to_vec(),
        ),
        (
            "transformer.wpe.weight".into(),
            vec![shape.max_seq, c],
            p[l.wpe.clone()].to_vec(),
        ),
    ];
    for (i, b) in l.blocks.iter().enumerate() {
        let h = |n: &str| format!("transformer.h.{i}.{n}");
        owned.push((h("ln_1.weight"), vec![c], p[b.ln1w.clone()].to_vec()));
        owned.push((h("ln_1.bias"), vec![c], p[b.ln1b.clone()].to_vec()));
        owned.push((
            h("attn.c_attn.weight"),
            vec![c, 3 * c],
            transpose(&p[b.qkvw.clone()], 3 * c, c),
        ));
        owned.push((h("attn.c_attn.bias"), vec![3 * c], p[b.qkvb.clone()].to_vec()));
        owned.push((
            h("attn.c_proj.weight"),
            vec![c, c],
            transpose(&p[b.projw.clone()], c, c),
        ));
        owned.push((h("attn.c_proj.bias"), vec![c], p[b.projb.clone()].to_vec()));
        owned.push((h("ln_2.weight"), vec![c], p[b.ln2w.clone()].to_vec()));
        owned.push((h("ln_2.bias"), vec![c], p[b.ln2b.clone()].to_vec()));
        owned.push((h("mlp.c_fc.weight"), vec![c, f], transpose(&p[b.fcw.clone()], f, c)));
        owned.push((h("mlp.c_fc.bias"), vec![f], p[b.fcb.clone()].to_vec()));
        owned.push((
            h("mlp.c_proj.weight"),
            vec![f, c],
            transpose(&p[b.fcprojw.clone()], c, f),
        ));
        owned.push((h("mlp.c_proj.bias"), vec![c], p[b.fcprojb.clone()].to_vec()));
    }
    owned.push(("transformer.ln_f.weight".into(), vec![c], p[l.lnfw.clone()].to_vec()));
    owned.push(("transformer.ln_f.bias".into(), vec![c], p[l.lnfb.clone()].to_vec()));
    let views: Vec<(String, Vec<usize>, &[f32])> = owned
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_slice()))
        .collect();
    write_tensors(&dir.join("model.safetensors"), &views)?;
    let eot = eot_token.unwrap_or(0);
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": v,
        "n_positions": shape.max_seq,
        "n_ctx": shape.max_seq,
        "n_embd": c,
        "n_layer": shape.layers,
        "n_head": shape.heads,
        "n_inner": f,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": true,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "float32",
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).expect("json"),
    )
    .map_err(err)?;
    Ok(())
}

/// The fixed model of the round-trip fixture: GPT-2 init (seed 42) plus a deterministic
/// perturbation of every parameter, so LayerNorm gains and biases are not trivial.
pub fn fixture_model() -> (GptShape, Vec<f32>) {
    let shape = GptShape {
        layers: 2,
        channels: 16,
        heads: 2,
        ffn: 64,
        max_seq: 12,
        vocab: 50,
        padded_vocab: 64,
    };
    let mut m = crate::Gpt::<f32>::new(shape, 42);
    let v_rows = shape.vocab * shape.channels;
    for (i, p) in m.params.iter_mut().enumerate() {
        let in_padding = i >= v_rows && i < shape.padded_vocab * shape.channels;
        if !in_padding {
            *p += 0.05 * ((i as f32) * 0.7).sin();
        }
    }
    (shape, m.params)
}

/// The token ids of the fixture's input: two sequences of 12.
pub fn fixture_tokens() -> Vec<u32> {
    (0..24).map(|i| ((i * 17 + 3) % 50) as u32).collect()
}
