use exatrain_train::kernels::*;
use std::time::Instant;
fn t<F: FnMut()>(name: &str, flops: f64, mut f: F) -> f64 {
    f();
    let n = 5;
    let t0 = Instant::now();
    for _ in 0..n {
        f();
    }
    let dt = t0.elapsed().as_secs_f64() / n as f64;
    println!("{name:<28} {:>8.2} ms {:>8.1} GFLOP/s", dt * 1e3, flops / dt / 1e9);
    dt
}
fn main() {
    let (b, tt, c, nh, v) = (8usize, 256usize, 384usize, 6usize, 8192usize);
    let n = b * tt;
    let x = vec![0.01f32; n * 4 * c];
    let w = vec![0.01f32; v * c];
    let bias = vec![0.0f32; v];
    let mut out = vec![0.0f32; n * v];
    let mut total = 0.0;
    for (name, ci, oc, k) in [
        ("qkv", c, 3 * c, 1.0),
        ("attproj", c, c, 1.0),
        ("fc", c, 4 * c, 1.0),
        ("fcproj", 4 * c, c, 1.0),
        ("logits", c, v, 1.0 / 6.0),
    ] {
        let fl = 2.0 * (n * ci * oc) as f64;
        total += 6.0
            * k
            * t(&format!("matmul fwd {name}"), fl, || {
                matmul_forward(
                    &mut out[..n * oc],
                    &x[..n * ci],
                    &w[..oc * ci],
                    Some(&bias[..oc]),
                    ci,
                    oc,
                )
            });
        let mut dinp = vec![0.0f32; n * ci];
        let mut dw = vec![0.0f32; oc * ci];
        let mut db = vec![0.0f32; oc];
        let dout = vec![0.01f32; n * oc];
        total += 6.0
            * k
            * t(&format!("matmul bwd {name}"), 2.0 * fl, || {
                matmul_backward(
                    &mut dinp,
                    &mut dw,
                    Some(&mut db),
                    &dout,
                    &x[..n * ci],
                    &w[..oc * ci],
                    ci,
                    oc,
                )
            });
    }
    let qkv = vec![0.01f32; n * 3 * c];
    let mut att = vec![0.0f32; b * nh * tt * tt];
    let mut y = vec![0.0f32; n * c];
    let afl = 4.0 * (b * tt * tt * c) as f64;
    total += 6.0
        * t("attention fwd", afl, || {
            attention_forward(&mut y, &mut att, &qkv, b, tt, c, nh)
        });
    let mut dq = vec![0.0f32; n * 3 * c];
    total += 6.0
        * t("attention bwd", 2.0 * afl, || {
            attention_backward(&mut dq, &y, &qkv, &att, b, tt, c, nh)
        });
    let (mut m, mut r) = (vec![0.0f32; n], vec![0.0f32; n]);
    let lw = vec![1.0f32; c];
    total += 13.0
        * t("layernorm fwd", 0.0, || {
            layernorm_forward(&mut y, &mut m, &mut r, &x[..n * c], &lw, &lw, c)
        });
    let (mut dw, mut db) = (vec![0.0f32; c], vec![0.0f32; c]);
    let mut dx = vec![0.0f32; n * c];
    total += 13.0
        * t("layernorm bwd", 0.0, || {
            layernorm_backward(&mut dx, &mut dw, &mut db, &x[..n * c], &x[..n * c], &lw, &m, &r, c)
        });
    let mut g = vec![0.0f32; n * 4 * c];
    total += 6.0 * t("gelu fwd", 0.0, || gelu_forward(&mut g, &x));
    total += 6.0 * t("gelu bwd", 0.0, || gelu_backward(&mut g, &x, &x));
    let mut probs = vec![0.0f32; n * v];
    let mut losses = vec![0.0f32; n];
    let targets = vec![1u32; n];
    total += t("crossentropy fwd", 0.0, || {
        crossentropy_forward(&mut probs, &mut losses, &out, &targets, v, v)
    });
    total += t("crossentropy bwd", 0.0, || {
        crossentropy_backward(&mut out, &probs, &targets, 0, 1e-3, v, v)
    });
    println!("estimated step: {:.3} s", total);
}
