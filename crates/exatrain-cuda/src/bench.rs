//! What `exatrain calibrate --device cuda` measures on a GPU: cuBLASLt bf16 GEMM throughput over
//! shapes (each product checked on sampled entries against f64 on the host), the `beta = 1`
//! accumulation a trainer with fp32 gradients needs, and streaming memory bandwidth. Timed with
//! CUDA events: the median of three groups of `reps` launches after two warm-up launches.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};
use half::bf16;

use crate::device::Gpu;
use crate::gemm::{Lt, Shape, Ty};
use crate::GpuError;

/// One measured GEMM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmTiming {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub seconds: f64,
    pub tflops: f64,
    /// The largest error of the sampled entries, relative to Σ|a·b| of that entry.
    pub max_rel_error: f64,
}

fn derr(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GpuError {
    move |e| GpuError::new(format!("{what}: {e}"))
}

/// Deterministic values in [-0.5, 0.5).
fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut z = seed;
    (0..n)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((z >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// Time `f` (which launches work on the GPU's stream): two warm-ups, then the median of three
/// groups of `reps` calls, seconds per call.
fn time_it(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> Result<(), GpuError>) -> Result<f64, GpuError> {
    for _ in 0..2 {
        f()?;
    }
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut groups = Vec::new();
    for _ in 0..3 {
        let start = gpu.ctx.new_event(flags).map_err(derr("cuEventCreate"))?;
        let stop = gpu.ctx.new_event(flags).map_err(derr("cuEventCreate"))?;
        start.record(&gpu.stream).map_err(derr("cuEventRecord"))?;
        for _ in 0..reps {
            f()?;
        }
        stop.record(&gpu.stream).map_err(derr("cuEventRecord"))?;
        stop.synchronize().map_err(derr("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&stop).map_err(derr("cuEventElapsedTime"))?;
        groups.push(ms as f64 / 1e3 / reps as f64);
    }
    groups.sort_by(f64::total_cmp);
    Ok(groups[1])
}

/// Row-major A[m, k]·B[k, n] → C[m, n] in bf16 with fp32 compute (what torch's `a @ b` does),
/// timed and checked on sampled entries.
pub fn time_gemm(gpu: &Gpu, lt: &mut Lt, m: usize, n: usize, k: usize, reps: usize) -> Result<GemmTiming, GpuError> {
    gpu.check_fits(
        ((m * k + k * n + m * n) * 2) as u64,
        &format!("a {m}×{n}×{k} bf16 GEMM"),
    )?;
    let (a32, b32) = (fill(m * k, 1), fill(k * n, 2));
    let s = &gpu.stream;
    let a: CudaSlice<bf16> = s.clone_htod(&to_bf16(&a32)).map_err(derr("copy A"))?;
    let b: CudaSlice<bf16> = s.clone_htod(&to_bf16(&b32)).map_err(derr("copy B"))?;
    let c: CudaSlice<bf16> = s.alloc_zeros(m * n).map_err(derr("allocate C"))?;
    // row-major C = A·B is column-major Cᵀ[n, m] = Bᵀ[n, k]·Aᵀ[k, m]
    let shape = Shape::plain(n as u64, m as u64, k as u64, Ty::Bf16, Ty::Bf16);
    let seconds = {
        let (pa, _sa) = a.device_ptr(s);
        let (pb, _sb) = b.device_ptr(s);
        let (pc, _sc) = c.device_ptr(s);
        // SAFETY: the buffers hold the shape's packed operands.
        time_it(gpu, reps, &mut || unsafe { lt.gemm(&shape, 1.0, pb, pa, 0.0, pc) })?
    };
    let got = s.clone_dtoh(&c).map_err(derr("copy C back"))?;
    let max_rel_error = sampled_error(&a32, &b32, |i, j| got[i * n + j].to_f64(), m, n, k, 0.0);
    Ok(GemmTiming {
        m,
        n,
        k,
        seconds,
        tflops: 2.0 * (m * n * k) as f64 / seconds / 1e12,
        max_rel_error,
    })
}

/// The largest |got − (base + Σ a·b)| / Σ|a·b| over 64 sampled entries (the inputs are the bf16
/// roundings of `a`, `b`).
fn sampled_error(
    a: &[f32],
    b: &[f32],
    got: impl Fn(usize, usize) -> f64,
    m: usize,
    n: usize,
    k: usize,
    base: f64,
) -> f64 {
    let r = |x: f32| bf16::from_f32(x).to_f64();
    (0..64)
        .map(|t| {
            let (i, j) = ((t * 7919) % m, (t * 104729) % n);
            let (mut exact, mut size) = (base, 0.0f64);
            for l in 0..k {
                let p = r(a[i * k + l]) * r(b[l * n + j]);
                exact += p;
                size += p.abs();
            }
            (got(i, j) - exact).abs() / size.max(1e-30)
        })
        .fold(0.0, f64::max)
}

/// bf16 A·B accumulated into an fp32 C that holds ones (`beta = 1`): the weight-gradient GEMM.
/// Returns the largest relative error of sampled entries.
pub fn check_accumulate(gpu: &Gpu, lt: &mut Lt, m: usize, n: usize, k: usize) -> Result<f64, GpuError> {
    let (a32, b32) = (fill(m * k, 3), fill(k * n, 4));
    let s = &gpu.stream;
    let a: CudaSlice<bf16> = s.clone_htod(&to_bf16(&a32)).map_err(derr("copy A"))?;
    let b: CudaSlice<bf16> = s.clone_htod(&to_bf16(&b32)).map_err(derr("copy B"))?;
    let c: CudaSlice<f32> = s.clone_htod(&vec![1.0f32; m * n]).map_err(derr("copy C"))?;
    let shape = Shape::plain(n as u64, m as u64, k as u64, Ty::Bf16, Ty::F32);
    {
        let (pa, _sa) = a.device_ptr(s);
        let (pb, _sb) = b.device_ptr(s);
        let (pc, _sc) = c.device_ptr(s);
        // SAFETY: the buffers hold the shape's packed operands.
        unsafe { lt.gemm(&shape, 1.0, pb, pa, 1.0, pc)? };
    }
    let got = s.clone_dtoh(&c).map_err(derr("copy C back"))?;
    Ok(sampled_error(&a32, &b32, |i, j| got[i * n + j] as f64, m, n, k, 1.0))
}

/// Device-to-device copy bandwidth of `mib` MiB buffers: (read + write) bytes per second.
pub fn memory_bandwidth(gpu: &Gpu, mib: usize, reps: usize) -> Result<f64, GpuError> {
    let bytes = mib << 20;
    gpu.check_fits(2 * bytes as u64, "the bandwidth benchmark")?;
    let s = &gpu.stream;
    let src: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(derr("allocate"))?;
    let mut dst: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(derr("allocate"))?;
    let t = time_it(gpu, reps, &mut || {
        s.memcpy_dtod(&src, &mut dst).map_err(derr("cuMemcpyDtoD"))
    })?;
    Ok(2.0 * bytes as f64 / t)
}
