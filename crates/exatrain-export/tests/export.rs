//! Exports: golden files for a spread of layouts (checked against the frameworks' own parsers
//! by `scripts/check-exports.py`; regenerate with `EXATRAIN_BLESS=1 cargo test -p exatrain-export
//! --test export` after such a check), and properties over many layouts.

use exatrain_export::{export, shape, Format, Launcher};
use exatrain_spec::{presets, Framework, ParallelConfig, RankOrder, Recompute};

fn layout(tp: u32, pp: u32, dp: u32, mb: u32, gb: u32) -> ParallelConfig {
    ParallelConfig::new(tp, pp, dp, mb, gb)
}

/// (golden file, model, cluster, layout, format, launcher)
fn cases() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    ParallelConfig,
    Format,
    Launcher,
)> {
    let mlm = Format::Framework(Framework::MegatronLm);
    let ds = Format::Framework(Framework::MegatronDeepspeed);
    let tt = Format::Framework(Framework::Torchtitan);
    vec![
        (
            "gpt-175b-frontier-megatron-lm",
            "gpt-175b",
            "frontier",
            ParallelConfig {
                zero: 1,
                sequence_parallel: true,
                virtual_stages: 3,
                ..layout(4, 8, 32, 2, 2048)
            },
            mlm,
            Launcher::Torchrun,
        ),
        (
            "gpt-175b-frontier-slurm",
            "gpt-175b",
            "frontier",
            ParallelConfig {
                zero: 1,
                ..layout(8, 16, 8, 1, 1024)
            },
            Format::Slurm,
            Launcher::Slurm,
        ),
        (
            "llama3-8b-h100-megatron-lm-fsdp",
            "llama3-8b",
            "dgx-h100",
            ParallelConfig {
                zero: 3,
                flash_attention: true,
                recompute: Recompute::Full,
                ..layout(1, 1, 64, 1, 256)
            },
            mlm,
            Launcher::Torchrun,
        ),
        (
            "llama2-70b-h100-megatron-deepspeed",
            "llama2-70b",
            "dgx-h100",
            ParallelConfig {
                flash_attention: true,
                sequence_parallel: true,
                ..layout(8, 4, 4, 1, 512)
            },
            ds,
            Launcher::Torchrun,
        ),
        (
            "llama3-70b-perlmutter-torchtitan-slurm",
            "llama3-70b",
            "perlmutter",
            ParallelConfig {
                zero: 3,
                flash_attention: true,
                sequence_parallel: true,
                virtual_stages: 2,
                recompute: Recompute::Full,
                ..layout(4, 4, 16, 1, 512)
            },
            tt,
            Launcher::Slurm,
        ),
        (
            // context parallelism: Llama 3 70B as Megatron-Bridge's H100 recipe runs it (tp 4, cp 2)
            "llama3-70b-h100-megatron-lm-cp2",
            "llama3-70b",
            "dgx-h100",
            ParallelConfig {
                cp: 2,
                zero: 1,
                flash_attention: true,
                sequence_parallel: true,
                virtual_stages: 5,
                ..layout(4, 4, 4, 1, 128)
            },
            mlm,
            Launcher::Torchrun,
        ),
        (
            "llama3-8b-h100-torchtitan-cp2",
            "llama3-8b",
            "dgx-h100",
            ParallelConfig {
                cp: 2,
                zero: 3,
                flash_attention: true,
                ..layout(1, 1, 8, 1, 64)
            },
            tt,
            Launcher::Torchrun,
        ),
        (
            "llama3-405b-h100-uneven-stages",
            "llama3-405b",
            "dgx-h100",
            ParallelConfig {
                zero: 1,
                flash_attention: true,
                sequence_parallel: true,
                recompute: Recompute::Full,
                ..layout(8, 16, 16, 1, 2048)
            },
            mlm,
            Launcher::Torchrun,
        ),
        (
            // Llama 3 405B as Meta ran it: interleaved over 7, 14 × 8, 7 layers
            "llama3-405b-h100-interleaved-uneven-stages",
            "llama3-405b",
            "dgx-h100",
            ParallelConfig {
                zero: 1,
                flash_attention: true,
                sequence_parallel: true,
                virtual_stages: 8,
                ..layout(8, 16, 64, 1, 2048)
            },
            mlm,
            Launcher::Torchrun,
        ),
        (
            "gpt-22b-h100-12gpus-tp-pp-dp",
            "gpt-22b",
            "dgx-h100",
            ParallelConfig {
                order: "tp-pp-dp".parse().unwrap(),
                dtype: exatrain_spec::Dtype::Fp32,
                ..layout(2, 2, 3, 1, 48)
            },
            mlm,
            Launcher::Torchrun,
        ),
    ]
}

