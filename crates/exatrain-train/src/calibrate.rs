//! Micro-benchmarks of the machine the trainer runs on, turned into a `ClusterSpec` the planner
//! reads: fp32 GEMM throughput over a range of shapes (fitted to the planner's efficiency curve
//! `eff = max·d/(d + half)`, d the harmonic mean of m, n, k), streaming memory bandwidth, and
//! the collectives of a group of ranks (all-reduce, all-gather, reduce-scatter, send/recv over
//! message sizes) fitted to the planner's α–β ring model: one link's bandwidth and latency.

use std::time::Instant;

use exatrain_parallel::comm::{CommError, Communicator};
use exatrain_spec::{ClusterSpec, DeviceSpec, GemmEfficiency, LinkClass, NetworkSpec, NodeSpec, SystemSpec};
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

/// Measured GEMMs against a peak (GFLOP/s), as the planner takes them: the fitted curve, its
/// median |relative error| on the measured shapes, and the shapes themselves as the spec's
/// `gemm_table` (at most `GEMM_TABLE_MAX`). The CPU and the GPU calibrations both use it.
pub struct GemmFit {
    pub curve: GemmEfficiency,
    pub median_error: f64,
    pub table: Vec<exatrain_spec::GemmMeasure>,
}

pub fn gemm_fit(points: &[GemmPoint], peak: f64) -> GemmFit {
    let curve = fit_gemm(points, peak);
    let mut errs: Vec<f64> = points
        .iter()
        .map(|p| (peak * curve.efficiency(p.m as f64, p.n as f64, p.k as f64) / p.gflops - 1.0).abs())
        .collect();
    errs.sort_by(|a, b| a.total_cmp(b));
    let table = points
        .iter()
        .take(exatrain_spec::GEMM_TABLE_MAX)
        .map(|p| exatrain_spec::GemmMeasure {
            m: p.m as f64,
            n: p.n as f64,
            k: p.k as f64,
            efficiency: (p.gflops / peak).clamp(1e-6, 1.0),
        })
        .collect();
    GemmFit {
        curve,
        median_error: errs[errs.len() / 2],
        table,
    }
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
    let GemmFit {
        curve: fit,
        median_error: fit_error,
        table,
    } = gemm_fit(&gemm, peak);
    let memory_gbps = memory_bandwidth(if quick { 64 } else { 256 }, reps);
    let threads = rayon::current_num_threads();
    let spec = ClusterSpec {
        name: "local".into(),
        device: DeviceSpec {
            name: format!("this machine's CPU ({threads} threads, fp32)"),
            peak_tflops_bf16: peak / 1e3,
            peak_tflops_fp32: peak / 1e3,
            peak_tflops_fp8: None,
            hbm_gib: memory_gib,
            hbm_gbps: memory_gbps,
            memory_efficiency: 1.0,
            gemm: fit,
            gemm_fp8: None,
            // each measured shape as it ran: the planner corrects the curve toward them
            gemm_table: table,
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
        launch: Default::default(),
        stack: Default::default(),
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

/// A collective the planner prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// one message from rank 0 to rank 1 (half a ping-pong)
    SendRecv,
}

impl Collective {
    pub const ALL: [Collective; 4] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::SendRecv,
    ];

    /// The ring model's (bandwidth factor, latency hops) for `n` ranks: time = f·M/B + h·α,
    /// M the full buffer's bytes (the planner's `comm` formulas).
    pub fn ring(self, n: usize) -> (f64, f64) {
        let nf = n as f64;
        match self {
            Collective::AllReduce => (2.0 * (nf - 1.0) / nf, 2.0 * (nf - 1.0)),
            Collective::AllGather | Collective::ReduceScatter => ((nf - 1.0) / nf, nf - 1.0),
            Collective::SendRecv => (1.0, 1.0),
        }
    }
}

/// One measured collective.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CommPoint {
    pub kind: Collective,
    pub ranks: usize,
    /// the full buffer (all-reduce: the buffer; all-gather, reduce-scatter: all ranks' parts)
    pub bytes: usize,
    pub seconds: f64,
}

