//! `exatrain calibrate`: measure this machine and write it as a cluster spec.

use std::path::PathBuf;

use clap::Args;
use exatrain_spec::{presets, Dtype, ParallelConfig, SpecError};
use exatrain_train::calibrate::{self, CommPoint};
use exatrain_tune::store::write_atomic;

use crate::reports;

#[derive(Args)]
pub struct CalibrateArgs {
    /// Write the measured machine as a cluster TOML that `plan` and `tune` accept (--cluster FILE).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Fewer and smaller benchmarks (seconds instead of tens of seconds).
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub json: bool,
    /// Time the collectives (all-reduce, all-gather, reduce-scatter, send/recv) over this many
    /// in-process ranks and fit the planner's link bandwidth and latency to them (1: skip);
    /// the spec then is one node of this many devices.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Time the collectives over the ranks of this MPI job instead
    /// (`mpirun -n N exatrain calibrate --mpi`); rank 0 runs the rest and writes the spec.
    #[arg(long)]
    pub mpi: bool,
    /// Instead of benchmarking: fit the --cluster spec's efficiency factors (compute, memory,
    /// link bandwidth, latency) to these `exatrain train --report` files or framework logs
    /// (Megatron-LM, Megatron-DeepSpeed, torchtitan: .log/.out/.txt, each with its run file
    /// `<name>.toml` or `run.toml` from `export --format exatrain`, or Megatron's argument dump)
    /// (files or folders; at least 3 trainer reports; one framework log or published run fits the
    /// compute factor alone) by least squares on their measured time terms, and write the result
    /// to --out (default: over the --cluster file, only once the fit succeeded, keeping the spec
    /// before the first fit as FILE.orig).
    #[arg(long, num_args = 1..)]
    pub fit: Vec<PathBuf>,
    /// Fit the --cluster spec's compute and link-bandwidth factors to the published or measured
    /// runs of this CSV (the columns of data/published-runs.csv: each row's throughput becomes a
    /// step time) instead of, or with, --fit's files. Only the rows that ran on --cluster are
    /// used. One or two runs (one short run, then project) fit the compute factor alone.
    #[arg(long)]
    pub fit_runs: Option<PathBuf>,
    /// With --fit: the spec to start from (what `exatrain calibrate --out` wrote).
    #[arg(long)]
    pub cluster: Option<String>,
    /// With --fit: every report must be a run of this model. With --fit-runs: only the rows of
    /// this model are fitted (its preset in the CSV's `model` column, or the row's name).
    #[arg(long)]
    pub model: Option<String>,
    /// What to measure: this machine's CPU (fp32 GEMMs, memory, in-process or MPI collectives)
    /// or one NVIDIA GPU (bf16 cuBLASLt GEMMs over transformer shapes, copy bandwidth, the
    /// trainer's kernels compiled by NVRTC; needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// With --device cuda: which GPU (CUDA ordinal).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// With --device cuda: the GPU's dense bf16 peak, TFLOP/s (known for H200, H100, GH200,
    /// A100, L40S; needed for any other).
    #[arg(long)]
    pub peak_tflops: Option<f64>,
}

/// Where `calibrate` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

