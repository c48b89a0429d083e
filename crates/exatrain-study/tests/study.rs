use exatrain_spec::presets;
use exatrain_study::ttt::{daly_interval, expected_wall_time, time_to_train, young_interval};
use exatrain_study::{report, scaling_efficiency, study, StudySpec};

fn spec(nodes: Vec<u32>) -> StudySpec {
    StudySpec {
        nodes,
        global_batch: None,
        tokens: Some(1e11),
        tokens_per_param: 20.0,
        node_mtbf_hours: None,
        checkpoint_write_gbps: None,
        search: exatrain_study::explain::Stack::any(),
        compare: None,
    }
}

/// A layout as a study point, planned on `c`.
fn point(
    m: &exatrain_spec::ModelSpec,
    c: &exatrain_spec::ClusterSpec,
    config: exatrain_spec::ParallelConfig,
) -> exatrain_study::Point {
    exatrain_study::Point {
        global_batch: config.global_batch,
        plan: exatrain_cost::plan(m, c, &config).unwrap(),
        config,
    }
}

#[test]
fn scaling_efficiency_by_hand() {
    // 8 devices at 100 tokens/s each; 32 devices giving 2800 tokens/s → 87.5 %
    assert_eq!(scaling_efficiency(Some(100.0), Some(2800.0), 32), Some(0.875));
    assert_eq!(scaling_efficiency(Some(100.0), None, 32), None);
}

#[test]
fn young_and_daly_intervals_by_hand() {
    // δ = 60 s, M = 1 day: Young √(2·60·86400) = 3220.0 s
    let (d, m) = (60.0, 86400.0);
    assert!((young_interval(d, m) - 3219.94).abs() < 0.01);
    // Daly: √(2δM)·(1 + ⅓√(δ/2M) + δ/(18M)) − δ
    let r: f64 = d / (2.0 * m);
    let want = (2.0 * d * m).sqrt() * (1.0 + r.sqrt() / 3.0 + r / 9.0) - d;
    assert!((daly_interval(d, m) - want).abs() < 1e-9);
    assert!((daly_interval(d, m) - 3180.06).abs() < 0.05);
    assert_eq!(daly_interval(3.0 * m, m), m, "δ ≥ 2M: checkpoint every MTBF");
    // no failures: only the checkpoint writes cost, (τ + δ)/τ
    let w = expected_wall_time(1e6, 3600.0, 60.0, 0.0, 1e15);
    assert!((w / 1e6 - 3660.0 / 3600.0).abs() < 1e-6);
    // failures make it longer
    assert!(expected_wall_time(1e6, 3600.0, 60.0, 600.0, 86400.0) > w);
}

#[test]
fn time_to_train_arithmetic() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let t = time_to_train(&m, &c, exatrain_spec::Dtype::Bf16, 16, 1e5, 1e9, &spec(vec![2]));
    assert_eq!(t.seconds, 1e4);
    assert!((t.gpu_hours - 1e4 / 3600.0 * 16.0).abs() < 1e-9);
    assert!((t.node_hours - 1e4 / 3600.0 * 2.0).abs() < 1e-9);
    assert!((t.energy_mwh.unwrap() - t.node_hours * 2.4 / 1000.0).abs() < 1e-12);
    let ck = t.checkpoint.unwrap();
    assert!(
        (ck.bytes - m.params() as f64 * 14.0).abs() < 1.0,
        "bf16 weights + fp32 master/m/v"
    );
    assert!((ck.system_mtbf_hours - 25000.0 / 2.0).abs() < 1e-9);
    assert!(ck.overhead > 0.0 && ck.effective_days > t.days);
}

#[test]
fn study_rows_report_and_json_agree() {
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    // 1 node cannot hold a 175B model with its Adam state: its row says why, the others go on.
    let s = study(&[m], &c, &spec(vec![1, 16, 32]));
    let rows = &s.models[0].rows;
    assert!(
        rows[0].strong.is_none() && rows[0].why.as_ref().unwrap().contains("fits"),
        "{:?}",
        rows[0].why
    );
    assert!(rows[1].strong.is_some() && rows[2].strong.is_some());
    assert_eq!(
        rows[1].strong_efficiency,
        Some(1.0),
        "the baseline is the smallest count with a layout"
    );
    assert!(rows[0].strong_efficiency.is_none());
    let s = study(&[presets::model("gpt-22b").unwrap()], &c, &spec(vec![4, 8, 16]));
    let r = &s.models[0].rows;
    assert_eq!(r[0].weak_efficiency, Some(1.0));
    let base = r[0].strong.as_ref().unwrap().plan.tokens_per_s / 32.0;
    let want = r[2].strong.as_ref().unwrap().plan.tokens_per_s / 128.0 / base;
    assert!((r[2].strong_efficiency.unwrap() - want).abs() < 1e-12);
    assert_eq!(
        r[2].weak.as_ref().unwrap().global_batch,
        4 * r[0].weak.as_ref().unwrap().global_batch
    );
    let json = serde_json::to_string_pretty(&s).unwrap();
    let page = report::html(&s, &json);
    assert!(
        page.matches("<svg").count() >= 5,
        "throughput, MFU, scaling, time, memory plots"
    );
    let start = page.find("id=\"study\">").unwrap() + "id=\"study\">".len();
    let end = page[start..].find("</script>").unwrap() + start;
    let embedded: serde_json::Value = serde_json::from_str(&page[start..end].replace("<\\/", "</")).unwrap();
    assert_eq!(embedded, serde_json::from_str::<serde_json::Value>(&json).unwrap());
    let t = r[1].time_to_train.as_ref().unwrap();
    assert!(
        page.contains(&format!("{:.1}", t.days)),
        "the table shows the JSON's days"
    );
}

