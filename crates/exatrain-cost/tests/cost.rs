use exatrain_cost::comm::{self, group_link, Link};
use exatrain_cost::{flops, memory, plan};
use exatrain_spec::{presets, Dim, Framework, ModelFile, ParallelConfig, Recompute};

fn gpt(layers: u32, hidden: u32, heads: u32, seq: u32, vocab: u32) -> exatrain_spec::ModelSpec {
    ModelFile {
        layers: Some(layers),
        hidden: Some(hidden),
        heads: Some(heads),
        seq_len: Some(seq),
        vocab: Some(vocab),
        ..Default::default()
    }
    .resolve("gpt")
    .unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

#[test]
fn hardware_flops_equal_megatron_formula_under_full_recompute() {
    for name in ["mlm21-1.7b", "mlm21-145.6b", "mlm21-1008b", "gpt-175b"] {
        let m = presets::model(name).unwrap();
        let ours = flops::hardware_step(&m, 512, Recompute::Full);
        let megatron = flops::megatron_formula(&m, 512, true);
        assert!(close(ours, megatron, 1e-12), "{name}: {ours} vs {megatron}");
        // model FLOPs: 72·B·s·l·h²·(1 + s/6h + V/12lh) — the logits counted forward + backward
        let (b, s, l, h, v) = (
            512.0,
            m.seq_len as f64,
            m.layers as f64,
            m.hidden as f64,
            m.padded_vocab as f64,
        );
        let model = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        assert!(close(flops::model_step(&m, 512), model, 1e-12), "{name}");
    }
}

#[test]
fn flops_count_gqa_swiglu_and_untied_heads() {
    let m = presets::model("llama3-8b").unwrap();
    let (s, h, q, kv, f, v) = (8192.0, 4096.0, 4096.0, 1024.0, 14336.0, 128256.0);
    let per_layer = 2.0 * s * (h * (q + 2.0 * kv) + q * h + 3.0 * h * f) + 4.0 * s * s * q;
    let fwd = 32.0 * per_layer + 2.0 * s * h * v;
    assert!(close(flops::model_step(&m, 1), 3.0 * fwd, 1e-12));
    // 6·N·tokens rule (matmul params incl. head) plus the attention term
    let six_n = 6.0 * m.matmul_params() as f64 * s + 3.0 * 32.0 * 4.0 * s * s * q;
    assert!(close(flops::model_step(&m, 1), six_n, 1e-12));
}

#[test]
fn collective_costs_by_hand() {
    let l = Link {
        bytes_per_s: 100e9,
        latency_s: 0.0,
        inter_node: false,
    };
    // ring all-reduce: 2(n-1)/n · M / B
    assert!(close(comm::all_reduce(1e9, 8, l), 2.0 * 7.0 / 8.0 * 1e9 / 100e9, 1e-12));
    assert!(close(comm::reduce_scatter(1e9, 8, l), 7.0 / 8.0 * 1e9 / 100e9, 1e-12));
    assert_eq!(comm::all_reduce(1e9, 1, l), 0.0);
    // small messages take the tree: latency 2·log2(n)·α beats 2(n-1)·α
    let lat = Link {
        bytes_per_s: 100e9,
        latency_s: 1e-5,
        inter_node: true,
    };
    assert!(close(
        comm::all_reduce(8.0, 64, lat),
        2.0 * 8.0 / 100e9 + 2.0 * 6.0 * 1e-5,
        1e-9
    ));
}

#[test]
fn groups_use_the_link_they_cross() {
    let f = presets::cluster("frontier").unwrap();
    let eff = f.network.efficiency;
    // TP 2 on one MI250X: 200 GB/s; TP 8 across the node: 50 GB/s
    assert!(close(group_link(&f, 2, 1).bytes_per_s, 200e9 * eff, 1e-12));
    assert!(close(group_link(&f, 8, 1).bytes_per_s, 50e9 * eff, 1e-12));
    // DP 16 with TP 8 inside the node: one member per node, 8 rings share 4 × 25 GB/s
    let dp = group_link(&f, 16, 8);
    assert!(dp.inter_node && close(dp.bytes_per_s, 100e9 / 8.0 * eff, 1e-12));
    // DP 16 with TP 2: 4 members per node, 2 rings share the NICs -> 50 GB/s each (= intra class)
    let dp = group_link(&f, 16, 2);
    assert!(dp.inter_node && close(dp.bytes_per_s, 50e9 * eff, 1e-12));
    // the rank order decides: DP innermost puts the DP group inside the node instead of TP
    let cfg = ParallelConfig {
        order: "dp-tp-pp".parse().unwrap(),
        ..ParallelConfig::new(8, 1, 8, 1, 8)
    };
    assert_eq!(cfg.stride(Dim::Dp), 1);
    assert_eq!(cfg.stride(Dim::Tp), 8);
    assert!(group_link(&f, 8, cfg.stride(Dim::Tp)).inter_node);
}

#[test]
fn step_terms_add_up_and_vanish_without_parallelism() {
    let m = gpt(4, 512, 8, 256, 1024);
    let c = presets::cluster("selene").unwrap();
    let p = plan(&m, &c, &ParallelConfig::new(1, 1, 1, 2, 8)).unwrap();
    let t = p.time_s;
    assert_eq!((t.tp_comm, t.pp_comm, t.dp_comm, t.bubble), (0.0, 0.0, 0.0, 0.0));
    assert!(close(p.step_time_s, t.compute + t.optimizer, 1e-12));
    assert_eq!(p.microbatches, 4);
    assert!(close(p.tokens_per_s, 8.0 * 256.0 / p.step_time_s, 1e-12));
    assert!(close(
        p.tflops_per_gpu * 1e12 * p.step_time_s,
        flops::model_step(&m, 8),
        1e-9
    ));
}

/// The pipeline's fill and drain pass once through every stage but the slowest (1F1B; each
/// chunk 1/v of its stage when interleaved: `exatrain-parallel`'s test runs the schedules with
/// these times): (p − 1)/(v·m) of the work when the stages are equal, a little less when the
/// head makes the last one the slowest, and far less when inner stages hold most of the layers.
#[test]
fn the_bubble_is_every_other_stage_once() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    for (pp, v, gb) in [(4u32, 1u32, 64u32), (8, 1, 32), (4, 2, 64), (4, 3, 64)] {
        let cfg = ParallelConfig {
            virtual_stages: v,
            ..ParallelConfig::new(2, pp, 2, 1, gb)
        };
        let p = plan(&m, &c, &cfg).unwrap();
        let mb = p.microbatches as f64;
        let work = p.time_s.compute + p.time_s.tp_comm;
        let equal = (pp as f64 - 1.0) / (v as f64 * mb);
        let got = p.time_s.bubble / work;
        assert!(got < equal && got > 0.9 * equal, "pp {pp} v {v}: {got} of {equal}");
    }
    // 48 layers as 6 | 18 | 18 | 6: an inner stage is the slowest, the others hold 30 layers
    // (and the embedding and the head): the bubble is about 30/18 of its microbatch, not 3
    let cfg = ParallelConfig {
        first_stage_layers: Some(6),
        last_stage_layers: Some(6),
        ..ParallelConfig::new(2, 4, 2, 1, 64)
    };
    let p = plan(&m, &c, &cfg).unwrap();
    let per_mb = (p.time_s.compute + p.time_s.tp_comm) / p.microbatches as f64;
    let got = p.time_s.bubble / per_mb;
    assert!(
        got > 30.0 / 18.0 && got < 1.1 * 30.0 / 18.0,
        "{got} slowest-stage microbatches"
    );
}

