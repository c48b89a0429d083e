//! Every `_backward` against central finite differences in f64, the whole model's gradient
//! likewise, and a tiny model overfitting a tiny batch.

use exatrain_train::kernels::*;
use exatrain_train::model::{Gpt, GptShape};
use exatrain_train::optim::{clip_grad_norm, lr_at, AdamW, AdamWConfig};
use exatrain_train::Cpu;

fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut r = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| r.f64() * 2.0 - 1.0).collect()
}

/// Check analytic gradient `g` of scalar f at x by central differences.
fn check(name: &str, x: &mut [f64], g: &[f64], f: &mut dyn FnMut(&[f64]) -> f64) {
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..x.len() {
        let x0 = x[i];
        x[i] = x0 + h;
        let fp = f(x);
        x[i] = x0 - h;
        let fm = f(x);
        x[i] = x0;
        let num = (fp - fm) / (2.0 * h);
        let err = (num - g[i]).abs() / (1e-6 + num.abs().max(g[i].abs()));
        worst = worst.max(err);
        assert!(
            err < 1e-5 || (num - g[i]).abs() < 1e-8,
            "{name}[{i}]: numeric {num} vs analytic {}",
            g[i]
        );
    }
    eprintln!("{name}: worst relative error {worst:.2e}");
}

/// A random projection of an op's output makes a scalar loss L = Σ w·out.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let (n, c) = (5, 7);
    let mut x = rand_vec(n * c, 1);
    let mut w = rand_vec(c, 2);
    let b = rand_vec(c, 3);
    let proj = rand_vec(n * c, 4);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        let (mut o, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        layernorm_forward(&mut o, &mut m, &mut r, x, w, b, c);
        (o, m, r)
    };
    let (_, m, r) = fwd(&x, &w, &b);
    let (mut dx, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
    layernorm_backward(&mut dx, &mut dw, &mut db, &proj, &x, &w, &m, &r, c);
    let (w2, b2) = (w.clone(), b.clone());
    check("layernorm dx", &mut x.clone(), &dx, &mut |xx| {
        dot(&fwd(xx, &w2, &b2).0, &proj)
    });
    check("layernorm dw", &mut w, &dw, &mut |ww| dot(&fwd(&x, ww, &b2).0, &proj));
    let mut bb = b.clone();
    let w3 = rand_vec(c, 2);
    check("layernorm db", &mut bb, &db, &mut |bv| dot(&fwd(&x, &w3, bv).0, &proj));
    x[0] += 0.0;
}

#[test]
fn matmul_backward_matches_finite_differences() {
    // N = 70 crosses the 64-row block boundary; OC = 67 too.
    let (n, c, oc) = (70, 5, 67);
    let x = rand_vec(n * c, 5);
    let w = rand_vec(oc * c, 6);
    let b = rand_vec(oc, 7);
    let proj = rand_vec(n * oc, 8);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        let mut o = vec![0.0; n * oc];
        matmul_forward(&mut o, x, w, Some(b), c, oc);
        dot(&o, &proj)
    };
    let (mut dx, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; oc * c], vec![0.0; oc]);
    matmul_backward(&mut dx, &mut dw, Some(&mut db), &proj, &x, &w, c, oc);
    check("matmul dx", &mut x.clone(), &dx, &mut |xx| fwd(xx, &w, &b));
    check("matmul dw", &mut w.clone(), &dw, &mut |ww| fwd(&x, ww, &b));
    check("matmul db", &mut b.clone(), &db, &mut |bb| fwd(&x, &w, bb));
    // the forward is a plain product
    let mut o = vec![0.0; n * oc];
    matmul_forward(&mut o, &x, &w, Some(&b), c, oc);
    let want: f64 = (0..c).map(|k| x[3 * c + k] * w[5 * c + k]).sum::<f64>() + b[5];
    assert!((o[3 * oc + 5] - want).abs() < 1e-12);
}

