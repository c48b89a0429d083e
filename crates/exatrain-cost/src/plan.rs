//! The composition: memory and step time of one layout.

use exatrain_spec::{ClusterSpec, Dim, GradBuckets, Invalid, ModelSpec, ParallelConfig, Recompute};
use serde::Serialize;

use crate::comm::{self, group_link};
use crate::compute::{self, Device};
use crate::{flops, memory};

/// The trainer's buckets of a stage's `params`: the share whose reduction it can start only
/// when backward ends, and how many buckets there are. It cuts its buckets at block boundaries
/// from the last block back, each once it holds at least `bucket` parameters (the last one
/// counts the `trailing` final norm after the blocks; a block never starts a cut of its own:
/// the first block stays with whatever follows it), and keeps the vocabulary table (`table`:
/// the stage holds the embedding or the head) in a bucket of its own; so the first blocks'
/// bucket and the table's are ready only at the end, and every full bucket before them is
/// reduced while backward goes on. `bucket` infinite: one bucket, and the table's. The
/// trainer's `Regions::new` cuts its buffers by this rule (a test there checks the two agree).
pub fn trainer_buckets(
    blocks: u32,
    block_params: f64,
    trailing: f64,
    params: f64,
    bucket: f64,
    table: bool,
) -> (f64, f64) {
    let table = if table { 1.0 } else { 0.0 };
    if !(params > 0.0 && bucket.is_finite()) {
        return (1.0, 1.0 + table);
    }
    // walk back over the blocks after the first, as the trainer cuts
    let (mut since, mut cut, mut cuts) = (trailing, 0.0, 0.0);
    for _ in 1..blocks {
        since += block_params;
        if since >= bucket {
            (cut, cuts, since) = (cut + since, cuts + 1.0, 0.0);
        }
    }
    ((1.0 - cut / params).clamp(0.0, 1.0), cuts + 1.0 + table)
}

/// Bytes held by one device at its peak (the pipeline stage that holds the most).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Memory {
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Framework reserve (context, communication buffers, workspaces), ZeRO-3 prefetch buffers and
    /// allocator fragmentation.
    pub other: f64,
    pub total: f64,
}

/// One optimizer step, by term, in seconds; the terms add up to `step_time_s`. The trainer
/// measures the same terms into the same type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Times {
    /// Forward, backward and recomputation of the slowest pipeline stage, all microbatches.
    pub compute: f64,
    /// Tensor-parallel collectives, the part not overlapped with GEMMs (Megatron's asynchronous
    /// backward collectives, `--tp-comm-overlap`).
    pub tp_comm: f64,
    /// Pipeline send/recv between stages.
    pub pp_comm: f64,
    /// Context-parallel attention's ring exchanges of keys and values (and their gradients), the
    /// part not hidden under the attention kernels.
    #[serde(default)]
    pub cp_comm: f64,
    /// The exposed part of the data-parallel gradient reduction / ZeRO gathers.
    pub dp_comm: f64,
    /// Pipeline fill and drain: one microbatch through every stage but the slowest, over v
    /// ((p - 1)/v microbatch times when the stages are equal).
    pub bubble: f64,
    /// The optimizer update (memory-bound).
    pub optimizer: f64,
}

impl Times {
    pub fn total(&self) -> f64 {
        self.compute + self.tp_comm + self.pp_comm + self.cp_comm + self.dp_comm + self.bubble + self.optimizer
    }
}

/// Bytes one device sends per step, by collective kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CommBytes {
    pub tp: f64,
    pub pp: f64,
    pub dp: f64,
    pub cp: f64,
}

/// Everything the planner predicts for one layout.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Plan {
    pub fits: bool,
    pub memory_bytes: Memory,
    pub capacity_bytes: f64,
    /// capacity − total: negative when the layout does not fit, by that much.
    pub headroom_bytes: f64,
    pub step_time_s: f64,
    pub time_s: Times,
    pub tokens_per_s: f64,
    /// Model TFLOP/s per device (no recomputation counted).
    pub tflops_per_gpu: f64,
    /// Hardware TFLOP/s per device (recomputation counted; Megatron's count under full recompute).
    pub hfu_tflops_per_gpu: f64,
    pub mfu: f64,
    pub hfu: f64,
    pub microbatches: u32,
    pub params: f64,
    pub model_flops_per_step: f64,
    pub hardware_flops_per_step: f64,
    pub comm_bytes: CommBytes,
}

