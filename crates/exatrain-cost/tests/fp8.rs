//! FP8 linear layers (`ParallelConfig::fp8`, `plan --fp8`): the block's four weight GEMMs on the
//! device's FP8 peak and curve, the casts they need, the FP8 weight copies Transformer Engine
//! keeps and the FP8 inputs it saves; refused where the device has no FP8 tensor cores.

use exatrain_cost::plan;
use exatrain_spec::{presets, Dtype, Invalid, ParallelConfig, Recompute};

/// Llama 2 70B on 64 H100s as NeMo benchmarks it (tp 4, pp 4, 20 chunks per stage).
fn layout(fp8: bool) -> ParallelConfig {
    ParallelConfig {
        zero: 1,
        recompute: Recompute::None,
        sequence_parallel: true,
        flash_attention: true,
        overlap_tp: true,
        virtual_stages: 20,
        fp8,
        ..ParallelConfig::new(4, 4, 4, 1, 128)
    }
}

#[test]
fn fp8_runs_the_linear_gemms_faster_but_not_twice_as_fast() {
    let m = presets::model("llama2-70b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let bf16 = plan(&m, &c, &layout(false)).unwrap();
    let fp8 = plan(&m, &c, &layout(true)).unwrap();
    let speedup = bf16.time_s.compute / fp8.time_s.compute;
    // the GEMMs run on twice the peak at a lower fraction of it; attention, norms, the head and
    // the casts do not speed up
    assert!(speedup > 1.2 && speedup < 2.0, "compute speedup {speedup}");
    assert!(fp8.step_time_s < bf16.step_time_s);
    // communication is priced as before (bf16 activations and gradients on the wire)
    assert_eq!(fp8.time_s.tp_comm, bf16.time_s.tp_comm);
    assert_eq!(fp8.comm_bytes.tp, bf16.comm_bytes.tp);
    // model FLOPs are the same; MFU stays against the bf16 peak
    assert_eq!(fp8.model_flops_per_step, bf16.model_flops_per_step);
    assert!((fp8.mfu / bf16.mfu - bf16.step_time_s / fp8.step_time_s).abs() < 1e-9);
}

#[test]
fn fp8_keeps_weight_copies_and_saves_its_inputs_as_fp8() {
    let m = presets::model("llama2-70b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let bf16 = plan(&m, &c, &layout(false)).unwrap().memory_bytes;
    let fp8 = plan(&m, &c, &layout(true)).unwrap().memory_bytes;
    // an FP8 copy and its transpose (1 byte each) of every linear weight of a stage's 20 layers
    let copies = 2.0 * 20.0 * m.layer_matrix_params() as f64 / 4.0;
    assert!(
        (fp8.weights - bf16.weights - copies).abs() < 1.0,
        "{} vs {}",
        fp8.weights - bf16.weights,
        copies
    );
    assert!(fp8.activations < bf16.activations);
    assert_eq!(fp8.grads, bf16.grads);
    assert_eq!(fp8.optimizer, bf16.optimizer);
}

#[test]
fn fp8_needs_bf16_and_a_device_with_fp8_tensor_cores() {
    let m = presets::model("llama2-70b").unwrap();
    for cluster in ["selene", "frontier", "dgx-2h"] {
        let c = presets::cluster(cluster).unwrap();
        assert_eq!(
            plan(&m, &c, &layout(true)).unwrap_err(),
            Invalid::Fp8Unsupported,
            "{cluster}"
        );
        assert!(plan(&m, &c, &layout(false)).is_ok(), "{cluster}");
    }
    let c = presets::cluster("dgx-h100").unwrap();
    let fp32 = ParallelConfig {
        dtype: Dtype::Fp32,
        ..layout(true)
    };
    assert_eq!(plan(&m, &c, &fp32).unwrap_err(), Invalid::Fp8NeedsBf16);
    assert!(Invalid::Fp8Unsupported.to_string().contains("peak_tflops_fp8"));
}

/// The FP8 curve, not the bf16 one, prices the FP8 GEMMs: a slower FP8 curve slows only the
/// FP8 plan.
#[test]
fn the_fp8_gemms_follow_the_devices_fp8_curve() {
    let m = presets::model("llama2-70b").unwrap();
    let c = presets::cluster("dgx-h100").unwrap();
    let mut slow = c.clone();
    let g = slow.device.gemm_fp8.as_mut().expect("the preset has an FP8 curve");
    g.max_efficiency /= 2.0;
    slow.validate().unwrap();
    assert_eq!(
        plan(&m, &slow, &layout(false)).unwrap().step_time_s,
        plan(&m, &c, &layout(false)).unwrap().step_time_s
    );
    assert!(
        plan(&m, &slow, &layout(true)).unwrap().time_s.compute
            > 1.3 * plan(&m, &c, &layout(true)).unwrap().time_s.compute
    );
}
