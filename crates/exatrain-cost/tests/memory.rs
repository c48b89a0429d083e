//! Memory: activations per block (Korthikanti et al. 2022), microbatches in flight per pipeline
//! rank, and model-state bytes by ZeRO stage and framework.

use exatrain_cost::{memory, plan};
use exatrain_spec::{presets, ParallelConfig, Recompute};

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

/// Korthikanti et al. 2022, Table 2, for a GPT block (16-bit, dropout): bytes per block.
#[test]
fn korthikanti_activation_bytes_per_block() {
    let m = presets::model("gpt-175b").unwrap();
    let (s, b, h, a) = (2048.0, 2.0, 12288.0, 96.0);
    let sbh = s * b * h;
    for t in [1u32, 2, 4, 8] {
        let tf = t as f64;
        let base = ParallelConfig {
            tp: t,
            dp: 1,
            ..ParallelConfig::new(t, 1, 1, 2, 2)
        };
        let none = memory::block_activations(&m, &base);
        assert!(
            close(none, sbh * (10.0 + 24.0 / tf + 5.0 * a * s / (h * tf)), 1e-12),
            "tp {t}"
        );
        if t > 1 {
            let sp = ParallelConfig {
                sequence_parallel: true,
                ..base
            };
            let v = memory::block_activations(&m, &sp);
            assert!(close(v, sbh / tf * (34.0 + 5.0 * a * s / h), 1e-12), "tp {t} sp");
            let sel = ParallelConfig {
                recompute: Recompute::Selective,
                ..sp
            };
            assert!(close(memory::block_activations(&m, &sel), sbh * 34.0 / tf, 1e-12));
            let full = ParallelConfig {
                recompute: Recompute::Full,
                ..sp
            };
            assert!(close(memory::block_activations(&m, &full), 2.0 * sbh / tf, 1e-12));
        }
        let sel = ParallelConfig {
            recompute: Recompute::Selective,
            ..base
        };
        assert!(close(
            memory::block_activations(&m, &sel),
            sbh * (10.0 + 24.0 / tf),
            1e-12
        ));
    }
}

#[test]
fn pipeline_in_flight_microbatches() {
    // 1F1B: rank r holds min(m, p - r); interleaved: p·v + p - 1 chunks on rank 0 (Megatron warm-up + 1)
    let c = ParallelConfig::new(1, 4, 1, 1, 16);
    assert_eq!(memory::chunks_in_flight(&c, 0), 4.0);
    assert_eq!(memory::chunks_in_flight(&c, 3), 1.0);
    let few = ParallelConfig::new(1, 4, 1, 1, 2);
    assert_eq!(memory::chunks_in_flight(&few, 0), 2.0);
    let v = ParallelConfig { virtual_stages: 2, ..c };
    assert_eq!(memory::chunks_in_flight(&v, 0), 4.0 * 2.0 + 3.0);
    // Korthikanti: interleaving stores L·(1 + (p-1)/(p·v)) blocks on rank 0
    let blocks_per_chunk = 48.0 / (4.0 * 2.0);
    assert_eq!(
        blocks_per_chunk * memory::chunks_in_flight(&v, 0),
        48.0 * (1.0 + 3.0 / 8.0)
    );
}

