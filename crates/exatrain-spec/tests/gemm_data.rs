//! Each cluster preset's GEMM efficiency curve (the bare matmul's, `device.gemm`) against the
//! published GEMM microbenchmarks in `data/gemm-microbenchmarks.csv`, each row with its source.

use exatrain_spec::{presets, Dtype};

/// Over every measured shape of a preset, the curve is off by at most 5 % rms and 10 % on any
/// one shape (ln of predicted over measured efficiency).
#[test]
fn the_gemm_curves_follow_the_published_microbenchmarks() {
    let text = include_str!("../../../data/gemm-microbenchmarks.csv");
    let mut rows = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    assert_eq!(rows.next(), Some("cluster,m,n,k,tflops,source"));
    let mut by_cluster: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for row in rows {
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f.len(), 6, "{row}");
        assert!(!f[5].is_empty(), "{row}: every row names its source");
        let num = |i: usize| f[i].parse::<f64>().unwrap_or_else(|e| panic!("{row}: {e}"));
        let c = presets::cluster(f[0]).unwrap();
        let measured = num(4) * 1e12 / c.device.peak_flops(Dtype::Bf16);
        assert!(measured > 0.0 && measured <= 1.0, "{row}: {measured} of the peak");
        let curve = c.device.gemm.efficiency(num(1), num(2), num(3));
        let err = (curve / measured).ln();
        assert!(err.abs() <= 0.10, "{row}: curve {curve:.3}, measured {measured:.3}");
        by_cluster.entry(f[0]).or_default().push(err);
    }
    assert!(by_cluster.contains_key("dgx-h100"));
    for (cluster, errs) in by_cluster {
        let rms = (errs.iter().map(|e| e * e).sum::<f64>() / errs.len() as f64).sqrt();
        assert!(rms <= 0.05, "{cluster}: rms {rms:.3} over {} shapes", errs.len());
    }
}
