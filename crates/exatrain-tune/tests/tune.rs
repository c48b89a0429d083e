use std::collections::HashSet;
use std::time::Duration;

use exatrain_cost::plan;
use exatrain_spec::{presets, ModelFile, ParallelConfig, RankOrder, Recompute};
use exatrain_tune::bayes::{self, Settings, Strategy};
use exatrain_tune::eval::{CommandEval, CostModel, Evaluator, Metric, Outcome};
use exatrain_tune::exhaustive::{self, cfg_key};
use exatrain_tune::space::{self, SpaceSpec};
use exatrain_tune::store::{Store, Trial};
use exatrain_tune::trend::{self, Trend};

fn tiny() -> exatrain_spec::ModelSpec {
    ModelFile {
        layers: Some(4),
        hidden: Some(64),
        heads: Some(4),
        seq_len: Some(16),
        vocab: Some(128),
        ..Default::default()
    }
    .resolve("tiny")
    .unwrap()
}

fn small_space() -> SpaceSpec {
    SpaceSpec {
        zero: vec![0, 1],
        recompute: vec![Recompute::None, Recompute::Full],
        flash_attention: vec![false],
        orders: vec![RankOrder::default()],
        max_micro_batch: 4,
        ..SpaceSpec::new(4, 4)
    }
}

/// A fresh folder, removed with everything in it when the test ends.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("exatrain-{name}-"))
        .tempdir()
        .expect("a folder under the system's temp dir")
}
#[test]
fn space_count_matches_hand_count() {
    // Shapes (tp, pp, dp) × micro-batches, and the options each admits (see the derivation):
    // (1,1,4): 4 | (1,2,2): 8 + 4 | (1,4,1): 6 | (2,1,2): 16 | (2,2,1): 8 + 8 + 4 | (4,1,1): 12  → 70
    let m = tiny();
    assert_eq!(space::configs(&m, &small_space()).count(), 70);
    // All six orders: distinct placements only (1 order with one dim > 1, 2 with two, 6 with three).
    let all = SpaceSpec {
        orders: RankOrder::ALL.to_vec(),
        ..small_space()
    };
    let n_default = space::configs(&m, &small_space())
        .filter(|c| [c.tp, c.pp, c.dp].iter().filter(|x| **x > 1).count() == 2)
        .count();
    let n_all = space::configs(&m, &all)
        .filter(|c| [c.tp, c.pp, c.dp].iter().filter(|x| **x > 1).count() == 2)
        .count();
    assert_eq!(n_all, 2 * n_default);
}

#[test]
fn space_has_no_duplicates_and_only_valid_distinct_configs() {
    for (model, gpus, gb) in [("gpt-22b", 128u32, 256u32), ("llama3-70b", 64, 128)] {
        let m = presets::model(model).unwrap();
        let s = SpaceSpec::new(gpus, gb);
        let mut keys = HashSet::new();
        let mut n = 0;
        for c in space::configs(&m, &s) {
            n += 1;
            assert!(keys.insert(cfg_key(&c)), "duplicate {c:?}");
            assert!(c.check(&m, gpus).is_ok());
            assert!(!(c.sequence_parallel && c.tp == 1));
            assert!(!(c.zero > 0 && c.dp_cp() == 1));
            assert!(!(c.flash_attention && c.recompute == Recompute::Selective));
            assert!(!(c.virtual_stages > 1 && c.pp == 1));
        }
        assert!(n > 1000, "{model}: {n}");
    }
}

#[test]
fn no_layout_says_why() {
    let m = presets::model("gpt-175b").unwrap();
    let s = SpaceSpec::new(7, 1024);
    let why = space::why_empty(&m, &s).unwrap();
    assert!(
        why.contains("no (tp, pp) divides 96 layers and 96 heads into 7 GPUs"),
        "{why}"
    );
    assert!(space::why_empty(&m, &SpaceSpec::new(8, 1024)).is_none());
}