#[test]
fn a_layout_that_does_not_fit_says_by_how_much() {
    let m = presets::model("gpt-1t").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let p = plan(&m, &c, &ParallelConfig::new(8, 1, 1, 1, 1)).unwrap();
    assert!(!p.fits);
    assert!(close(
        -p.headroom_bytes,
        p.memory_bytes.total - c.capacity_bytes(),
        1e-12
    ));
    // weights alone: 2 bytes × ~1T / 8
    assert!(p.memory_bytes.weights > 2.0 * 1.0e12 / 8.0);
}

#[test]
fn memory_savers_save_memory_and_cost_time() {
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let base = ParallelConfig::new(8, 16, 8, 1, 256);
    let run = |cfg: ParallelConfig| plan(&m, &c, &cfg).unwrap();
    let b = run(base);
    let sp = run(ParallelConfig {
        sequence_parallel: true,
        ..base
    });
    let full = run(ParallelConfig {
        recompute: Recompute::Full,
        ..base
    });
    let flash = run(ParallelConfig {
        flash_attention: true,
        ..base
    });
    assert!(sp.memory_bytes.activations < b.memory_bytes.activations);
    assert!(full.memory_bytes.activations < b.memory_bytes.activations);
    assert!(full.time_s.compute > b.time_s.compute && full.time_s.tp_comm > b.time_s.tp_comm);
    assert!(flash.memory_bytes.activations < b.memory_bytes.activations);
    assert!(flash.time_s.compute < b.time_s.compute);
    // TP communication volume: 4 all-reduces of b·s·h·2 bytes per block, 2(n-1)/n of each sent
    let msg = 2048.0 * 12288.0 * 2.0;
    let per_block = 4.0 * 2.0 * 7.0 / 8.0 * msg;
    let want = b.microbatches as f64 * (6.0 * per_block + 2.0 * 7.0 / 8.0 * msg);
    assert!(close(b.comm_bytes.tp, want, 1e-12));
}

/// `base` with each factor of `xs` applied: the machine synthetic runs are measured on.
fn scaled(base: &exatrain_spec::ClusterSpec, xs: &[(exatrain_cost::fit::Factor, f64)]) -> exatrain_spec::ClusterSpec {
    let mut c = base.clone();
    for &(f, x) in xs {
        f.apply(&mut c, x);
    }
    c
}

/// The same runs, each priced as the cluster's own stack runs it (`RunStack::Cluster`).
fn as_cluster_stack(runs: &[exatrain_cost::fit::Measured]) -> Vec<exatrain_cost::fit::Measured> {
    runs.iter()
        .cloned()
        .map(|r| exatrain_cost::fit::Measured {
            stack: exatrain_cost::fit::RunStack::Cluster,
            ..r
        })
        .collect()
}

/// Every factor of the fit is fitted, in `xs`'s order, within 2 % of its value there.
fn assert_recovers(f: &exatrain_cost::fit::Fit, xs: &[(exatrain_cost::fit::Factor, f64)]) {
    for (fx, &(factor, want)) in f.factors.iter().zip(xs) {
        assert_eq!(fx.factor, factor);
        assert!(fx.fitted, "{factor:?} has measured terms depending on it");
        assert!(
            (fx.multiplier / want - 1.0).abs() < 0.02,
            "{factor:?}: {} vs {want}",
            fx.multiplier
        );
    }
}

