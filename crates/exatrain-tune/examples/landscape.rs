use exatrain_cost::plan;
use exatrain_spec::presets;
use exatrain_tune::space::{self, SpaceSpec};
fn main() {
    for (model, gpus, gbs) in [
        ("gpt-22b", 128u32, 1024u32),
        ("gpt-175b", 1024, 1024),
        ("gpt-1t", 3072, 3072),
    ] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster("frontier").unwrap();
        let mut s = SpaceSpec::new(gpus, gbs);
        if std::env::var("SMALL").is_ok() {
            s.orders = vec![Default::default()];
            s.flash_attention = vec![true];
        }
        if std::env::var("NOV").is_ok() {
            s.interleave = false;
        }
        let v: Vec<f64> = space::configs(&m, &s)
            .map(|cfg| {
                plan(&m, &c, &cfg)
                    .ok()
                    .filter(|p| p.fits)
                    .map_or(0.0, |p| p.tokens_per_s)
            })
            .collect();
        let best = v.iter().cloned().fold(0.0, f64::max);
        let n = |f: f64| v.iter().filter(|x| **x >= best * f).count();
        println!(
            "{model}: {} configs, feasible {}, within 2% {}, 5% {}, 10% {}",
            v.len(),
            n(1e-9),
            n(0.98),
            n(0.95),
            n(0.90)
        );
    }
}