#[test]
fn exhaustive_finds_the_brute_force_optimum_and_top_k_in_order() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec {
        max_micro_batch: 4,
        ..SpaceSpec::new(64, 128)
    };
    let mut all: Vec<(f64, ParallelConfig)> = space::configs(&m, &s)
        .filter_map(|cfg| {
            plan(&m, &c, &cfg)
                .ok()
                .filter(|p| p.fits)
                .map(|p| (p.tokens_per_s, cfg))
        })
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    let r = exhaustive::search(&m, &c, &s, 5, &|_| {});
    assert_eq!(r.evaluated as usize, space::configs(&m, &s).count());
    assert_eq!(r.feasible as usize, all.len());
    assert_eq!(r.best.len(), 5);
    assert_eq!(r.best[0].plan.tokens_per_s, all[0].0);
    for w in r.best.windows(2) {
        assert!(w[0].plan.tokens_per_s >= w[1].plan.tokens_per_s);
    }
    for (i, b) in r.best.iter().enumerate() {
        assert_eq!(b.plan.tokens_per_s, all[i].0);
    }
    // deterministic despite threads
    let again = exhaustive::search(&m, &c, &s, 5, &|_| {});
    assert_eq!(
        again.best.iter().map(|b| cfg_key(&b.cfg)).collect::<Vec<_>>(),
        r.best.iter().map(|b| cfg_key(&b.cfg)).collect::<Vec<_>>()
    );
}

#[test]
fn pareto_front_over_device_counts() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec {
        max_micro_batch: 2,
        orders: vec![RankOrder::default()],
        ..SpaceSpec::new(8, 256)
    };
    let (points, front) = exhaustive::pareto(&m, &c, &s, &[8, 16, 24, 32, 64], &|_| {});
    assert_eq!(points.len(), 5);
    // 8 GCDs cannot hold a 22B model with its optimizer state... or can; either way the front
    // is increasing in both devices and throughput.
    let tput = |g: u32| {
        points
            .iter()
            .find(|p| p.gpus == g)
            .unwrap()
            .best
            .unwrap()
            .plan
            .tokens_per_s
    };
    for w in front.windows(2) {
        assert!(w[0] < w[1] && tput(w[0]) < tput(w[1]));
    }
    assert!(front.contains(&64));
}

fn search(
    strategy: Strategy,
    seed: u64,
    m: &exatrain_spec::ModelSpec,
    c: &exatrain_spec::ClusterSpec,
    s: &SpaceSpec,
    budget: usize,
) -> Vec<Trial> {
    let space: Vec<_> = space::configs(m, s).collect();
    let eval = CostModel { model: m, cluster: c };
    bayes::run(
        &space,
        &eval,
        &Settings {
            encoding: Some(bayes::Encoding::new(m, c)),
            ..Settings::new(strategy, budget, seed)
        },
        Vec::new(),
        &mut |_| Ok(()),
    )
    .unwrap()
}

#[test]
fn bayes_is_reproducible_and_beats_random_on_a_seeded_problem() {
    // The benchmark's 175B problem (73k layouts, 5 within 2 % of the optimum).
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec::new(1024, 1024);
    let optimum = exhaustive::search(&m, &c, &s, 1, &|_| {}).best[0].plan.tokens_per_s;
    let a = search(Strategy::Bayes, 3, &m, &c, &s, 30);
    let b = search(Strategy::Bayes, 3, &m, &c, &s, 30);
    let what = |ts: &[Trial]| {
        ts.iter()
            .map(|t| (t.id, cfg_key(&t.config), t.outcome.clone()))
            .collect::<Vec<_>>()
    };
    assert!(what(&a) == what(&b), "same seed, same search");
    let keys: HashSet<u128> = a.iter().map(|t| cfg_key(&t.config)).collect();
    assert_eq!(keys.len(), a.len(), "no layout tried twice");
    let best = |ts: &[Trial]| ts.iter().filter_map(|t| t.outcome.value()).fold(0.0, f64::max) / optimum;
    let (mut bo, mut rnd) = (Vec::new(), Vec::new());
    for seed in 0..8 {
        bo.push(best(&search(Strategy::Bayes, seed, &m, &c, &s, 30)));
        rnd.push(best(&search(Strategy::Random, seed, &m, &c, &s, 30)));
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2])
    };
    assert!(
        median(&bo) > median(&rnd) + 0.1,
        "bayes {bo:?} vs random {rnd:?} (best after 30 trials / optimum)"
    );
}

