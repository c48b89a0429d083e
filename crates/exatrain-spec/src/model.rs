use serde::{Deserialize, Serialize};

use crate::SpecError;

/// Feed-forward block kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mlp {
    /// `fc2(gelu(fc1(x)))`: two weight matrices h×f and f×h (GPT).
    #[default]
    Gelu,
    /// `down(silu(gate(x)) * up(x))`: three matrices (LLaMA).
    Swiglu,
}

/// Normalization kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// weight + bias per feature.
    #[default]
    Layernorm,
    /// weight only.
    Rmsnorm,
}

/// Position encoding kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Position {
    /// A learned `seq_len × hidden` table (GPT-2/3).
    #[default]
    Learned,
    /// Rotary embeddings: no parameters.
    Rope,
}

/// A decoder-only transformer, fully resolved and validated. Build one with [`ModelFile::resolve`]
/// or take a preset from [`crate::presets::model`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    /// Transformer blocks.
    pub layers: u32,
    /// Model width h.
    pub hidden: u32,
    /// Query heads a.
    pub heads: u32,
    /// Key/value heads (GQA; = heads for multi-head attention).
    pub kv_heads: u32,
    /// Width of one head d (usually hidden / heads).
    pub head_dim: u32,
    /// Feed-forward width f (4h for GPT).
    pub ffn_hidden: u32,
    /// Sequence length s.
    pub seq_len: u32,
    /// Tokenizer vocabulary size.
    pub vocab: u32,
    /// Vocabulary rows actually allocated (padded for efficient GEMMs / TP sharding).
    pub padded_vocab: u32,
    /// Output head shares the input embedding matrix.
    pub tied_embeddings: bool,
    pub mlp: Mlp,
    pub norm: Norm,
    pub position: Position,
    /// Linear layers carry biases.
    pub bias: bool,
    /// Dropout after attention probabilities and after each block (stores 1-byte masks).
    pub dropout: bool,
    /// Rotary base θ (used with `position = "rope"`; 10000 for LLaMA 2, 500000 for LLaMA 3).
    #[serde(default = "default_rope_base")]
    pub rope_base: f64,
    /// Normalization epsilon.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
}

fn default_rope_base() -> f64 {
    10000.0
}
fn default_norm_eps() -> f64 {
    1e-5
}

/// A model as written in a TOML/JSON file: optional fields take the documented defaults.
/// Calculon's model JSON (`hidden`, `feedforward`, `seq_size`, `attn_heads`, `attn_size`,
/// `num_blocks`) is accepted too, through the aliases.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub name: Option<String>,
    #[serde(alias = "num_blocks")]
    pub layers: Option<u32>,
    pub hidden: Option<u32>,
    #[serde(alias = "attn_heads")]
    pub heads: Option<u32>,
    /// default: heads
    pub kv_heads: Option<u32>,
    /// default: hidden / heads
    #[serde(alias = "attn_size")]
    pub head_dim: Option<u32>,
    /// default: 4 × hidden
    #[serde(alias = "feedforward")]
    pub ffn_hidden: Option<u32>,
    #[serde(alias = "seq_size")]
    pub seq_len: Option<u32>,
    /// default: 51200 (Megatron GPT's padded GPT-2 vocabulary); Calculon files have none
    pub vocab: Option<u32>,
    /// default: vocab rounded up to a multiple of 128
    pub padded_vocab: Option<u32>,
    /// default: true
    pub tied_embeddings: Option<bool>,
    pub mlp: Option<Mlp>,
    pub norm: Option<Norm>,
    pub position: Option<Position>,
    /// default: true
    pub bias: Option<bool>,
    /// default: true
    pub dropout: Option<bool>,
    /// default: 10000
    pub rope_base: Option<f64>,
    /// default: 1e-5
    pub norm_eps: Option<f64>,
}

fn required(v: Option<u32>, field: &str) -> Result<u32, SpecError> {
    match v {
        None => Err(SpecError::new(format!(
            "model: missing field `{field}` (a positive integer)"
        ))),
        Some(0) => Err(SpecError::new(format!(
            "model: `{field}` must be a positive integer, got 0"
        ))),
        Some(x) => Ok(x),
    }
}

fn positive(v: Option<u32>, field: &str, default: u32) -> Result<u32, SpecError> {
    match v {
        Some(0) => Err(SpecError::new(format!(
            "model: `{field}` must be a positive integer, got 0"
        ))),
        Some(x) => Ok(x),
        None => Ok(default),
    }
}