/// `--zero 0,1 --no-flash`: the study searches only what a TP/PP + ZeRO-1 stack without flash
/// attention runs (the Frontier study's Megatron-DeepSpeed), and is never faster than the full
/// search.
#[test]
fn a_restricted_study_recommends_only_what_the_stack_runs() {
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let full = study(std::slice::from_ref(&m), &c, &spec(vec![128]));
    let narrow = study(
        std::slice::from_ref(&m),
        &c,
        &StudySpec {
            search: exatrain_study::explain::Stack {
                framework: None,
                zero: vec![0, 1],
                flash_attention: false,
                fp8: false,
            },
            ..spec(vec![128])
        },
    );
    let layout = |s: &exatrain_study::Study| s.models[0].rows[0].strong.as_ref().unwrap().config;
    let (f, n) = (layout(&full), layout(&narrow));
    assert!(n.zero <= 1 && !n.flash_attention, "{n:?}");
    let tps = |s: &exatrain_study::Study| s.models[0].rows[0].strong.as_ref().unwrap().plan.tokens_per_s;
    assert!(tps(&narrow) <= tps(&full) * (1.0 + 1e-9), "{n:?} beat {f:?}");
}

#[test]
fn the_report_explains_the_recommendation_against_a_stack_term_by_term() {
    use exatrain_study::explain::{sentence, Stack};
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let stack = Stack {
        framework: Some("megatron-deepspeed".parse().unwrap()),
        zero: vec![0, 1],
        flash_attention: false,
        fp8: false,
    };
    let s = study(
        std::slice::from_ref(&m),
        &c,
        &StudySpec {
            compare: Some(stack.clone()),
            ..spec(vec![128])
        },
    );
    let row = &s.models[0].rows[0];
    let rec = row.strong.as_ref().unwrap();
    let e = row.compared.as_ref().expect("compared when asked");
    let b = e.stack_best.as_ref().expect("the stack has a layout at 128 nodes");
    // the stack's best runs on the stack; the whole-space recommendation is at least as fast
    assert!(b.config.zero <= 1 && !b.config.flash_attention, "{:?}", b.config);
    assert!(e.speedup.unwrap() >= 1.0 - 1e-9);
    // the terms are both plans' own, and the step is their sum
    assert_eq!(e.terms.len(), 8);
    assert_eq!(e.terms[7].name, "step");
    let sum = |f: fn(&exatrain_study::explain::Term) -> f64| e.terms[..7].iter().map(f).sum::<f64>();
    assert!((sum(|t| t.recommended_s) - rec.plan.step_time_s).abs() < 1e-6 * rec.plan.step_time_s);
    assert!((sum(|t| t.stack_s) - b.plan.step_time_s).abs() < 1e-6 * b.plan.step_time_s);
    // what the recommendation uses beyond the stack is named
    let needs = e.needs.join("; ");
    if rec.config.zero > 1 {
        assert!(needs.contains(&format!("ZeRO-{}", rec.config.zero)), "{needs}");
    }
    if rec.config.flash_attention {
        assert!(needs.contains("flash attention"), "{needs}");
    }
    // the stack's best is priced with Megatron-DeepSpeed's kernel efficiency, the recommendation
    // with the preset's (Megatron-LM's), and the gap is named
    assert!(needs.contains("megatron-lm's kernel efficiency"), "{needs}");
    // and so is BF16_Optimizer's gradient accumulation, which Megatron-LM fuses into its GEMMs
    assert!(
        needs.contains("megatron-lm's gradient accumulation") && needs.contains("26 bytes per parameter"),
        "{needs}"
    );
    let ds = c.for_framework(stack.framework.unwrap());
    let replanned = exatrain_cost::plan(&m, &ds, &b.config).unwrap();
    assert!((replanned.step_time_s - b.plan.step_time_s).abs() < 1e-9 * b.plan.step_time_s);
    let text = sentence(e);
    assert!(
        text.contains("megatron-deepspeed, ZeRO 0/1, no flash attention"),
        "{text}"
    );
    // a stack that runs everything runs the recommendation itself
    let all = Stack::any();
    let s = study(
        std::slice::from_ref(&m),
        &c,
        &StudySpec {
            compare: Some(all),
            ..spec(vec![128])
        },
    );
    let e = s.models[0].rows[0].compared.as_ref().unwrap();
    assert!(
        e.needs.is_empty() && (e.speedup.unwrap() - 1.0).abs() < 1e-12,
        "{:?}",
        e.needs
    );
    assert!(sentence(e).contains("runs the recommended layout itself"));
}

