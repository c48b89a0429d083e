//! The model on the CUDA backend against the same model on the CPU: the whole forward and
//! backward (every kernel pair, the matmuls and attention through cuBLASLt) in the all-fp32
//! mode, from the same initial weights and tokens. The GPU test is ignored here (no GPU);
//! `scripts/device_check.sh` runs it on the GPU machine with `--ignored`. What needs no GPU —
//! the errors on a machine without one — runs everywhere.
#![cfg(feature = "cuda")]

use exatrain_cuda::device;
use exatrain_cuda::kernels::Precision;
use exatrain_spec::Recompute;
use exatrain_train::backend::{Backend, Cuda};
use exatrain_train::model::Part;
use exatrain_train::{GptShape, Model};

fn shape() -> GptShape {
    GptShape {
        layers: 2,
        channels: 64,
        heads: 4,
        ffn: 256,
        max_seq: 32,
        vocab: 100,
        padded_vocab: 128,
    }
}

/// max |a − b| over max |b| (b the f64 reference).
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn the_bf16_trainer_mode_is_refused_with_the_flag_to_use_instead() {
    let e = Cuda::open(0, Precision::Bf16).err().expect("bf16 is refused");
    assert!(e.0.contains("--precision fp32"), "{e}");
}

#[test]
fn without_a_driver_opening_the_gpu_is_a_clear_error() {
    let driver = device::libraries()
        .iter()
        .any(|(name, present)| *name == "libcuda" && *present);
    if driver {
        // the GPU machine: the ignored test below covers it
        return;
    }
    let e = Cuda::open(0, Precision::Fp32).err().expect("no driver here");
    assert!(e.0.contains("no CUDA driver"), "{e}");
}

fn step_matches(recompute: Recompute) {
    let s = shape();
    let (b, t) = (2, 32);
    let tokens: Vec<u32> = (0..b * t).map(|i| (i * 37 % 100) as u32).collect();
    let targets: Vec<u32> = (0..b * t).map(|i| ((i * 11 + 5) % 100) as u32).collect();
    let mut part = Part::whole(&s);
    part.recompute = recompute;
    let mut cpu = Model::init(exatrain_train::Cpu::<f64>::default(), s, &part, 3);
    let gpu = Cuda::open(0, Precision::Fp32).unwrap_or_else(|e| panic!("{e}"));
    let mut dev = Model::init(gpu, s, &part, 3);
    for m in 0..2 {
        // two microbatches: the second accumulates onto the first's gradients
        let want = cpu.forward(&tokens, &targets, b, t).unwrap();
        cpu.backward(0.5).unwrap();
        let got = dev.forward(&tokens, &targets, b, t).unwrap();
        dev.backward(0.5).unwrap();
        assert!(
            (got as f64 - want).abs() < 1e-5 * want.abs(),
            "microbatch {m}: loss {got} vs {want}"
        );
    }
    let weights = dev.be.download(&dev.params);
    assert!(
        rel_err(&weights, &cpu.params) < 1e-6,
        "the weights were uploaded as they are"
    );
    let grads = dev.be.download(&dev.grads);
    let err = rel_err(&grads, &cpu.grads);
    println!("{recompute:?}: gradients' max error {err:.2e} of the largest");
    assert!(err < 1e-4, "gradients differ by {err:.2e} of the largest");
    dev.be.check().unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn a_training_step_on_the_gpu_matches_the_cpu() {
    step_matches(Recompute::None);
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn a_training_step_with_recomputation_on_the_gpu_matches_the_cpu() {
    step_matches(Recompute::Selective);
    step_matches(Recompute::Full);
}
