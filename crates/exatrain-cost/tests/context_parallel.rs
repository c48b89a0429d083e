//! Context parallelism: each sequence split over `cp` ranks. Token-local work and activations
//! shrink by cp, attention keeps every key, the ring's key/value exchanges are priced against the
//! attention kernels, and the weights are reduced and sharded over dp · cp ranks.

use exatrain_cost::comm::{self, group_link};
use exatrain_cost::compute::{self, Device};
use exatrain_cost::{memory, plan};
use exatrain_spec::{presets, ClusterSpec, Invalid, ParallelConfig, Recompute};

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

/// Llama 3 8B (seq 8192, GQA) on `gpus` H100s: tp, cp, dp, micro-batch 1, flash attention.
fn layout(tp: u32, cp: u32, dp: u32, gb: u32) -> ParallelConfig {
    ParallelConfig {
        cp,
        flash_attention: true,
        recompute: Recompute::None,
        ..ParallelConfig::new(tp, 1, dp, 1, gb)
    }
}

#[test]
fn the_grid_counts_cp_and_the_checks_name_it() {
    let m = presets::model("llama3-8b").unwrap();
    let c = layout(2, 4, 2, 64);
    assert_eq!(c.gpus(), 16);
    assert_eq!(c.dp_cp(), 8);
    assert_eq!(c.local_seq(&m), 2048);
    assert!(c.check(&m, 16).is_ok());
    // tp · cp · pp · dp must be the device count, and the message names cp
    let e = c.check(&m, 8).unwrap_err();
    assert!(matches!(e, Invalid::Product { cp: 4, .. }));
    assert!(e.to_string().contains("--cp 4"), "{e}");
    // ring attention is a fused kernel
    let no_flash = ParallelConfig {
        flash_attention: false,
        ..c
    };
    assert_eq!(no_flash.check(&m, 16), Err(Invalid::CpNeedsFlash));
    // the load-balanced causal split needs 2·cp equal chunks
    let odd = presets::model("llama3-8b").map(|mut m| {
        m.seq_len = 8190;
        m
    });
    let e = layout(1, 2, 1, 8).check(&odd.unwrap(), 2).unwrap_err();
    assert_eq!(e, Invalid::SeqCp { seq_len: 8190, cp: 2 });
    assert!(e.to_string().contains("2 × 2 equal chunks"), "{e}");
    // sequence parallelism splits the rank's share of the sequence over TP
    let sp = ParallelConfig {
        sequence_parallel: true,
        ..layout(8, 2, 1, 8)
    };
    assert!(sp.check(&m, 16).is_ok());
    assert_eq!(
        ParallelConfig { cp: 0, ..c }.check(&m, 16),
        Err(Invalid::ZeroSize("cp"))
    );
    // a product beyond any device count is refused, not wrapped (and `gpus` saturates)
    let huge = ParallelConfig { cp: 4_000_000_000, ..c };
    assert_eq!(huge.gpus(), u32::MAX);
    let e = huge.check(&m, huge.gpus()).unwrap_err();
    assert!(matches!(e, Invalid::TooManyDevices { .. }));
    assert!(e.to_string().contains("more than any machine"), "{e}");
    assert!(plan(&m, &presets::cluster("dgx-h100").unwrap(), &huge).is_err());
}

#[test]
fn cp_ranks_sit_right_outside_tp_in_the_rank_grid() {
    use exatrain_spec::Dim;
    let c = layout(4, 2, 3, 24);
    assert_eq!(c.stride(Dim::Tp), 1);
    // dp neighbours are a whole tp · cp block apart
    assert_eq!(c.stride(Dim::Dp), 8);
    assert_eq!(c.rank(0, 1, 0), 8);
    assert_eq!(c.coords(8), (0, 1, 0));
    // a rank of cp coordinate 1 keeps its tp and dp coordinates
    assert_eq!(c.coords(4 + 8), (0, 1, 0));
    assert_eq!(c.coords(5), (1, 0, 0));
    assert_eq!((c.cp_coord(5), c.cp_coord(4 + 8), c.cp_coord(3)), (1, 1, 0));
    // every rank is one (tp, cp, dp, pp) and back
    for r in 0..c.gpus() {
        let (t, d, p) = c.coords(r);
        assert_eq!(c.rank_cp(t, c.cp_coord(r), d, p), r);
    }
    let pp_first: ParallelConfig = ParallelConfig {
        order: "pp-tp-dp".parse().unwrap(),
        ..ParallelConfig::new(4, 2, 1, 1, 2)
    };
    let c2 = ParallelConfig {
        cp: 2,
        flash_attention: true,
        ..pp_first
    };
    assert_eq!(c2.stride(Dim::Tp), 2);
    assert_eq!(c2.stride(Dim::Dp), 16);
    for r in 0..c2.gpus() {
        let (t, d, p) = c2.coords(r);
        assert_eq!(c2.rank_cp(t, c2.cp_coord(r), d, p), r);
    }
    // serialized, cp is written only when it is not 1, and read back with 1 as its default
    let one = serde_json::to_string(&layout(1, 1, 2, 2)).unwrap();
    assert!(!one.contains("\"cp\""), "{one}");
    let back: ParallelConfig = serde_json::from_str(&one).unwrap();
    assert_eq!(back.cp, 1);
    let two: ParallelConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(two, c);
}