/// A TP layout without sequence parallelism, priced with Megatron-LM (which hides the backward TP
/// all-reduces under the GEMMs), needs that overlap from Megatron-DeepSpeed, which switches it off
/// under DeepSpeed; with sequence parallelism both overlap and nothing is named; torchtitan never.
#[test]
fn the_explanation_names_the_asynchronous_tp_communication_a_stack_lacks() {
    use exatrain_spec::{Framework, ParallelConfig};
    use exatrain_study::explain::{needs, Stack};
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let point = |config: ParallelConfig| point(&m, &c, config);
    let stack = |f: Framework| Stack {
        framework: Some(f),
        zero: vec![0, 1],
        flash_attention: true,
        fp8: false,
    };
    let no_sp = ParallelConfig {
        zero: 1,
        flash_attention: true,
        ..ParallelConfig::new(8, 16, 8, 1, 1024)
    };
    let said = |cfg: ParallelConfig, f: Framework| {
        needs(&m, &point(cfg), &stack(f), Some(Framework::MegatronLm))
            .join("; ")
            .contains("megatron-lm's asynchronous TP communication")
    };
    assert!(said(no_sp, Framework::MegatronDeepspeed));
    let sp = ParallelConfig {
        sequence_parallel: true,
        ..no_sp
    };
    assert!(!said(sp, Framework::MegatronDeepspeed));
    assert!(said(sp, Framework::Torchtitan));
    assert!(!said(no_sp, Framework::MegatronLm));
}

/// An FP8 study searches FP8 layouts only, is faster than the bf16 one on an H100, and explains
/// its recommendation against a bf16 stack by naming FP8 as a need (once).
#[test]
fn an_fp8_study_recommends_fp8_layouts_and_names_fp8_against_a_bf16_stack() {
    use exatrain_study::explain::Stack;
    let m = presets::model("llama2-13b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let bf16 = study(std::slice::from_ref(&m), &c, &spec(vec![2]));
    let fp8_stack = Stack {
        fp8: true,
        ..Stack::any()
    };
    let fp8 = study(
        std::slice::from_ref(&m),
        &c,
        &StudySpec {
            search: fp8_stack.clone(),
            compare: Some(Stack {
                framework: Some("megatron-lm".parse().unwrap()),
                ..Stack::any()
            }),
            ..spec(vec![2])
        },
    );
    let best = |s: &exatrain_study::Study| s.models[0].rows[0].strong.clone().unwrap();
    let (a, b) = (best(&bf16), best(&fp8));
    assert!(!a.config.fp8 && b.config.fp8, "{:?} {:?}", a.config, b.config);
    assert!(
        b.plan.tokens_per_s > a.plan.tokens_per_s,
        "{} {}",
        b.plan.tokens_per_s,
        a.plan.tokens_per_s
    );
    let e = fp8.models[0].rows[0].compared.as_ref().unwrap();
    let needs = e.needs.join("; ");
    assert_eq!(needs.matches("FP8").count(), 1, "{needs}");
    assert!(fp8_stack.describe().ends_with(", FP8 linears"));
    // a cluster without FP8 tensor cores has no FP8 layout to offer
    let a100 = presets::cluster("selene").unwrap();
    let none = study(
        std::slice::from_ref(&m),
        &a100,
        &StudySpec {
            search: fp8_stack,
            ..spec(vec![2])
        },
    );
    assert!(none.models[0].rows[0].strong.is_none());
}

/// DeepSpeed's separate accumulation passes belong to its `BF16_Optimizer` (ZeRO ≤ 1): a ZeRO-3
/// recommendation that the stack runs at ZeRO-3 does not need Megatron-LM's fused accumulation,
/// a ZeRO-1 one does, and a ZeRO-3 one the stack runs only at ZeRO 0/1 does too.
#[test]
fn the_accumulation_need_is_priced_at_the_stage_the_stack_would_run() {
    use exatrain_spec::{Framework, ParallelConfig};
    use exatrain_study::explain::{needs, Stack};
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let point = |config: ParallelConfig| point(&m, &c, config);
    let ds = |zero: Vec<u8>| Stack {
        framework: Some(Framework::MegatronDeepspeed),
        zero,
        flash_attention: true,
        fp8: false,
    };
    let said = |zero: u8, stack: Stack| {
        let cfg = ParallelConfig {
            zero,
            flash_attention: true,
            ..ParallelConfig::new(1, 1, 64, 1, 128)
        };
        needs(&m, &point(cfg), &stack, Some(Framework::MegatronLm))
            .join("; ")
            .contains("gradient accumulation, without separate passes")
    };
    assert!(!said(3, ds(vec![0, 1, 2, 3])));
    assert!(said(1, ds(vec![0, 1, 2, 3])));
    assert!(said(3, ds(vec![0, 1])));
}