#[test]
fn failures_are_recorded_and_the_search_goes_on() {
    let m = presets::model("gpt-175b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec {
        orders: vec![RankOrder::default()],
        ..SpaceSpec::new(256, 256)
    };
    let t = search(Strategy::Bayes, 1, &m, &c, &s, 30);
    assert_eq!(t.len(), 30);
    assert!(
        t.iter().any(|x| matches!(x.outcome, Outcome::OutOfMemory { .. })),
        "175B on 256 GCDs: some layouts must not fit"
    );
    assert!(t.iter().any(|x| x.outcome.value().is_some()));
}

fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    format!("sh {}", p.display())
}

#[test]
fn command_evaluator_reads_numbers_and_survives_bad_trials() {
    let tmp = scratch("eval");
    let dir = tmp.path();
    let cfg = ParallelConfig::new(2, 4, 8, 1, 64);
    let t = Duration::from_secs(5);
    let good = script(
        dir,
        "good.sh",
        r#"echo "starting tp=$1 pp=$2"; echo '{"tokens_per_s": 1234.5}'"#,
    );
    let e = CommandEval::new(
        &format!("{good} {{tp}} {{pp}}"),
        8,
        t,
        Metric::JsonKey("tokens_per_s".into()),
    )
    .unwrap();
    assert_eq!(e.render(&cfg, 0), format!("{good} 2 4"));
    assert_eq!(e.evaluate(&cfg, 0), Outcome::Ok { value: 1234.5 });
    let mds = script(
        dir,
        "mds.sh",
        "echo 'iteration 10 | TFLOPs: 69.2 |'; echo 'iteration 20 | TFLOPs: 71.5 |'",
    );
    let re = Metric::Regex(regex::Regex::new(r"TFLOPs: ([0-9.]+)").unwrap());
    assert_eq!(
        CommandEval::new(&mds, 8, t, re).unwrap().evaluate(&cfg, 0),
        Outcome::Ok { value: 71.5 }
    );
    let fail = script(dir, "fail.sh", "echo boom >&2; exit 3");
    let out = CommandEval::new(&fail, 8, t, Metric::JsonKey("x".into()))
        .unwrap()
        .evaluate(&cfg, 0);
    assert!(
        matches!(&out, Outcome::Failed { message } if message.contains("exit 3") && message.contains("boom")),
        "{out:?}"
    );
    let oom = script(
        dir,
        "oom.sh",
        "echo 'RuntimeError: HIP out of memory. Tried to allocate' >&2; exit 1",
    );
    assert!(matches!(
        CommandEval::new(&oom, 8, t, Metric::JsonKey("x".into()))
            .unwrap()
            .evaluate(&cfg, 0),
        Outcome::OutOfMemory { .. }
    ));
    let silent = script(dir, "silent.sh", "echo no numbers here");
    let out = CommandEval::new(&silent, 8, t, Metric::JsonKey("tokens_per_s".into()))
        .unwrap()
        .evaluate(&cfg, 0);
    assert!(
        matches!(&out, Outcome::Failed { message } if message.contains("no JSON line")),
        "{out:?}"
    );
    let hang = script(dir, "hang.sh", "sleep 30; echo '{\"tokens_per_s\": 1}'");
    let start = std::time::Instant::now();
    let out = CommandEval::new(
        &hang,
        8,
        Duration::from_millis(500),
        Metric::JsonKey("tokens_per_s".into()),
    )
    .unwrap()
    .evaluate(&cfg, 0);
    assert_eq!(out, Outcome::Timeout { seconds: 0.5 });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "killed promptly, grandchildren too"
    );
    let bad = CommandEval::new("run --tp {tp} --foo {foo}", 8, t, Metric::JsonKey("x".into()))
        .err()
        .unwrap();
    assert!(
        bad.0.contains("unknown placeholder {foo}") && bad.0.contains("{micro_batch}"),
        "{bad}"
    );
}

