//! `exatrain train --device cuda`: the one-process trainer on one NVIDIA GPU through the CUDA
//! backend (all-fp32 mode) — or, for a multi-rank layout, its in-process ranks sharing that GPU
//! (each its own backend; activations and gradients pass through the host hub) — after
//! refusing, before anything is allocated or written, a run the GPU's free memory cannot hold.
//! Without the `cuda` feature, or without a driver or a device, one clear error and exit 2.

use exatrain_spec::SpecError;

use crate::train_cmd::{Run, TrainArgs};

#[cfg(not(feature = "cuda"))]
pub fn run(_a: &TrainArgs, _run: &Run) -> Result<(), SpecError> {
    Err(SpecError::new(format!("--device cuda: {}", exatrain_cuda::not_built())))
}

#[cfg(not(feature = "cuda"))]
pub fn run_ranks(a: &TrainArgs, run: &Run) -> Result<(), SpecError> {
    self::run(a, run)
}

/// The layout's ranks as in-process ranks sharing GPU `--gpu`, each with its own backend
/// (stream, scratch, cuBLASLt handle), after checking that all of them fit.
#[cfg(feature = "cuda")]
pub fn run_ranks(a: &TrainArgs, run: &Run) -> Result<(), SpecError> {
    use exatrain_cuda::kernels::Precision;
    use exatrain_train::backend::Cuda;

    use crate::run_folder;
    use crate::train_cmd;

    let gpu_err = |e: exatrain_cuda::GpuError| SpecError::new(format!("--device cuda: {e}"));
    let n = crate::train_ranks::ranks(run);
    let first = Cuda::open(a.gpu, Precision::Fp32, !a.no_tf32).map_err(gpu_err)?;
    let need = run_folder::rank_bytes(&run.spec, &run.pc)? * n as f64;
    first
        .gpu()
        .check_fits(
            need as u64,
            &format!(
                "{n} ranks sharing the GPU (each: weights, gradients, AdamW moments, activations and logits, all fp32)"
            ),
        )
        .map_err(gpu_err)?;
    let mut backends = vec![first];
    for _ in 1..n {
        backends.push(Cuda::open(a.gpu, Precision::Fp32, !a.no_tf32).map_err(gpu_err)?);
    }
    train_cmd::start(a, run)?;
    crate::train_ranks::in_process(a, run, backends)
}

#[cfg(feature = "cuda")]
pub fn run(a: &TrainArgs, run: &Run) -> Result<(), SpecError> {
    use exatrain_cuda::kernels::Precision;
    use exatrain_train::backend::Cuda;
    use exatrain_train::train::Trainer;

    use crate::run_folder;
    use crate::train_cmd;

    let gpu_err = |e: exatrain_cuda::GpuError| SpecError::new(format!("--device cuda: {e}"));
    let be = Cuda::open(a.gpu, Precision::Fp32, !a.no_tf32).map_err(gpu_err)?;
    // the planner's bytes of this layout in fp32 (what the trainer holds), checked before the
    // first allocation
    let need = run_folder::rank_bytes(&run.spec, &run.pc)?;
    be.gpu()
        .check_fits(
            need as u64,
            "the run (weights, gradients, AdamW moments, activations and logits, all fp32)",
        )
        .map_err(gpu_err)?;
    let info = &be.gpu().info;
    // MFU against the peak of the units the GEMMs run on: TF32 tensor cores (half the dense
    // bf16 peak on A100, H100, H200, L40S) or the fp32 units
    let (peak, units) = match crate::calibrate_gpu::known_device(&info.name) {
        Some((_, fp32, _)) if a.no_tf32 => (fp32 * 1e12, "fp32"),
        Some((bf16, _, _)) => (bf16 / 2.0 * 1e12, "dense TF32"),
        None => (f64::NAN, ""),
    };
    if !a.json {
        eprintln!(
            "GPU {}: {} ({:.1} GiB free; the planner counts {:.2} GiB for this run), fp32 mode with {} GEMMs{}",
            info.ordinal,
            info.name,
            info.free_bytes as f64 / (1u64 << 30) as f64,
            need / (1u64 << 30) as f64,
            if a.no_tf32 { "fp32" } else { "TF32" },
            if peak.is_nan() {
                "; its peak is not known here, so MFU is not reported".to_string()
            } else {
                format!(", MFU against its {:.1} TFLOP/s {units} peak", peak / 1e12)
            }
        );
    }
    train_cmd::start(a, run)?;
    let trainer = match &run.resumed {
        Some(r) => Trainer::resume_on(be, peak, &r.ckpt, Some(run.cfg.clone()))?,
        None => Trainer::on(be, peak, run.spec.clone(), run.cfg.clone(), &run.data, &run.out)?,
    };
    train_cmd::drive(a, run, trainer)
}