fn render(files: &[exatrain_export::File]) -> String {
    let mut s = String::new();
    for f in files {
        s.push_str(&format!("==== {} ====\n{}", f.name, f.contents));
    }
    s
}

#[test]
fn exports_match_their_golden_files() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("EXATRAIN_BLESS").is_some();
    for (name, model, cluster, cfg, format, launcher) in cases() {
        let m = presets::model(model).unwrap();
        let cl = presets::cluster(cluster).unwrap();
        let got = render(&export(&m, &cl, &cfg, format, launcher).unwrap_or_else(|e| panic!("{name}: {e}")));
        let path = dir.join(format!("{name}.txt"));
        if bless {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            got == want,
            "{name}: the export changed; diff against {}:\n{got}",
            path.display()
        );
    }
}

fn flag<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let toks: Vec<&str> = text.split_whitespace().collect();
    toks.iter().position(|t| *t == name).map(|i| toks[i + 1])
}

/// Over every framework, many layouts and every cluster: a job launches exactly the planned
/// number of ranks, carries the layout and the environment its framework asserts, or is refused
/// with the reason `can_run` gives.
#[test]
fn every_export_launches_the_planned_ranks_or_is_refused_with_the_reason() {
    let mut exported = 0;
    let mut refused = 0;
    for model in ["gpt-22b", "llama3-8b", "llama2-70b"] {
        let m = presets::model(model).unwrap();
        for cluster in ["frontier", "dgx-h100", "perlmutter"] {
            let cl = presets::cluster(cluster).unwrap();
            for (tp, pp, dp) in [
                (1, 1, 12),
                (2, 2, 3),
                (8, 4, 4),
                (4, 8, 2),
                (2, 1, 6),
                (1, 7, 2),
                (2, 3, 2),
            ] {
                for zero in 0..=3u8 {
                    for order in [RankOrder::default(), "tp-pp-dp".parse().unwrap()] {
                        for virtual_stages in [1, 2] {
                            let cfg = ParallelConfig {
                                zero,
                                order,
                                virtual_stages,
                                sequence_parallel: tp > 1,
                                flash_attention: true,
                                ..layout(tp, pp, dp, 1, 16 * dp)
                            };
                            if cfg.check(&m, cfg.gpus()).is_err() {
                                continue;
                            }
                            for f in Framework::ALL {
                                for launcher in [Launcher::Torchrun, Launcher::Slurm] {
                                    let r = export(&m, &cl, &cfg, Format::Framework(f), launcher);
                                    match (f.can_run(&m, &cfg), r) {
                                        (Err(why), Err(e)) => {
                                            assert!(e.0.contains(&why), "{e} vs {why}");
                                            refused += 1;
                                        }
                                        (Ok(()), Ok(files)) => {
                                            exported += 1;
                                            check_job(&m, &cl, &cfg, f, launcher, &files);
                                        }
                                        (Ok(()), Err(e)) if f == Framework::Torchtitan => {
                                            assert!(e.0.contains("registered Llama 3 flavors"), "{e}")
                                        }
                                        (a, b) => panic!("{model} {cfg:?} {f}: can_run {a:?} but export {b:?}"),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        exported > 100 && refused > 100,
        "{exported} exported, {refused} refused"
    );
}

fn check_job(
    m: &exatrain_spec::ModelSpec,
    cl: &exatrain_spec::ClusterSpec,
    cfg: &ParallelConfig,
    f: Framework,
    launcher: Launcher,
    files: &[exatrain_export::File],
) {
    let main = &files[0].contents;
    let (nodes, per_node) = shape(cfg.gpus(), cl.node.devices);
    assert_eq!(nodes * per_node, cfg.gpus());
    assert!(per_node <= cl.node.devices);
    match launcher {
        Launcher::Torchrun => {
            assert_eq!(files[0].name, "launch.sh");
            assert_eq!(flag(main, "--nnodes"), Some(nodes.to_string().as_str()));
            assert_eq!(flag(main, "--nproc-per-node"), Some(per_node.to_string().as_str()));
        }
        Launcher::Slurm => {
            assert_eq!(files[0].name, "job.sbatch");
            assert!(main.contains(&format!("#SBATCH --nodes={nodes}\n")));
            assert!(main.contains(&format!("--ntasks={} ", cfg.gpus())));
            assert!(!main.contains("--cpu-bind=closest"), "closest is a --gpu-bind value");
            let rank = &files.iter().find(|f| f.name == "rank.sh").expect("rank.sh").contents;
            for v in ["RANK=$SLURM_PROCID", "WORLD_SIZE=$SLURM_NTASKS", "LOCAL_RANK="] {
                assert!(rank.contains(v), "{v} in {rank}");
            }
        }
    }
    let max_conn = main.contains("CUDA_DEVICE_MAX_CONNECTIONS=\"1\"");
    match f {
        Framework::MegatronLm => {
            assert_eq!(
                flag(main, "--tensor-model-parallel-size"),
                Some(cfg.tp.to_string().as_str())
            );
            assert_eq!(
                flag(main, "--pipeline-model-parallel-size"),
                Some(cfg.pp.to_string().as_str())
            );
            assert_eq!(
                flag(main, "--global-batch-size"),
                Some(cfg.global_batch.to_string().as_str())
            );
            let st = cfg.stage_layers(m).unwrap();
            let v = cfg.virtual_stages;
            assert_eq!(
                flag(main, "--decoder-first-pipeline-num-layers").map(|x| x.parse::<u32>().unwrap()),
                (!st.even() && v == 1).then_some(st.first)
            );
            // interleaved uneven stages: the embedding and the loss counted as layers
            assert_eq!(
                main.contains("--account-for-embedding-in-pipeline-split"),
                !st.even() && v > 1
            );
            assert_eq!(
                main.contains("--account-for-loss-in-pipeline-split"),
                !st.even() && v > 1
            );
            assert_eq!(
                flag(main, "--num-layers-per-virtual-pipeline-stage").map(|x| x.parse::<u32>().unwrap()),
                (v > 1).then(|| if st.even() { st.first } else { st.middle } / v)
            );
            // asserted by Megatron-LM with tp or cp > 1 (pre-Blackwell), forbidden with Megatron-FSDP
            assert_eq!(max_conn, (cfg.tp > 1 || cfg.cp > 1) && cfg.zero < 2, "{cfg:?}");
            assert_eq!(
                flag(main, "--context-parallel-size").map(|x| x.parse::<u32>().unwrap()),
                (cfg.cp > 1).then_some(cfg.cp)
            );
            let d: u32 = flag(main, "--make-vocab-size-divisible-by").unwrap().parse().unwrap();
            assert_eq!(m.vocab.div_ceil(d * cfg.tp) * d * cfg.tp, m.padded_vocab);
            assert_eq!(main.contains("--use-megatron-fsdp"), cfg.zero >= 2);
        }
        Framework::MegatronDeepspeed => {
            let ds: serde_json::Value =
                serde_json::from_str(&files.iter().find(|f| f.name == "ds_config.json").unwrap().contents).unwrap();
            assert_eq!(ds["train_batch_size"], cfg.global_batch);
            assert_eq!(
                ds["train_micro_batch_size_per_gpu"].as_u64().unwrap()
                    * ds["gradient_accumulation_steps"].as_u64().unwrap()
                    * cfg.dp as u64,
                cfg.global_batch as u64
            );
            assert_eq!(ds["zero_optimization"]["stage"], cfg.zero);
            assert!(!main.contains("--num-query-groups") && !main.contains("--position-embedding-type"));
        }
        Framework::Torchtitan => {
            let py = &files.iter().find(|f| f.name == "exatrain_recipe.py").unwrap().contents;
            assert!(py.contains(&format!("p.tensor_parallel_degree = {}\n", cfg.tp)));
            assert!(py.contains(&format!("p.pipeline_parallel_degree = {}\n", cfg.pp)));
            assert_eq!(
                py.contains(&format!("p.context_parallel_degree = {}\n", cfg.cp)),
                cfg.cp > 1
            );
            assert!(main.contains("-m torchtitan.train --module exatrain_recipe --config exatrain_run"));
        }
    }
}

/// The Megatron-LM job of a layout, rendered as one text.
fn megatron_lm_job(m: &exatrain_spec::ModelSpec, c: &exatrain_spec::ClusterSpec, cfg: &ParallelConfig) -> String {
    render(&export(m, c, cfg, Format::Framework(Framework::MegatronLm), Launcher::Torchrun).unwrap())
}

/// `--overlap-tp` is Megatron-LM's `--tp-comm-overlap` (its parser's assertion wants sequence
/// parallelism, which the layout check already demands); the other frameworks refuse it.
#[test]
fn tp_overlap_is_exported_to_megatron_lm_and_refused_elsewhere() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let cfg = ParallelConfig {
        sequence_parallel: true,
        overlap_tp: true,
        ..layout(8, 1, 2, 1, 16)
    };
    let mlm = megatron_lm_job(&m, &c, &cfg);
    assert!(mlm.contains("--tp-comm-overlap"), "{mlm}");
    assert!(mlm.contains("--sequence-parallel"));
    let plain = ParallelConfig {
        overlap_tp: false,
        ..cfg
    };
    let without = megatron_lm_job(&m, &c, &plain);
    assert!(!without.contains("--tp-comm-overlap"));
    for f in [Framework::MegatronDeepspeed, Framework::Torchtitan] {
        let e = export(&m, &c, &cfg, Format::Framework(f), Launcher::Torchrun).unwrap_err();
        assert!(e.to_string().contains("--overlap-tp"), "{f:?}: {e}");
    }
}

/// `--fp8` is Megatron-LM's Transformer Engine recipe as NVIDIA's H100 FP8 examples set it; the
/// other frameworks refuse it (Megatron-DeepSpeed has no FP8 training; torchtitan's float8
/// converter is not exported), and the run file keeps it so `plan --run` prices the same layout.
#[test]
fn fp8_is_exported_to_megatron_lm_and_refused_elsewhere() {
    let m = presets::model("llama3-8b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let cfg = ParallelConfig {
        zero: 3,
        sequence_parallel: true,
        flash_attention: true,
        fp8: true,
        ..layout(2, 1, 4, 1, 32)
    };
    let mlm = megatron_lm_job(&m, &c, &cfg);
    for f in [
        "--bf16",
        "--fp8-format hybrid",
        "--fp8-amax-history-len 1024",
        "--fp8-amax-compute-algo max",
    ] {
        assert!(mlm.contains(f), "{f}: {mlm}");
    }
    let plain = ParallelConfig { fp8: false, ..cfg };
    let without = megatron_lm_job(&m, &c, &plain);
    assert!(!without.contains("--fp8"), "{without}");
    for f in [Framework::MegatronDeepspeed, Framework::Torchtitan] {
        let e = export(&m, &c, &cfg, Format::Framework(f), Launcher::Torchrun).unwrap_err();
        assert!(e.to_string().contains("--fp8"), "{f:?}: {e}");
    }
    let run = render(&export(&m, &c, &cfg, Format::Exatrain, Launcher::Torchrun).unwrap());
    assert!(run.contains("fp8 = true"), "{run}");
    // an A100 cluster has no FP8 tensor cores: no format exports an FP8 job for it
    let a100 = presets::cluster("selene").unwrap();
    for format in [
        Format::Framework(Framework::MegatronLm),
        Format::Slurm,
        Format::Exatrain,
    ] {
        let e = export(&m, &a100, &cfg, format, Launcher::Torchrun).unwrap_err();
        assert!(e.to_string().contains("FP8 tensor cores"), "{format:?}: {e}");
    }
}

/// Context parallelism is Megatron-LM's `--context-parallel-size` and torchtitan's
/// `context_parallel_degree` (which shards the weights over the CP ranks with FSDP2, so it needs
/// ZeRO-2/3 there); Megatron-DeepSpeed's sequence splitting is DeepSpeed-Ulysses, not planned.
#[test]
fn context_parallelism_is_exported_where_a_framework_has_ring_attention() {
    let m = presets::model("llama3-8b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let cfg = ParallelConfig {
        cp: 2,
        zero: 1,
        flash_attention: true,
        ..layout(1, 1, 4, 1, 32)
    };
    let mlm = megatron_lm_job(&m, &c, &cfg);
    assert_eq!(flag(&mlm, "--context-parallel-size"), Some("2"));
    // gradients are still reduced over dp · cp = 8 ranks
    assert!(mlm.contains("--overlap-grad-reduce") && mlm.contains("--grad-reduce-in-bf16"));
    assert!(mlm.contains("CUDA_DEVICE_MAX_CONNECTIONS=\"1\""));
    assert!(mlm.contains("tp 1 × cp 2 × pp 1 × dp 4"), "{mlm}");
    let ds = Format::Framework(Framework::MegatronDeepspeed);
    let e = export(&m, &c, &cfg, ds, Launcher::Torchrun).unwrap_err().to_string();
    assert!(e.contains("Ulysses") && e.contains("--cp 2"), "{e}");
    let tt = Format::Framework(Framework::Torchtitan);
    let e = export(&m, &c, &ParallelConfig { zero: 0, ..cfg }, tt, Launcher::Torchrun).unwrap_err();
    assert!(e.to_string().contains("--zero 2 or 3"), "{e}");
    let recipe = render(&export(&m, &c, &ParallelConfig { zero: 3, ..cfg }, tt, Launcher::Torchrun).unwrap());
    assert!(recipe.contains("p.context_parallel_degree = 2\n"), "{recipe}");
    let run = render(&export(&m, &c, &cfg, Format::Exatrain, Launcher::Torchrun).unwrap());
    assert!(run.contains("cp = 2"), "{run}");
}

/// A planned data-parallel bucket is Megatron-LM's `--ddp-bucket-size` (with the overlap it
/// sizes), carried by the run file, and refused by the frameworks that have no such option
/// rather than silently dropped.
#[test]
fn the_dp_bucket_is_megatron_lms_ddp_bucket_size_or_refused() {
    let m = presets::model("llama3-8b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let cfg = ParallelConfig {
        zero: 3,
        flash_attention: true,
        dp_bucket: Some(80_000_000),
        ..layout(1, 1, 8, 1, 32)
    };
    let mlm = megatron_lm_job(&m, &c, &ParallelConfig { zero: 1, ..cfg });
    assert_eq!(flag(&mlm, "--ddp-bucket-size"), Some("80000000"));
    assert!(mlm.contains("--overlap-grad-reduce"), "{mlm}");
    // without the overlap Megatron-LM reduces in one bucket whatever the size: no flag
    let plain = megatron_lm_job(
        &m,
        &c,
        &ParallelConfig {
            zero: 1,
            overlap_dp: false,
            ..cfg
        },
    );
    assert_eq!(flag(&plain, "--ddp-bucket-size"), None);
    let run = render(&export(&m, &c, &cfg, Format::Exatrain, Launcher::Torchrun).unwrap());
    assert!(run.contains("dp_bucket = 80000000"), "{run}");
    for (f, why) in [
        (Framework::MegatronDeepspeed, "no bucket size"),
        (Framework::Torchtitan, "no data-parallel bucket-size option"),
    ] {
        let e = export(&m, &c, &cfg, Format::Framework(f), Launcher::Torchrun).unwrap_err();
        assert!(
            e.to_string().contains(why) && e.to_string().contains("--dp-bucket"),
            "{f}: {e}"
        );
    }
    // one bucket (the trainer's --bucket-mb 0) has no Megatron-LM spelling
    let one = ParallelConfig {
        zero: 1,
        dp_bucket: Some(0),
        ..cfg
    };
    let e = export(
        &m,
        &c,
        &one,
        Format::Framework(Framework::MegatronLm),
        Launcher::Torchrun,
    )
    .unwrap_err();
    assert!(e.to_string().contains("--dp-bucket 0"), "{e}");
}
