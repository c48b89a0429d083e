//! What a framework's stack changes in the price of a layout: its selective recomputation,
//! its loss and its softmax (`Framework::selective_recompute`, `Framework::loss_bytes_per_logit`,
//! `Framework::fused_softmax_fits`).

use exatrain_spec::{presets, ParallelConfig, Recompute};

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

/// Selective recomputation is what each framework's exported option recomputes: Megatron's
/// `--recompute-granularity selective` redoes only the attention core (nothing with flash),
/// torchtitan's op-level SelectiveAC every other matmul and every element-wise op.
#[test]
fn selective_recomputation_is_the_frameworks_own() {
    use exatrain_cost::compute::{block_forward, block_train, Device};
    use exatrain_spec::{Dtype, Framework};
    let lm = presets::cluster("dgx-h100").unwrap();
    let tt = lm.for_framework(Framework::Torchtitan);
    let m = presets::model("llama3-8b").unwrap();
    let flash = ParallelConfig {
        flash_attention: true,
        recompute: Recompute::Selective,
        ..ParallelConfig::new(1, 1, 8, 1, 8)
    };
    let none = ParallelConfig {
        recompute: Recompute::None,
        ..flash
    };
    let (dl, dt) = (Device::new(&lm, Dtype::Bf16), Device::new(&tt, Dtype::Bf16));
    // Megatron-LM with flash attention: selective costs nothing
    assert_eq!(block_train(&m, &flash, &dl), block_train(&m, &none, &dl));
    // torchtitan: wk, wo and w3 (every other matmul in call order) and all element-wise ops
    // again; llama3-8b: (1024 + 4096 + 14336) of (4096 + 2·1024 + 4096 + 3·14336) columns
    let share = Framework::Torchtitan.selective_recompute(&m).gemm;
    assert!(close(share, 19456.0 / 53248.0, 1e-12), "{share}");
    let f = block_forward(&m, &flash, &dt);
    let extra = block_train(&m, &flash, &dt) - block_train(&m, &none, &dt);
    assert!(close(extra, share * f.gemm + f.elementwise, 1e-12), "{extra}");
    // without flash, Megatron's selective redoes exactly the core
    let unfused = ParallelConfig {
        flash_attention: false,
        ..flash
    };
    let g = block_forward(&m, &unfused, &dl);
    let extra = block_train(&m, &unfused, &dl)
        - block_train(
            &m,
            &ParallelConfig {
                recompute: Recompute::None,
                ..unfused
            },
            &dl,
        );
    assert!(close(extra, g.core, 1e-12));
}

#[test]
fn the_loss_is_priced_as_each_stack_computes_it() {
    use exatrain_cost::compute::{head_train, Device};
    use exatrain_spec::{Dtype, Framework};
    let mut lm = presets::cluster("dgx-h100").unwrap();
    // the trainer's TP collectives block; Megatron's backward ones overlap (priced apart)
    lm.stack.async_tp = false;
    let mut trainer = lm.clone();
    trainer.stack.framework = None;
    let m = presets::model("llama3-8b").unwrap();
    let p = ParallelConfig::new(2, 1, 4, 1, 8);
    let logits = p.micro_batch as f64 * m.seq_len as f64 * m.padded_vocab as f64 / p.tp as f64;
    let (dl, dt) = (Device::new(&lm, Dtype::Bf16), Device::new(&trainer, Dtype::Bf16));
    // Megatron's unfused fp32 cross-entropy moves 52 bytes per bf16 logit, the trainer's fused
    // classifier 12: the head differs by exactly the 40 bytes' streaming time
    assert_eq!(Framework::MegatronLm.loss_bytes_per_logit(Dtype::Bf16), 52.0);
    assert_eq!(Framework::Torchtitan.loss_bytes_per_logit(Dtype::Fp32), 40.0);
    let extra = head_train(&m, &p, &dl) - head_train(&m, &p, &dt);
    assert!(close(extra, dl.stream(40.0 * logits), 1e-9), "{extra}");
    // and it shows in the plan: a large-vocabulary model on one stage runs slower under the stack
    let slow = exatrain_cost::plan(&m, &lm, &p).unwrap().time_s.total();
    let fast = exatrain_cost::plan(&m, &trainer, &p).unwrap().time_s.total();
    assert!(slow > fast, "{slow} vs {fast}");
}