#[test]
fn store_survives_a_torn_write_and_rejects_corruption() {
    let tmp = scratch("store");
    let dir = tmp.path().join("store");
    let mut st = Store::create(&dir, &serde_json::json!({"what": "test"})).unwrap();
    let t = |id| Trial {
        id,
        config: ParallelConfig::new(1, 1, id as u32 + 1, 1, 8),
        outcome: Outcome::Ok { value: id as f64 },
        seconds: 0.1,
    };
    st.append(&t(0)).unwrap();
    st.append(&t(1)).unwrap();
    drop(st);
    assert!(
        Store::create(&dir, &serde_json::json!({})).is_err(),
        "never overwrites a search"
    );
    let path = dir.join("trials.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"id\": 2, \"config\": {\"tp\"");
    std::fs::write(&path, &text).unwrap();
    let (mut st, meta, trials): (Store, serde_json::Value, Vec<Trial>) = Store::open(&dir).unwrap();
    assert_eq!(meta["what"], "test");
    assert_eq!(trials, vec![t(0), t(1)]);
    st.append(&t(2)).unwrap();
    drop(st);
    let (_, _, trials): (Store, serde_json::Value, Vec<Trial>) = Store::open(&dir).unwrap();
    assert_eq!(trials.len(), 3);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replacen("\"id\":1", "\"id\":\"x\"", 1);
    std::fs::write(&path, text).unwrap();
    let err = Store::open::<serde_json::Value>(&dir).err().unwrap();
    assert!(err.0.contains("line 2") && err.0.contains("corrupt"), "{err}");
}

#[test]
fn a_miscalibrated_cost_model_as_prior_needs_fewer_trials_than_a_cold_start() {
    // The truth: the cost model on Frontier. The prior: the same model on a Frontier whose
    // links are half as fast and whose GEMMs reach 80 % of what they do (a poor calibration).
    let m = presets::model("gpt-22b").unwrap();
    let truth = presets::cluster("frontier").unwrap();
    let mut wrong = truth.clone();
    exatrain_cost::fit::Factor::Compute.apply(&mut wrong, 0.8);
    exatrain_cost::fit::Factor::Bandwidth.apply(&mut wrong, 0.5);
    let s = SpaceSpec {
        orders: vec![RankOrder::default()],
        ..SpaceSpec::new(128, 512)
    };
    let space: Vec<_> = space::configs(&m, &s).collect();
    let optimum = exhaustive::search(&m, &truth, &s, 1, &|_| {}).best[0].plan.tokens_per_s;
    let prior: Vec<f64> = space
        .iter()
        .map(|c| match plan(&m, &wrong, c) {
            Ok(p) if p.fits => p.tokens_per_s.ln(),
            _ => f64::NAN,
        })
        .collect();
    let eval = CostModel {
        model: &m,
        cluster: &truth,
    };
    let trials = |seed: u64, prior: Option<Vec<f64>>| {
        let mut st = Settings::new(Strategy::Bayes, 30, seed);
        st.prior = prior;
        let t = bayes::run(&space, &eval, &st, Vec::new(), &mut |_| Ok(())).unwrap();
        bayes::trials_to_reach(&t, optimum, 0.02).unwrap_or(31)
    };
    let median = |mut v: Vec<usize>| {
        v.sort();
        v[v.len() / 2]
    };
    let cold = median((0..3).map(|s| trials(s, None)).collect());
    let warm = median((0..3).map(|s| trials(s, Some(prior.clone()))).collect());
    eprintln!("trials to within 2 %: {warm} with the prior, {cold} without");
    assert!(
        warm < cold,
        "trials to within 2 %: {warm} with the prior, {cold} without"
    );
    assert!(warm <= 12, "{warm}");
    // the prior must rate the search's own space
    let mut st = Settings::new(Strategy::Bayes, 5, 0);
    st.prior = Some(vec![0.0; 3]);
    let e = bayes::run(&space, &eval, &st, Vec::new(), &mut |_| Ok(()))
        .err()
        .unwrap();
    assert!(e.0.contains("the prior rates 3 layouts"), "{e}");
}