/// The rows of a runs CSV (`validate`'s format) as measured step times: the row's throughput
/// metric turned back into the seconds one step took.
fn csv_runs(
    path: &std::path::Path,
    model: Option<&str>,
    cluster: &str,
) -> Result<Vec<exatrain_cost::fit::Measured>, SpecError> {
    let at = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| SpecError::new(format!("--fit-runs {at}: cannot read: {e}")))?;
    let mut out = Vec::new();
    let mut elsewhere = std::collections::BTreeSet::new();
    // with --model, the rows of that model: its preset in the `model` column, or its name
    let mut other_models = std::collections::BTreeSet::new();
    let mut of_model = 0usize;
    for run in crate::validate::read_runs(&text, &at)? {
        if model.is_some_and(|m| m != run.model && m != run.name) {
            other_models.insert(if run.model == "-" {
                run.name.clone()
            } else {
                run.model.clone()
            });
            continue;
        }
        of_model += 1;
        let c = crate::validate::to_case(&run)?;
        // a runs file may hold several machines: each fits its own spec
        if c.cluster.name != cluster {
            elsewhere.insert(c.cluster.name.clone());
            continue;
        }
        let step = crate::validate::measured_step(&c);
        if !(step.is_finite() && step > 0.0) {
            return Err(SpecError::new(format!(
                "--fit-runs {at}: run {}: measured {} {} gives no step time",
                run.name, run.metric, run.measured
            )));
        }
        out.push(exatrain_cost::fit::Measured {
            name: run.name.clone(),
            model: c.model,
            layout: c.cfg,
            time_s: Default::default(),
            step_s: Some(step),
            stack: exatrain_cost::fit::RunStack::Framework(c.framework),
            // the row's softmax, async_tp, bias_fusion and overlap_pp, as validate prices it
            switches: exatrain_spec::StackSwitches::of(&c.cluster.stack),
        });
    }
    if let (Some(m), 0) = (model, of_model) {
        return Err(SpecError::new(format!(
            "--fit-runs {at}: no row is a run of --model {m} (a row's `model` column or its name; the rows' models: {})",
            crate::validate::listed(other_models)
        )));
    }
    if out.is_empty() {
        return Err(SpecError::new(format!(
            "--fit-runs {at}: no run ran on --cluster {cluster} (its runs ran on: {}): fit each machine's runs to its own spec",
            elsewhere.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(out)
}

/// When the fit is written over the `--cluster` file itself, copy that file to `<file>.orig`
/// first, unless a copy is already there (the spec before the first fit). Returns the copy
/// made.
fn keep_original(base: &str, out: &std::path::Path) -> Result<Option<PathBuf>, SpecError> {
    let base = std::path::Path::new(base);
    let same = match (base.canonicalize(), out.canonicalize()) {
        (Ok(b), Ok(o)) => b == o,
        _ => false,
    };
    if !same {
        return Ok(None);
    }
    let mut name = base.as_os_str().to_owned();
    name.push(".orig");
    let copy = PathBuf::from(name);
    if copy.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(base).map_err(|e| SpecError::new(format!("--cluster {}: {e}", base.display())))?;
    write_atomic(&copy, &bytes)?;
    Ok(Some(copy))
}

/// `--fit`: the spec's factors fitted to measured runs, written atomically only on success.
fn run_fit(a: &CalibrateArgs) -> Result<(), SpecError> {
    let base_name = a.cluster.as_deref().ok_or_else(|| {
        SpecError::new("--fit needs --cluster FILE: the spec to fit (from `exatrain calibrate --out`)")
    })?;
    let base = exatrain_spec::load::cluster(base_name)?;
    let out = match (&a.out, std::path::Path::new(base_name).is_file()) {
        (Some(o), _) => o.clone(),
        (None, true) => PathBuf::from(base_name),
        (None, false) => {
            return Err(SpecError::new(format!(
                "--fit: --cluster {base_name} is a preset, not a file: say where to write with --out FILE"
            )))
        }
    };
    let mut files = Vec::new();
    for f in &a.fit {
        files.extend(reports::files(f, "--fit")?);
    }
    let (logs, jsons) = crate::framework_logs::split(files);
    let mut runs = reports::read(&jsons)?
        .iter()
        .map(|(name, v)| reports::measured(name, v, a.model.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    for f in &logs {
        let (run, log) = crate::framework_logs::measured(f, a.model.as_deref())?;
        println!(
            "{}: {} log, {} on {} GPUs, {:.3} s per step (median after {} warm-up iterations)",
            run.name,
            log.format,
            run.model.name,
            run.layout.gpus(),
            run.step_s.unwrap_or(f64::NAN),
            crate::framework_logs::WARMUP
        );
        runs.push(run);
    }
    if let Some(csv) = &a.fit_runs {
        runs.extend(csv_runs(csv, a.model.as_deref(), &base.name)?);
    }
    let fit = exatrain_cost::fit::fit(&base, &runs)?;
    fit.cluster.validate()?;
    if !(fit.rms_log_error_after <= fit.rms_log_error_before) {
        return Err(SpecError::new(
            "calibrate --fit: the fit did not improve on the spec; nothing written",
        ));
    }
    let describe: Vec<String> = fit
        .factors
        .iter()
        .map(|f| {
            let name = serde_json::to_value(f.factor)
                .expect("json")
                .as_str()
                .unwrap_or("")
                .to_string();
            if f.fitted {
                format!("{name} ×{:.3}", f.multiplier)
            } else {
                format!(
                    "{name} kept ({})",
                    if fit.compute_only
                        && f.factor != exatrain_cost::fit::Factor::Memory
                        && f.factor != exatrain_cost::fit::Factor::Latency
                    {
                        "fewer than 3 step times fit the compute factor alone; give 3 or more runs to fit it"
                    } else if fit.step_times_only {
                        "step times alone cannot tell it from compute and bandwidth"
                    } else {
                        "no measured term depends on it"
                    }
                )
            }
        })
        .collect();
    // keep the benchmark's comment lines, add the fit's
    let kept: String = std::fs::read_to_string(base_name)
        .unwrap_or_default()
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter(|l| !l.starts_with("# Fitted"))
        .map(|l| format!("{l}\n"))
        .collect();
    let header = format!(
        "{kept}# Fitted by `exatrain calibrate --fit` to {} runs ({} measured terms): {}; rms ln(predicted/measured) {:.3} -> {:.3}.\n",
        fit.runs,
        fit.terms,
        describe.join(", "),
        fit.rms_log_error_before,
        fit.rms_log_error_after
    );
    let text = toml::to_string(&fit.cluster).map_err(|e| SpecError::new(format!("--out {}: {e}", out.display())))?;
    // Writing over the spec it started from: the first such spec is kept beside it, so the
    // measured machine is never lost to a fit (a later fit leaves that copy as it is).
    let kept_copy = keep_original(base_name, &out)?;
    write_atomic(&out, format!("{header}{text}").as_bytes())?;
    if let Some(k) = &kept_copy {
        eprintln!("kept the spec the fit started from as {}", k.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&fit).expect("json"));
    } else {
        println!("fitted {} runs ({} measured time terms):", fit.runs, fit.terms);
        for d in &describe {
            println!("  {d}");
        }
        println!(
            "rms ln(predicted/measured): {:.3} before, {:.3} after",
            fit.rms_log_error_before, fit.rms_log_error_after
        );
        println!("wrote {}", out.display());
    }
    Ok(())
}

fn comm_sizes(quick: bool) -> (Vec<usize>, usize) {
    if quick {
        (vec![4 << 10, 64 << 10, 1 << 20], 3)
    } else {
        (
            vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20],
            5,
        )
    }
}

/// The most in-process ranks `calibrate` times (each is a thread with its own buffers).
const MAX_RANKS: usize = 256;

/// The collectives over `ranks` in-process ranks (rank 0's points).
fn collectives_in_process(ranks: usize, quick: bool) -> Result<Vec<CommPoint>, SpecError> {
    let (sizes, reps) = comm_sizes(quick);
    let comms = exatrain_parallel::comm::in_process(ranks, std::time::Duration::from_secs(60));
    let mut all: Vec<Result<Vec<CommPoint>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let sizes = &sizes;
                s.spawn(move || calibrate::time_collectives(&c, sizes, reps).map_err(|e| e.0))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    all.swap_remove(0)
        .map_err(|e| SpecError::new(format!("calibrate --ranks {ranks}: {e}")))
}

fn memory_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(16.0, |kib| kib / 1048576.0)
}

/// What `calibrate_mpi` gives: the device's calibration, the collectives measured, whether this
/// is rank 0, and the MPI state to keep alive until the run ends.
type MpiCalibration = (calibrate::Calibration, Vec<CommPoint>, bool, Box<dyn std::any::Any>);

/// Under MPI every rank measures its device at the same time (the share of the machine it gets
/// when all train at once), then the group's collectives; rank 0's numbers are kept.
#[cfg(feature = "mpi")]
fn calibrate_mpi(quick: bool) -> Result<MpiCalibration, SpecError> {
    use exatrain_parallel::comm::Communicator;
    let (universe, world) = exatrain_parallel::mpi_comm::Mpi::world(std::time::Duration::from_secs(300))
        .map_err(|e| SpecError::new(e.0))?;
    let c = calibrate::calibrate(memory_gib(), quick);
    let (sizes, reps) = comm_sizes(quick);
    let points = calibrate::time_collectives(&world, &sizes, reps).map_err(|e| SpecError::new(e.0))?;
    let root = world.rank() == 0;
    // MPI ends when the universe drops: keep it (and the world) to the end of the run
    Ok((c, points, root, Box::new((world, universe))))
}

#[cfg(not(feature = "mpi"))]
fn calibrate_mpi(_quick: bool) -> Result<MpiCalibration, SpecError> {
    Err(SpecError::new(
        "--mpi: this exatrain was built without MPI (build with `cargo build --release --features mpi`)",
    ))
}

pub fn run(a: CalibrateArgs) -> Result<(), SpecError> {
    if !a.fit.is_empty() || a.fit_runs.is_some() {
        return run_fit(&a);
    }
    if a.cluster.is_some() || a.model.is_some() {
        return Err(SpecError::new("--cluster and --model go with --fit REPORTS"));
    }
    if a.device == Device::Cuda {
        if a.mpi || a.ranks != 4 {
            return Err(SpecError::new(
                "--device cuda measures one GPU: --mpi and --ranks go with --device cpu",
            ));
        }
        return crate::calibrate_gpu::run(&a);
    }
    if a.peak_tflops.is_some() || a.gpu != 0 {
        return Err(SpecError::new("--gpu and --peak-tflops go with --device cuda"));
    }
    if a.ranks == 0 || a.ranks > MAX_RANKS {
        return Err(SpecError::new(format!(
            "--ranks {}: must be in 1..={MAX_RANKS} (1 skips the collectives)",
            a.ranks
        )));
    }
    let (mut c, points, ranks, _universe) = if a.mpi {
        let (c, points, root, universe) = calibrate_mpi(a.quick)?;
        if !root {
            return Ok(());
        }
        let n = points.first().map_or(1, |p| p.ranks);
        (c, points, n, Some(universe))
    } else {
        let points = if a.ranks > 1 {
            collectives_in_process(a.ranks, a.quick)?
        } else {
            Vec::new()
        };
        (calibrate::calibrate(memory_gib(), a.quick), points, a.ranks, None)
    };
    let link = if points.is_empty() {
        None
    } else {
        Some(calibrate::fit_link(&points).ok_or_else(|| {
            SpecError::new("calibrate: the collective timings do not determine a bandwidth (all zero?)")
        })?)
    };
    if let Some(l) = &link {
        c.spec = calibrate::with_link(&c.spec, ranks, l);
    }
    c.spec.validate()?;
    // The planner on this machine, for the trainer's bench config (compare with `cargo bench -p exatrain-train`).
    let bench = presets::model("bench")?;
    let cfg = ParallelConfig {
        dtype: Dtype::Fp32,
        ..ParallelConfig::new(1, 1, 1, 8, 8)
    };
    let p = exatrain_cost::plan(&bench, &c.spec, &cfg)?;
    if let Some(out) = &a.out {
        let text = toml::to_string(&c.spec).map_err(|e| SpecError::new(format!("--out {}: {e}", out.display())))?;
        let mut header = format!(
            "# Measured by `exatrain calibrate` on this machine ({} threads): fp32 GEMM peak {:.1} GFLOP/s,\n# memory {:.1} GB/s; GEMM curve fitted on {} shapes (median error {:.1} %).\n",
            c.threads,
            c.peak_gflops,
            c.memory_gbps,
            c.gemm.len(),
            100.0 * c.fit_error
        );
        if let Some(l) = &link {
            header += &format!(
                "# Collectives over {ranks} {} ranks: link {:.2} GB/s, latency {:.1} µs ({} points, median error {:.1} %).\n",
                if a.mpi { "MPI" } else { "in-process" },
                l.gbps,
                l.latency_us,
                points.len(),
                100.0 * l.median_error
            );
        }
        write_atomic(out, format!("{header}{text}").as_bytes())?;
    }
    if a.json {
        let mut v = serde_json::to_value(&c).expect("json");
        v["collectives"] = serde_json::json!(points);
        v["link"] = serde_json::json!(link);
        v["bench_prediction"] =
            serde_json::json!({"step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s, "time_s": p.time_s});
        println!("{v}");
        return Ok(());
    }
    println!("{:>6} {:>6} {:>6} {:>10} {:>10}", "m", "n", "k", "GFLOP/s", "fitted");
    for g in &c.gemm {
        println!(
            "{:>6} {:>6} {:>6} {:>10.1} {:>10.1}",
            g.m,
            g.n,
            g.k,
            g.gflops,
            c.peak_gflops * c.fit.efficiency(g.m as f64, g.n as f64, g.k as f64)
        );
    }
    println!(
        "\nfp32 GEMM peak {:.1} GFLOP/s; curve max_efficiency {:.3}, half_size {:.0} (median error {:.1} %); memory {:.1} GB/s; {} threads",
        c.peak_gflops,
        c.fit.max_efficiency,
        c.fit.half_size,
        100.0 * c.fit_error,
        c.memory_gbps,
        c.threads
    );
    if let Some(l) = &link {
        println!(
            "\n{:<15} {:>5} {:>10} {:>10} {:>10}",
            "collective", "ranks", "bytes", "µs", "fitted µs"
        );
        for p in &points {
            let (f, h) = p.kind.ring(p.ranks);
            let fitted = f * p.bytes as f64 / (l.gbps * 1e9) + h * l.latency_us * 1e-6;
            println!(
                "{:<15} {:>5} {:>10} {:>10.1} {:>10.1}",
                serde_json::to_value(p.kind).expect("json").as_str().unwrap_or(""),
                p.ranks,
                p.bytes,
                1e6 * p.seconds,
                1e6 * fitted
            );
        }
        println!(
            "link over {ranks} ranks: {:.2} GB/s, latency {:.1} µs (median error {:.1} %)",
            l.gbps,
            l.latency_us,
            100.0 * l.median_error
        );
    }
    println!(
        "planner on this machine, bench config (6×384, seq 256, batch 8, fp32): {:.3} s/step, {:.0} tokens/s",
        p.step_time_s, p.tokens_per_s
    );
    if let Some(out) = &a.out {
        println!("wrote {} (use: exatrain plan --cluster {0} ...)", out.display());
    }
    Ok(())
}