/// FSDP2 (torchtitan's ZeRO-3) copies each gathered parameter out twice and each gradient into
/// the fp32 reduce-scatter input: 14 bytes per bf16 parameter per microbatch, exposed on the
/// compute stream, so they scale with HBM bandwidth while the hidden collectives do not.
#[test]
fn fsdp2_pays_for_its_copies_and_megatron_fsdp_does_not() {
    use exatrain_cost::compute::Device;
    use exatrain_spec::{Dtype, Framework};
    assert_eq!(Framework::Torchtitan.zero3_copy_bytes_per_param(Dtype::Bf16), 14.0);
    assert_eq!(Framework::MegatronLm.zero3_copy_bytes_per_param(Dtype::Bf16), 0.0);
    let m = presets::model("llama3-8b").unwrap();
    let p = ParallelConfig {
        zero: 3,
        flash_attention: true,
        ..ParallelConfig::new(1, 1, 8, 1, 8)
    };
    let dp_comm = |c: &exatrain_spec::ClusterSpec| exatrain_cost::plan(&m, c, &p).unwrap();
    let tt = presets::cluster("dgx-h100")
        .unwrap()
        .for_framework(Framework::Torchtitan);
    let mut fast = tt.clone();
    fast.device.hbm_gbps *= 2.0;
    let (slow_plan, fast_plan) = (dp_comm(&tt), dp_comm(&fast));
    // one node, one microbatch: the collectives hide behind each block, so the difference is
    // exactly the copies' time at the two bandwidths
    let bytes = slow_plan.params * 14.0;
    let want = Device::new(&tt, Dtype::Bf16).stream(bytes) - Device::new(&fast, Dtype::Bf16).stream(bytes);
    let got = slow_plan.time_s.dp_comm - fast_plan.time_s.dp_comm;
    assert!(close(got, want, 1e-9), "{got} vs {want}");
    // Megatron-FSDP's parameters are views of its buffer: the same change moves nothing there
    let lm = presets::cluster("dgx-h100").unwrap();
    let mut lm_fast = lm.clone();
    lm_fast.device.hbm_gbps *= 2.0;
    let d = dp_comm(&lm).time_s.dp_comm - dp_comm(&lm_fast).time_s.dp_comm;
    assert!(d.abs() < 1e-12, "{d}");
}

/// Without flash attention the softmax is one fused kernel where the stack has it and the
/// layout fits its constraints (Megatron's `FusedScaleMaskSoftmax`: s ≤ 4096, micro-batch ×
/// heads per rank divisible by 4); otherwise the scale, mask and softmax are separate passes:
/// 6 more bytes per bf16 score forward (3 read-write passes) and 4 backward.
#[test]
fn the_softmax_is_fused_only_where_the_stack_and_the_kernel_allow() {
    use exatrain_cost::compute::{block_forward, block_train, Device};
    use exatrain_spec::{Dtype, Framework};
    let lm = presets::cluster("selene").unwrap();
    let mut old = lm.clone();
    old.stack.fused_softmax = false;
    let mut m = presets::model("gpt-22b").unwrap(); // 48 heads
    let p = ParallelConfig::new(8, 1, 1, 2, 2); // 6 heads per rank, 12 batches: fits
    let (dl, dold) = (Device::new(&lm, Dtype::Bf16), Device::new(&old, Dtype::Bf16));
    let scores = 2.0 * 6.0 * (m.seq_len as f64).powi(2);
    let fused = block_forward(&m, &p, &dl);
    let unfused = block_forward(&m, &p, &dold);
    assert!(close(unfused.core - fused.core, dl.stream(6.0 * 2.0 * scores), 1e-9));
    assert!(close(
        unfused.core_bwd - fused.core_bwd,
        dl.stream(4.0 * 2.0 * scores),
        1e-9
    ));
    assert!(close(
        block_train(&m, &p, &dold) - block_train(&m, &p, &dl),
        dl.stream(10.0 * 2.0 * scores),
        1e-9
    ));
    // micro-batch 1 × 6 heads per rank = 6 batches, not a multiple of 4: Megatron's kernel
    // declines and the chain runs, while torchtitan's SDPA and the trainer's kernel take it
    let odd = ParallelConfig::new(8, 1, 1, 1, 1);
    assert!(!Framework::MegatronLm.fused_softmax_fits(&m, &odd));
    assert!(Framework::Torchtitan.fused_softmax_fits(&m, &odd));
    let dold1 = block_forward(&m, &odd, &dold);
    assert_eq!(block_forward(&m, &odd, &dl), dold1);
    let mut trainer = lm.clone();
    trainer.stack.framework = None;
    assert!(block_forward(&m, &odd, &Device::new(&trainer, Dtype::Bf16)).core < dold1.core);
    // a sequence longer than the kernel takes declines too: Megatron-DeepSpeed's 4096,
    // Transformer Engine's (Megatron-LM) 16384; flash attention has no softmax pass
    m.seq_len = 8192;
    assert!(Framework::MegatronLm.fused_softmax_fits(&m, &p));
    assert!(!Framework::MegatronDeepspeed.fused_softmax_fits(&m, &p));
    let ds = lm.for_framework(Framework::MegatronDeepspeed);
    let mut ds_old = ds.clone();
    ds_old.stack.fused_softmax = false;
    let (dds, dds_old) = (Device::new(&ds, Dtype::Bf16), Device::new(&ds_old, Dtype::Bf16));
    assert_eq!(block_forward(&m, &p, &dds), block_forward(&m, &p, &dds_old));
    m.seq_len = 16384;
    assert!(!Framework::MegatronLm.fused_softmax_fits(&m, &p));
    assert_eq!(block_forward(&m, &p, &dl), block_forward(&m, &p, &dold));
    let flash = ParallelConfig {
        flash_attention: true,
        ..p
    };
    assert_eq!(block_forward(&m, &flash, &dl), block_forward(&m, &flash, &dold));
}

