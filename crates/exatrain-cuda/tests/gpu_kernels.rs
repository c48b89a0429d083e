//! Each CUDA kernel against its CPU kernel (`exatrain_train::kernels`, run in f64) on the same
//! inputs: all-fp32 mode within 1e-5, bf16 mode within 1e-2 (of the largest reference value).
//! They need an NVIDIA GPU, so they are ignored here; `scripts/device_check.sh` runs them on the
//! GPU machine with `--ignored`.
#![cfg(feature = "cuda")]

use cudarc::driver::CudaSlice;
use exatrain_cuda::device::{self, Gpu};
use exatrain_cuda::kernels::Precision;
use exatrain_cuda::ops::{ptr, Ops, NORM_BLOCKS};
use exatrain_train::kernels as cpu;
use half::bf16;

const NEEDS_GPU: &str = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)";

fn gpu() -> Gpu {
    device::open(0).unwrap_or_else(|e| panic!("{e}"))
}

fn rand(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut z = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            scale * ((z >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
        })
        .collect()
}

/// A floatX buffer on the device, and what the device holds of `x` (the bf16 rounding in bf16
/// mode), so the CPU reference reads exactly the GPU's inputs.
enum Buf {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

impl Buf {
    fn ptr(&self, g: &Gpu) -> u64 {
        match self {
            Buf::F32(s) => ptr(s, g),
            Buf::Bf16(s) => ptr(s, g),
        }
    }
    fn read(&self, g: &Gpu) -> Vec<f64> {
        match self {
            Buf::F32(s) => g.stream.clone_dtoh(s).unwrap().iter().map(|&v| v as f64).collect(),
            Buf::Bf16(s) => g.stream.clone_dtoh(s).unwrap().iter().map(|v| v.to_f64()).collect(),
        }
    }
}

fn upx(g: &Gpu, p: Precision, x: &[f64]) -> (Buf, Vec<f64>) {
    match p {
        Precision::Fp32 => {
            let v: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            (
                Buf::F32(g.stream.clone_htod(&v).unwrap()),
                v.iter().map(|&v| v as f64).collect(),
            )
        }
        Precision::Bf16 => {
            let v: Vec<bf16> = x.iter().map(|&v| bf16::from_f64(v)).collect();
            (
                Buf::Bf16(g.stream.clone_htod(&v).unwrap()),
                v.iter().map(|v| v.to_f64()).collect(),
            )
        }
    }
}

fn up32(g: &Gpu, x: &[f64]) -> (CudaSlice<f32>, Vec<f64>) {
    let v: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    (g.stream.clone_htod(&v).unwrap(), v.iter().map(|&v| v as f64).collect())
}

fn read32(g: &Gpu, s: &CudaSlice<f32>) -> Vec<f64> {
    g.stream.clone_dtoh(s).unwrap().iter().map(|&v| v as f64).collect()
}

fn tol(p: Precision) -> f64 {
    match p {
        Precision::Fp32 => 1e-5,
        Precision::Bf16 => 1e-2,
    }
}

#[track_caller]
fn close(what: &str, p: Precision, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let err = got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
    eprintln!("{what} ({}): max error {err:.2e} of {scale:.2e}", p.name());
    assert!(err <= tol(p), "{what} ({}): error {err:.2e} > {:.0e}", p.name(), tol(p));
}

const MODES: [Precision; 2] = [Precision::Fp32, Precision::Bf16];

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn layernorm_matches_the_cpu() {
    let g = gpu();
    let (n, c) = (64, 96);
    for p in MODES {
        let ops = Ops { gpu: &g, p };
        let (x, xh) = upx(&g, p, &rand(n * c, 1, 4.0));
        let (w, wh) = upx(&g, p, &rand(c, 2, 2.0));
        let (b, bh) = upx(&g, p, &rand(c, 3, 1.0));
        let (out, _) = upx(&g, p, &vec![0.0; n * c]);
        let (mean, rstd) = (up32(&g, &vec![0.0; n]).0, up32(&g, &vec![0.0; n]).0);
        ops.layernorm_forward(
            out.ptr(&g),
            ptr(&mean, &g),
            ptr(&rstd, &g),
            x.ptr(&g),
            w.ptr(&g),
            b.ptr(&g),
            n,
            c,
        )
        .unwrap();
        let (mut o, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        cpu::layernorm_forward(&mut o, &mut m, &mut r, &xh, &wh, &bh, c);
        close("layernorm_forward out", p, &out.read(&g), &o);
        close("layernorm_forward rstd", p, &read32(&g, &rstd), &r);
        // backward, accumulating onto nonzero gradients
        let (dout, douth) = upx(&g, p, &rand(n * c, 4, 1.0));
        let (dinp, dinph) = upx(&g, p, &rand(n * c, 5, 1.0));
        let (dw, dwh) = up32(&g, &rand(c, 6, 1.0));
        let (db, dbh) = up32(&g, &rand(c, 7, 1.0));
        let scratch = g.stream.alloc_zeros::<f32>(Ops::layernorm_scratch(n, c)).unwrap();
        // the CPU's statistics, as the GPU's backward reads its own
        let (mh, rh) = (read32(&g, &mean), read32(&g, &rstd));
        ops.layernorm_backward(
            dinp.ptr(&g),
            ptr(&dw, &g),
            ptr(&db, &g),
            dout.ptr(&g),
            x.ptr(&g),
            w.ptr(&g),
            ptr(&mean, &g),
            ptr(&rstd, &g),
            ptr(&scratch, &g),
            n,
            c,
        )
        .unwrap();
        let (mut di, mut dwc, mut dbc) = (dinph.clone(), dwh.clone(), dbh.clone());
        cpu::layernorm_backward(&mut di, &mut dwc, &mut dbc, &douth, &xh, &wh, &mh, &rh, c);
        close("layernorm_backward dinp", p, &dinp.read(&g), &di);
        close("layernorm_backward dw", p, &read32(&g, &dw), &dwc);
        close("layernorm_backward db", p, &read32(&g, &db), &dbc);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn gelu_and_residual_match_the_cpu() {
    let g = gpu();
    let n = 10_000;
    for p in MODES {
        let ops = Ops { gpu: &g, p };
        let (x, xh) = upx(&g, p, &rand(n, 11, 8.0));
        let (y, yh) = upx(&g, p, &rand(n, 12, 2.0));
        let (out, _) = upx(&g, p, &vec![0.0; n]);
        ops.gelu_forward(out.ptr(&g), x.ptr(&g), n).unwrap();
        let mut o = vec![0.0; n];
        cpu::gelu_forward(&mut o, &xh);
        close("gelu_forward", p, &out.read(&g), &o);
        let (d, dh) = upx(&g, p, &rand(n, 13, 1.0));
        ops.gelu_backward(d.ptr(&g), x.ptr(&g), y.ptr(&g), n).unwrap();
        let mut dc = dh.clone();
        cpu::gelu_backward(&mut dc, &xh, &yh);
        close("gelu_backward", p, &d.read(&g), &dc);
        ops.residual_forward(out.ptr(&g), x.ptr(&g), y.ptr(&g), n).unwrap();
        cpu::residual_forward(&mut o, &xh, &yh);
        close("residual_forward", p, &out.read(&g), &o);
        let (da, dah) = upx(&g, p, &rand(n, 14, 1.0));
        let (db, dbh) = upx(&g, p, &rand(n, 15, 1.0));
        ops.residual_backward(da.ptr(&g), db.ptr(&g), y.ptr(&g), n).unwrap();
        let (mut dac, mut dbc) = (dah.clone(), dbh.clone());
        cpu::residual_backward(&mut dac, &mut dbc, &yh);
        close("residual_backward da", p, &da.read(&g), &dac);
        close("residual_backward db", p, &db.read(&g), &dbc);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn causal_softmax_matches_the_reference() {
    let g = gpu();
    // self-attention: T = 37 (not a multiple of the warp); a context-parallel chunk: 9 queries
    // from position 20 against its 29 keys
    for (tq, tk, offset) in [(37, 37, 0), (9, 29, 20)] {
        let heads = 6;
        let rows = heads * tq;
        for p in MODES {
            let ops = Ops { gpu: &g, p };
            let (att, ah) = upx(&g, p, &rand(rows * tk, 21, 6.0));
            ops.softmax_causal_forward(att.ptr(&g), rows, (tq, tk, offset)).unwrap();
            let mut want = vec![0.0; rows * tk];
            for r in 0..rows {
                let i = r % tq + offset;
                let row = &ah[r * tk..(r + 1) * tk];
                let mx = row[..=i].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row[..=i].iter().map(|v| (v - mx).exp()).sum();
                for j in 0..=i {
                    want[r * tk + j] = (row[j] - mx).exp() / s;
                }
            }
            let got = att.read(&g);
            close("softmax_causal_forward", p, &got, &want);
            let (datt, dh) = upx(&g, p, &rand(rows * tk, 22, 1.0));
            ops.softmax_causal_backward(datt.ptr(&g), att.ptr(&g), rows, (tq, tk, offset))
                .unwrap();
            let mut dwant = vec![0.0; rows * tk];
            for r in 0..rows {
                let i = r % tq + offset;
                let a = &got[r * tk..(r + 1) * tk];
                let d = &dh[r * tk..(r + 1) * tk];
                let s: f64 = (0..=i).map(|j| a[j] * d[j]).sum();
                for j in 0..=i {
                    dwant[r * tk + j] = a[j] * (d[j] - s);
                }
            }
            close("softmax_causal_backward", p, &datt.read(&g), &dwant);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn vocab_parallel_crossentropy_matches_the_cpu() {
    let g = gpu();
    let (n, vl, valid, lo) = (24, 300, 270, 100); // a shard of ids 100..400, 270 real
    let targets: Vec<u32> = (0..n).map(|k| (k * 37 % 500) as u32).collect(); // some outside the shard
    let ti: Vec<i32> = targets.iter().map(|&t| t as i32).collect();
    for p in MODES {
        let ops = Ops { gpu: &g, p };
        let (logits, lh) = upx(&g, p, &rand(n * vl, 31, 10.0));
        let dt = g.stream.clone_htod(&ti).unwrap();
        let maxes = g.stream.alloc_zeros::<f32>(n).unwrap();
        let stats = g.stream.alloc_zeros::<f32>(2 * n).unwrap();
        let losses = g.stream.alloc_zeros::<f32>(n).unwrap();
        let (probs, _) = upx(&g, p, &vec![0.0; n * vl]);
        ops.crossentropy_max(ptr(&maxes, &g), logits.ptr(&g), n, valid, vl)
            .unwrap();
        ops.crossentropy_exp(
            probs.ptr(&g),
            ptr(&stats, &g),
            logits.ptr(&g),
            ptr(&maxes, &g),
            ptr(&dt, &g),
            lo,
            n,
            valid,
            vl,
        )
        .unwrap();
        ops.crossentropy_normalize(probs.ptr(&g), ptr(&losses, &g), ptr(&stats, &g), n, vl)
            .unwrap();
        let (mut m, mut s, mut pr, mut l) = (vec![0.0; n], vec![0.0; 2 * n], vec![0.0; n * vl], vec![0.0; n]);
        cpu::crossentropy_max(&mut m, &lh, valid, vl);
        cpu::crossentropy_exp(&mut pr, &mut s, &lh, &m, &targets, lo, valid, vl);
        cpu::crossentropy_normalize(&mut pr, &mut l, &s, vl);
        close("crossentropy_max", p, &read32(&g, &maxes), &m);
        close("crossentropy probs", p, &probs.read(&g), &pr);
        close("crossentropy losses", p, &read32(&g, &losses), &l);
        let (dl, dlh) = upx(&g, p, &rand(n * vl, 32, 0.01));
        // the CPU reads the GPU's probabilities (the same inputs)
        let probs_h = probs.read(&g);
        ops.crossentropy_backward(
            dl.ptr(&g),
            probs.ptr(&g),
            ptr(&dt, &g),
            lo,
            1.0 / n as f32,
            n,
            valid,
            vl,
        )
        .unwrap();
        let mut dlc = dlh.clone();
        cpu::crossentropy_backward(&mut dlc, &probs_h, &targets, lo, 1.0 / n as f64, valid, vl);
        close("crossentropy_backward", p, &dl.read(&g), &dlc);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn encoder_matches_the_cpu_and_repeats_bit_for_bit() {
    let g = gpu();
    let (b, t, c, rows, lo) = (3, 16, 40, 50, 20);
    let tokens: Vec<u32> = (0..b * t).map(|k| ((k * 7919) % 90) as u32).collect();
    let ti: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
    for p in MODES {
        let ops = Ops { gpu: &g, p };
        let dt = g.stream.clone_htod(&ti).unwrap();
        let (wte, wteh) = upx(&g, p, &rand(rows * c, 41, 1.0));
        let (wpe, wpeh) = upx(&g, p, &rand(t * c, 42, 1.0));
        let (out, _) = upx(&g, p, &vec![0.0; b * t * c]);
        ops.encoder_forward(
            out.ptr(&g),
            ptr(&dt, &g),
            wte.ptr(&g),
            lo,
            rows,
            Some(wpe.ptr(&g)),
            b * t,
            t,
            c,
        )
        .unwrap();
        let mut o = vec![0.0; b * t * c];
        cpu::encoder_forward(&mut o, &tokens, &wteh, lo, Some(&wpeh), t, c);
        close("encoder_forward", p, &out.read(&g), &o);
        let (dout, douth) = upx(&g, p, &rand(b * t * c, 43, 1.0));
        let mut first = None;
        for _ in 0..2 {
            let (dwte, dwteh) = up32(&g, &rand(rows * c, 44, 1.0));
            let (dwpe, dwpeh) = up32(&g, &rand(t * c, 45, 1.0));
            ops.encoder_backward(
                ptr(&dwte, &g),
                lo,
                rows,
                Some(ptr(&dwpe, &g)),
                dout.ptr(&g),
                &tokens,
                t,
                c,
            )
            .unwrap();
            let (mut a, mut bb) = (dwteh.clone(), dwpeh.clone());
            cpu::encoder_backward(&mut a, lo, Some(&mut bb), &douth, &tokens, t, c);
            let got = read32(&g, &dwte);
            close("encoder_backward dwte", p, &got, &a);
            close("encoder_backward dwpe", p, &read32(&g, &dwpe), &bb);
            if let Some(f) = &first {
                assert_eq!(f, &got, "the same inputs give the same bits");
            }
            first = Some(got);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/device_check.sh runs it on the GPU machine)"]
fn adamw_and_the_global_norm_match_the_cpu() {
    let g = gpu();
    let n = 5000;
    let ops = Ops {
        gpu: &g,
        p: Precision::Fp32,
    };
    let (params, ph) = up32(&g, &rand(n, 51, 1.0));
    let (grads, gh) = up32(&g, &rand(n, 52, 0.1));
    let m = g.stream.alloc_zeros::<f32>(n).unwrap();
    let v = g.stream.alloc_zeros::<f32>(n).unwrap();
    let cfg = exatrain_train::optim::AdamWConfig::default();
    let mut opt = exatrain_train::optim::AdamW::new(&exatrain_train::Cpu::<f64>::default(), cfg, n, vec![0..n]);
    let mut pc = ph.clone();
    for step in 1..=3u64 {
        ops.adamw_update(
            ptr(&params, &g),
            None,
            ptr(&grads, &g),
            ptr(&m, &g),
            ptr(&v, &g),
            n,
            1e-3,
            cfg.beta1 as f32,
            cfg.beta2 as f32,
            cfg.eps as f32,
            cfg.weight_decay as f32,
            step,
        )
        .unwrap();
        opt.update(&exatrain_train::Cpu::default(), &mut pc, &gh, 1e-3);
    }
    close("adamw_update (3 steps)", Precision::Fp32, &read32(&g, &params), &pc);
    let out = g.stream.alloc_zeros::<f32>(1).unwrap();
    let partial = g.stream.alloc_zeros::<f32>(NORM_BLOCKS as usize).unwrap();
    ops.norm_squared(ptr(&out, &g), ptr(&grads, &g), ptr(&partial, &g), n)
        .unwrap();
    let want: f64 = gh.iter().map(|x| x * x).sum();
    close("norm_squared", Precision::Fp32, &read32(&g, &out), &[want]);
}

#[test]
fn the_gpu_tests_say_why_they_are_ignored() {
    // every test above is #[ignore = NEEDS_GPU]: listed by `cargo test -- --ignored --list`
    let src = include_str!("gpu_kernels.rs");
    let ignored = src.matches("#[ignore = \"needs an NVIDIA GPU").count();
    let tests = src.matches("#[test]").count();
    assert_eq!(ignored + 2, tests, "every GPU test is ignored with the reason");
    assert!(NEEDS_GPU.contains("device_check.sh"));
}