/// Predict memory and step time. Invalid layouts are returned as values for the caller to count.
pub fn plan(m: &ModelSpec, c: &ClusterSpec, p: &ParallelConfig) -> Result<Plan, Invalid> {
    p.check(m, p.gpus())?;
    if p.fp8 {
        c.device.require_fp8()?;
    }
    let d = Device::new(c, p.dtype);
    let e = p.dtype.bytes();
    let mb = p.microbatches();
    let mbf = mb as f64;
    let (tp, pp, dp, v) = (p.tp, p.pp, p.dp, p.virtual_stages as f64);
    let st = p.stage_layers(m)?;
    let (b_first, b_mid, b_last) = (st.first as f64, st.middle as f64, st.last as f64);
    // the stage with the most layers (ZeRO-3 gathers, per-chunk activations)
    let blocks = st.max() as f64;
    // the tokens of one microbatch a rank holds (each sequence's 1/cp under context parallelism)
    let tokens = p.micro_batch as f64 * p.local_seq(m) as f64;
    let act_msg = tokens * m.hidden as f64 * e; // one full activation tensor

    // --- per microbatch, per stage: compute and TP communication
    let fwd = compute::block_forward(m, p, &d);
    let block = compute::block_train_of(m, p, &d, &fwd);
    let emb = compute::embedding_train(m, p, &d);
    let head = compute::head_train(m, p, &d);
    // the framework's own gradient-accumulation passes after each backward, per stage
    let accum_bytes = c.stack.framework.map_or(0.0, |f| f.grad_accum_bytes_per_param(p));
    let (first_p, mid_p, last_p) = memory::stage_params(m, p, &st);
    let accum = |params: f64| d.stream(params * accum_bytes);
    let (first_c, last_c) = if pp == 1 {
        let all = b_first * block + emb + head + accum(first_p);
        (all, all)
    } else {
        (
            b_first * block + emb + accum(first_p),
            b_last * block + head + accum(last_p),
        )
    };
    let mid_c = b_mid * block + accum(mid_p);
    let tp_link = group_link(c, tp, p.stride(Dim::Tp));
    let per_pair = if p.sequence_parallel {
        comm::all_gather(act_msg, tp, tp_link) + comm::reduce_scatter(act_msg, tp, tp_link)
    } else {
        comm::all_reduce(act_msg, tp, tp_link)
    };
    // forward 2, backward 2, re-forward 2 under full recomputation
    let collectives = if p.recompute == Recompute::Full { 6.0 } else { 4.0 };
    // Sequence parallelism keeps only 1/t of the norms' outputs, so backward gathers the two
    // column-parallel GEMMs' inputs again for their weight gradients (and the head's once).
    let regather = if p.sequence_parallel {
        comm::all_gather(act_msg, tp, tp_link)
    } else {
        0.0
    };
    let tp_block = collectives * per_pair + 2.0 * regather;
    // Megatron's asynchronous TP communication: in backward the two column-parallel linears'
    // input-gradient collectives run under their weight-gradient GEMMs and, with SP, the
    // re-gathers under their data-gradient GEMMs; only what outlasts its GEMM is exposed.
    let async_tp = c.stack.async_tp && c.stack.framework.is_some_and(|f| f.overlaps_tp_backward(p));
    let tp_block = if async_tp && !p.overlap_tp && tp > 1 {
        let [qkv, up] = fwd.column_gemms;
        let input_grad = if p.sequence_parallel {
            comm::reduce_scatter(act_msg, tp, tp_link)
        } else {
            comm::all_reduce(act_msg, tp, tp_link)
        };
        tp_block - input_grad.min(qkv) - input_grad.min(up) - regather.min(qkv) - regather.min(up)
    } else {
        tp_block
    };
    // With TP communication overlap (Transformer Engine userbuffers) each all-gather /
    // reduce-scatter is split into t chunks pipelined with the GEMM next to it: only the first
    // chunk waits, unless the communication outlasts the block's GEMMs.
    let tp_block = if p.overlap_tp && tp > 1 {
        let passes = if p.recompute == Recompute::Full { 4.0 } else { 3.0 };
        let gemm = passes * fwd.gemm;
        (tp_block - gemm).max(tp_block / tp as f64)
    } else {
        tp_block
    };
    // The vocabulary-parallel embedding reduces its output; the head reduces its input gradient.
    let (first_tp, last_tp) = if pp == 1 {
        (
            b_first * tp_block + 2.0 * per_pair + regather,
            b_first * tp_block + 2.0 * per_pair + regather,
        )
    } else {
        (b_first * tp_block + per_pair, b_last * tp_block + per_pair + regather)
    };
    // the slowest stage sets the pace: the first, the last, or (uneven stages) an inner one
    let mut slowest = if first_c + first_tp >= last_c + last_tp {
        (first_c, first_tp)
    } else {
        (last_c, last_tp)
    };
    if pp > 2 && mid_c + b_mid * tp_block > slowest.0 + slowest.1 {
        slowest = (mid_c, b_mid * tp_block);
    }
    let (stage_c, stage_tp) = slowest;

    // --- context parallelism: Transformer Engine's ring attention (Megatron-LM's default
    // `cp_comm_type p2p`; torchtitan's ring too). Each block's forward passes the rank's keys and
    // values (1/t of the kv heads, its s/cp tokens) cp − 1 hops around the ring, its backward
    // passes them again with their gradients (twice the bytes); each hop runs under the attention
    // kernel of the step before it, so a hop exposes what it outlasts one step (1/cp of the
    // core) by. Under full recomputation the forward's ring runs twice.
    let cpn = p.cp;
    // a CP group's neighbours are a whole TP group apart
    let cp_link = group_link(c, cpn, p.stride(Dim::Tp) * tp);
    // the keys and values of the rank's tokens, one ring hop's message
    let kv_chunk = tokens * 2.0 * m.kv_dim() as f64 / tp as f64 * e;
    let (cp_block, cp_bytes_block) = if cpn > 1 && c.stack.framework.is_none() {
        // the trainer's exchange (no framework): the whole sequence's keys and values
        // all-gathered before the attention, forward and again for backward (by the full
        // recomputation's forward, or before the backward), their gradients reduce-scattered;
        // every collective blocks
        let whole = cpn as f64 * kv_chunk;
        (
            2.0 * comm::all_gather(whole, cpn, cp_link) + comm::reduce_scatter(whole, cpn, cp_link),
            3.0 * (cpn as f64 - 1.0) * kv_chunk,
        )
    } else if cpn > 1 {
        let hops = cpn as f64 - 1.0;
        let fwd_pass = hops * (comm::send_recv(kv_chunk, cp_link) - fwd.core / cpn as f64).max(0.0);
        let bwd_pass = hops * (comm::send_recv(2.0 * kv_chunk, cp_link) - fwd.core_bwd / cpn as f64).max(0.0);
        let fwd_passes = if p.recompute == Recompute::Full { 2.0 } else { 1.0 };
        (fwd_passes * fwd_pass + bwd_pass, (fwd_passes + 2.0) * hops * kv_chunk)
    } else {
        (0.0, 0.0)
    };
    let stage_cp = blocks * cp_block;
    let nf = tp as f64;
    let ring = |k: f64| {
        if tp > 1 {
            k * (nf - 1.0) / nf * act_msg
        } else {
            0.0
        }
    };
    // A ring all-reduce sends 2(n-1)/n of the buffer; all-gather + reduce-scatter send the same.
    let sp_regather = if p.sequence_parallel { ring(1.0) } else { 0.0 };
    let tp_bytes_block = collectives * ring(2.0) + 2.0 * sp_regather;
    // the busiest rank: the last stage (head: one pair and, with SP, one re-gather) unless
    // uneven stages give another more layers
    let tp_bytes = mbf
        * if pp == 1 {
            b_first * tp_bytes_block + 2.0 * ring(2.0) + sp_regather
        } else {
            (b_last * tp_bytes_block + ring(2.0) + sp_regather)
                .max(b_first * tp_bytes_block + ring(2.0))
                .max(if pp > 2 { b_mid * tp_bytes_block } else { 0.0 })
        };

    // --- pipeline
    let (pp_comm, pp_bytes) = if pp > 1 {
        // Scatter-gather optimisation: each TP rank sends its 1/t slice across stages.
        let msg = act_msg / tp as f64;
        let link = group_link(c, pp, p.stride(Dim::Pp));
        // The busiest rank sends each microbatch forward out of, and its gradient back out of,
        // each of its v chunks, except out of the very first stage (backward) and the very last
        // (forward): with pp = 2 both ranks hold one of those ends.
        let sends = if pp == 2 { 2.0 * v - 1.0 } else { 2.0 * v };
        let send = comm::send_recv(msg, link);
        let overlapped = c.stack.overlap_p2p && c.stack.framework.is_some_and(|f| f.overlaps_pp_comm(p));
        let exposed = if overlapped {
            // Megatron's overlap_p2p_comm: each send runs while the rank computes its next chunk
            // (a forward chunk, the shortest, is a third of the chunk's stage_c / v), so only
            // the fill's and the drain's sends (pp - 1 hops each way) wait, plus what a send
            // outlasts its chunk by.
            let chunk = stage_c / (3.0 * v);
            2.0 * (pp as f64 - 1.0) * send + sends * mbf * (send - chunk).max(0.0)
        } else {
            sends * mbf * send
        };
        (exposed, sends * mbf * msg)
    } else {
        (0.0, 0.0)
    };
    // The pipeline's fill and drain: the slowest stage runs every microbatch back to back, and
    // the first microbatch's way to it and the last one's way back pass through every other
    // stage once (1F1B: m·t_slowest + Σ_other t_s; interleaved, each chunk 1/v of its stage).
    // Stages that are lighter than the slowest (the first without the head, inner ones of an
    // uneven split) make a shorter bubble than (p − 1) slowest-stage times.
    let bubble = if pp > 1 {
        let stage = |compute: f64, tp_time: f64, blocks: f64| compute + tp_time + blocks * cp_block;
        let (first, mid, last) = (
            stage(first_c, first_tp, b_first),
            stage(mid_c, b_mid * tp_block, b_mid),
            stage(last_c, last_tp, b_last),
        );
        let all = first + (pp as f64 - 2.0) * mid + last;
        let slowest = first.max(last).max(if pp > 2 { mid } else { 0.0 });
        ((all - slowest) / v).max(0.0)
    } else {
        0.0
    };

    // --- data parallel and the optimizer
    let params_dev = first_p.max(last_p).max(if pp > 2 { mid_p } else { 0.0 });
    // How the stack reduces gradients: Megatron-LM's (and the trainer's) bucketed overlap in the
    // training dtype (see Dtype::grad_bytes), or DeepSpeed's fp32 all-reduce after the flush.
    let red = c
        .stack
        .framework
        .unwrap_or(exatrain_spec::Framework::MegatronLm)
        .dp_reduction(p, &c.stack);
    let grad_bytes = params_dev * red.grad_wire_bytes;
    let weight_bytes = params_dev * e;
    // the ranks that hold the same weights: dp · cp (Megatron's data-parallel group with context
    // parallelism); its ring runs over the data-parallel ranks' links, or the context-parallel
    // ones' without data parallelism. From here on `dp` counts that whole group.
    let dp_link = if dp == 1 && cpn > 1 {
        cp_link
    } else {
        group_link(c, dp, p.stride(Dim::Dp))
    };
    let dp = p.dp_cp();
    // the backward and the forward part of one microbatch
    let (bwd_mb, fwd_mb) = (stage_c * 2.0 / 3.0, stage_c / 3.0);
    // Overlap as the frameworks do it: gradients are reduced as backward produces them, so the
    // reduction hides behind the last microbatch's backward except for what is left when
    // backward ends (`GradBuckets`): Megatron-LM's last bucket of max(40 M, 1 M·dp) parameters
    // (or `dp_bucket`), DeepSpeed's of `reduce_bucket_size`, torchtitan's FSDP2 units of the
    // first block and the embedding. The distributed optimizer's parameter all-gather
    // (ZeRO-1/2) hides behind the next step's first forward except for the first bucket, which
    // the first layer waits for (Megatron-LM, torchtitan; DeepSpeed gathers when its optimizer
    // step ends). The trainer (no framework) cuts its buckets at block boundaries, keeps the
    // embedding table in a bucket of its own, and gathers the updated parameters after the
    // optimizer step, with nothing left to hide behind.
    // Each bucket is a collective of its own, so many small ones pay many latencies.
    let block_p = memory::block_params(m, p);
    let (tail, buckets) = match (c.stack.framework, red.buckets) {
        (None, _) => {
            let bucket = match p.trainer_bucket() {
                0 => f64::INFINITY,
                b => b as f64,
            };
            // the busiest stage holds the vocabulary table unless it is an inner one, and the
            // final norm after its blocks if it is the last
            let table = pp == 1 || first_p.max(last_p) >= mid_p;
            let head = pp == 1 || last_p >= first_p.max(mid_p);
            let trailing = if head { m.norm_params() as f64 } else { 0.0 };
            trainer_buckets(st.max(), block_p, trailing, params_dev, bucket, table)
        }
        // one bucket when the reduction waits for backward (Megatron-LM without the overlap)
        (Some(_), _) if !red.overlapped => (1.0, 1.0),
        (Some(_), GradBuckets::Params(bucket)) => {
            ((bucket / params_dev).min(1.0), (params_dev / bucket).ceil().max(1.0))
        }
        (Some(_), GradBuckets::Units) => {
            // the busiest stage's first block, and the embedding where that stage holds it
            let holds_embedding = pp == 1 || first_p >= last_p.max(mid_p);
            let left = block_p
                + if holds_embedding {
                    memory::embedding_params(m, p)
                } else {
                    0.0
                };
            // a unit per block, the embedding's and the head's
            ((left / params_dev).min(1.0), st.max() as f64 + 2.0)
        }
    };
    // a reduction (or gather) of `bytes` over the data-parallel group, run bucket by bucket
    let bucketed =
        |collective: fn(f64, u32, comm::Link) -> f64, bytes: f64| buckets * collective(bytes / buckets, dp, dp_link);
    let hide = |t: f64, window: f64| {
        if red.overlapped {
            (t - window).max(t * tail)
        } else {
            t
        }
    };
    let gather_hides = c.stack.framework.is_some() && red.gather_hidden;
    let hide_gather = |t: f64, window: f64| if gather_hides { hide(t, window) } else { t };
    let dpf = dp as f64;
    let ring_bytes = |full: f64| {
        if dp > 1 {
            (dpf - 1.0) / dpf * full
        } else {
            0.0
        }
    };
    let (dp_comm, dp_bytes) = match p.zero {
        0 => (
            hide(bucketed(comm::all_reduce, grad_bytes), bwd_mb),
            2.0 * ring_bytes(grad_bytes),
        ),
        1 if red.all_reduce => (
            // DeepSpeed's BF16_Optimizer: the whole fp32 sum on every rank, then the gather
            hide(bucketed(comm::all_reduce, grad_bytes), bwd_mb)
                + hide_gather(bucketed(comm::all_gather, weight_bytes), fwd_mb),
            2.0 * ring_bytes(grad_bytes) + ring_bytes(weight_bytes),
        ),
        1 => (
            hide(bucketed(comm::reduce_scatter, grad_bytes), bwd_mb)
                + hide_gather(bucketed(comm::all_gather, weight_bytes), fwd_mb),
            ring_bytes(grad_bytes) + ring_bytes(weight_bytes),
        ),
        2 => (
            mbf * hide(bucketed(comm::reduce_scatter, grad_bytes), bwd_mb)
                + hide_gather(bucketed(comm::all_gather, weight_bytes), fwd_mb),
            mbf * ring_bytes(grad_bytes) + ring_bytes(weight_bytes),
        ),
        _ => {
            // ZeRO-3 / FSDP gathers each block's weights before its forward and its backward, and
            // reduce-scatters its gradients after: 3 collectives per block per microbatch. With
            // overlap each block's collectives are prefetched one block ahead, so they hide
            // behind that block's compute only: a block whose collectives take longer than its
            // compute exposes the difference, and the first gather of each pass is exposed.
            let gather = comm::all_gather(weight_bytes / blocks, dp, dp_link);
            let per_blk_comm = 2.0 * gather + comm::reduce_scatter(grad_bytes / blocks, dp, dp_link);
            let per_blk_compute = (stage_c + stage_tp) / blocks;
            let per_mb = if red.overlapped {
                blocks * (per_blk_comm - per_blk_compute).max(0.0) + 2.0 * gather
            } else {
                blocks * per_blk_comm
            };
            // the framework's own copies around the collectives (FSDP2's copy-out and
            // reduce-scatter copy-in), on the compute stream
            let copies = c
                .stack
                .framework
                .map_or(0.0, |f| d.stream(params_dev * f.zero3_copy_bytes_per_param(p.dtype)));
            (
                mbf * (per_mb + copies),
                mbf * (2.0 * ring_bytes(weight_bytes) + ring_bytes(grad_bytes)),
            )
        }
    };
    // The tied embedding's gradient, all-reduced between the first and the last stage (pp > 1)
    // after the data-parallel reduction (Megatron's embedding-grads all-reduce of the gradient
    // buffer, DeepSpeed's `_exec_reduce_tied_grads` of the fp32 one), in the stack's gradient
    // wire dtype; its bytes are not data-parallel bytes, so only its time is added.
    let dp_comm = if pp > 1 && m.tied_embeddings {
        let emb = m.padded_vocab as f64 * m.hidden as f64 / tp as f64 * red.grad_wire_bytes;
        dp_comm + comm::all_reduce(emb, 2, group_link(c, 2, p.stride(Dim::Pp) * (pp - 1)))
    } else {
        dp_comm
    };
    let opt_params = if p.zero >= 1 { params_dev / dpf } else { params_dev };
    // Adam's update of the parameters this rank updates, and the framework's passes around it
    // (the gradient norm, the copy into the training-dtype weights, the zeroed gradient buffer);
    // the trainer (no framework) is priced by its update alone
    let (per_updated, per_held) = c
        .stack
        .framework
        .map_or((0.0, 0.0), |f| f.optimizer_pass_bytes(p, &c.stack));
    let optimizer = d.stream(opt_params * (28.0 + e + per_updated) + params_dev * per_held);

    let time_s = Times {
        compute: mbf * stage_c,
        tp_comm: mbf * stage_tp,
        pp_comm,
        cp_comm: mbf * stage_cp,
        dp_comm,
        bubble,
        optimizer,
    };
    let step = time_s.total();

    // --- memory: the first and the last stage, whichever holds more
    let shard = |x: f64, from: u8| if p.zero >= from { x / dpf } else { x };
    let act_block = memory::block_activations(m, p);
    let working = if p.recompute == Recompute::Full {
        memory::block_activations(
            m,
            &ParallelConfig {
                recompute: Recompute::None,
                ..*p
            },
        )
    } else {
        0.0
    };
    // the ring's transient buffers in one block's backward: the key/value chunk being received
    // and the one being used, and their gradients' two
    let working = working + if cpn > 1 { 4.0 * kv_chunk } else { 0.0 };

    let sp = if p.sequence_parallel { tp as f64 } else { 1.0 };
    let mask = if m.dropout { 1.0 } else { 0.0 };
    // the fp32 logits the loss keeps, of one of the framework's loss chunks
    let loss_chunks = c.stack.framework.map_or(1.0, |f| f.loss_chunks());
    let logits = tokens * m.padded_vocab as f64 / tp as f64 * 4.0 / loss_chunks;
    // the gradient buffer as the framework keeps it; the trainer (no framework) accumulates
    // into fp32 gradients in both precisions
    let grad_store = c.stack.framework.map_or(4.0, |f| f.grad_store_bytes(p, &c.stack));
    let stage_memory = |params: f64, rank: u32, first: bool, last: bool| {
        let chunks = memory::chunks_in_flight(p, rank);
        let blocks_per_chunk = st.of(rank) as f64 / v;
        let mut act = act_block * blocks_per_chunk * chunks + working;
        if first {
            act += tokens * m.hidden as f64 * mask / sp * chunks / v;
        }
        if last {
            // the softmax over the logits, and the final norm's input and output (the head's
            // GEMM input)
            act += logits + 2.0 * tokens * m.hidden as f64 * e / sp;
        }
        if pp > 1 {
            // every in-flight chunk that does not start with the embedding keeps the activation
            // it received from the previous stage (Megatron's input_tensors)
            let received = chunks - if first { chunks / v } else { 0.0 };
            act += tokens * m.hidden as f64 * e / sp * received;
        }
        // Transformer Engine keeps each FP8 linear weight and its transpose (1 byte each) for
        // the whole step
        let fp8_copies = if p.fp8 {
            2.0 * st.of(rank) as f64 * m.layer_matrix_params() as f64 / tp as f64
        } else {
            0.0
        };
        let weights = shard(params * e, 3) + fp8_copies;
        let grads = shard(params * grad_store, 2);
        let optimizer = shard(params * p.dtype.optimizer_bytes(), 1);
        let prefetch = if p.zero >= 3 { 2.0 * params / blocks * e } else { 0.0 };
        let tensors = weights + grads + optimizer + act;
        let other = c.reserved_gib * (1u64 << 30) as f64 + prefetch + c.fragmentation * tensors;
        Memory {
            weights,
            grads,
            optimizer,
            activations: act,
            other,
            total: tensors + other,
        }
    };
    let first_mem = stage_memory(first_p, 0, true, pp == 1);
    let memory_bytes = if pp == 1 {
        first_mem
    } else {
        let last_mem = stage_memory(last_p, pp - 1, false, true);
        let mut worst = if last_mem.total > first_mem.total {
            last_mem
        } else {
            first_mem
        };
        // uneven stages: the first inner stage (the most microbatches in flight after stage 0)
        if pp > 2 && !st.even() {
            let mid_mem = stage_memory(mid_p, 1, false, false);
            if mid_mem.total > worst.total {
                worst = mid_mem;
            }
        }
        worst
    };
    let capacity = c.capacity_bytes();

    let gpus = p.gpus() as f64;
    let model_flops = flops::model_step(m, p.global_batch);
    let hw_flops = flops::hardware_step(m, p.global_batch, p.recompute);
    let tflops = model_flops / step / gpus / 1e12;
    let hfu_tflops = hw_flops / step / gpus / 1e12;
    let peak = d.peak / 1e12;
    Ok(Plan {
        fits: memory_bytes.total <= capacity,
        memory_bytes,
        capacity_bytes: capacity,
        headroom_bytes: capacity - memory_bytes.total,
        step_time_s: step,
        time_s,
        tokens_per_s: p.global_batch as f64 * m.seq_len as f64 / step,
        tflops_per_gpu: tflops,
        hfu_tflops_per_gpu: hfu_tflops,
        mfu: tflops / peak,
        hfu: hfu_tflops / peak,
        microbatches: mb,
        params: m.params() as f64,
        model_flops_per_step: model_flops,
        hardware_flops_per_step: hw_flops,
        comm_bytes: CommBytes {
            tp: tp_bytes,
            pp: pp_bytes,
            dp: dp_bytes,
            cp: mbf * blocks * cp_bytes_block,
        },
    })
}