impl ModelFile {
    /// Fill defaults and check every field; `fallback_name` names a model whose file has no `name`.
    pub fn resolve(self, fallback_name: &str) -> Result<ModelSpec, SpecError> {
        let layers = required(self.layers, "layers")?;
        let hidden = required(self.hidden, "hidden")?;
        let heads = required(self.heads, "heads")?;
        let seq_len = required(self.seq_len, "seq_len")?;
        // bounds that keep every parameter and FLOP count far inside u64 (the largest published
        // models are well within them); checked before any default is computed from them
        for (field, v, max) in [
            ("layers", Some(layers), 1u32 << 14),
            ("hidden", Some(hidden), 1 << 18),
            ("heads", Some(heads), 1 << 14),
            ("kv_heads", self.kv_heads, 1 << 14),
            ("head_dim", self.head_dim, 1 << 14),
            ("ffn_hidden", self.ffn_hidden, 1 << 20),
            ("seq_len", Some(seq_len), 1 << 24),
            ("vocab", self.vocab, 1 << 24),
            ("padded_vocab", self.padded_vocab, 1 << 24),
        ] {
            if let Some(v) = v.filter(|v| *v > max) {
                return Err(SpecError::new(format!(
                    "model: `{field}` {v} is too large (at most {max})"
                )));
            }
        }
        let kv_heads = positive(self.kv_heads, "kv_heads", heads)?;
        if heads % kv_heads != 0 {
            return Err(SpecError::new(format!(
                "model: `kv_heads` {kv_heads} must divide `heads` {heads}"
            )));
        }
        let head_dim = match self.head_dim {
            Some(d) => positive(Some(d), "head_dim", 0)?,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(SpecError::new(format!(
                    "model: `heads` {heads} does not divide `hidden` {hidden}; give `head_dim` explicitly"
                )))
            }
        };
        let ffn_hidden = positive(self.ffn_hidden, "ffn_hidden", 4 * hidden)?;
        let vocab = positive(self.vocab, "vocab", 51200)?;
        let padded_vocab = positive(self.padded_vocab, "padded_vocab", vocab.div_ceil(128) * 128)?;
        if padded_vocab < vocab {
            return Err(SpecError::new(format!(
                "model: `padded_vocab` {padded_vocab} is smaller than `vocab` {vocab}"
            )));
        }
        let rope_base = self.rope_base.unwrap_or_else(default_rope_base);
        if !(rope_base.is_finite() && rope_base > 1.0) {
            return Err(SpecError::new(format!(
                "model: `rope_base` must be a finite number above 1, got {rope_base}"
            )));
        }
        let norm_eps = self.norm_eps.unwrap_or_else(default_norm_eps);
        if !(norm_eps.is_finite() && norm_eps > 0.0 && norm_eps < 1.0) {
            return Err(SpecError::new(format!(
                "model: `norm_eps` must be in (0, 1), got {norm_eps}"
            )));
        }
        Ok(ModelSpec {
            name: self.name.unwrap_or_else(|| fallback_name.to_string()),
            rope_base,
            norm_eps,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn_hidden,
            seq_len,
            vocab,
            padded_vocab,
            tied_embeddings: self.tied_embeddings.unwrap_or(true),
            mlp: self.mlp.unwrap_or_default(),
            norm: self.norm.unwrap_or_default(),
            position: self.position.unwrap_or_default(),
            bias: self.bias.unwrap_or(true),
            dropout: self.dropout.unwrap_or(true),
        })
    }
}

impl ModelSpec {
    /// Width of all query heads together: heads × head_dim.
    pub fn q_dim(&self) -> u64 {
        self.heads as u64 * self.head_dim as u64
    }

    /// Width of all key (or value) heads together: kv_heads × head_dim.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads as u64 * self.head_dim as u64
    }

    /// Weight matrices per feed-forward block (2 for GELU, 3 for SwiGLU).
    pub fn mlp_matrices(&self) -> u64 {
        match self.mlp {
            Mlp::Gelu => 2,
            Mlp::Swiglu => 3,
        }
    }

    /// Parameters of one norm layer.
    pub fn norm_params(&self) -> u64 {
        match self.norm {
            Norm::Layernorm => 2 * self.hidden as u64,
            Norm::Rmsnorm => self.hidden as u64,
        }
    }

    /// Weight-matrix parameters of one block (what GEMMs multiply): QKV, attention out, MLP.
    pub fn layer_matrix_params(&self) -> u64 {
        let h = self.hidden as u64;
        let qkv = h * (self.q_dim() + 2 * self.kv_dim());
        let out = self.q_dim() * h;
        let mlp = self.mlp_matrices() * h * self.ffn_hidden as u64;
        qkv + out + mlp
    }

    /// Biases of one block's linear layers, split as (sharded by TP, replicated across TP):
    /// column-parallel biases (QKV, MLP up/gate) shard, row-parallel ones (attention out, MLP
    /// down) are replicated.
    pub fn layer_bias_params(&self) -> (u64, u64) {
        if !self.bias {
            return (0, 0);
        }
        let h = self.hidden as u64;
        let up = (self.mlp_matrices() - 1) * self.ffn_hidden as u64;
        (self.q_dim() + 2 * self.kv_dim() + up, 2 * h)
    }

    /// All parameters of one block.
    pub fn layer_params(&self) -> u64 {
        let (bs, br) = self.layer_bias_params();
        self.layer_matrix_params() + bs + br + 2 * self.norm_params()
    }

    /// Input embedding (+ learned positions).
    pub fn embedding_params(&self) -> u64 {
        let tok = self.padded_vocab as u64 * self.hidden as u64;
        let pos = match self.position {
            Position::Learned => self.seq_len as u64 * self.hidden as u64,
            Position::Rope => 0,
        };
        tok + pos
    }

    /// Output head matrix (0 when tied to the embedding).
    pub fn head_params(&self) -> u64 {
        if self.tied_embeddings {
            0
        } else {
            self.padded_vocab as u64 * self.hidden as u64
        }
    }

    /// Total parameters N, counted once (a tied head is not counted twice).
    pub fn params(&self) -> u64 {
        self.layers as u64 * self.layer_params() + self.embedding_params() + self.head_params() + self.norm_params()
    }

    /// Parameters that multiply a token in a GEMM in the forward pass: every block matrix plus the
    /// output head (used whether or not it is tied). This is the N of the `6·N` per token rule,
    /// before attention's sequence term.
    pub fn matmul_params(&self) -> u64 {
        self.layers as u64 * self.layer_matrix_params() + self.padded_vocab as u64 * self.hidden as u64
    }
}
