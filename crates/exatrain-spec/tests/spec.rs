use exatrain_spec::{load, presets, Dim, Invalid, ParallelConfig, RankOrder, Recompute};

/// Megatron's parameter count 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)) (Narayanan et al. 2021,
/// eq. 2); ours adds only the final norm (2h).
fn megatron_params(l: f64, h: f64, v: f64, s: f64) -> f64 {
    12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h))
}

#[test]
fn megatron_table1_parameter_counts() {
    // (preset, published billions)
    for (name, published) in [
        ("mlm21-1.7b", 1.7),
        ("mlm21-3.6b", 3.6),
        ("mlm21-7.5b", 7.5),
        ("mlm21-18.4b", 18.4),
        ("mlm21-39.1b", 39.1),
        ("mlm21-76.1b", 76.1),
        ("mlm21-145.6b", 145.6),
        ("mlm21-310.1b", 310.1),
        ("mlm21-529.6b", 529.6),
        ("mlm21-1008b", 1008.0),
    ] {
        let m = presets::model(name).unwrap();
        let ours = m.params() as f64;
        let formula = megatron_params(m.layers as f64, m.hidden as f64, 51200.0, 2048.0);
        assert!(
            (ours - formula - 2.0 * m.hidden as f64).abs() < 1e-2,
            "{name}: only the final norm differs"
        );
        // the paper rounds to one decimal
        assert!(
            (ours / 1e9 - published).abs() <= 0.05,
            "{name}: {} B vs published {published} B",
            ours / 1e9
        );
    }
}

#[test]
fn one_trillion_model_by_hand() {
    let m = presets::model("mlm21-1008b").unwrap();
    // per layer: 12h² + 13h; h = 25600
    let h: u64 = 25600;
    assert_eq!(m.layer_params(), 12 * h * h + 13 * h);
    assert_eq!(m.params(), 128 * (12 * h * h + 13 * h) + (51200 + 2048) * h + 2 * h);
    assert_eq!(m.params(), 1_008_038_758_400);
}

#[test]
fn llama_counts_match_released_models() {
    // Released parameter counts from the model cards (exact for 7B/8B, rounded otherwise).
    for (name, billions) in [
        ("llama2-7b", 6.738),
        ("llama2-13b", 13.016),
        ("llama2-70b", 68.977),
        ("llama3-8b", 8.030),
        ("llama3-70b", 70.554),
        ("llama3-405b", 405.85),
    ] {
        let p = presets::model(name).unwrap().params() as f64 / 1e9;
        assert!((p - billions).abs() / billions < 0.002, "{name}: {p} B vs {billions} B");
    }
}

#[test]
fn every_preset_loads_and_validates() {
    assert!(presets::model_names().len() >= 20);
    for n in presets::cluster_names() {
        presets::cluster(n).unwrap().validate().unwrap();
    }
    for n in [
        "frontier",
        "selene",
        "jean-zay",
        "dgx-2h",
        "dgx-h100",
        "lumi",
        "perlmutter",
    ] {
        assert!(presets::cluster(n).is_ok(), "{n}");
    }
    let f = presets::cluster("frontier").unwrap();
    assert_eq!(f.node.devices, 8);
    assert_eq!(f.device.peak_tflops_bf16, 191.5);
    assert_eq!(f.intra_gbps(2), 200.0);
    assert_eq!(f.intra_gbps(4), 50.0);
    assert_eq!(f.node_nic_gbps(), 100.0);
}

#[test]
fn unknown_preset_lists_known_ones() {
    let e = load::model("gpt-9000").unwrap_err().to_string();
    assert!(
        e.contains("gpt-9000") && e.contains("gpt-175b") && e.contains("llama3-8b"),
        "{e}"
    );
    let e = load::cluster("summit").unwrap_err().to_string();
    assert!(e.contains("frontier") && e.contains("selene"), "{e}");
}

#[test]
fn calculon_json_model() {
    let json = r#"{"hidden": 12288, "feedforward": 49152, "seq_size": 2048,
                   "attn_heads": 96, "attn_size": 128, "num_blocks": 96}"#;
    let m = load::model_from_str(json, true, "gpt3-175B.json").unwrap();
    assert_eq!(
        (m.layers, m.hidden, m.heads, m.head_dim, m.ffn_hidden),
        (96, 12288, 96, 128, 49152)
    );
    assert_eq!(m.name, "gpt3-175B");
}

