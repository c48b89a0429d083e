use exatrain_spec::presets;
use exatrain_tune::bayes::{self, Settings, Strategy};
use exatrain_tune::eval::CostModel;
use exatrain_tune::{
    exhaustive,
    space::{self, SpaceSpec},
};
fn main() {
    let m = presets::model("gpt-22b").unwrap();
    let c = presets::cluster("frontier").unwrap();
    let s = SpaceSpec::new(128, 1024);
    let space: Vec<_> = space::configs(&m, &s).collect();
    let r = exhaustive::search(&m, &c, &s, 5, &|_| {});
    for b in &r.best {
        println!("OPT {:.0} {:?}", b.plan.tokens_per_s, b.cfg);
    }
    let eval = CostModel {
        model: &m,
        cluster: &c,
    };
    let t = bayes::run(
        &space,
        &eval,
        &Settings::new(Strategy::Bayes, 80, 0),
        Vec::new(),
        &mut |_| Ok(()),
    )
    .unwrap();
    for x in &t {
        let c = x.config;
        println!(
            "{:>3} {:>10} tp{} pp{} dp{} mb{} z{} {:?} sp{} v{} fl{} {}",
            x.id,
            x.outcome
                .value()
                .map_or("FAIL".into(), |v| format!("{v:.0}")),
            c.tp,
            c.pp,
            c.dp,
            c.micro_batch,
            c.zero,
            c.recompute,
            c.sequence_parallel as u8,
            c.virtual_stages,
            c.flash_attention as u8,
            c.order
        );
    }
}
