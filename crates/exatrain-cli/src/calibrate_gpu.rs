//! `exatrain calibrate --device cuda`: measure one GPU through cuBLASLt and the NVRTC-compiled
//! kernels and write it as a cluster spec the planner reads — the bf16 GEMM efficiency curve
//! fitted over transformer-shaped products, the memory bandwidth, the device's memory — plus
//! the checks the trainer's GPU path relies on (every kernel module compiles for this device;
//! a bf16 product accumulates into fp32 with `beta = 1`). Without the `cuda` feature, or
//! without a driver or a device, one clear error and exit 2.

use exatrain_spec::SpecError;

use crate::calibrate_cmd::CalibrateArgs;

/// The dense peaks (bf16 tensor, fp32 non-tensor; TFLOP/s) and HBM bandwidth (GB/s) NVIDIA
/// publishes, by the name the driver reports. A device not listed needs --peak-tflops.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const KNOWN_DEVICES: &[(&str, f64, f64, f64)] = &[
    ("H200", 989.4, 66.9, 4800.0),
    ("H100 PCIe", 756.0, 51.2, 2000.0),
    ("H100 NVL", 835.0, 60.0, 3900.0),
    ("H100", 989.4, 66.9, 3350.0),
    ("GH200", 989.4, 66.9, 4000.0),
    ("A100-SXM4-80GB", 312.0, 19.5, 2039.0),
    ("A100 80GB PCIe", 312.0, 19.5, 1935.0),
    ("A100", 312.0, 19.5, 1555.0),
    ("L40S", 362.1, 91.6, 864.0),
];

/// (bf16 peak, fp32 peak, HBM GB/s) of a device by its driver name: the first listed name it
/// contains.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn known_device(name: &str) -> Option<(f64, f64, f64)> {
    KNOWN_DEVICES
        .iter()
        .find(|(k, ..)| name.contains(k))
        .map(|&(_, bf16, fp32, hbm)| (bf16, fp32, hbm))
}

/// The GEMM shapes timed (row-major m×k by k×n): squares, and GPT-2 124M's and a 7B model's
/// products at 8192 tokens (QKV, attention out, MLP up, MLP down, the head).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const SHAPES: &[(usize, usize, usize)] = &[
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 2304, 768),
    (8192, 768, 768),
    (8192, 3072, 768),
    (8192, 768, 3072),
    (8192, 50304, 768),
    (8192, 12288, 4096),
    (8192, 4096, 4096),
    (8192, 11008, 4096),
    (8192, 4096, 11008),
];

#[cfg(not(feature = "cuda"))]
pub fn run(_a: &CalibrateArgs) -> Result<(), SpecError> {
    Err(SpecError::new(format!("--device cuda: {}", exatrain_cuda::not_built())))
}