#[test]
fn malformed_files_name_line_and_field() {
    let e = load::model_from_str("layers = 4\nhidden = \"wide\"\n", false, "m.toml")
        .unwrap_err()
        .0;
    assert!(
        e.contains("m.toml") && e.contains("line 2") && e.contains("hidden"),
        "{e}"
    );
    let e = load::model_from_str("layers = 4\nhiden = 8\n", false, "m.toml")
        .unwrap_err()
        .0;
    assert!(e.contains("hiden") && e.contains("hidden"), "{e}");
    let e = load::model_from_str("layers = 4\nhidden = 8\nheads = 3\nseq_len = 8\n", false, "m.toml")
        .unwrap_err()
        .0;
    assert!(e.contains("heads") && e.contains("head_dim"), "{e}");
    let e = load::model_from_str("layers = 0\n", false, "m.toml").unwrap_err().0;
    assert!(e.contains("`layers` must be a positive integer"), "{e}");
    let bad_cluster = include_str!("../presets/clusters.toml").replace("hbm_gib = 80.0", "hbm_gib = -1.0");
    let table: toml::Table = toml::from_str(&bad_cluster).unwrap();
    let selene = toml::to_string(&table["selene"]).unwrap();
    let e = load::cluster_from_str(&selene, false, "c.toml").unwrap_err().0;
    assert!(e.contains("device.hbm_gib"), "{e}");
}

/// Data-driven: each bad layout and the words its message must contain.
#[test]
fn invalid_layouts_are_values_with_clear_messages() {
    let m = presets::model("gpt-22b").unwrap(); // 48 layers, 48 heads
    let base = ParallelConfig::new(2, 2, 2, 1, 8);
    let cases: Vec<(ParallelConfig, u32, &str)> = vec![
        (
            ParallelConfig { tp: 5, dp: 1, ..base },
            10,
            "--tp 5 does not divide 48 heads",
        ),
        (
            ParallelConfig {
                pp: 49,
                dp: 1,
                tp: 1,
                ..base
            },
            49,
            "--pp 49 is more than the 48 layers (allowed: 1..=48)",
        ),
        (
            ParallelConfig {
                pp: 7,
                dp: 1,
                tp: 1,
                first_stage_layers: Some(5),
                ..base
            },
            7,
            "--first-stage-layers 5 / --last-stage-layers - leave no even split of 48 layers",
        ),
        (
            ParallelConfig {
                pp: 7,
                dp: 1,
                tp: 1,
                virtual_stages: 2,
                ..base
            },
            7,
            "--virtual-stages needs equal stages, or inner stages one layer longer than the first and the last (the embedding and the loss counted as layers): --pp 7 over 48 layers is neither",
        ),
        (base, 16, "does not equal --gpus 16"),
        (
            ParallelConfig {
                global_batch: 9,
                ..base
            },
            8,
            "--global-batch 9 is not divisible",
        ),
        (
            ParallelConfig { zero: 5, ..base },
            8,
            "--zero 5 is not a ZeRO stage (allowed: 0, 1, 2, 3)",
        ),
        (
            ParallelConfig { micro_batch: 0, ..base },
            8,
            "--micro-batch must be a positive",
        ),
        (
            ParallelConfig {
                tp: 1,
                dp: 4,
                sequence_parallel: true,
                ..base
            },
            8,
            "--sequence-parallel needs --tp > 1",
        ),
        (
            ParallelConfig {
                virtual_stages: 5,
                ..base
            },
            8,
            "--virtual-stages 5 does not divide the 24 layers",
        ),
        (
            ParallelConfig {
                virtual_stages: 2,
                global_batch: 2,
                ..base
            },
            8,
            "multiple of --pp 2",
        ),
    ];
    for (cfg, gpus, want) in cases {
        let e = cfg.check(&m, gpus).expect_err(want);
        assert!(e.to_string().contains(want), "{cfg:?}: got {e}, want {want}");
    }
    assert!(base.check(&m, 8).is_ok());
    assert_eq!(
        ParallelConfig { tp: 5, dp: 1, ..base }.check(&m, 10),
        Err(Invalid::TpHeads { tp: 5, heads: 48 })
    );
}

