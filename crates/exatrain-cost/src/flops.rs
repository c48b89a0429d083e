//! FLOP counts. A multiply-add is 2 FLOPs. Attention scores are counted over the full s×s square
//! (as Megatron and PaLM count them), not the causal half.

use exatrain_spec::{ModelSpec, Recompute};

/// Forward FLOPs of one block for one sequence: `2·s·(matrix params) + 4·s²·q_dim`
/// (QKᵀ and softmax·V).
pub fn block_forward(m: &ModelSpec) -> f64 {
    let s = m.seq_len as f64;
    2.0 * s * m.layer_matrix_params() as f64 + attention_core_forward(m)
}

/// Forward FLOPs of the attention core (QKᵀ and ·V) of one block for one sequence.
pub fn attention_core_forward(m: &ModelSpec) -> f64 {
    let s = m.seq_len as f64;
    4.0 * s * s * m.q_dim() as f64
}

/// Forward FLOPs of the output head (logits) for one sequence.
pub fn head_forward(m: &ModelSpec) -> f64 {
    2.0 * m.seq_len as f64 * m.hidden as f64 * m.padded_vocab as f64
}

/// Model FLOPs of one optimizer step over `batch` sequences: forward + backward (2× forward),
/// no recomputation. The numerator of MFU.
pub fn model_step(m: &ModelSpec, batch: u32) -> f64 {
    let fwd = m.layers as f64 * block_forward(m) + head_forward(m);
    3.0 * fwd * batch as f64
}

/// Hardware FLOPs of one step: model FLOPs plus what recomputation repeats (a whole block forward
/// for `full`, the attention core for `selective`). The numerator of HFU.
pub fn hardware_step(m: &ModelSpec, batch: u32, recompute: Recompute) -> f64 {
    let extra = match recompute {
        Recompute::None => 0.0,
        Recompute::Selective => attention_core_forward(m),
        Recompute::Full => block_forward(m),
    };
    model_step(m, batch) + m.layers as f64 * extra * batch as f64
}

/// Megatron's closed form `24·f·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))` (Narayanan et al. 2021, eq. 3),
/// with f = 4 under full recomputation and 3 otherwise. It assumes MHA, ffn = 4h and a tied head;
/// for such models and f = 4 it equals [`hardware_step`] exactly (up to biases, which neither counts).
pub fn megatron_formula(m: &ModelSpec, batch: u32, full_recompute: bool) -> f64 {
    let f = if full_recompute { 4.0 } else { 3.0 };
    let (b, s, l, h, v) = (
        batch as f64,
        m.seq_len as f64,
        m.layers as f64,
        m.hidden as f64,
        m.padded_vocab as f64,
    );
    24.0 * f * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
}
