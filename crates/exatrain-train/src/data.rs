//! Data: a BPE tokenizer trained with Hugging Face's `tokenizers` on a text file, token shards
//! written once (`train.bin` / `val.bin`, little-endian u16, plus `data.json`), memory-mapped, and
//! a deterministic, resumable sampler (the j-th sequence of a run depends only on (seed, j)).

use std::path::{Path, PathBuf};

use exatrain_spec::SpecError;
use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer, TokenizerImpl,
};

/// The smallest vocabulary a byte-level BPE tokenizer fits in: 256 bytes + `<|endoftext|>`.
pub const MIN_VOCAB: u32 = 257;

/// The shards' header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataMeta {
    pub format: String,
    pub vocab_size: u32,
    pub train_tokens: u64,
    pub val_tokens: u64,
    pub source: String,
    pub source_bytes: u64,
    /// Entropy of the training tokens' unigram distribution, nats: the loss a model that ignores
    /// context would reach.
    pub unigram_entropy: f64,
}

fn err(what: impl std::fmt::Display) -> SpecError {
    SpecError::new(what.to_string())
}

/// Train a byte-level BPE tokenizer of `vocab` tokens on `text_file`; save it as `tokenizer.json`.
pub fn train_tokenizer(text_file: &Path, vocab: u32, out: &Path) -> Result<Tokenizer, SpecError> {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab as usize)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .build();
    let mut tk: TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper> =
        TokenizerImpl::new(BPE::default());
    tk.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::default())));
    tk.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    let file = text_file
        .to_str()
        .ok_or_else(|| err(format!("--data {}: not a UTF-8 path", text_file.display())))?;
    tk.train_from_files(&mut trainer, vec![file.to_string()])
        .map_err(|e| err(format!("--data {}: training the tokenizer: {e}", text_file.display())))?;
    tk.save(out, false)
        .map_err(|e| err(format!("{}: {e}", out.display())))?;
    Tokenizer::from_file(out).map_err(|e| err(format!("{}: {e}", out.display())))
}

pub fn load_tokenizer(dir: &Path) -> Result<Tokenizer, SpecError> {
    let p = dir.join("tokenizer.json");
    Tokenizer::from_file(&p).map_err(|e| err(format!("{}: cannot load the tokenizer: {e}", p.display())))
}