#[test]
fn fit_recovers_known_efficiency_factors_from_synthetic_runs() {
    use exatrain_cost::fit::{fit, Factor, Measured, RunStack};
    let base = presets::cluster("frontier").unwrap();
    let truth_x = [
        (Factor::Compute, 0.55),
        (Factor::Memory, 0.7),
        (Factor::Bandwidth, 0.3),
        (Factor::Latency, 3.0),
    ];
    let truth = scaled(&base, &truth_x);
    let layouts = [
        (
            "gpt-22b",
            ParallelConfig {
                zero: 1,
                ..ParallelConfig::new(2, 2, 2, 1, 32)
            },
        ),
        ("gpt-22b", ParallelConfig::new(8, 1, 1, 2, 16)),
        (
            "gpt-22b",
            ParallelConfig {
                overlap_dp: false,
                ..ParallelConfig::new(4, 1, 2, 1, 16)
            },
        ),
        (
            "bench",
            ParallelConfig {
                overlap_dp: false,
                ..ParallelConfig::new(1, 2, 4, 1, 16)
            },
        ),
        ("bench", ParallelConfig::new(2, 1, 4, 2, 16)),
    ];
    let runs: Vec<Measured> = layouts
        .iter()
        .map(|(m, l)| {
            let model = presets::model(m).unwrap();
            let time_s = plan(&model, &truth, l).unwrap().time_s;
            Measured {
                name: format!("{m} {l:?}"),
                model,
                layout: *l,
                time_s,
                step_s: None,
                stack: RunStack::Cluster,
                switches: Default::default(),
            }
        })
        .collect();
    let f = fit(&base, &runs).unwrap();
    assert_recovers(&f, &truth_x);
    assert!(f.rms_log_error_before > 0.3 && f.rms_log_error_after < 1e-3, "{f:?}");
    // the fitted spec predicts the runs
    for r in &runs {
        let p = plan(&r.model, &f.cluster, &r.layout).unwrap();
        assert!(close(p.time_s.compute, r.time_s.compute, 0.01), "{}", r.name);
    }

    // too few runs: says how many are needed
    let e = fit(&base, &runs[..2]).unwrap_err().to_string();
    assert!(e.contains("2 run report(s) given, at least 3 needed"), "{e}");

    // single-device runs: nothing tells the links, so they keep their values
    let alone: Vec<Measured> = [1u32, 2, 4]
        .iter()
        .map(|&mb| {
            let model = presets::model("bench").unwrap();
            let l = ParallelConfig::new(1, 1, 1, mb, 8);
            Measured {
                name: format!("mb {mb}"),
                time_s: plan(&model, &truth, &l).unwrap().time_s,
                model,
                layout: l,
                step_s: None,
                stack: RunStack::Cluster,
                switches: Default::default(),
            }
        })
        .collect();
    let f = fit(&base, &alone).unwrap();
    let by = |x: Factor| f.factors.iter().find(|y| y.factor == x).unwrap().clone();
    assert!(!by(Factor::Bandwidth).fitted && by(Factor::Bandwidth).multiplier == 1.0);
    assert!(!by(Factor::Latency).fitted);
    assert!(
        (by(Factor::Compute).multiplier / 0.55 - 1.0).abs() < 0.02,
        "{:?}",
        by(Factor::Compute)
    );
}

/// Trainer reports fitted against a cluster whose stack names a framework (a preset: Megatron-LM)
/// are priced as the trainer runs them (no framework: blocking TP collectives, fp32 gradients),
/// so the fit recovers the machine; priced as the framework (its asynchronous TP overlap) the
/// same reports fit worse and give other factors.
#[test]
fn trainer_reports_fit_as_the_trainer_runs_whatever_framework_the_cluster_names() {
    use exatrain_cost::fit::{fit, Factor, Measured, RunStack};
    let base = presets::cluster("frontier").unwrap();
    assert!(base.stack.framework.is_some(), "the preset names a framework");
    let truth_x = [
        (Factor::Compute, 0.8),
        (Factor::Memory, 0.9),
        (Factor::Bandwidth, 0.5),
        (Factor::Latency, 2.0),
    ];
    let truth = scaled(&base, &truth_x).for_trainer();
    let sp = |l: ParallelConfig| ParallelConfig {
        sequence_parallel: true,
        ..l
    };
    let layouts = [
        sp(ParallelConfig::new(4, 1, 2, 1, 16)),
        sp(ParallelConfig::new(8, 1, 1, 2, 16)),
        ParallelConfig {
            zero: 1,
            ..sp(ParallelConfig::new(2, 2, 2, 1, 32))
        },
        ParallelConfig::new(1, 2, 4, 1, 16),
    ];
    let runs: Vec<Measured> = layouts
        .iter()
        .map(|l| {
            let model = presets::model("gpt-22b").unwrap();
            Measured {
                name: format!("{l:?}"),
                time_s: plan(&model, &truth, l).unwrap().time_s,
                model,
                layout: *l,
                step_s: None,
                stack: RunStack::Trainer,
                switches: Default::default(),
            }
        })
        .collect();
    let f = fit(&base, &runs).unwrap();
    assert_recovers(&f, &truth_x);
    assert!(f.rms_log_error_after < 1e-3, "{f:?}");
    // the same reports priced as the cluster's framework runs them
    let g = fit(&base, &as_cluster_stack(&runs)).unwrap();
    assert!(g.rms_log_error_after > 10.0 * f.rms_log_error_after.max(1e-4), "{g:?}");
}

