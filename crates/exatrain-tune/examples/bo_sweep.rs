use exatrain_spec::presets;
use exatrain_tune::bayes::{self, Settings, Strategy};
use exatrain_tune::eval::CostModel;
use exatrain_tune::{
    exhaustive,
    space::{self, SpaceSpec},
};
fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (k0, kf, init, trees) = (args[0], args[1], args[2] as usize, args[3] as usize);
    for (model, gpus, gbs) in [
        ("gpt-22b", 128u32, 1024u32),
        ("gpt-175b", 1024, 1024),
        ("gpt-1t", 3072, 3072),
    ] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster("frontier").unwrap();
        let s = SpaceSpec::new(gpus, gbs);
        let space: Vec<_> = space::configs(&m, &s).collect();
        let opt = exhaustive::search(&m, &c, &s, 1, &|_| {}).best[0]
            .plan
            .tokens_per_s;
        let eval = CostModel {
            model: &m,
            cluster: &c,
        };
        let mut out = Vec::new();
        for seed in 0..5 {
            let mut st = Settings::new(Strategy::Bayes, 80, seed);
            st.kappa = k0;
            if std::env::var("TREES").is_ok() {
                st.surrogate = bayes::Surrogate::ExtraTrees;
            }
            st.global_every = std::env::var("GLOBAL").map_or(4, |v| v.parse().unwrap());
            st.kappa_final = kf;
            st.initial = init;
            st.trees = trees;
            let t = bayes::run(&space, &eval, &st, Vec::new(), &mut |_| Ok(())).unwrap();
            out.push(bayes::trials_to_reach(&t, opt, 0.02).map_or(999, |n| n));
        }
        println!("{model}: {out:?}");
    }
}
