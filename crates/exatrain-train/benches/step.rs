//! One full training step (forward, backward, AdamW) on the bench config: 6 layers, hidden 384,
//! 6 heads, seq 256, micro-batch 8, vocab 8192, fp32. Run: `cargo bench -p exatrain-train --bench step`.
//! Prints tokens/s, model GFLOP/s (6·N·tokens + attention, the planner's count), the sgemm peak
//! measured here on 1024³, and the bytes held against the planner's prediction.

use std::time::Instant;

use exatrain_spec::{presets, Dtype, ParallelConfig};
use exatrain_train::model::{Gpt, GptShape};
use exatrain_train::optim::{clip_grad_norm, AdamW, AdamWConfig};
use exatrain_train::Cpu;

fn main() {
    let peak = exatrain_train::train::measure_peak() / 1e9;
    let spec = presets::model("bench").unwrap();
    let shape = GptShape::from_spec(&spec).unwrap();
    let (b, t) = (8usize, 256usize);
    let mut m = Gpt::<f32>::new(shape, 0);
    let decay: Vec<_> = m
        .layout
        .blocks
        .iter()
        .flat_map(|bl| [bl.qkvw.clone(), bl.projw.clone(), bl.fcw.clone(), bl.fcprojw.clone()])
        .chain([m.layout.wte.clone()])
        .collect();
    let mut opt = AdamW::new(&Cpu::<f32>::default(), AdamWConfig::default(), m.params.len(), decay);
    let mut rng = fastrand::Rng::with_seed(1);
    let tokens: Vec<u32> = (0..b * t).map(|_| rng.u32(0..8192)).collect();
    let targets: Vec<u32> = (0..b * t).map(|_| rng.u32(0..8192)).collect();
    let mut times = Vec::new();
    for i in 0..8 {
        let t0 = Instant::now();
        m.zero_grad();
        m.forward(&tokens, &targets, b, t).unwrap();
        m.backward(1.0).unwrap();
        clip_grad_norm(&mut m.grads, 1.0);
        opt.update(&Cpu::default(), &mut m.params, &m.grads, 3e-4);
        if i >= 2 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let step = times[times.len() / 2];
    let flops = exatrain_cost::flops::model_step(&spec, b as u32);
    let tokens_s = (b * t) as f64 / step;
    println!("threads: {}", rayon::current_num_threads());
    println!("{:<28} {:>12}", "step (median of 6)", format!("{:.3} s", step));
    println!("{:<28} {:>12.0}", "tokens/s", tokens_s);
    println!("{:<28} {:>12.1}", "model GFLOP/s", flops / step / 1e9);
    println!("{:<28} {:>12.1}", "sgemm 1024³ GFLOP/s", peak);
    println!("{:<28} {:>11.1}%", "of sgemm peak", 100.0 * flops / step / 1e9 / peak);
    // Bytes held against the planner's prediction for the same config (fp32, one device).
    let cfg = ParallelConfig {
        dtype: Dtype::Fp32,
        ..ParallelConfig::new(1, 1, 1, b as u32, b as u32)
    };
    let c = presets::cluster("frontier").unwrap();
    let p = exatrain_cost::plan(&spec, &c, &cfg).unwrap();
    let g = 1048576.0;
    println!("\n{:<14} {:>12} {:>12}", "bytes (MiB)", "trainer", "planner");
    println!(
        "{:<14} {:>12.1} {:>12.1}",
        "weights",
        (m.params.len() * 4) as f64 / g,
        p.memory_bytes.weights / g
    );
    println!(
        "{:<14} {:>12.1} {:>12.1}",
        "grads",
        (m.grads.len() * 4) as f64 / g,
        p.memory_bytes.grads / g
    );
    println!(
        "{:<14} {:>12.1} {:>12.1}",
        "optimizer",
        ((opt.m.len() + opt.v.len()) * 4) as f64 / g,
        p.memory_bytes.optimizer / g
    );
    println!(
        "{:<14} {:>12.1} {:>12.1}",
        "activations",
        m.activation_bytes() as f64 / g,
        p.memory_bytes.activations / g
    );
    println!(
        "{:<14} {:>12.1} {:>12}",
        "bwd workspace",
        m.workspace_bytes() as f64 / g,
        "-"
    );
    let mut ru: Rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(RUSAGE_SELF) fills the struct it is given.
    unsafe { getrusage(0, &mut ru) };
    println!(
        "{:<14} {:>12.1} {:>12.1}",
        "peak RSS/total",
        ru.ru_maxrss as f64 / 1024.0,
        p.memory_bytes.total / g
    );
}

/// struct rusage on Linux (x86_64 / aarch64): two timevals, then 14 longs; ru_maxrss in KiB.
#[repr(C)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    ru_maxrss: i64,
    rest: [i64; 13],
}

extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}