/// DeepSpeed's `BF16_Optimizer` zeroes, accumulates and adds each microbatch's bf16 gradients
/// into fp32 after every backward: 26 bytes per parameter of the stage per microbatch on the
/// compute stream. Megatron-LM's weight-gradient GEMMs accumulate into `main_grad` themselves.
#[test]
fn bf16_optimizer_accumulation_passes_are_priced_per_microbatch() {
    use exatrain_cost::compute::Device;
    use exatrain_spec::{Dtype, Framework};
    let lm = presets::cluster("jean-zay")
        .unwrap()
        .for_framework(Framework::MegatronLm);
    let ds = lm.for_framework(Framework::MegatronDeepspeed);
    let m = presets::model("gpt-22b").unwrap();
    let zero1 = ParallelConfig {
        zero: 1,
        ..ParallelConfig::new(8, 1, 1, 1, 4)
    };
    let zero2 = ParallelConfig { zero: 2, ..zero1 };
    assert_eq!(Framework::MegatronDeepspeed.grad_accum_bytes_per_param(&zero1), 26.0);
    assert_eq!(Framework::MegatronDeepspeed.grad_accum_bytes_per_param(&zero2), 0.0);
    assert_eq!(Framework::MegatronLm.grad_accum_bytes_per_param(&zero1), 0.0);
    let compute =
        |c: &exatrain_spec::ClusterSpec, p: &ParallelConfig| exatrain_cost::plan(&m, c, p).unwrap().time_s.compute;
    let st = zero1.stage_layers(&m).unwrap();
    let params = exatrain_cost::memory::stage_params(&m, &zero1, &st).0;
    let d = Device::new(&ds, Dtype::Bf16);
    // 4 microbatches, each followed by the passes over the whole model (one stage)
    let extra = compute(&ds, &zero1) - compute(&ds, &zero2);
    assert!(close(extra, 4.0 * d.stream(26.0 * params), 1e-9), "{extra}");
    assert_eq!(compute(&lm, &zero1), compute(&lm, &zero2));
}

/// torchtitan's eager Llama code moves more element-wise bytes than the fused kernels priced for
/// every stack: the complex-fp32 rotary embedding, the attention output's contiguous copy and
/// SiLU apart from the gate's multiply.
#[test]
fn torchtitans_eager_elementwise_passes_are_priced() {
    use exatrain_cost::compute::{block_forward, Device};
    use exatrain_spec::{Dtype, Framework};
    let lm = presets::cluster("selene").unwrap();
    let tt = lm.for_framework(Framework::Torchtitan);
    let (dl, dt) = (Device::new(&lm, Dtype::Bf16), Device::new(&tt, Dtype::Bf16));
    let p = ParallelConfig {
        flash_attention: true,
        ..ParallelConfig::new(1, 1, 8, 1, 8)
    };
    // llama3-8b (q 4096, kv 1024, ffn 14336), bf16: rope 16 · 5120 + transpose 2 · 2 · 4096
    // + gate 2 · 2 · 14336 = 155 648 bytes per token
    let m = presets::model("llama3-8b").unwrap();
    assert_eq!(
        Framework::Torchtitan.eager_elementwise_bytes_per_token(&m, &p),
        155_648.0
    );
    assert_eq!(Framework::MegatronLm.eager_elementwise_bytes_per_token(&m, &p), 0.0);
    let tokens = m.seq_len as f64;
    let extra = block_forward(&m, &p, &dt).elementwise - block_forward(&m, &p, &dl).elementwise;
    assert!(close(extra, dl.stream(155_648.0 * tokens), 1e-9), "{extra}");
    // a GPT block (learned positions, MHA, GELU) keeps only the output copy
    let g = presets::model("gpt-22b").unwrap();
    assert_eq!(
        Framework::Torchtitan.eager_elementwise_bytes_per_token(&g, &p),
        2.0 * 2.0 * g.q_dim() as f64
    );
}