#[test]
fn model_state_bytes_by_zero_stage() {
    use exatrain_spec::Framework;
    let m = presets::model("mlm21-7.5b").unwrap();
    let n = m.params() as f64;
    // bf16 weights, fp32 master weights + Adam moments (12 bytes), and the gradient buffer as
    // each framework keeps it: Megatron-LM's main_grad in bf16 under the exported
    // --grad-reduce-in-bf16 (2 + 2 + 12 bytes), DeepSpeed's and FSDP2's in fp32 (2 + 4 + 12, as
    // Megatron-LM's distributed-optimizer table counts its fp32 default); sharded by stage
    for (fw, grad) in [
        (Framework::MegatronLm, 2.0),
        (Framework::MegatronDeepspeed, 4.0),
        (Framework::Torchtitan, 4.0),
    ] {
        let c = presets::cluster("selene").unwrap().for_framework(fw);
        let mut prev = f64::INFINITY;
        for zero in 0..=3u8 {
            let cfg = ParallelConfig {
                zero,
                ..ParallelConfig::new(1, 1, 8, 1, 64)
            };
            let p = plan(&m, &c, &cfg).unwrap();
            let mb = p.memory_bytes;
            let (w, g, o) = match zero {
                0 => (2.0 * n, grad * n, 12.0 * n),
                1 => (2.0 * n, grad * n, 12.0 * n / 8.0),
                2 => (2.0 * n, grad * n / 8.0, 12.0 * n / 8.0),
                _ => (2.0 * n / 8.0, grad * n / 8.0, 12.0 * n / 8.0),
            };
            assert!(
                close(mb.weights, w, 1e-12) && close(mb.grads, g, 1e-12) && close(mb.optimizer, o, 1e-12),
                "{fw} zero {zero}: {} {}",
                mb.grads,
                g
            );
            assert!(mb.weights + mb.grads + mb.optimizer < prev);
            prev = mb.weights + mb.grads + mb.optimizer;
            assert!(close(
                mb.total,
                mb.weights + mb.grads + mb.optimizer + mb.activations + mb.other,
                1e-12
            ));
        }
    }
    // fp32 training (and the trainer, which runs it) keeps fp32 gradients under Megatron-LM too
    let c = presets::cluster("selene").unwrap();
    let fp32 = ParallelConfig {
        dtype: exatrain_spec::Dtype::Fp32,
        ..ParallelConfig::new(1, 1, 8, 1, 64)
    };
    assert!(close(plan(&m, &c, &fp32).unwrap().memory_bytes.grads, 4.0 * n, 1e-12));
    // the trainer (a cluster of no framework) accumulates into fp32 gradients in bf16 as well
    let mut trainer = c.clone();
    trainer.stack.framework = None;
    let bf16 = ParallelConfig::new(1, 1, 8, 1, 64);
    assert!(close(
        plan(&m, &trainer, &bf16).unwrap().memory_bytes.grads,
        4.0 * n,
        1e-12
    ));
    // without data parallelism Megatron-LM's export passes no --grad-reduce-in-bf16: fp32
    let one = ParallelConfig::new(8, 1, 1, 1, 64);
    let g = plan(&m, &c, &one).unwrap().memory_bytes.grads;
    assert!(close(g, 4.0 * n / 8.0, 0.01), "{g}");
    // a Megatron-LM run without the flag (`StackSpec::grad_reduce_bf16` false, as a log's
    // arguments say): fp32 main_grad, and twice the reduce-scatter bytes on the wire
    let mut fp32_reduce = c.clone();
    fp32_reduce.stack.grad_reduce_bf16 = false;
    let zero1 = ParallelConfig {
        zero: 1,
        overlap_dp: false,
        ..ParallelConfig::new(1, 1, 8, 1, 64)
    };
    let (a, b) = (plan(&m, &c, &zero1).unwrap(), plan(&m, &fp32_reduce, &zero1).unwrap());
    assert!(close(a.memory_bytes.grads, 2.0 * n, 1e-12) && close(b.memory_bytes.grads, 4.0 * n, 1e-12));
    // reduce-scatter of the gradients and all-gather of the bf16 weights: 2 + 2 → 4 + 2 bytes
    assert!(
        close(b.comm_bytes.dp / a.comm_bytes.dp, 1.5, 1e-9),
        "{:?} {:?}",
        a.comm_bytes,
        b.comm_bytes
    );
}

#[test]
fn torchtitan_keeps_one_loss_chunk_of_logits() {
    use exatrain_spec::Framework;
    // torchtitan's ChunkedLossWrapper runs the head and the loss on 1/8 of the tokens at a
    // time: the last stage keeps 1/8 of the fp32 logits Megatron-LM keeps, nothing else differs
    let m = presets::model("llama3-8b").unwrap();
    let cfg = ParallelConfig {
        zero: 3,
        flash_attention: true,
        ..ParallelConfig::new(1, 1, 8, 1, 8)
    };
    let act = |fw: Framework| {
        let c = presets::cluster("dgx-h100").unwrap().for_framework(fw);
        plan(&m, &c, &cfg).unwrap().memory_bytes.activations
    };
    let logits = m.seq_len as f64 * m.padded_vocab as f64 * 4.0;
    let saved = act(Framework::MegatronLm) - act(Framework::Torchtitan);
    assert!(
        close(saved, logits * 7.0 / 8.0, 1e-9),
        "{saved} vs {}",
        logits * 7.0 / 8.0
    );
}