#[test]
fn token_local_work_and_activations_shrink_by_cp() {
    let m = presets::model("llama3-8b").unwrap();
    let cl = presets::cluster("dgx-h100").unwrap();
    let d = Device::new(&cl, exatrain_spec::Dtype::Bf16);
    let one = layout(1, 1, 1, 1);
    let two = layout(1, 2, 1, 1);
    // activations are per token: exactly half (flash keeps a log-sum-exp per local query row)
    assert!(close(
        memory::block_activations(&m, &two),
        memory::block_activations(&m, &one) / 2.0,
        1e-12
    ));
    // the weight GEMMs of cp = 2 are those of a sequence half as long on one rank
    let mut half = m.clone();
    half.seq_len = m.seq_len / 2;
    let f2 = compute::block_forward(&m, &two, &d);
    let fh = compute::block_forward(&half, &one, &d);
    assert!(close(f2.gemm, fh.gemm, 1e-12));
    assert!(close(f2.elementwise, fh.elementwise, 1e-12));
    // attention keeps every key: twice the half sequence's core, about half of the whole one's
    let f1 = compute::block_forward(&m, &one, &d);
    assert!(f2.core > 1.5 * fh.core, "{} vs {}", f2.core, fh.core);
    assert!(
        f2.core > 0.45 * f1.core && f2.core < 0.75 * f1.core,
        "{} vs {}",
        f2.core,
        f1.core
    );
}

#[test]
fn the_ring_exchange_is_priced_against_the_attention_it_hides_under() {
    let m = presets::model("llama3-8b").unwrap();
    let fast = presets::cluster("dgx-h100").unwrap();
    // cp 8 over the node's NVLink: every hop hides under its attention step
    let c = layout(1, 8, 1, 8);
    let p = plan(&m, &fast, &c).unwrap();
    assert_eq!(p.time_s.cp_comm, 0.0);
    // bytes: keys and values of the rank's tokens, cp - 1 hops forward and twice that backward
    let kv = 8192.0 / 8.0 * 2.0 * m.kv_dim() as f64 * 2.0;
    let want = 8.0 * m.layers as f64 * 3.0 * 7.0 * kv; // 8 microbatches
    assert!(close(p.comm_bytes.cp, want, 1e-12), "{} vs {want}", p.comm_bytes.cp);
    // the same layout on a node whose links are 1000 times slower exposes the hops
    let mut slow: ClusterSpec = fast.clone();
    for l in slow.node.links.iter_mut() {
        l.gbps /= 1000.0;
    }
    let ps = plan(&m, &slow, &c).unwrap();
    let link = group_link(&slow, 8, 1);
    let d = Device::new(&slow, c.dtype);
    let f = compute::block_forward(&m, &c, &d);
    let hop = |bytes: f64, core: f64| 7.0 * (comm::send_recv(bytes, link) - core / 8.0).max(0.0);
    let per_block = hop(kv, f.core) + hop(2.0 * kv, f.core_bwd);
    assert!(per_block > 0.0);
    assert!(close(ps.time_s.cp_comm, 8.0 * m.layers as f64 * per_block, 1e-9));
    // full recomputation runs the forward's ring again
    let full = ParallelConfig {
        recompute: Recompute::Full,
        ..c
    };
    let pf = plan(&m, &slow, &full).unwrap();
    assert!(close(
        pf.time_s.cp_comm,
        8.0 * m.layers as f64 * (per_block + hop(kv, f.core)),
        1e-9
    ));
}

#[test]
fn weights_are_reduced_and_sharded_over_dp_times_cp() {
    let m = presets::model("llama3-8b").unwrap();
    let cl = presets::cluster("dgx-h100").unwrap();
    // cp = 2 without data parallelism still reduces the gradients, over the two CP ranks
    let c = ParallelConfig {
        zero: 1,
        ..layout(1, 2, 1, 4)
    };
    let p = plan(&m, &cl, &c).unwrap();
    assert!(p.comm_bytes.dp > 0.0);
    assert!(p.time_s.dp_comm > 0.0);
    // ZeRO-1 shards the optimizer state over dp · cp: as over 4 data-parallel ranks
    let c4 = ParallelConfig {
        zero: 1,
        ..layout(1, 2, 2, 8)
    };
    let d4 = ParallelConfig {
        zero: 1,
        ..layout(1, 1, 4, 8)
    };
    let (a, b) = (plan(&m, &cl, &c4).unwrap(), plan(&m, &cl, &d4).unwrap());
    assert!(close(a.memory_bytes.optimizer, b.memory_bytes.optimizer, 1e-12));
    assert!(close(a.memory_bytes.weights, b.memory_bytes.weights, 1e-12));
    // … and the model FLOPs per device are those of the same device count
    assert!(close(a.model_flops_per_step, b.model_flops_per_step, 1e-12));
    assert!(a.memory_bytes.activations < 0.6 * b.memory_bytes.activations);
    // the ring's transient buffers (two key/value chunks and their gradients) on top of the
    // stored activations, which are exactly half of the same layout's on whole sequences
    let kv = 8192.0 / 2.0 * 2.0 * m.kv_dim() as f64 * 2.0;
    let one = ParallelConfig { cp: 1, ..c4 };
    let p1 = plan(&m, &cl, &ParallelConfig { dp: 4, ..one }).unwrap();
    let half = ParallelConfig { global_batch: 16, ..c4 };
    let ph = plan(&m, &cl, &half).unwrap();
    assert!(
        close(
            ph.memory_bytes.activations,
            p1.memory_bytes.activations / 2.0 + 4.0 * kv,
            1e-9
        ),
        "{} vs {}",
        ph.memory_bytes.activations,
        p1.memory_bytes.activations / 2.0 + 4.0 * kv
    );
}