/// Megatron's asynchronous TP communication hides the two column-parallel linears' backward
/// input-gradient collectives under their weight-gradient GEMMs (and, with sequence parallelism,
/// the input re-gathers under the data-gradient GEMMs); torchtitan and the trainer block.
#[test]
fn backward_tp_collectives_hide_under_the_column_parallel_gemms() {
    use exatrain_cost::comm::{all_gather, all_reduce, group_link, reduce_scatter};
    use exatrain_cost::compute::{block_forward, Device};
    use exatrain_spec::{Dtype, Framework};
    let lm = presets::cluster("selene").unwrap();
    let mut blocking = lm.clone();
    blocking.stack.async_tp = false;
    let m = presets::model("gpt-175b").unwrap();
    // tp 8 on one node, 4 microbatches of one sequence, every block on one stage
    let p = ParallelConfig::new(8, 1, 1, 1, 4);
    let times = |c: &exatrain_spec::ClusterSpec, p: &ParallelConfig| exatrain_cost::plan(&m, c, p).unwrap().time_s;
    let link = group_link(&lm, 8, 1);
    let act = m.seq_len as f64 * m.hidden as f64 * 2.0;
    let [qkv, up] = block_forward(&m, &p, &Device::new(&lm, Dtype::Bf16)).column_gemms;
    let ar = all_reduce(act, 8, link);
    // at this size each GEMM outlasts its collective: the whole collective hides
    assert!(ar < qkv && ar < up, "{ar} {qkv} {up}");
    let blocks = 4.0 * m.layers as f64;
    let (a, b) = (times(&lm, &p), times(&blocking, &p));
    assert!(
        close(b.tp_comm - a.tp_comm, blocks * 2.0 * ar, 1e-9),
        "{} {}",
        a.tp_comm,
        b.tp_comm
    );
    assert_eq!(a.compute, b.compute);
    // with SP: the two reduce-scatters and the two re-gathers
    let sp = ParallelConfig {
        sequence_parallel: true,
        ..p
    };
    let hidden = 2.0 * reduce_scatter(act, 8, link) + 2.0 * all_gather(act, 8, link);
    let (a, b) = (times(&lm, &sp), times(&blocking, &sp));
    assert!(close(b.tp_comm - a.tp_comm, blocks * hidden, 1e-9));
    // torchtitan and the trainer (no framework) do not overlap them
    for (fw, name) in [(Some(Framework::Torchtitan), "torchtitan"), (None, "trainer")] {
        let (mut on, mut off) = (lm.clone(), blocking.clone());
        on.stack.framework = fw;
        off.stack.framework = fw;
        assert_eq!(times(&on, &p).tp_comm, times(&off, &p).tp_comm, "{name}");
    }
    // Megatron-DeepSpeed turns the all-reduce's overlap off under DeepSpeed; its sequence-
    // parallel path overlaps regardless
    let (mut on, mut off) = (lm.clone(), blocking.clone());
    on.stack.framework = Some(Framework::MegatronDeepspeed);
    off.stack.framework = Some(Framework::MegatronDeepspeed);
    assert_eq!(times(&on, &p).tp_comm, times(&off, &p).tp_comm);
    assert!(close(
        times(&off, &sp).tp_comm - times(&on, &sp).tp_comm,
        blocks * hidden,
        1e-9
    ));
    // --tp-comm-overlap prices its own overlap; the flag changes nothing there
    let tpo = ParallelConfig { overlap_tp: true, ..sp };
    assert_eq!(times(&lm, &tpo).tp_comm, times(&blocking, &tpo).tp_comm);
}

