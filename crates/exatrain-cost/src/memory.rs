//! Bytes held per device, by category.
//!
//! Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
//! Transformer Models", §4), term by term, so that for GPT (MHA, ffn = 4h, dropout, 16-bit) one
//! block stores `s·b·h·(34 + 5·a·s/h)` bytes without parallelism, `s·b·h·(10 + 24/t + 5·a·s/(h·t))`
//! with TP, `s·b·h/t·(34 + 5·a·s/h)` with TP + SP, the `5·a·s/h` term removed by selective
//! recomputation (or flash attention), and `2·s·b·h` (/t with SP) under full recomputation.

use exatrain_spec::{Mlp, ModelSpec, ParallelConfig, Position, Recompute, StageLayers};

/// Activation bytes one block stores for backward, one microbatch, one device.
pub fn block_activations(m: &ModelSpec, p: &ParallelConfig) -> f64 {
    let e = p.dtype.bytes();
    let t = p.tp as f64;
    let sp = if p.sequence_parallel { t } else { 1.0 };
    // the rank's share of each sequence under context parallelism
    let tokens = p.micro_batch as f64 * p.local_seq(m) as f64;
    let h = m.hidden as f64;
    if p.recompute == Recompute::Full {
        return tokens * h * e / sp; // the block's input only
    }
    let mask = if m.dropout { 1.0 } else { 0.0 };
    // Replicated across TP unless sequence-parallel: two norm inputs, the two norm outputs that
    // feed the column-parallel GEMMs, two dropout masks.
    let replicated = tokens * h * (4.0 * e + 2.0 * mask) / sp;
    // Sharded by TP: Q, K, V, the attention output (input of the out projection), the MLP.
    let q = m.q_dim() as f64;
    let kv = m.kv_dim() as f64;
    let f = m.ffn_hidden as f64;
    let mlp = match m.mlp {
        Mlp::Gelu => 2.0 * f,   // fc1 output, GELU output
        Mlp::Swiglu => 3.0 * f, // gate, up, product
    };
    let sharded = tokens * (2.0 * q + 2.0 * kv + mlp) * e / t;
    // The s×s part: softmax output (+ dropout mask and output). Gone with flash attention
    // (it keeps an fp32 log-sum-exp per row) or with selective recomputation.
    let s = p.local_seq(m) as f64;
    let scores = p.micro_batch as f64 * m.heads as f64 / t * s * s;
    let core = if p.flash_attention {
        p.micro_batch as f64 * m.heads as f64 / t * s * 4.0
    } else if p.recompute == Recompute::Selective {
        0.0
    } else {
        scores * (e + mask * (1.0 + e))
    };
    // FP8 linear layers keep each linear's input as FP8 for the weight gradient (Transformer
    // Engine saves the cast, 1 byte, not the bf16 tensor): the two norm outputs, the attention
    // output and the MLP's last input.
    let fp8_saved = if p.fp8 {
        tokens * (2.0 * h / sp + (q + f) / t) * (e - 1.0)
    } else {
        0.0
    };
    replicated + sharded + core - fp8_saved
}

/// Microbatches (chunks, for interleaving) whose activations pipeline rank `r` holds at its peak.
/// 1F1B: `min(m, p - r)`; interleaved 1F1B with v chunks: `min(m·v, 2(p-r-1) + (v-1)·p + 1)`
/// (Megatron's warm-up count + 1), each chunk holding `L/(p·v)` blocks.
pub fn chunks_in_flight(p: &ParallelConfig, rank: u32) -> f64 {
    let (pp, v, m) = (p.pp as u64, p.virtual_stages as u64, p.microbatches() as u64);
    let r = rank as u64;
    let n = if v == 1 {
        pp - r
    } else {
        2 * (pp - r - 1) + (v - 1) * pp + 1
    };
    n.min(m * v) as f64
}

/// Parameters held by one device of a pipeline stage (before ZeRO sharding) for one TP rank:
/// (first stage, an inner stage, last stage). The first holds the embedding, the last the head;
/// `st` is the layout's split ([`ParallelConfig::stage_layers`]). With one stage all three are equal.
pub fn stage_params(m: &ModelSpec, p: &ParallelConfig, st: &StageLayers) -> (f64, f64, f64) {
    let t = p.tp as f64;
    let block = block_params(m, p);
    let table = m.padded_vocab as f64 * m.hidden as f64 / t; // vocabulary-parallel
    let emb = embedding_params(m, p);
    let norm = m.norm_params() as f64;
    // The output head: its own matrix when untied; when tied and pp > 1 the last stage keeps a
    // copy of the embedding (Megatron), when tied and pp = 1 it is the same tensor.
    let head = if !m.tied_embeddings || p.pp > 1 { table } else { 0.0 };
    if p.pp == 1 {
        let all = st.first as f64 * block + emb + head + norm;
        (all, all, all)
    } else {
        (
            st.first as f64 * block + emb,
            st.middle as f64 * block,
            st.last as f64 * block + head + norm,
        )
    }
}

/// Parameters of one transformer block on one TP rank: its matrices and sharded biases split
/// over the TP ranks, the replicated biases and the two norms whole.
pub fn block_params(m: &ModelSpec, p: &ParallelConfig) -> f64 {
    let (bias_sharded, bias_replicated) = m.layer_bias_params();
    (m.layer_matrix_params() + bias_sharded) as f64 / p.tp as f64 + (bias_replicated + 2 * m.norm_params()) as f64
}

/// Parameters of the input embedding on one TP rank: the vocabulary-parallel table and, for
/// learned positions, the position table.
pub fn embedding_params(m: &ModelSpec, p: &ParallelConfig) -> f64 {
    let table = m.padded_vocab as f64 * m.hidden as f64 / p.tp as f64;
    table
        + match m.position {
            Position::Learned => m.seq_len as f64 * m.hidden as f64,
            Position::Rope => 0.0,
        }
}
