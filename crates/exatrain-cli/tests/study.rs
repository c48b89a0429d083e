//! `exatrain study` and `exatrain export` end to end.

mod common;
use common::exatrain;

#[test]
fn default_study_is_the_seed_study_and_writes_a_report() {
    let scratch = common::tmp_dir("study-seed");
    let dir = scratch.path().join("out");
    let out = exatrain(&["study", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for w in ["gpt-22b", "gpt-175b", "gpt-1t", "weak eff", "days+fail"] {
        assert!(text.contains(w), "{w}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("study.json")).unwrap()).unwrap();
    assert_eq!(v["nodes"], serde_json::json!([128, 384]));
    assert_eq!(v["models"].as_array().unwrap().len(), 3);
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page.starts_with("<!doctype html>") && page.contains("</html>"));
    assert!(!dir.join("report.tmp").exists(), "no temp file left behind");
    // 1T on 20 trillion tokens: ~120 million exaFLOPs
    let flops = v["models"][2]["total_flops"].as_f64().unwrap() / 1e18;
    assert!((1.1e8..1.3e8).contains(&flops), "{flops}");

    // export from the study: the row's layout, exactly
    let row = &v["models"][1]["rows"][0]["strong"]["config"];
    let study = dir.join("study.json");
    let export_at = |nodes: &str| {
        exatrain(&[
            "export",
            "--from",
            study.to_str().unwrap(),
            "--model",
            "gpt-175b",
            "--nodes",
            nodes,
            "--format",
            "megatron-lm",
        ])
    };
    let out = export_at("128");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains(&format!("--tensor-model-parallel-size {}", row["tp"])),
        "{s}"
    );
    assert!(s.contains(&format!("--pipeline-model-parallel-size {}", row["pp"])));
    assert!(s.contains(&format!("--global-batch-size {}", row["global_batch"])));
    // a node count the study did not run is refused, naming those it did
    let out = export_at("3");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no layout for --nodes 3 in the study (its node counts: 128, 384)"),
        "{err}"
    );
}

#[test]
fn export_from_flags_and_from_a_tune_result() {
    let out = exatrain(&[
        "export",
        "--format",
        "slurm",
        "--model",
        "gpt-22b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--pp",
        "4",
        "--global-batch",
        "64",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8(out.stdout).unwrap().contains("#SBATCH --nodes=8"));
    let scratch = common::tmp_dir("study-tune");
    let dir = scratch.path().join("out");
    let out = exatrain(&[
        "tune",
        "--model",
        "gpt-22b",
        "--gpus",
        "64",
        "--global-batch",
        "128",
        "--out",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success());
    let tune: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let best = &tune["best"][1];
    let files = dir.join("files");
    let out = exatrain(&[
        "export",
        "--from",
        dir.join("tune.json").to_str().unwrap(),
        "--pick",
        "1",
        "--format",
        "exatrain",
        "--out",
        files.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = std::fs::read_to_string(files.join("run.toml")).unwrap();
    let t: toml::Value = toml::from_str(&run).unwrap();
    for k in ["tp", "pp", "dp", "micro_batch", "global_batch", "zero"] {
        assert_eq!(
            t["parallel"][k].as_integer().unwrap() as u64,
            best[k].as_u64().unwrap(),
            "{k}"
        );
    }
    assert_eq!(t["model"]["name"].as_str(), Some("gpt-22b"));
}

#[test]
fn study_and_export_bad_input() {
    let cases: &[(&[&str], &str)] = &[
        (&["study", "--tokens", "0"], "the token budget must be positive"),
        (
            &["study", "--tokens", "1e300T"],
            "--tokens 1e300T: the token budget must be positive and finite",
        ),
        (&["study", "--tokens", "lots"], "is not a number"),
        (&["study", "--nodes", "0"], "--nodes 0 is not a positive integer"),
        (
            &["study", "--out", "/proc/exatrain/report"],
            "--out /proc/exatrain/report: cannot create",
        ),
        (
            &["export", "--format", "nemo"],
            "allowed: megatron-lm, megatron-deepspeed, torchtitan, slurm, exatrain",
        ),
        (
            &["export", "--zero", "3"],
            "through Megatron-FSDP, which exatrain exports only without pipeline parallelism",
        ),
        (
            &["export", "--launcher", "mpirun"],
            "--launcher mpirun is not known (allowed: torchrun, slurm)",
        ),
        (
            &["export", "--format", "torchtitan"],
            "--format torchtitan: torchtitan builds Llama-family models",
        ),
        (
            &["export", "--format", "megatron-deepspeed", "--virtual-stages", "2"],
            "no interleaved schedule",
        ),
        (
            &["export", "--order", "pp-dp-tp"],
            "rank order pp-dp-tp cannot be expressed",
        ),
        (
            &["plan", "--run", "/nonexistent.toml"],
            "--run /nonexistent.toml: cannot read",
        ),
        (&["export", "--from", "/nonexistent.json"], "cannot read"),
    ];
    for (args, want) in cases {
        let out = exatrain(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: got {err}, want {want}");
    }
}

/// `study --framework F` recommends only layouts F runs, so each exports to F.
#[test]
fn study_for_a_framework_recommends_what_it_can_export() {
    for f in ["megatron-lm", "megatron-deepspeed", "torchtitan"] {
        let scratch = common::tmp_dir(&format!("study-fw-{f}"));
        let dir = scratch.path().join("out");
        let out = exatrain(&[
            "study",
            "--model",
            "llama3-8b",
            "--nodes",
            "4,8",
            "--framework",
            f,
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
        for nodes in ["4", "8"] {
            let out = exatrain(&[
                "export",
                "--from",
                dir.join("study.json").to_str().unwrap(),
                "--nodes",
                nodes,
                "--format",
                f,
            ]);
            assert!(
                out.status.success(),
                "{f} at {nodes} nodes: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let out = exatrain(&[
        "tune",
        "--model",
        "gpt-22b",
        "--gpus",
        "64",
        "--framework",
        "torchtitan",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("torchtitan can run none of the layouts"));
}
