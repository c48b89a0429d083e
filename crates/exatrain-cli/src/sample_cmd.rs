//! `exatrain sample`, `exatrain export-hf`: use a checkpoint.

use std::path::{Path, PathBuf};

use clap::Args;
use exatrain_spec::SpecError;
use exatrain_train::checkpoint;
use exatrain_train::data;
use exatrain_train::model::Gpt;
use exatrain_train::train;

#[derive(Args)]
pub struct SampleArgs {
    /// A checkpoint or a run folder.
    pub ckpt: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "LOVE, n.")]
    pub prompt: String,
    /// Tokens to generate (at most 65536).
    #[arg(long, default_value_t = 60)]
    pub tokens: usize,
    /// Softmax temperature, in [0, 100] (0: the most likely token).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Seeds the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn load_model(ckpt: &Path) -> Result<(PathBuf, Gpt<f32>, checkpoint::State), SpecError> {
    let dir = checkpoint::resolve(ckpt)?;
    let (state, params, _) = checkpoint::load(&dir, false)?;
    let shape = exatrain_train::GptShape::from_spec(&state.model)?;
    let mut m = Gpt::<f32>::new(shape, 0);
    m.params = params;
    Ok((dir, m, state))
}

pub fn run_sample(a: SampleArgs) -> Result<(), SpecError> {
    if a.tokens > train::MAX_SAMPLE_TOKENS {
        return Err(SpecError::new(format!(
            "--tokens {}: at most {}",
            a.tokens,
            train::MAX_SAMPLE_TOKENS
        )));
    }
    train::check_range("--temperature", a.temperature, 0.0, 100.0, "in [0, 100]")?;
    let (dir, mut m, _) = load_model(&a.ckpt)?;
    let tk = data::load_tokenizer(&dir)?;
    let text = train::sample(&mut m, &tk, &a.prompt, a.tokens, a.temperature, a.seed)?;
    println!("{}{}", a.prompt, text);
    Ok(())
}

#[derive(Args)]
pub struct ExportHfArgs {
    /// A checkpoint or a run folder.
    pub ckpt: PathBuf,
    /// Output folder for config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
    pub dir: PathBuf,
}

pub fn run_export_hf(a: ExportHfArgs) -> Result<(), SpecError> {
    let (dir, m, _) = load_model(&a.ckpt)?;
    let tk = data::load_tokenizer(&dir)?;
    exatrain_train::hf::export(&m.shape, &m.params, tk.token_to_id("<|endoftext|>"), &a.dir)?;
    std::fs::copy(dir.join("tokenizer.json"), a.dir.join("tokenizer.json"))
        .map_err(|e| SpecError::new(format!("{}: {e}", a.dir.display())))?;
    // AutoTokenizer loads tokenizer.json as it is (the trainer's byte-level BPE, its prefix
    // space included) only as a PreTrainedTokenizerFast; as a "gpt2" model type it would rebuild
    // GPT-2's own tokenizer from the vocabulary and split differently
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": m.shape.max_seq,
        "clean_up_tokenization_spaces": false,
    });
    exatrain_tune::store::write_atomic(
        &a.dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config).expect("json").as_bytes(),
    )?;
    println!(
        "wrote {}/config.json, model.safetensors, tokenizer.json, tokenizer_config.json",
        a.dir.display()
    );
    Ok(())
}