#[cfg(feature = "cuda")]
pub fn run(a: &CalibrateArgs) -> Result<(), SpecError> {
    use exatrain_cuda::kernels::{Precision, MODULES};
    use exatrain_cuda::{bench, device, gemm::Lt};
    use exatrain_spec::{ClusterSpec, DeviceSpec, NetworkSpec, NodeSpec};
    use exatrain_train::calibrate::{gemm_fit, GemmFit, GemmPoint};
    use exatrain_tune::store::write_atomic;

    let gpu_err = |e: exatrain_cuda::GpuError| SpecError::new(format!("calibrate --device cuda: {e}"));
    if let Some(p) = a.peak_tflops {
        if !(p.is_finite() && p > 0.0) {
            return Err(SpecError::new(format!(
                "--peak-tflops {p}: must be a positive number of TFLOP/s"
            )));
        }
    }
    let gpu = device::open(a.gpu).map_err(gpu_err)?;
    let info = gpu.info.clone();
    let known = known_device(&info.name);
    let (peak_bf16, fp32_known, nominal_hbm) = match (a.peak_tflops, known) {
        (Some(p), k) => (p, k.map(|k| k.1), k.map(|k| k.2)),
        (None, Some((p, f, h))) => (p, Some(f), Some(h)),
        (None, None) => {
            return Err(SpecError::new(format!(
                "calibrate --device cuda: `{}` is not a device whose peak exatrain knows ({}): give its dense bf16 peak with --peak-tflops",
                info.name,
                KNOWN_DEVICES.iter().map(|k| k.0).collect::<Vec<_>>().join(", ")
            )))
        }
    };
    eprintln!(
        "device {}: {} ({}), {:.1} GiB",
        info.ordinal,
        info.name,
        info.arch(),
        info.total_bytes as f64 / (1u64 << 30) as f64
    );
    // every kernel module, both precisions, for this device (what the trainer loads)
    let t0 = std::time::Instant::now();
    for m in MODULES {
        for p in [Precision::Fp32, Precision::Bf16] {
            gpu.module(m.name, p).map_err(gpu_err)?;
        }
    }
    let compile_s = t0.elapsed().as_secs_f64();
    let mut lt = Lt::new(gpu.stream.clone()).map_err(gpu_err)?;
    let reps = if a.quick { 3 } else { 10 };
    let shapes: Vec<_> = SHAPES
        .iter()
        .copied()
        .filter(|&(m, n, k)| !a.quick || m * n * k <= 1 << 34)
        .collect();
    let mut timings = Vec::new();
    for (m, n, k) in shapes {
        let t = bench::time_gemm(&gpu, &mut lt, m, n, k, reps).map_err(gpu_err)?;
        if t.max_rel_error > 1e-2 {
            return Err(SpecError::new(format!(
                "calibrate --device cuda: the bf16 GEMM {m}×{n}×{k} is wrong: sampled entries off by {:.2e} (relative)",
                t.max_rel_error
            )));
        }
        timings.push(t);
    }
    let accumulate_error = bench::check_accumulate(&gpu, &mut lt, 512, 384, 1024).map_err(gpu_err)?;
    if accumulate_error > 1e-5 {
        return Err(SpecError::new(format!(
            "calibrate --device cuda: bf16·bf16 accumulated into fp32 (beta = 1) is off by {accumulate_error:.2e}"
        )));
    }
    let memory_gbps = bench::memory_bandwidth(&gpu, if a.quick { 256 } else { 1024 }, reps).map_err(gpu_err)? / 1e9;
    let points: Vec<GemmPoint> = timings
        .iter()
        .map(|t| GemmPoint {
            m: t.m,
            n: t.n,
            k: t.k,
            gflops: t.tflops * 1e3,
        })
        .collect();
    let GemmFit {
        curve: fit,
        median_error: fit_error,
        table,
    } = gemm_fit(&points, peak_bf16 * 1e3);
    let (hbm_gbps, memory_efficiency) = match nominal_hbm {
        Some(h) => (h, (memory_gbps / h).min(1.0)),
        None => (memory_gbps, 1.0),
    };
    let spec = ClusterSpec {
        name: "local-gpu".into(),
        device: DeviceSpec {
            name: format!("{} (measured by exatrain calibrate --device cuda)", info.name),
            peak_tflops_bf16: peak_bf16,
            // not measured: the tensor cores' fp32 path is TF32; the published non-tensor peak
            peak_tflops_fp32: fp32_known.unwrap_or(peak_bf16 / 16.0),
            // FP8 GEMMs are not timed here: set `peak_tflops_fp8` (and `gemm_fp8`) by hand to
            // plan `--fp8` on this spec
            peak_tflops_fp8: None,
            hbm_gib: info.total_bytes as f64 / (1u64 << 30) as f64,
            hbm_gbps,
            memory_efficiency,
            gemm: fit,
            gemm_fp8: None,
            gemm_table: table,
        },
        node: NodeSpec {
            devices: 1,
            links: Vec::new(),
            nics: 1,
            nic_gbps: 25.0,
        },
        network: NetworkSpec {
            intra_latency_us: 1.0,
            inter_latency_us: 5.0,
            efficiency: 1.0,
        },
        reserved_gib: 1.0,
        fragmentation: 0.0,
        system: Default::default(),
        launch: Default::default(),
        stack: Default::default(),
    };
    spec.validate()?;
    if let Some(out) = &a.out {
        let text = toml::to_string(&spec).map_err(|e| SpecError::new(format!("--out {}: {e}", out.display())))?;
        let header = format!(
            "# Measured by `exatrain calibrate --device cuda` on {} ({}): bf16 GEMM curve fitted on {} shapes\n# (median error {:.1} %) against a {peak_bf16} TFLOP/s peak; copy bandwidth {memory_gbps:.0} GB/s.\n# One device: the links and network are placeholders (NCCL collectives are not measured yet).\n",
            info.name,
            info.arch(),
            points.len(),
            100.0 * fit_error
        );
        write_atomic(out, format!("{header}{text}").as_bytes())?;
    }
    if a.json {
        let v = serde_json::json!({
            "device": info.name, "arch": info.arch(), "memory_gib": spec.device.hbm_gib,
            "kernel_compile_s": compile_s,
            "gemm": timings.iter().map(|t| serde_json::json!({"m": t.m, "n": t.n, "k": t.k, "seconds": t.seconds, "tflops": t.tflops, "max_rel_error": t.max_rel_error})).collect::<Vec<_>>(),
            "accumulate_max_rel_error": accumulate_error,
            "memory_gbps": memory_gbps, "fit": fit, "fit_error": fit_error, "spec": spec,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "{} ({}), {:.1} GiB; {} kernel modules compiled in {compile_s:.2} s",
        info.name,
        info.arch(),
        spec.device.hbm_gib,
        2 * MODULES.len()
    );
    println!(
        "{:>6} {:>6} {:>6} {:>9} {:>9} {:>9}",
        "m", "n", "k", "TFLOP/s", "fitted", "MFU %"
    );
    for (t, p) in timings.iter().zip(&points) {
        let fitted = peak_bf16 * fit.efficiency(p.m as f64, p.n as f64, p.k as f64);
        println!(
            "{:>6} {:>6} {:>6} {:>9.1} {:>9.1} {:>9.1}",
            t.m,
            t.n,
            t.k,
            t.tflops,
            fitted,
            100.0 * t.tflops / peak_bf16
        );
    }
    println!(
        "bf16·bf16 into fp32 with beta = 1: max relative error {accumulate_error:.1e}; copy bandwidth {memory_gbps:.0} GB/s{}",
        nominal_hbm.map_or(String::new(), |h| format!(" ({:.0} % of {h:.0})", 100.0 * memory_gbps / h))
    );
    println!(
        "GEMM curve: max efficiency {:.3}, half size {:.0} (median error {:.1} %)",
        fit.max_efficiency,
        fit.half_size,
        100.0 * fit_error
    );
    if let Some(out) = &a.out {
        println!("wrote {}", out.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_find_their_peaks_most_specific_first() {
        assert_eq!(known_device("NVIDIA H200").map(|k| k.0), Some(989.4));
        assert_eq!(known_device("NVIDIA H100 PCIe").map(|k| k.0), Some(756.0));
        assert_eq!(known_device("NVIDIA H100 80GB HBM3").map(|k| k.2), Some(3350.0));
        assert_eq!(known_device("NVIDIA A100-SXM4-80GB").map(|k| k.2), Some(2039.0));
        assert_eq!(known_device("Tesla T4"), None);
    }
}