/// One short run (the study's method: run briefly, then project): one or two step times fit the
/// compute factor alone, exactly when the machine differs from the spec in compute only, and
/// keep every other factor; no runs at all is refused.
#[test]
fn one_or_two_step_times_fit_the_compute_factor_alone() {
    use exatrain_cost::fit::{fit, Factor, Measured, RunStack};
    let base = presets::cluster("dgx-h100").unwrap();
    let mut truth = base.clone();
    Factor::Compute.apply(&mut truth, 0.7);
    let model = presets::model("llama2-7b").unwrap();
    let run = |l: ParallelConfig| Measured {
        name: format!("{l:?}"),
        model: model.clone(),
        layout: l,
        time_s: Default::default(),
        step_s: Some(plan(&model, &truth, &l).unwrap().step_time_s),
        stack: RunStack::Cluster,
        switches: Default::default(),
    };
    let one = [run(ParallelConfig::new(8, 1, 2, 1, 64))];
    let two = [one[0].clone(), run(ParallelConfig::new(2, 4, 2, 1, 64))];
    for runs in [&one[..], &two[..]] {
        let f = fit(&base, runs).unwrap();
        assert!(f.compute_only && f.step_times_only, "{f:?}");
        for fx in &f.factors {
            if fx.factor == Factor::Compute {
                assert!(fx.fitted && (fx.multiplier / 0.7 - 1.0).abs() < 0.01, "{f:?}");
            } else {
                assert!(!fx.fitted && fx.multiplier == 1.0, "{f:?}");
            }
        }
        // the fitted spec predicts what was measured
        for r in runs {
            let p = plan(&r.model, &f.cluster, &r.layout).unwrap().step_time_s;
            assert!(close(p, r.step_s.unwrap(), 0.005), "{}: {p}", r.name);
        }
    }
    assert!(fit(&base, &[]).unwrap_err().to_string().contains("no runs given"));
}

/// Runs known only by their step time (framework logs): the fit recovers the compute and link
/// bandwidth factors from the whole step and keeps memory and latency.
#[test]
fn fit_from_step_times_alone_recovers_compute_and_bandwidth() {
    use exatrain_cost::fit::{fit, Factor, Measured, RunStack};
    let base = presets::cluster("dgx-h100").unwrap();
    let mut truth = base.clone();
    Factor::Compute.apply(&mut truth, 0.8);
    Factor::Bandwidth.apply(&mut truth, 0.4);
    let runs: Vec<Measured> = [
        ParallelConfig::new(8, 1, 2, 1, 64),
        ParallelConfig::new(2, 4, 2, 1, 64),
        ParallelConfig {
            overlap_dp: false,
            ..ParallelConfig::new(1, 1, 16, 1, 64)
        },
        ParallelConfig::new(4, 2, 4, 2, 128),
    ]
    .iter()
    .map(|l| {
        let model = presets::model("llama2-7b").unwrap();
        let step = plan(&model, &truth, l).unwrap().step_time_s;
        Measured {
            name: format!("{l:?}"),
            model,
            layout: *l,
            time_s: Default::default(),
            step_s: Some(step),
            stack: RunStack::Cluster,
            switches: Default::default(),
        }
    })
    .collect();
    let f = fit(&base, &runs).unwrap();
    let by = |x: Factor| f.factors.iter().find(|y| y.factor == x).unwrap().clone();
    assert!(!by(Factor::Memory).fitted && !by(Factor::Latency).fitted, "{f:?}");
    assert!((by(Factor::Compute).multiplier / 0.8 - 1.0).abs() < 0.03, "{f:?}");
    assert!((by(Factor::Bandwidth).multiplier / 0.4 - 1.0).abs() < 0.1, "{f:?}");
    assert!(f.rms_log_error_after < 0.01 && f.rms_log_error_before > 0.1, "{f:?}");
}

/// Runs of two frameworks on one machine: each run is predicted with the stack carried to its
/// framework, so the fit recovers the machine's one stack factor (not a blend of the two).
#[test]
fn a_fit_carries_each_run_to_its_framework() {
    use exatrain_cost::fit::{fit, Factor, Measured, RunStack};
    let base = presets::cluster("dgx-h100").unwrap();
    assert_eq!(base.stack.framework, Some(Framework::MegatronLm));
    let mut truth = base.clone();
    Factor::Compute.apply(&mut truth, 0.9);
    let layouts = [
        ParallelConfig::new(8, 1, 2, 1, 64),
        ParallelConfig::new(2, 4, 2, 1, 64),
        ParallelConfig::new(4, 2, 4, 2, 128),
        ParallelConfig::new(8, 2, 1, 1, 64),
    ];
    let runs: Vec<Measured> = layouts
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let model = presets::model("llama2-7b").unwrap();
            // every other run by Megatron-DeepSpeed, which reaches less of the same machine
            let fw = if i % 2 == 0 {
                Framework::MegatronLm
            } else {
                Framework::MegatronDeepspeed
            };
            let step = plan(&model, &truth.for_framework(fw), l).unwrap().step_time_s;
            Measured {
                name: format!("{fw:?} {l:?}"),
                model,
                layout: *l,
                time_s: Default::default(),
                step_s: Some(step),
                stack: RunStack::Framework(fw),
                switches: Default::default(),
            }
        })
        .collect();
    let f = fit(&base, &runs).unwrap();
    let compute = f.factors.iter().find(|y| y.factor == Factor::Compute).unwrap();
    assert!((compute.multiplier / 0.9 - 1.0).abs() < 0.02, "{f:?}");
    assert!(f.rms_log_error_after < 0.01, "{f:?}");
    // without the frameworks the same runs fit worse: a blend
    let g = fit(&base, &as_cluster_stack(&runs)).unwrap();
    assert!(
        g.rms_log_error_after > 2.0 * f.rms_log_error_after + 0.01,
        "{g:?} vs {f:?}"
    );
}