#[test]
fn attention_backward_matches_finite_differences() {
    let (b, t, c, nh) = (2, 5, 6, 2);
    let qkv = rand_vec(b * t * 3 * c, 9);
    let proj = rand_vec(b * t * c, 10);
    let fwd = |q: &[f64]| {
        let (mut o, mut a) = (vec![0.0; b * t * c], vec![0.0; b * nh * t * t]);
        attention_forward(&mut o, &mut a, q, b, t, c, nh);
        (o, a)
    };
    let (_, att) = fwd(&qkv);
    // causal: position 0 attends only to itself
    assert!((att[0] - 1.0).abs() < 1e-12 && att[1] == 0.0);
    let mut dq = vec![0.0; qkv.len()];
    attention_backward(&mut dq, &proj, &qkv, &att, b, t, c, nh);
    check("attention dqkv", &mut qkv.clone(), &dq, &mut |q| dot(&fwd(q).0, &proj));
}

#[test]
fn gelu_residual_encoder_crossentropy_backward_match_finite_differences() {
    let n = 9;
    let x = rand_vec(n, 11);
    let proj = rand_vec(n, 12);
    let mut dx = vec![0.0; n];
    gelu_backward(&mut dx, &x, &proj);
    check("gelu", &mut x.clone(), &dx, &mut |xx| {
        let mut o = vec![0.0; n];
        gelu_forward(&mut o, xx);
        dot(&o, &proj)
    });
    let (mut da, mut db) = (vec![0.0; n], vec![0.0; n]);
    residual_backward(&mut da, &mut db, &proj);
    assert_eq!(da, proj);
    assert_eq!(db, proj);

    let (t, c, v) = (3, 4, 5);
    let tokens = [1u32, 4, 1, 0, 2, 3];
    let wte = rand_vec(v * c, 13);
    let wpe = rand_vec(t * c, 14);
    let proj = rand_vec(tokens.len() * c, 15);
    let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; t * c]);
    encoder_backward(&mut dwte, 0, Some(&mut dwpe), &proj, &tokens, t, c);
    let enc = |wte: &[f64], wpe: &[f64]| {
        let mut o = vec![0.0; tokens.len() * c];
        encoder_forward(&mut o, &tokens, wte, 0, Some(wpe), t, c);
        dot(&o, &proj)
    };
    check("encoder dwte", &mut wte.clone(), &dwte, &mut |w| enc(w, &wpe));
    check("encoder dwpe", &mut wpe.clone(), &dwpe, &mut |w| enc(&wte, w));

    let (rows, vp) = (4, 7);
    let logits = rand_vec(rows * vp, 16);
    let targets = [0u32, 4, 2, 1];
    let loss = |lg: &[f64]| {
        let (mut p, mut l) = (vec![0.0; rows * vp], vec![0.0; rows]);
        crossentropy_forward(&mut p, &mut l, lg, &targets, 5, vp);
        l.iter().sum::<f64>() / rows as f64
    };
    let (mut p, mut l) = (vec![0.0; rows * vp], vec![0.0; rows]);
    crossentropy_forward(&mut p, &mut l, &logits, &targets, 5, vp);
    let mut dl = vec![0.0; rows * vp];
    crossentropy_backward(&mut dl, &p, &targets, 0, 1.0 / rows as f64, 5, vp);
    check("crossentropy", &mut logits.clone(), &dl, &mut |lg| loss(lg));
    assert!(dl[5] == 0.0 && dl[6] == 0.0, "padded vocabulary gets no gradient");
}

fn tiny() -> GptShape {
    GptShape {
        layers: 2,
        channels: 8,
        heads: 2,
        ffn: 32,
        max_seq: 6,
        vocab: 11,
        padded_vocab: 16,
    }
}