/// Time every collective over `comm` for full buffers of `sizes` bytes (a multiple of 4·size):
/// the median of `reps` after a warm-up, each started together after a barrier. Every rank of
/// the group must call this; all return the same points (rank 0's clock).
pub fn time_collectives(comm: &dyn Communicator, sizes: &[usize], reps: usize) -> Result<Vec<CommPoint>, CommError> {
    let n = comm.size();
    let me = comm.rank();
    let mut out = Vec::new();
    for &bytes in sizes {
        let full = (bytes / 4).div_ceil(n) * n;
        let mut buf = vec![1.0f32; full];
        let mut part = vec![0.0f32; full / n];
        for kind in Collective::ALL {
            if kind == Collective::SendRecv && n < 2 {
                continue;
            }
            let mut once = || -> Result<(), CommError> {
                match kind {
                    Collective::AllReduce => comm.all_reduce(&mut buf),
                    Collective::AllGather => comm.all_gather(&part, &mut buf),
                    Collective::ReduceScatter => comm.reduce_scatter(&buf, &mut part),
                    Collective::SendRecv => match me {
                        0 => {
                            comm.send(1, 7, &buf)?;
                            comm.recv(1, 7, &mut buf)
                        }
                        1 => {
                            comm.recv(0, 7, &mut buf)?;
                            comm.send(0, 7, &buf)
                        }
                        _ => Ok(()),
                    },
                }
            };
            once()?; // warm-up
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps.max(1) {
                comm.barrier()?;
                let t0 = Instant::now();
                once()?;
                let mut t = t0.elapsed().as_secs_f64();
                if kind == Collective::SendRecv {
                    t /= 2.0;
                }
                times.push(t);
            }
            times.sort_by(|a, b| a.total_cmp(b));
            // every rank reports rank 0's time
            let mut t = [if me == 0 { times[times.len() / 2] as f32 } else { 0.0 }];
            comm.all_reduce(&mut t)?;
            out.push(CommPoint {
                kind,
                ranks: n,
                bytes: full * 4,
                seconds: t[0] as f64,
            });
            buf.iter_mut().for_each(|x| *x = 1.0);
        }
    }
    Ok(out)
}

/// A link fitted to collective timings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinkFit {
    /// bandwidth per direction, GB/s
    pub gbps: f64,
    /// per-hop latency, µs
    pub latency_us: f64,
    /// median |relative error| of the fitted model on the points
    pub median_error: f64,
}

/// Least squares on the relative error of `t = f·M/B + h·α` (the ring model of each point's
/// collective) for 1/B and α ≥ 0. None without two points of different sizes.
pub fn fit_link(points: &[CommPoint]) -> Option<LinkFit> {
    let rows: Vec<([f64; 2], f64)> = points
        .iter()
        .filter(|p| p.seconds > 0.0 && p.ranks > 1)
        .map(|p| {
            let (f, h) = p.kind.ring(p.ranks);
            ([f * p.bytes as f64 / p.seconds, h / p.seconds], 1.0)
        })
        .collect();
    let solve = |rows: &[([f64; 2], f64)]| -> Option<[f64; 2]> {
        let (mut a, mut b) = ([[0.0f64; 2]; 2], [0.0f64; 2]);
        for (x, y) in rows {
            for i in 0..2 {
                b[i] += x[i] * y;
                for j in 0..2 {
                    a[i][j] += x[i] * x[j];
                }
            }
        }
        let det = a[0][0] * a[1][1] - a[0][1] * a[1][0];
        (det.abs() > 1e-12 * (a[0][0] * a[1][1]).abs().max(1e-300)).then(|| {
            [
                (b[0] * a[1][1] - b[1] * a[0][1]) / det,
                (a[0][0] * b[1] - a[1][0] * b[0]) / det,
            ]
        })
    };
    let [mut inv_b, mut alpha] = solve(&rows)?;
    if alpha < 0.0 || inv_b <= 0.0 {
        // latency below resolution: bandwidth alone
        let (sxx, sxy) = rows
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x[0] * x[0], b + x[0] * y));
        (inv_b, alpha) = (sxy / sxx, 0.0);
    }
    if !(inv_b > 0.0 && inv_b.is_finite()) {
        return None;
    }
    let mut errs: Vec<f64> = points
        .iter()
        .filter(|p| p.seconds > 0.0 && p.ranks > 1)
        .map(|p| {
            let (f, h) = p.kind.ring(p.ranks);
            ((f * p.bytes as f64 * inv_b + h * alpha) / p.seconds - 1.0).abs()
        })
        .collect();
    errs.sort_by(|a, b| a.total_cmp(b));
    Some(LinkFit {
        gbps: 1.0 / inv_b / 1e9,
        latency_us: alpha * 1e6,
        median_error: errs[errs.len() / 2],
    })
}

/// `spec` as one node of `ranks` devices joined by the fitted link.
pub fn with_link(spec: &ClusterSpec, ranks: usize, link: &LinkFit) -> ClusterSpec {
    let mut s = spec.clone();
    s.node = NodeSpec {
        devices: ranks as u32,
        links: vec![LinkClass {
            span: ranks as u32,
            gbps: link.gbps,
        }],
        nics: 1,
        nic_gbps: link.gbps,
    };
    s.network = NetworkSpec {
        intra_latency_us: link.latency_us.max(1e-3),
        inter_latency_us: link.latency_us.max(1e-3),
        efficiency: 1.0,
    };
    s
}
