//! Micro-benchmarks of the machine the trainer runs on, turned into a `ClusterSpec` the planner
//! reads: fp32 GEMM throughput over a range of shapes (fitted to the planner's efficiency curve
//! `eff = max·d/(d + half)`, d the harmonic mean of m, n, k) and streaming memory bandwidth.

use std::time::Instant;

use exatrain_spec::{ClusterSpec, DeviceSpec, GemmEfficiency, NetworkSpec, NodeSpec, SystemSpec};
use rayon::prelude::*;
use serde::Serialize;

/// One measured GEMM.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GemmPoint {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub gflops: f64,
}

/// GEMM shapes: squares and the transformer's skinny products.
pub const SHAPES: [(usize, usize, usize); 9] = [
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (1536, 1536, 1536),
    (2048, 1152, 384),
    (2048, 384, 1536),
    (2048, 8192, 384),
    (256, 256, 64),
];

/// Time `c = a·b` (m×k · k×n) split over rayon like the trainer's kernels; best of `reps`.
pub fn time_gemm(m: usize, n: usize, k: usize, reps: usize) -> f64 {
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let rows = 256;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        c.par_chunks_mut(rows * n).enumerate().for_each(|(blk, cb)| {
            let r = cb.len() / n;
            // SAFETY: a block of r rows of a (r×k), all of b (k×n), this block of c (r×n).
            unsafe {
                matrixmultiply::sgemm(
                    r,
                    k,
                    n,
                    1.0,
                    a.as_ptr().add(blk * rows * k),
                    k as isize,
                    1,
                    b.as_ptr(),
                    n as isize,
                    1,
                    0.0,
                    cb.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    2.0 * (m * n * k) as f64 / best / 1e9
}

/// Streaming bandwidth (read + write) of a parallel copy of `mib` MiB, GB/s; best of `reps`.
pub fn memory_bandwidth(mib: usize, reps: usize) -> f64 {
    let n = mib * 1024 * 1024 / 4;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * (n * 4) as f64 / best / 1e9
}

/// Fit `eff(d) = max·d/(d + half)` against `peak` (GFLOP/s) by grid search on squared log error.
pub fn fit_gemm(points: &[GemmPoint], peak: f64) -> GemmEfficiency {
    let mut best = (
        f64::INFINITY,
        GemmEfficiency {
            max_efficiency: 1.0,
            half_size: 0.0,
        },
    );
    for i in 0..=100 {
        let max_efficiency = 0.5 + 0.005 * i as f64;
        for j in 0..=200 {
            let g = GemmEfficiency {
                max_efficiency,
                half_size: 5.0 * j as f64,
            };
            let err: f64 = points
                .iter()
                .map(|p| {
                    let pred = peak * g.efficiency(p.m as f64, p.n as f64, p.k as f64);
                    (pred / p.gflops).ln().powi(2)
                })
                .sum();
            if err < best.0 {
                best = (err, g);
            }
        }
    }
    best.1
}

/// What a calibration measured, and the spec made from it.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub threads: usize,
    pub gemm: Vec<GemmPoint>,
    /// Dense fp32 peak used for the spec: the best GEMM measured.
    pub peak_gflops: f64,
    pub fit: GemmEfficiency,
    /// Median |relative error| of the fitted curve on the measured shapes.
    pub fit_error: f64,
    pub memory_gbps: f64,
    pub spec: ClusterSpec,
}

/// Measure this machine. `memory_gib` is its memory capacity (the "device memory" of the spec).
pub fn calibrate(memory_gib: f64, quick: bool) -> Calibration {
    let reps = if quick { 2 } else { 5 };
    let gemm: Vec<GemmPoint> = SHAPES
        .iter()
        .filter(|s| !quick || s.0 * s.1 * s.2 <= 1 << 30)
        .map(|&(m, n, k)| GemmPoint {
            m,
            n,
            k,
            gflops: time_gemm(m, n, k, reps),
        })
        .collect();
    let peak = gemm.iter().map(|p| p.gflops).fold(0.0, f64::max);
    let fit = fit_gemm(&gemm, peak);
    let mut errs: Vec<f64> = gemm
        .iter()
        .map(|p| (peak * fit.efficiency(p.m as f64, p.n as f64, p.k as f64) / p.gflops - 1.0).abs())
        .collect();
    errs.sort_by(|a, b| a.total_cmp(b));
    let fit_error = errs[errs.len() / 2];
    let memory_gbps = memory_bandwidth(if quick { 64 } else { 256 }, reps);
    let threads = rayon::current_num_threads();
    let spec = ClusterSpec {
        name: "local".into(),
        device: DeviceSpec {
            name: format!("this machine's CPU ({threads} threads, fp32)"),
            peak_tflops_bf16: peak / 1e3,
            peak_tflops_fp32: peak / 1e3,
            hbm_gib: memory_gib,
            hbm_gbps: memory_gbps,
            memory_efficiency: 1.0,
            gemm: fit,
        },
        node: NodeSpec {
            devices: 1,
            links: Vec::new(),
            nics: 1,
            nic_gbps: 1.0,
        },
        network: NetworkSpec {
            intra_latency_us: 1.0,
            inter_latency_us: 1.0,
            efficiency: 1.0,
        },
        reserved_gib: 0.0,
        fragmentation: 0.0,
        system: SystemSpec::default(),
    };
    Calibration {
        threads,
        gemm,
        peak_gflops: peak,
        fit,
        fit_error,
        memory_gbps,
        spec,
    }
}