#[test]
fn whole_model_gradient_matches_finite_differences() {
    let s = tiny();
    let mut m = Gpt::<f64>::new(s, 1);
    // non-trivial LayerNorm gains/biases so their gradients are exercised
    let mut r = fastrand::Rng::with_seed(3);
    for x in m.params.iter_mut() {
        *x += 0.05 * (r.f64() - 0.5);
    }
    let (b, t) = (2, 5);
    let tokens: Vec<u32> = (0..b * t).map(|i| (i * 7 % 11) as u32).collect();
    let targets: Vec<u32> = (0..b * t).map(|i| ((i * 3 + 1) % 11) as u32).collect();
    m.zero_grad();
    m.forward(&tokens, &targets, b, t).unwrap();
    m.backward(1.0).unwrap();
    let g = m.grads.clone();
    // every 7th parameter (all tensors are covered), against the f64 loss
    let h = 1e-6;
    let mut checked = 0;
    let real = |i: usize| !(i >= s.vocab * s.channels && i < s.padded_vocab * s.channels);
    for i in (0..m.params.len()).step_by(7).filter(|&i| real(i)) {
        let x0 = m.params[i];
        m.params[i] = x0 + h;
        let fp = m.forward(&tokens, &targets, b, t).unwrap();
        m.params[i] = x0 - h;
        let fm = m.forward(&tokens, &targets, b, t).unwrap();
        m.params[i] = x0;
        let num = (fp - fm) / (2.0 * h);
        let err = (num - g[i]).abs();
        assert!(
            err < 1e-7 + 1e-5 * num.abs(),
            "param {i}: numeric {num} vs analytic {}",
            g[i]
        );
        checked += 1;
    }
    assert!(checked > 250, "{checked}");
}