#[test]
fn the_throughput_may_come_from_a_file_the_trial_writes() {
    let tmp = scratch("jsonfile");
    let dir = tmp.path();
    let cfg = ParallelConfig::new(2, 1, 4, 1, 8);
    let writer = script(dir, "w.sh", r#"echo "{\"measured\": {\"tps\": $2}}" > "$1""#);
    let report = format!("{}/r{{trial}}-{{tp}}.json", dir.display());
    let metric = |p: &str| Metric::JsonFile {
        path: report.clone(),
        pointer: p.into(),
    };
    let e = CommandEval::new(
        &format!("{writer} {report} 77.5"),
        8,
        Duration::from_secs(5),
        metric("/measured/tps"),
    )
    .unwrap();
    assert_eq!(e.evaluate(&cfg, 3), Outcome::Ok { value: 77.5 });
    assert!(dir.join("r3-2.json").is_file(), "placeholders filled in the path");
    let e = CommandEval::new(
        &format!("{writer} {report} 1"),
        8,
        Duration::from_secs(5),
        metric("/nope"),
    )
    .unwrap();
    let out = e.evaluate(&cfg, 4);
    assert!(
        matches!(&out, Outcome::Failed { message } if message.contains("no number at /nope in") && message.contains("r4-2.json")),
        "{out:?}"
    );
    let bad = Metric::JsonFile {
        path: "{out}/r.json".into(),
        pointer: "/x".into(),
    };
    let err = CommandEval::new("true", 8, Duration::from_secs(5), bad).err().unwrap();
    assert!(err.0.contains("the report path: unknown placeholder {out}"), "{err}");
}

/// Spearman's rank correlation.
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let ranks = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|x, y| v[*x].total_cmp(&v[*y]));
        let mut r = vec![0.0; v.len()];
        for (k, i) in idx.into_iter().enumerate() {
            r[i] = k as f64;
        }
        r
    };
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let var: f64 = ra.iter().map(|x| (x - mean).powi(2)).sum();
    cov / var
}

#[test]
fn the_trend_fitted_to_a_few_trials_ranks_the_layouts_it_has_not_seen() {
    // Fit the textbook trend's constants to 15 random layouts that ran (the cost model's
    // throughput), then rank every other layout that runs; the median over 5 draws of the 15,
    // so that one unlucky draw neither passes nor fails the test.
    for (model, gpus, gbs) in [("gpt-22b", 128, 1024), ("gpt-175b", 1024, 1024), ("gpt-1t", 3072, 3072)] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster("frontier").unwrap();
        let enc = bayes::Encoding::new(&m, &c);
        let runs: Vec<(ParallelConfig, f64)> = space::configs(&m, &SpaceSpec::new(gpus, gbs))
            .filter_map(|p| plan(&m, &c, &p).ok().filter(|x| x.fits).map(|x| (p, x.tokens_per_s)))
            .collect();
        let (mut rhos, mut errs) = (Vec::new(), Vec::new());
        for seed in 1..=5 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let seen: Vec<usize> = (0..15).map(|_| rng.usize(..runs.len())).collect();
            let rows: Vec<_> = seen.iter().map(|&i| trend::terms(&enc, &runs[i].0)).collect();
            let secs: Vec<f64> = seen.iter().map(|&i| 1.0 / runs[i].1).collect();
            let fit = Trend::fit(&rows, &secs).unwrap();
            let unseen: Vec<&(ParallelConfig, f64)> = runs
                .iter()
                .enumerate()
                .filter(|(i, _)| !seen.contains(i))
                .map(|x| x.1)
                .collect();
            let pred: Vec<f64> = unseen
                .iter()
                .map(|(p, _)| fit.ln_throughput(&trend::terms(&enc, p)).unwrap())
                .collect();
            let truth: Vec<f64> = unseen.iter().map(|x| x.1.ln()).collect();
            rhos.push(spearman(&pred, &truth));
            let mut err: Vec<f64> = pred.iter().zip(&truth).map(|(p, t)| (p - t).abs()).collect();
            err.sort_by(|a, b| a.total_cmp(b));
            errs.push(err[err.len() / 2]);
        }
        rhos.sort_by(|a, b| a.total_cmp(b));
        errs.sort_by(|a, b| a.total_cmp(b));
        let (rho, median_err) = (rhos[2], errs[2]);
        eprintln!(
            "{model}: Spearman {rhos:.3?}, median |ln error| {errs:.3?} over {} layouts",
            runs.len() - 15
        );
        assert!(rho > 0.9, "{model}: Spearman {rho:.3}");
        assert!(median_err < 0.1, "{model}: median |ln error| {median_err:.3}");
    }
}