fn write_u16(path: &Path, toks: &[u32]) -> Result<(), SpecError> {
    let mut bytes = Vec::with_capacity(toks.len() * 2);
    for &t in toks {
        bytes.extend_from_slice(&(t as u16).to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// Tokenize `text_file` into `dir` (written to `dir.tmp`, then renamed): the last 10 % of the
/// tokens is the validation split.
pub fn prepare(text_file: &Path, vocab: u32, dir: &Path) -> Result<DataMeta, SpecError> {
    if vocab > 65535 {
        return Err(err(format!(
            "model vocab {vocab}: shards store u16 tokens (at most 65535)"
        )));
    }
    if vocab < MIN_VOCAB {
        return Err(err(format!(
            "model vocab {vocab}: the byte-level tokenizer needs at least {MIN_VOCAB} tokens (256 bytes + <|endoftext|>)"
        )));
    }
    let text = std::fs::read_to_string(text_file)
        .map_err(|e| err(format!("--data {}: cannot read: {e}", text_file.display())))?;
    if text.trim().is_empty() {
        return Err(err(format!("--data {}: the file is empty", text_file.display())));
    }
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| err(format!("{}: cannot create: {e}", tmp.display())))?;
    let tk = train_tokenizer(text_file, vocab, &tmp.join("tokenizer.json"))?;
    let ids: Vec<u32> = tk
        .encode(text.as_str(), false)
        .map_err(|e| err(format!("tokenizing: {e}")))?
        .get_ids()
        .to_vec();
    let have = tk.get_vocab_size(true);
    if have > vocab as usize || ids.iter().any(|&t| t >= vocab) {
        return Err(err(format!(
            "model vocab {vocab}: the tokenizer trained on --data has {have} tokens"
        )));
    }
    let split = ids.len() * 9 / 10;
    let (train, val) = ids.split_at(split);
    write_u16(&tmp.join("train.bin"), train)?;
    write_u16(&tmp.join("val.bin"), val)?;
    let mut counts = vec![0u64; vocab as usize];
    for &t in train {
        counts[t as usize] += 1;
    }
    let n = train.len() as f64;
    let unigram_entropy = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| -(c as f64 / n) * (c as f64 / n).ln())
        .sum();
    let meta = DataMeta {
        format: "exatrain-tokens-u16-v1".into(),
        vocab_size: tk.get_vocab_size(true) as u32,
        train_tokens: train.len() as u64,
        val_tokens: val.len() as u64,
        source: text_file
            .file_name()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
        source_bytes: text.len() as u64,
        unigram_entropy,
    };
    std::fs::write(
        tmp.join("data.json"),
        serde_json::to_string_pretty(&meta).expect("json"),
    )
    .map_err(|e| err(format!("{}: {e}", tmp.display())))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    Ok(meta)
}

/// A memory-mapped split.
pub struct Shard {
    map: memmap2::Mmap,
}

impl Shard {
    pub fn open(path: &Path) -> Result<Shard, SpecError> {
        let f = std::fs::File::open(path).map_err(|e| err(format!("{}: cannot open: {e}", path.display())))?;
        // SAFETY: the shard is written once and never modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| err(format!("{}: cannot map: {e}", path.display())))?;
        if map.len() % 2 != 0 {
            return Err(err(format!("{}: truncated shard (odd length)", path.display())));
        }
        Ok(Shard { map })
    }

    pub fn len(&self) -> usize {
        self.map.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> u32 {
        u16::from_le_bytes([self.map[2 * i], self.map[2 * i + 1]]) as u32
    }
}

/// Both splits and their header.
pub struct Dataset {
    pub dir: PathBuf,
    pub meta: DataMeta,
    pub train: Shard,
    pub val: Shard,
}

impl Dataset {
    /// Open `dir`, checking that each split holds at least one (seq_len + 1)-token window.
    pub fn open(dir: &Path, seq_len: usize) -> Result<Dataset, SpecError> {
        let mp = dir.join("data.json");
        let text = std::fs::read_to_string(&mp).map_err(|e| {
            err(format!(
                "--data {}: no data.json ({e}); pass a text file to tokenize, or a folder made from one",
                dir.display()
            ))
        })?;
        let meta: DataMeta = serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", mp.display())))?;
        let train = Shard::open(&dir.join("train.bin"))?;
        let val = Shard::open(&dir.join("val.bin"))?;
        for (name, s) in [("train", &train), ("val", &val)] {
            if s.len() < seq_len + 1 {
                return Err(err(format!(
                    "--data {}: the {name} split has {} tokens, fewer than one sequence of {} + 1",
                    dir.display(),
                    s.len(),
                    seq_len
                )));
            }
        }
        Ok(Dataset {
            dir: dir.to_path_buf(),
            meta,
            train,
            val,
        })
    }
}

impl Dataset {
    /// The tokens must index the model's embedding: its vocabulary holds the tokenizer's.
    pub fn check_vocab(&self, vocab: usize, model: &str) -> Result<(), SpecError> {
        if self.meta.vocab_size as usize > vocab {
            return Err(err(format!(
                "--data {}: the tokenizer has {} tokens but model {model} has vocab {vocab}",
                self.dir.display(),
                self.meta.vocab_size
            )));
        }
        Ok(())
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `tokens` / `targets` ([B·T]) with `b` training windows: sequences number `first ..
/// first + b` of the run, each at an offset that depends only on (seed, its number).
pub fn train_batch(
    s: &Shard,
    seed: u64,
    first: u64,
    b: usize,
    t: usize,
    tokens: &mut Vec<u32>,
    targets: &mut Vec<u32>,
) {
    tokens.clear();
    targets.clear();
    let span = (s.len() - t - 1) as u64 + 1;
    for j in first..first + b as u64 {
        let off = (splitmix(seed ^ splitmix(j)) % span) as usize;
        for i in 0..t {
            tokens.push(s.get(off + i));
            targets.push(s.get(off + i + 1));
        }
    }
}

/// The k-th validation batch: consecutive, non-overlapping windows (the same every evaluation).
pub fn val_batch(s: &Shard, k: usize, b: usize, t: usize, tokens: &mut Vec<u32>, targets: &mut Vec<u32>) {
    tokens.clear();
    targets.clear();
    let windows = (s.len() - 1) / t;
    for j in 0..b {
        let off = ((k * b + j) % windows) * t;
        for i in 0..t {
            tokens.push(s.get(off + i));
            targets.push(s.get(off + i + 1));
        }
    }
}