#[test]
fn gradients_are_bit_identical_run_to_run() {
    let s = GptShape {
        layers: 2,
        channels: 64,
        heads: 4,
        ffn: 256,
        max_seq: 80,
        vocab: 100,
        padded_vocab: 128,
    };
    let run = || {
        let mut m = Gpt::<f32>::new(s, 5);
        let tokens: Vec<u32> = (0..2 * 80).map(|i| (i * 13 % 100) as u32).collect();
        let targets: Vec<u32> = (0..2 * 80).map(|i| (i * 17 % 100) as u32).collect();
        let l = m.forward(&tokens, &targets, 2, 80).unwrap();
        m.backward(1.0).unwrap();
        (l, m.grads)
    };
    let (l1, g1) = run();
    let (l2, g2) = run();
    assert_eq!(l1.to_bits(), l2.to_bits());
    assert!(g1.iter().zip(&g2).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn a_tiny_model_overfits_a_tiny_batch() {
    let s = GptShape {
        layers: 2,
        channels: 32,
        heads: 4,
        ffn: 128,
        max_seq: 16,
        vocab: 50,
        padded_vocab: 64,
    };
    let mut m = Gpt::<f32>::new(s, 7);
    let decay: Vec<_> = m
        .layout
        .blocks
        .iter()
        .flat_map(|b| [b.qkvw.clone(), b.projw.clone(), b.fcw.clone(), b.fcprojw.clone()])
        .collect();
    let mut opt = AdamW::new(
        &Cpu::<f32>::default(),
        AdamWConfig {
            lr: 3e-3,
            weight_decay: 0.0,
            ..Default::default()
        },
        m.params.len(),
        decay,
    );
    let tokens: Vec<u32> = (0..2 * 16).map(|i| (i * 7 % 50) as u32).collect();
    let targets: Vec<u32> = (0..2 * 16).map(|i| (i * 11 % 50) as u32).collect();
    let first = m.forward(&tokens, &targets, 2, 16).unwrap();
    assert!((first - (50f32).ln()).abs() < 0.3, "starts near ln V: {first}");
    let mut last = first;
    for step in 0..300 {
        m.zero_grad();
        last = m.forward(&tokens, &targets, 2, 16).unwrap();
        m.backward(1.0).unwrap();
        clip_grad_norm(&mut m.grads, 1.0);
        opt.update(
            &Cpu::default(),
            &mut m.params,
            &m.grads,
            lr_at(step, 3e-3, 3e-4, 10, 300),
        );
    }
    assert!(last < 0.05, "loss {first} -> {last}");
}

#[test]
fn schedule_and_clipping() {
    assert!((lr_at(0, 1.0, 0.1, 10, 100) - 0.1).abs() < 1e-12);
    assert!((lr_at(9, 1.0, 0.1, 10, 100) - 1.0).abs() < 1e-12);
    assert!((lr_at(55, 1.0, 0.1, 10, 100) - 0.55).abs() < 1e-12, "cosine midpoint");
    assert_eq!(lr_at(100, 1.0, 0.1, 10, 100), 0.1);
    let mut g = vec![3.0f32, 4.0];
    assert_eq!(clip_grad_norm(&mut g, 1.0), 5.0);
    assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
}

#[test]
fn calibration_fit_recovers_a_known_gemm_curve() {
    use exatrain_spec::GemmEfficiency;
    use exatrain_train::calibrate::{fit_gemm, GemmPoint, SHAPES};
    let truth = GemmEfficiency {
        max_efficiency: 0.8,
        half_size: 120.0,
    };
    let peak = 200.0;
    let points: Vec<GemmPoint> = SHAPES
        .iter()
        .map(|&(m, n, k)| GemmPoint {
            m,
            n,
            k,
            gflops: peak * truth.efficiency(m as f64, n as f64, k as f64),
        })
        .collect();
    let fit = fit_gemm(&points, peak);
    assert!(
        (fit.max_efficiency - 0.8).abs() < 0.006 && (fit.half_size - 120.0).abs() <= 5.0,
        "{fit:?}"
    );
}

#[test]
fn link_fit_recovers_a_known_bandwidth_and_latency() {
    use exatrain_train::calibrate::{fit_link, Collective, CommPoint};
    let (gbps, alpha) = (12.5, 20e-6);
    let mut points = Vec::new();
    for ranks in [2usize, 4] {
        for kind in Collective::ALL {
            for (i, bytes) in [4096usize, 65536, 1 << 20, 16 << 20].into_iter().enumerate() {
                let (f, h) = kind.ring(ranks);
                let noise = 1.0 + 0.02 * if i % 2 == 0 { 1.0 } else { -1.0 };
                let seconds = (f * bytes as f64 / (gbps * 1e9) + h * alpha) * noise;
                points.push(CommPoint {
                    kind,
                    ranks,
                    bytes,
                    seconds,
                });
            }
        }
    }
    let fit = fit_link(&points).unwrap();
    assert!((fit.gbps / gbps - 1.0).abs() < 0.03, "{fit:?}");
    assert!((fit.latency_us / 20.0 - 1.0).abs() < 0.05, "{fit:?}");
    assert!(fit.median_error < 0.03, "{fit:?}");
    // one size only: bandwidth and latency cannot be told apart
    let one: Vec<CommPoint> = points
        .iter()
        .filter(|p| p.bytes == 4096 && p.ranks == 2 && p.kind == Collective::SendRecv)
        .copied()
        .collect();
    assert_eq!(one.len(), 1);
    assert!(fit_link(&one).is_none());
}

#[test]
fn collective_timings_cover_every_kind_and_size_on_in_process_ranks() {
    use exatrain_train::calibrate::{time_collectives, Collective};
    let ranks = exatrain_parallel::comm::in_process(3, std::time::Duration::from_secs(10));
    let all: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|c| s.spawn(move || time_collectives(&c, &[1200, 120_000], 3).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(all[0].len(), 8);
    assert!(all.iter().all(|p| *p == all[0]), "every rank reports rank 0's clock");
    for p in &all[0] {
        assert!(p.seconds > 0.0 && p.ranks == 3 && p.bytes % 12 == 0, "{p:?}");
    }
    let kinds: Vec<Collective> = all[0].iter().map(|p| p.kind).collect();
    assert_eq!(&kinds[..4], &Collective::ALL);
}