#[test]
fn rank_grid_round_trips_in_every_order() {
    for order in RankOrder::ALL {
        let c = ParallelConfig {
            order,
            ..ParallelConfig::new(2, 3, 4, 1, 12)
        };
        let mut seen = [false; 24];
        for r in 0..24 {
            let (t, d, p) = c.coords(r);
            assert!(t < 2 && d < 4 && p < 3);
            assert_eq!(c.rank(t, d, p), r, "{order}");
            seen[r as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // neighbours along a dim are `stride` ranks apart
        for d in [Dim::Tp, Dim::Dp, Dim::Pp] {
            let s = c.stride(d);
            let (t, dd, p) = c.coords(0);
            let next = match d {
                Dim::Tp => c.rank(t + 1, dd, p),
                Dim::Dp => c.rank(t, dd + 1, p),
                Dim::Pp => c.rank(t, dd, p + 1),
            };
            assert_eq!(next, s, "{order} {d:?}");
        }
    }
    // default order: rank = tp + tp_size·(dp + dp_size·pp)
    let c = ParallelConfig::new(2, 3, 4, 1, 12);
    assert_eq!(c.rank(1, 2, 1), 1 + 2 * (2 + 4 * 1));
    assert_eq!("pp-dp-tp".parse::<RankOrder>().unwrap().to_string(), "pp-dp-tp");
    assert!("tp-tp-dp".parse::<RankOrder>().is_err());
    assert!("full".parse::<Recompute>().is_ok() && "some".parse::<Recompute>().is_err());
}

/// `--pp` need not divide the layers: by default they are spread as evenly as possible with
/// equal inner stages (Megatron's form); explicit first/last sizes split the rest evenly.
#[test]
fn uneven_pipeline_stages() {
    let split = |layers: u32, pp: u32, first: Option<u32>, last: Option<u32>| {
        let m = exatrain_spec::ModelFile {
            layers: Some(layers),
            hidden: Some(64),
            heads: Some(4),
            seq_len: Some(32),
            ..Default::default()
        }
        .resolve("m")
        .unwrap();
        let c = ParallelConfig {
            first_stage_layers: first,
            last_stage_layers: last,
            ..ParallelConfig::new(1, pp, 1, 1, 8)
        };
        c.stage_layers(&m)
            .map(|s| (0..pp).map(|i| s.of(i)).collect::<Vec<u32>>())
    };
    // Llama 3 405B on 16 stages, BLOOM's 70 layers on 12
    assert_eq!(
        split(126, 16, None, None).unwrap(),
        [vec![7], vec![8; 14], vec![7]].concat()
    );
    assert_eq!(
        split(70, 12, None, None).unwrap(),
        [vec![5], vec![6; 10], vec![5]].concat()
    );
    assert_eq!(split(48, 8, None, None).unwrap(), vec![6; 8]);
    assert_eq!(split(9, 8, None, None).unwrap().iter().max(), Some(&2));
    assert_eq!(split(7, 2, None, None).unwrap(), vec![3, 4]);
    assert_eq!(
        split(126, 16, Some(6), Some(8)).unwrap(),
        [vec![6], vec![8; 14], vec![8]].concat()
    );
    assert_eq!(split(50, 4, Some(2), None).unwrap(), vec![2, 16, 16, 16]);
    assert_eq!(split(50, 4, None, Some(2)).unwrap(), vec![16, 16, 16, 2]);
    for (l, pp) in [(126u32, 16u32), (70, 12), (9, 8), (100, 7), (31, 30), (5, 5)] {
        let v = split(l, pp, None, None).unwrap();
        assert_eq!(v.iter().sum::<u32>(), l);
        assert!(v.iter().all(|x| *x >= 1));
        assert!(
            v.iter().max().unwrap() - v.iter().min().unwrap() <= 2,
            "{l} on {pp}: {v:?}"
        );
    }
    assert!(split(8, 9, None, None).is_err());
    assert_eq!(split(48, 4, Some(10), Some(10)).unwrap(), vec![10, 14, 14, 10]);
    assert!(split(48, 4, Some(10), Some(39)).is_err());
    assert!(
        split(48, 5, Some(10), Some(10)).is_err(),
        "28 layers do not split over 3 stages"
    );
}

#[test]
fn a_gemm_table_corrects_the_curve_toward_what_was_measured() {
    use exatrain_spec::{GemmCorrection, GemmEfficiency, GemmMeasure};
    let curve = GemmEfficiency {
        max_efficiency: 0.8,
        half_size: 100.0,
    };
    let at = |m: f64, n: f64, k: f64, e: f64| GemmMeasure { m, n, k, efficiency: e };
    // measured: small squares run at half the curve, large ones at the curve
    let small = curve.efficiency(256.0, 256.0, 256.0);
    let large = curve.efficiency(8192.0, 8192.0, 8192.0);
    let table = GemmCorrection::new(
        &curve,
        &[at(256.0, 256.0, 256.0, small / 2.0), at(8192.0, 8192.0, 8192.0, large)],
    );
    assert_eq!(
        GemmCorrection::new(&curve, &[]).efficiency(&curve, 1000.0, 900.0, 800.0),
        curve.efficiency(1000.0, 900.0, 800.0)
    );
    // at a measured shape: the measurement
    assert_eq!(table.efficiency(&curve, 256.0, 256.0, 256.0), small / 2.0);
    assert_eq!(table.efficiency(&curve, 8192.0, 8192.0, 8192.0), large);
    // halfway (in ln size) the ratio is the geometric mean of the two: 1/√2
    let mid = (256.0f64 * 8192.0).sqrt();
    let got = table.efficiency(&curve, mid, mid, mid) / curve.efficiency(mid, mid, mid);
    assert!((got - 0.5f64.sqrt()).abs() < 1e-9, "{got}");
    // nearer the small shape, nearer its ratio
    let near = table.efficiency(&curve, 300.0, 300.0, 300.0) / curve.efficiency(300.0, 300.0, 300.0);
    assert!(near < 0.55 && near > 0.5, "{near}");
}

#[test]
fn a_bad_gemm_table_is_named() {
    let base = toml::to_string(&presets::cluster("selene").unwrap()).unwrap();
    for (entry, field) in [
        ("{ m = 0.0, n = 8.0, k = 8.0, efficiency = 0.5 }", "gemm_table[0].m"),
        (
            "{ m = 8.0, n = 8.0, k = 8.0, efficiency = 1.5 }",
            "gemm_table[0].efficiency",
        ),
        ("{ m = 8.0, n = 8.0, k = 8.0, efficiency = 0.5, extra = 1 }", "extra"),
    ] {
        let text = base.replace("[device]\n", &format!("[device]\ngemm_table = [{entry}]\n"));
        assert!(text.contains("gemm_table"), "the table went into [device]");
        let e = load::cluster_from_str(&text, false, "c.toml").unwrap_err().0;
        assert!(e.contains(field), "{field}: {e}");
    }
    let many = vec!["{ m = 8.0, n = 8.0, k = 8.0, efficiency = 0.5 }"; 65].join(", ");
    let text = base.replace("[device]\n", &format!("[device]\ngemm_table = [{many}]\n"));
    let e = load::cluster_from_str(&text, false, "c.toml").unwrap_err().0;
    assert!(e.contains("at most 64"), "{e}");
}

/// Interleaving takes an even split, or Megatron-LM's split that counts the embedding and the
/// loss as layers (inner stages one layer longer than the ends): Llama 3 405B's 126 layers on
/// 16 stages interleave in chunks of 8 / v slots, the first and last chunk one layer short.
#[test]
fn interleaving_over_stages_that_count_the_embedding_and_the_loss() {
    let m = exatrain_spec::presets::model("llama3-405b").unwrap();
    let c = |v: u32, first: Option<u32>| ParallelConfig {
        virtual_stages: v,
        first_stage_layers: first,
        ..ParallelConfig::new(8, 16, 8, 1, 128)
    };
    for v in [2, 4, 8] {
        c(v, None).check(&m, 1024).unwrap();
        let st = c(v, None).stage_layers(&m).unwrap();
        assert!(st.accounts_for_ends() && !st.even());
        // the chunks tile the layers in order, each of 8 / v slots, the two ends one short
        let chunks: Vec<_> = (0..16 * v).map(|k| st.chunk_range(k, v)).collect();
        assert_eq!(chunks[0].start, 0);
        assert_eq!(chunks.last().unwrap().end, 126);
        assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
        let size = |r: &std::ops::Range<u32>| r.end - r.start;
        assert_eq!(size(&chunks[0]), 8 / v - 1);
        assert_eq!(size(chunks.last().unwrap()), 8 / v - 1);
        assert!(chunks[1..chunks.len() - 1].iter().all(|r| size(r) == 8 / v));
        // stage s holds chunks s, s + 16, …: 7, 8, …, 8, 7 layers
        for s in 0..16 {
            let held: u32 = (0..v).map(|i| size(&chunks[(i * 16 + s) as usize])).sum();
            assert_eq!(held, st.of(s), "stage {s}");
        }
    }
    // 3 slots per chunk do not divide 8; a first stage of 6 is no such split
    assert!(c(3, None)
        .check(&m, 1024)
        .unwrap_err()
        .to_string()
        .contains("--virtual-stages 3"));
    let e = c(2, Some(6)).check(&m, 1024).unwrap_err().to_string();
    assert!(e.contains("the embedding and the loss counted as layers"), "{e}");
}

/// A cluster that reserves more memory than its devices have, whose latency or restart time is
/// infinite, or whose rates overflow once in base units, is refused with the field named (each
/// would make every plan meaningless, not fail).
#[test]
fn impossible_memory_reserve_and_infinite_latency_are_named() {
    let base = toml::to_string(&presets::cluster("selene").unwrap()).unwrap();
    for (from, to, says) in [
        (
            "reserved_gib = 1.5",
            "reserved_gib = 1e9",
            "`reserved_gib` must be ≥ 0 and less than `device.hbm_gib` (80)",
        ),
        (
            "intra_latency_us = 5.0",
            "intra_latency_us = inf",
            "`network.intra_latency_us` must be a finite number ≥ 0, got inf",
        ),
        (
            "inter_latency_us = 8.0",
            "inter_latency_us = -1.0",
            "`network.inter_latency_us` must be a finite number ≥ 0, got -1",
        ),
        (
            "restart_s = 600.0",
            "restart_s = inf",
            "`system.restart_s` must be a finite number ≥ 0, got inf",
        ),
        // finite as written, infinite in FLOP/s (every plan's MFU would read 0 %)
        (
            "peak_tflops_bf16 = 312.0",
            "peak_tflops_bf16 = 1e308",
            "`device.peak_tflops_bf16` must be a positive number below 1.798e296, got 1e308",
        ),
        (
            "checkpoint_write_gbps = 1000.0",
            "checkpoint_write_gbps = 1e305",
            "`system.checkpoint_write_gbps` must be a positive number below",
        ),
    ] {
        assert!(base.contains(from), "{from} in {base}");
        let e = load::cluster_from_str(&base.replace(from, to), false, "c.toml")
            .unwrap_err()
            .0;
        assert!(e.contains(says), "{says}: {e}");
    }
}

/// FP8: a device's FP8 peak and curve are checked like the bf16 ones, and a spec that never
/// names them (every non-Hopper preset) has no FP8.
#[test]
fn fp8_peak_and_curve_are_checked_and_optional() {
    let h100 = presets::cluster("dgx-h100").unwrap();
    let (peak, curve) = h100.device.fp8().expect("H100 has FP8");
    assert_eq!(peak, 1979e12);
    assert!(
        curve.half_size > h100.device.gemm.half_size,
        "FP8 tiles need larger shapes"
    );
    for name in ["selene", "frontier", "lumi", "dgx-2h", "jean-zay", "perlmutter"] {
        assert!(presets::cluster(name).unwrap().device.fp8().is_none(), "{name}");
    }
    // the TOML round trip keeps them
    let back = load::cluster_from_str(&toml::to_string(&h100).unwrap(), false, "h.toml").unwrap();
    assert_eq!(back.device.fp8(), h100.device.fp8());
    for (edit, says) in [
        (
            (|c: &mut exatrain_spec::ClusterSpec| c.device.peak_tflops_fp8 = Some(-1.0)) as fn(&mut _),
            "`device.peak_tflops_fp8` must be a positive number",
        ),
        (
            |c| c.device.peak_tflops_fp8 = Some(1e308),
            "`device.peak_tflops_fp8` must be a positive number below",
        ),
        (
            |c| c.device.gemm_fp8.as_mut().unwrap().max_efficiency = 1.5,
            "`device.gemm_fp8.max_efficiency` must be in (0, 1]",
        ),
        (
            |c| c.device.gemm_fp8.as_mut().unwrap().half_size = f64::NAN,
            "`device.gemm_fp8.half_size` must be a finite number ≥ 0",
        ),
    ] {
        let mut c = h100.clone();
        edit(&mut c);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
}