/// Without Megatron's bias fusions (Megatron-LM of 2019) every bias is a read-write pass of its
/// own — the QKV and up projections' outputs and the two residual sites after the row-parallel
/// reductions — and each dropout runs apart from its residual add: exactly those bytes more.
#[test]
fn unfused_biases_and_dropouts_are_passes_of_their_own() {
    use exatrain_cost::compute::{block_forward, Device};
    use exatrain_spec::Dtype;
    let fused = presets::cluster("selene").unwrap();
    let mut unfused = fused.clone();
    unfused.stack.bias_fusion = false;
    let m = presets::model("gpt-22b").unwrap();
    assert!(m.bias && m.dropout);
    let p = ParallelConfig::new(8, 1, 1, 2, 8);
    let (df, du) = (Device::new(&fused, Dtype::Bf16), Device::new(&unfused, Dtype::Bf16));
    let (a, b) = (block_forward(&m, &p, &df), block_forward(&m, &p, &du));
    let tokens = 2.0 * m.seq_len as f64;
    let h = m.hidden as f64;
    // per token: QKV (3h/t) and up (4h/t) bias passes, two residual-site bias passes and two
    // dropout passes over h (no sequence parallelism), each a read and a write of 2 bytes
    let bytes = tokens * 4.0 * (7.0 * h / 8.0 + 2.0 * h + 2.0 * h);
    assert!(close(b.elementwise - a.elementwise, df.stream(bytes), 1e-9));
    assert_eq!((a.gemm, a.core), (b.gemm, b.core));
    // sequence parallelism shards the residual sites' passes, not the column outputs'
    let sp = ParallelConfig {
        sequence_parallel: true,
        ..p
    };
    let extra = block_forward(&m, &sp, &du).elementwise - block_forward(&m, &sp, &df).elementwise;
    let bytes = tokens * 4.0 * (7.0 * h / 8.0 + 4.0 * h / 8.0);
    assert!(close(extra, df.stream(bytes), 1e-9));
}

/// Megatron-LM's interleaved schedule overlaps each pipeline send with the next chunk's compute
/// (`overlap_p2p_comm`): only the fill's and the drain's sends are exposed while a send is
/// shorter than a forward chunk. Without interleaving, with the 2021-2022 code, and for the
/// trainer and DeepSpeed's pipeline engine every send blocks.
#[test]
fn interleaved_pipeline_sends_hide_under_the_next_chunk() {
    use exatrain_cost::comm::{group_link, send_recv};
    use exatrain_spec::{Dim, Framework};
    let lm = presets::cluster("dgx-h100").unwrap();
    assert_eq!(lm.stack.framework, Some(Framework::MegatronLm));
    let mut blocking = lm.clone();
    blocking.stack.overlap_p2p = false;
    let m = presets::model("llama2-70b").unwrap();
    // tp 4 · pp 4 · dp 4, 32 microbatches, 20 chunks per stage (NeMo's Llama 2 70B layout)
    let p = ParallelConfig {
        sequence_parallel: true,
        virtual_stages: 20,
        ..ParallelConfig::new(4, 4, 4, 1, 128)
    };
    let times = |c: &exatrain_spec::ClusterSpec, p: &ParallelConfig| exatrain_cost::plan(&m, c, p).unwrap().time_s;
    let (a, b) = (times(&lm, &p), times(&blocking, &p));
    let send = send_recv(
        m.seq_len as f64 * m.hidden as f64 * 2.0 / 4.0,
        group_link(&lm, 4, p.stride(Dim::Pp)),
    );
    // blocking: each of 2 v sends per microbatch waits
    assert!(close(b.pp_comm, 2.0 * 20.0 * 32.0 * send, 1e-9), "{} {send}", b.pp_comm);
    // overlapped: the fill and the drain, 2 (pp - 1) sends
    assert!(close(a.pp_comm, 2.0 * 3.0 * send, 1e-9), "{} {send}", a.pp_comm);
    assert_eq!(a.compute, b.compute);
    // no interleaving: Megatron-LM turns the overlap off, every send waits
    let flat = ParallelConfig { virtual_stages: 1, ..p };
    let (a, b) = (times(&lm, &flat), times(&blocking, &flat));
    assert_eq!(a.pp_comm, b.pp_comm);
    // DeepSpeed's pipeline engine and the trainer (no framework) block
    for fw in [Some(Framework::MegatronDeepspeed), None] {
        let mut c = lm.clone();
        c.stack.framework = fw;
        let t = times(&c, &p);
        assert!(
            close(t.pp_comm, 2.0 * 20.0 * 32.0 * send, 1e-9),
            "{fw:?}: {}",
            t.pp_comm
        );
    }
}