#[test]
fn the_fitted_trend_as_mean_reaches_the_optimum_in_fewer_trials() {
    // The benchmark's 22B problem with the default rank order: the GP with the textbook trend as
    // its mean against the GP with a constant mean, 6 seeds each.
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec {
        orders: vec![RankOrder::default()],
        ..SpaceSpec::new(128, 1024)
    };
    let space: Vec<_> = space::configs(&m, &s).collect();
    let optimum = exhaustive::search(&m, &c, &s, 1, &|_| {}).best[0].plan.tokens_per_s;
    let eval = CostModel { model: &m, cluster: &c };
    let trials = |seed: u64, trend: bool| {
        let settings = Settings {
            encoding: Some(bayes::Encoding::new(&m, &c)),
            trend,
            ..Settings::new(Strategy::Bayes, 50, seed)
        };
        let t = bayes::run(&space, &eval, &settings, Vec::new(), &mut |_| Ok(())).unwrap();
        bayes::trials_to_reach(&t, optimum, 0.02).unwrap_or(51)
    };
    let median = |mut v: Vec<usize>| {
        v.sort();
        (v[v.len() / 2 - 1] + v[v.len() / 2]) as f64 / 2.0
    };
    let with = median((0..6).map(|s| trials(s, true)).collect());
    let without = median((0..6).map(|s| trials(s, false)).collect());
    eprintln!("median trials to within 2 %: {with} with the trend, {without} without");
    assert!(with < without, "{with} with the trend, {without} without");
    assert!(with <= 30.0, "{with}");
}

#[test]
fn context_parallelism_enters_the_space_for_long_sequences_only() {
    use exatrain_spec::Framework;
    let cp_sizes = |c: &[ParallelConfig]| {
        let mut v: Vec<u32> = c.iter().map(|c| c.cp).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    // seq 8192: cp 2 keeps 4096 tokens per rank (space::CP_MIN_LOCAL_SEQ), cp 4 would keep 2048
    let m = presets::model("llama3-8b").unwrap();
    let s = SpaceSpec {
        orders: vec![RankOrder::default()],
        ..SpaceSpec::new(16, 64)
    };
    let all: Vec<ParallelConfig> = space::configs(&m, &s).collect();
    assert_eq!(cp_sizes(&all), vec![1, 2]);
    for c in all.iter().filter(|c| c.cp > 1) {
        assert!(c.flash_attention, "{c:?}");
        assert_eq!(c.gpus(), 16);
        assert!(c.check(&m, 16).is_ok());
    }
    // a layout differing only in cp is a different layout: no key collides
    let keys: HashSet<u128> = all.iter().map(cfg_key).collect();
    assert_eq!(keys.len(), all.len());
    // --max-cp 1, no flash attention, or a framework without ring attention: none
    let capped = SpaceSpec { max_cp: 1, ..s.clone() };
    assert_eq!(cp_sizes(&space::configs(&m, &capped).collect::<Vec<_>>()), vec![1]);
    let no_flash = SpaceSpec {
        flash_attention: vec![false],
        ..s.clone()
    };
    assert_eq!(cp_sizes(&space::configs(&m, &no_flash).collect::<Vec<_>>()), vec![1]);
    let ds = SpaceSpec {
        framework: Some(Framework::MegatronDeepspeed),
        ..s.clone()
    };
    assert_eq!(cp_sizes(&space::configs(&m, &ds).collect::<Vec<_>>()), vec![1]);
    let tt = SpaceSpec {
        framework: Some(Framework::Torchtitan),
        ..s.clone()
    };
    let tt_all: Vec<ParallelConfig> = space::configs(&m, &tt).collect();
    assert_eq!(cp_sizes(&tt_all), vec![1, 2]);
    assert!(tt_all.iter().filter(|c| c.cp > 1).all(|c| c.zero >= 2));
    // seq 2048: no context parallelism at all
    let g = presets::model("gpt-22b").unwrap();
    let gs = SpaceSpec::new(16, 64);
    assert!(space::configs(&g, &gs).all(|c| c.cp == 1));
    // and the Bayesian search can reach a cp layout (its knob tree tells them apart)
    let space: Vec<ParallelConfig> = all.clone();
    let feats: HashSet<Vec<u64>> = space
        .iter()
        .map(|c| bayes::features(c, None).iter().map(|x| x.to_bits()).collect())
        .collect();
    assert_eq!(feats.len(), space.len());
}