/// Uneven stages: the slowest stage (8 layers of 126 on 16 stages) sets the pace, between the
/// even splits of 112 (7 per stage) and 128 (8 per stage, plus the embedding on the first).
#[test]
fn uneven_stages_are_paced_by_the_largest() {
    let base = presets::model("llama3-405b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let with = |layers: u32| exatrain_spec::ModelSpec { layers, ..base.clone() };
    let l = ParallelConfig {
        zero: 1,
        flash_attention: true,
        sequence_parallel: true,
        recompute: exatrain_spec::Recompute::Full,
        ..ParallelConfig::new(8, 16, 16, 1, 2048)
    };
    let p = |layers: u32| plan(&with(layers), &c, &l).unwrap();
    let (p112, p126, p128) = (p(112), p(126), p(128));
    assert!(p112.time_s.compute < p126.time_s.compute && p126.time_s.compute < p128.time_s.compute);
    // 128 on 16: the last stage's 8 blocks + the head (~half a block for a 128k vocabulary over
    // tp 8); 126 on 16: an inner stage's 8 blocks
    let ratio = p126.time_s.compute / p128.time_s.compute;
    assert!((0.9..0.99).contains(&ratio), "{ratio}");
    assert!(p112.memory_bytes.total < p126.memory_bytes.total && p126.memory_bytes.total <= p128.memory_bytes.total);
    // explicit sizes: the head counts toward the last stage, so 8 layers there (6 on the first)
    // make the step slower than the default split's 7
    let heavy_last = ParallelConfig {
        first_stage_layers: Some(6),
        last_stage_layers: Some(8),
        ..l
    };
    let q = plan(&with(126), &c, &heavy_last).unwrap();
    assert!(
        q.time_s.compute > 1.03 * p126.time_s.compute,
        "{} vs {}",
        q.time_s.compute,
        p126.time_s.compute
    );
}

/// Overlap as the frameworks do it: a bucketed gradient reduction leaves its last bucket
/// exposed, ZeRO-3 hides each block's gathers only behind that block, TP overlap hides all but
/// one chunk of each collective.
#[test]
fn overlaps_expose_what_the_frameworks_cannot_hide() {
    let c = presets::cluster("dgx-h100").unwrap();
    let m = presets::model("gpt-22b").unwrap();
    // ZeRO-0 / ZeRO-1, data parallel over nodes: overlap hides most but never all of the
    // reduction; at least the last bucket's share (40 M params of the stage's) stays exposed.
    for zero in [0u8, 1] {
        let on = ParallelConfig {
            zero,
            ..ParallelConfig::new(8, 1, 16, 1, 128)
        };
        let off = ParallelConfig {
            overlap_dp: false,
            ..on
        };
        let (p_on, p_off) = (plan(&m, &c, &on).unwrap(), plan(&m, &c, &off).unwrap());
        let params_dev = m.params() as f64 / 8.0;
        let tail_share = 40e6 / params_dev;
        assert!(
            p_on.time_s.dp_comm < p_off.time_s.dp_comm,
            "zero {zero}: overlap hides nothing"
        );
        assert!(
            p_on.time_s.dp_comm >= tail_share * p_off.time_s.dp_comm * 0.999,
            "zero {zero}: {} exposed, less than the last bucket's {}",
            p_on.time_s.dp_comm,
            tail_share * p_off.time_s.dp_comm
        );
    }
    // ZeRO-3 on a slow network: gathers that outlast each block's compute are exposed even
    // with overlap; the aggregate compute no longer hides them.
    let mut slow = c.clone();
    slow.node.nic_gbps /= 50.0;
    let z3 = ParallelConfig {
        zero: 3,
        ..ParallelConfig::new(1, 1, 64, 1, 64)
    };
    let p = plan(&m, &slow, &z3).unwrap();
    let off = plan(
        &m,
        &slow,
        &ParallelConfig {
            overlap_dp: false,
            ..z3
        },
    )
    .unwrap();
    assert!(p.time_s.dp_comm > 0.0 && p.time_s.dp_comm < off.time_s.dp_comm);
    assert!(
        p.time_s.dp_comm >= off.time_s.dp_comm - p.time_s.compute - 1e-9,
        "ZeRO-3 hid more than the compute it overlaps with"
    );
    // TP overlap needs sequence parallelism, and hides at most (t-1)/t of the TP time.
    let base = ParallelConfig {
        sequence_parallel: true,
        ..ParallelConfig::new(8, 1, 1, 1, 8)
    };
    let with = ParallelConfig {
        overlap_tp: true,
        ..base
    };
    let (a, b) = (plan(&m, &c, &base).unwrap(), plan(&m, &c, &with).unwrap());
    assert!(b.time_s.tp_comm < a.time_s.tp_comm);
    assert!(b.time_s.tp_comm >= a.time_s.tp_comm / 8.0 * 0.999);
    let no_sp = ParallelConfig {
        overlap_tp: true,
        ..ParallelConfig::new(8, 1, 1, 1, 8)
    };
    assert_eq!(
        plan(&m, &c, &no_sp).unwrap_err(),
        exatrain_spec::Invalid::OverlapTpNeedsSp
    );
}

/// The exposed tail of an overlapped gradient reduction is the share of the gradients no bucket
/// holds before backward ends: Megatron-LM's one bucket of `dp_bucket` (default max(40 M,
/// 1 M·dp)) parameters, DeepSpeed's of 5e8, torchtitan's FSDP2 units of the first block and
/// the embedding, or the trainer's buckets cut at block boundaries from the last block back
/// with the embedding apart; the trainer's ZeRO-1 parameter gather (after the optimizer step)
/// hides behind nothing. Each bucket is a collective of its own, with its own latencies.
#[test]
fn the_dp_bucket_sets_the_exposed_tail_as_each_stack_cuts_its_buckets() {
    let m = gpt(24, 1024, 16, 1024, 32000);
    let with_latency = presets::cluster("dgx-h100").unwrap();
    // without latency, bucketing costs nothing by itself and the shares are exact
    let mut megatron = with_latency.clone();
    megatron.network.intra_latency_us = 0.0;
    megatron.network.inter_latency_us = 0.0;
    let trainer = megatron.for_trainer();
    // dp 8 in one node: the reduction is shorter than one microbatch's backward, so what stays
    // exposed is the tail alone
    let at = |c: &exatrain_spec::ClusterSpec, zero: u8, overlap_dp: bool, dp_bucket: Option<u64>| {
        let p = ParallelConfig {
            zero,
            overlap_dp,
            dp_bucket,
            ..ParallelConfig::new(1, 1, 8, 1, 8)
        };
        plan(&m, c, &p).unwrap().time_s.dp_comm
    };
    let params = m.params() as f64;
    let block = memory::block_params(&m, &ParallelConfig::new(1, 1, 8, 1, 8));
    // Megatron-LM: the bucket's share of the gradients, whatever its size, at most all
    let whole = at(&megatron, 0, false, None);
    for (bucket, share) in [(None, 40e6 / params), (Some(20_000_000), 20e6 / params), (Some(0), 1.0)] {
        let exposed = at(&megatron, 0, true, bucket);
        assert!(
            close(exposed, share.min(1.0) * whole, 1e-9),
            "{bucket:?}: {exposed} of {whole}"
        );
    }
    // the trainer: buckets of 5 blocks (bucket = 4.5 blocks) cut 4 of them (20 blocks, the last
    // with the final norm) off the 24; the first 4 blocks and the embedding are the tail
    let whole = at(&trainer, 0, false, None);
    let bucket = (4.5 * block) as u64;
    let norm = m.norm_params() as f64;
    let tail = 1.0 - (20.0 * block + norm) / params;
    assert!(close(at(&trainer, 0, true, Some(bucket)), tail * whole, 1e-9));
    // one bucket (--bucket-mb 0), or one larger than the model: nothing hides
    assert!(close(at(&trainer, 0, true, Some(0)), whole, 1e-12));
    assert!(close(at(&trainer, 0, true, Some(u64::MAX)), whole, 1e-12));
    // the default 25 MB (6.25 M fp32 elements) is less than a block here (12.6 M): every block
    // but the first is a bucket of its own, as with the smallest bucket
    assert!(block > 6.25e6);
    let default = at(&trainer, 0, true, None);
    assert!(close(default, at(&trainer, 0, true, Some(1)), 1e-12) && default < whole);
    assert!(close(default, (1.0 - (23.0 * block + norm) / params) * whole, 1e-9));
    // ZeRO-1: the reduce-scatter hides as above, the gather (as many bytes) never does
    let (off, on) = (
        at(&trainer, 1, false, Some(bucket)),
        at(&trainer, 1, true, Some(bucket)),
    );
    assert!(close(off - on, off / 2.0 * (1.0 - tail), 1e-9), "{off} {on}");
    // torchtitan's FSDP2 units: the first block's and the embedding's are left at the end
    let titan = megatron.for_framework(Framework::Torchtitan);
    let emb = memory::embedding_params(&m, &ParallelConfig::new(1, 1, 8, 1, 8));
    let whole = at(&titan, 0, false, None);
    assert!(close(at(&titan, 0, true, None), (block + emb) / params * whole, 1e-9));
    // DeepSpeed's ZeRO-2 buckets of 5e8 elements hold this whole model: nothing hides; planned
    // smaller, they hide the reduce-scatter but not the parameter gather (as many bytes), which
    // DeepSpeed runs when its optimizer step ends
    let ds = megatron.for_framework(Framework::MegatronDeepspeed);
    let whole = at(&ds, 2, false, None);
    assert!(params < 5e8 && close(at(&ds, 2, true, None), whole, 1e-12));
    let exposed = at(&ds, 2, true, Some(20_000_000));
    assert!(
        close(whole - exposed, whole / 2.0 * (1.0 - 20e6 / params), 1e-9),
        "{exposed} of {whole}"
    );
    // with latency, buckets of a thousand parameters pay a ring's latencies each: far more
    // than the default's last bucket, and than no overlap at all
    let tiny = at(&with_latency, 0, true, Some(1000));
    assert!(tiny > 10.0 * at(&with_latency, 0, true, None), "{tiny}");
    assert!(tiny > at(&with_latency, 0, false, None), "{tiny}");
}

/// The software stack's efficiency is apart from the hardware: fitting it (or setting it) slows
/// the compute but leaves the device's peak, so MFU stays model TFLOP/s over the real peak.
#[test]
fn the_stack_efficiency_scales_compute_but_not_the_peak() {
    let c = presets::cluster("selene").unwrap();
    let m = presets::model("gpt-22b").unwrap();
    let cfg = ParallelConfig::new(8, 1, 1, 1, 8);
    let mut slow = c.clone();
    exatrain_cost::fit::Factor::Compute.apply(&mut slow, 0.5);
    assert_eq!(slow.device.peak_tflops_bf16, c.device.peak_tflops_bf16);
    assert_eq!(slow.stack.compute_efficiency, 0.5 * c.stack.compute_efficiency);
    slow.validate().unwrap();
    let (a, b) = (plan(&m, &c, &cfg).unwrap(), plan(&m, &slow, &cfg).unwrap());
    assert!(
        b.time_s.compute > 1.5 * a.time_s.compute,
        "{} vs {}",
        b.time_s.compute,
        a.time_s.compute
    );
    assert_eq!(b.time_s.tp_comm, a.time_s.tp_comm);
    for p in [a, b] {
        assert!(close(p.mfu, p.tflops_per_gpu / c.device.peak_tflops_bf16, 1e-12));
    }
    // never faster than the peak, however large the factor
    let mut fast = c.clone();
    fast.stack.compute_efficiency = 10.0;
    let f = plan(&m, &fast, &cfg).unwrap();
    assert!(f.hfu <= 1.0, "hfu {}", f.hfu);
    fast.stack.compute_efficiency = 11.0;
    assert!(fast
        .validate()
        .unwrap_err()
        .to_string()
        .contains("stack.compute_efficiency"));
}

/// A preset's stack is Megatron-LM's; carried to another framework it is scaled by the two
/// frameworks' kernel efficiencies, so the same layout is slower on Megatron-DeepSpeed by that
/// ratio in compute and unchanged in communication where both overlap it alike (with sequence
/// parallelism; without it Megatron-DeepSpeed blocks on the backward all-reduces that Megatron-LM
/// hides); a stack that names no framework is kept.
#[test]
fn a_cluster_is_carried_to_another_framework_by_its_kernel_efficiency() {
    let c = presets::cluster("selene").unwrap();
    assert_eq!(c.stack.framework, Some(Framework::MegatronLm));
    let ds = c.for_framework(Framework::MegatronDeepspeed);
    assert_eq!(ds.stack.framework, Some(Framework::MegatronDeepspeed));
    let ratio = Framework::MegatronDeepspeed.compute_efficiency() / Framework::MegatronLm.compute_efficiency();
    assert!(ratio < 1.0);
    assert!(close(
        ds.stack.compute_efficiency,
        c.stack.compute_efficiency * ratio,
        1e-12
    ));
    // back again: the same spec
    let back = ds.for_framework(Framework::MegatronLm);
    assert!(close(back.stack.compute_efficiency, c.stack.compute_efficiency, 1e-12));
    assert_eq!(c.for_framework(Framework::MegatronLm), c);
    let m = presets::model("gpt-22b").unwrap();
    let cfg = ParallelConfig {
        sequence_parallel: true,
        ..ParallelConfig::new(8, 1, 1, 1, 8)
    };
    let (a, b) = (plan(&m, &c, &cfg).unwrap(), plan(&m, &ds, &cfg).unwrap());
    assert!(b.time_s.compute > a.time_s.compute);
    assert_eq!(b.time_s.tp_comm, a.time_s.tp_comm);
    let no_sp = ParallelConfig::new(8, 1, 1, 1, 8);
    let (a, b) = (plan(&m, &c, &no_sp).unwrap(), plan(&m, &ds, &no_sp).unwrap());
    assert!(
        b.time_s.tp_comm > 1.2 * a.time_s.tp_comm,
        "{} vs {}",
        b.time_s.tp_comm,
        a.time_s.tp_comm
    );
    let mut own = c.clone();
    own.stack.framework = None;
    assert_eq!(own.for_framework(Framework::MegatronDeepspeed), own);
}

#[test]
fn a_measured_gemm_table_moves_the_compute_time() {
    let m = presets::model("gpt-22b").unwrap();
    let mut c = presets::cluster("selene").unwrap();
    let cfg = ParallelConfig::new(8, 1, 1, 1, 8);
    let before = plan(&m, &c, &cfg).unwrap();
    // GEMMs measured at half the curve everywhere: the GEMM part of compute doubles
    let g = c.device.gemm;
    c.device.gemm_table = [
        (1024.0, 1024.0, 1024.0),
        (16384.0, 2304.0, 6144.0),
        (16384.0, 6144.0, 3072.0),
    ]
    .iter()
    .map(|&(m, n, k)| exatrain_spec::GemmMeasure {
        m,
        n,
        k,
        efficiency: g.efficiency(m, n, k) / 2.0,
    })
    .collect();
    c.validate().unwrap();
    let after = plan(&m, &c, &cfg).unwrap();
    let (b, a) = (before.time_s.compute, after.time_s.compute);
    assert!(a > 1.5 * b && a < 2.0 * b, "compute {b} → {a}");
    assert_eq!(before.memory_bytes.total, after.memory_bytes.total);
}

/// Megatron-DeepSpeed in bf16 with ZeRO-1 reduces as DeepSpeed's BF16_Optimizer does: the fp32
/// gradients all-reduced after the pipeline's flush, then the bf16 weights all-gathered, with
/// nothing overlapped (`overlap_dp` changes nothing); Megatron-LM reduce-scatters bf16
/// gradients in buckets behind backward. The same layout's data-parallel time is priced by hand.
#[test]
fn deepspeed_reduces_fp32_gradients_after_the_flush() {
    let lm = presets::cluster("jean-zay").unwrap();
    let ds = lm.for_framework(Framework::MegatronDeepspeed);
    let m = presets::model("gpt-175b").unwrap();
    let cfg = ParallelConfig {
        zero: 1,
        ..ParallelConfig::new(4, 12, 8, 2, 16)
    };
    let p = plan(&m, &ds, &cfg).unwrap();
    let no_overlap = plan(
        &m,
        &ds,
        &ParallelConfig {
            overlap_dp: false,
            ..cfg
        },
    )
    .unwrap();
    assert_eq!(p.time_s.dp_comm, no_overlap.time_s.dp_comm);
    // by hand: the busiest stage's parameters, fp32 all-reduce + bf16 all-gather over dp = 8
    // ranks on 8 nodes (the NIC link), plus the tied embedding's gradient all-reduced over the 2
    // end stages in fp32 (`_exec_reduce_tied_grads` reduces the fp32 copy)
    let (first, mid, last) = memory::stage_params(&m, &cfg, &cfg.stage_layers(&m).unwrap());
    let params = first.max(mid).max(last);
    let dp_link = group_link(&ds, 8, cfg.stride(Dim::Dp));
    let emb = m.padded_vocab as f64 * m.hidden as f64 / 4.0 * 4.0;
    let pp_link = group_link(&ds, 2, cfg.stride(Dim::Pp) * 11);
    let want = comm::all_reduce(params * 4.0, 8, dp_link)
        + comm::all_gather(params * 2.0, 8, dp_link)
        + comm::all_reduce(emb, 2, pp_link);
    assert!(close(p.time_s.dp_comm, want, 1e-9), "{} vs {want}", p.time_s.dp_comm);
    // Megatron-LM on the same layout exposes less than half of that (bf16, bucketed, overlapped)
    let q = plan(&m, &lm, &cfg).unwrap();
    assert!(
        q.time_s.dp_comm < 0.5 * p.time_s.dp_comm,
        "{} vs {}",
        q.time_s.dp_comm,
        p.time_s.dp_comm
    );
    // ZeRO-2 without a pipeline: DeepSpeed's overlap_comm hides the bucket reductions again
    let z2 = ParallelConfig {
        zero: 2,
        ..ParallelConfig::new(8, 1, 48, 1, 96)
    };
    let on = plan(&m, &ds, &z2).unwrap();
    let off = plan(
        &m,
        &ds,
        &ParallelConfig {
            overlap_dp: false,
            ..z2
        },
    )
    .unwrap();
    assert!(on.time_s.dp_comm < off.time_s.dp_comm);
}

/// The optimizer step moves what each stack's code moves: Adam's update of the parameters a
/// rank updates (28 + e bytes each), plus Megatron-LM's and Megatron-DeepSpeed's gradient norm
/// and fp32-to-model copy (8 more per updated parameter) and their zeroed gradient buffer (the
/// stored gradient's bytes per held parameter), or torchtitan's norm alone (4); the trainer is
/// priced by its update.
#[test]
fn the_optimizer_step_moves_each_stacks_passes() {
    let m = gpt(8, 1024, 16, 1024, 32000);
    let selene = presets::cluster("selene").unwrap();
    let params = m.params() as f64;
    let bw = selene.device.hbm_gbps * 1e9 * selene.device.memory_efficiency;
    for (zero, dp) in [(0u8, 1u32), (1, 8)] {
        let cfg = ParallelConfig {
            zero,
            ..ParallelConfig::new(1, 1, dp, 1, dp)
        };
        let updated = if zero >= 1 { params / dp as f64 } else { params };
        let at = |c: &exatrain_spec::ClusterSpec| plan(&m, c, &cfg).unwrap().time_s.optimizer;
        let trainer = at(&selene.for_trainer());
        assert!(close(trainer, updated * 30.0 / bw, 1e-9), "zero {zero}: {trainer}");
        for (f, per_updated, zeroed) in [
            (Framework::MegatronLm, 38.0, true),
            (Framework::MegatronDeepspeed, 38.0, true),
            (Framework::Torchtitan, 34.0, false),
        ] {
            let c = selene.for_framework(f);
            let store = if zeroed {
                f.grad_store_bytes(&cfg, &c.stack)
            } else {
                0.0
            };
            let want = (updated * per_updated + params * store) / bw;
            assert!(close(at(&c), want, 1e-9), "{f:?} zero {zero}: {} vs {want}", at(&c));
        }
    }
}
