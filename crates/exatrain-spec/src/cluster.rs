use serde::{Deserialize, Serialize};

use crate::{Dtype, Framework, Invalid, SpecError};

/// How well one device's dense GEMMs use its peak, by problem size:
/// `eff(m, n, k) = max_efficiency · d / (d + half_size)` with `d = 3 / (1/m + 1/n + 1/k)`
/// (the harmonic mean of the three dimensions). Large square GEMMs approach `max_efficiency`;
/// a GEMM with one small dimension loses efficiency, as measured cuBLAS/rocBLAS curves do.
/// The roofline (bytes / HBM bandwidth) bounds thin GEMMs separately.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmEfficiency {
    pub max_efficiency: f64,
    pub half_size: f64,
}

impl GemmEfficiency {
    /// Fraction of peak a (m × k) · (k × n) GEMM reaches.
    #[inline]
    pub fn efficiency(&self, m: f64, n: f64, k: f64) -> f64 {
        let d = 3.0 / (1.0 / m + 1.0 / n + 1.0 / k);
        self.max_efficiency * d / (d + self.half_size)
    }
}

/// One measured GEMM: its shape (m × k by k × n) and the fraction of the device's peak it reached
/// (what `exatrain calibrate` measured, in the spec's training precision).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmMeasure {
    pub m: f64,
    pub n: f64,
    pub k: f64,
    pub efficiency: f64,
}

/// The most entries a `gemm_table` may hold (each GEMM the planner prices looks at all of them).
pub const GEMM_TABLE_MAX: usize = 64;

/// A `gemm_table` prepared for pricing GEMMs: each measured shape's ln m, ln n, ln k, the ln of
/// its measured/curve ratio, and its measured efficiency, computed once (not per GEMM priced).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GemmCorrection {
    points: Vec<[f64; 5]>,
}

impl GemmCorrection {
    pub fn new(curve: &GemmEfficiency, table: &[GemmMeasure]) -> Self {
        GemmCorrection {
            points: table
                .iter()
                .map(|t| {
                    let ratio = (t.efficiency / curve.efficiency(t.m, t.n, t.k)).ln();
                    [t.m.ln(), t.n.ln(), t.k.ln(), ratio, t.efficiency]
                })
                .collect(),
        }
    }

    /// The efficiency of an (m × k)·(k × n) GEMM: the curve, times the measured/curve ratio
    /// interpolated over the measured shapes (inverse squared distance in ln m, ln n, ln k). At a
    /// measured shape it is the measurement; far from all of them, the curve times the ratio of
    /// the nearest ones. No measurements: the curve.
    #[inline]
    pub fn efficiency(&self, curve: &GemmEfficiency, m: f64, n: f64, k: f64) -> f64 {
        let e = curve.efficiency(m, n, k);
        if self.points.is_empty() {
            return e;
        }
        let (lm, ln_, lk) = (m.ln(), n.ln(), k.ln());
        let (mut wsum, mut acc) = (0.0, 0.0);
        for &[pm, pn, pk, ratio, measured] in &self.points {
            let d2 = (lm - pm).powi(2) + (ln_ - pn).powi(2) + (lk - pk).powi(2);
            if d2 < 1e-18 {
                return measured;
            }
            let w = 1.0 / d2;
            wsum += w;
            acc += w * ratio;
        }
        e * (acc / wsum).exp()
    }
}

/// One accelerator (GPU, or GCD for MI250X).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub name: String,
    /// Dense bf16/fp16 matrix peak, TFLOP/s.
    pub peak_tflops_bf16: f64,
    /// Dense fp32 peak, TFLOP/s.
    pub peak_tflops_fp32: f64,
    /// Dense FP8 tensor-core peak, TFLOP/s (H100/H200: 1979); unset on devices without FP8
    /// (A100, V100, MI250X), where `--fp8` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_tflops_fp8: Option<f64>,
    /// HBM capacity, GiB.
    pub hbm_gib: f64,
    /// HBM bandwidth, GB/s.
    pub hbm_gbps: f64,
    /// Fraction of HBM bandwidth memory-bound kernels reach.
    #[serde(default = "default_mem_eff")]
    pub memory_efficiency: f64,
    pub gemm: GemmEfficiency,
    /// The FP8 GEMMs' curve, as a fraction of `peak_tflops_fp8` (FP8 tiles need larger shapes to
    /// fill the device than bf16 ones). Unset: `gemm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_fp8: Option<GemmEfficiency>,
    /// Measured GEMM efficiencies by shape (written by `exatrain calibrate`): the curve is
    /// corrected toward them (`GemmCorrection`). Empty: the curve alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemm_table: Vec<GemmMeasure>,
}

impl DeviceSpec {
    /// Dense FP8 peak in FLOP/s and the FP8 GEMM curve, or None on a device without FP8.
    pub fn fp8(&self) -> Option<(f64, GemmEfficiency)> {
        self.peak_tflops_fp8
            .map(|p| (1e12 * p, self.gemm_fp8.unwrap_or(self.gemm)))
    }

    /// The same, or why `--fp8` cannot run here: the one check every command makes of it.
    pub fn require_fp8(&self) -> Result<(f64, GemmEfficiency), Invalid> {
        self.fp8().ok_or(Invalid::Fp8Unsupported)
    }

    /// Dense peak in FLOP/s for a training precision (with `--fp8` too: MFU stays against the
    /// bf16 peak, as the frameworks report it).
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        1e12 * match dtype {
            Dtype::Bf16 => self.peak_tflops_bf16,
            Dtype::Fp32 => self.peak_tflops_fp32,
        }
    }
}

fn default_mem_eff() -> f64 {
    0.8
}

/// A class of intra-node link: any group of devices that lies inside one aligned block of `span`
/// consecutive devices of a node talks at `gbps` (per direction, per device). Classes are listed
/// from the smallest span up; the last one must span the whole node.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkClass {
    pub span: u32,
    pub gbps: f64,
}

/// One node: its devices, their links, its NICs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub devices: u32,
    pub links: Vec<LinkClass>,
    /// Network interfaces per node.
    pub nics: u32,
    /// Per-NIC bandwidth, GB/s per direction.
    pub nic_gbps: f64,
}

/// Collective-algorithm constants.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Per-hop latency inside a node, µs.
    pub intra_latency_us: f64,
    /// Per-hop latency between nodes, µs.
    pub inter_latency_us: f64,
    /// Fraction of link bandwidth a ring collective reaches (bus bandwidth / link bandwidth).
    pub efficiency: f64,
}

/// Facts about the whole system used by time-to-train projections.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    /// Mean time between failures of one node, hours.
    pub node_mtbf_hours: Option<f64>,
    /// Aggregate checkpoint write bandwidth of the file system, GB/s.
    pub checkpoint_write_gbps: Option<f64>,
    /// Time to restart a job after a failure (requeue, load), seconds.
    pub restart_s: Option<f64>,
    /// Power per node under load, kW.
    pub node_power_kw: Option<f64>,
}

/// How jobs are launched on this machine: what `exatrain export --launcher slurm` writes around
/// the framework's command. Every field is a site fact; `sources` says where each comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    /// `#SBATCH` options besides nodes, tasks and time (`ACCOUNT` is the placeholder the user
    /// replaces), e.g. `["--account=ACCOUNT", "--partition=batch"]`.
    #[serde(default)]
    pub sbatch: Vec<String>,
    /// `srun` options that bind one task to each GPU, e.g. `-c7 --gpus-per-task=1 --gpu-bind=closest`.
    #[serde(default)]
    pub srun: String,
    /// Each task sees only its own GPU (as device 0), so `LOCAL_RANK` is 0 in every task;
    /// otherwise every task sees the node's GPUs and `LOCAL_RANK` is the task's index on its node.
    #[serde(default)]
    pub one_gpu_per_task: bool,
    /// `module load` lines, in order.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Environment for every task (values may use shell variables such as `$USER`).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Where the facts above come from.
    #[serde(default)]
    pub sources: Vec<String>,
}

/// What the software stack (framework, kernels, compiler) gets out of the hardware, kept apart
/// from the hardware's own numbers so that a fitted spec still reports MFU against the device's
/// real peak. `calibrate --fit` and `validate --per-source` fit these.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackSpec {
    /// Multiplier on every compute kernel's efficiency (`device.gemm`'s curve, the attention
    /// core), capped at the device's peak: 1 = the curve as the spec gives it.
    #[serde(default = "one")]
    pub compute_efficiency: f64,
    /// The framework `compute_efficiency` was measured with (the GPU presets: Megatron-LM);
    /// [`ClusterSpec::for_framework`] carries it to another by [`Framework::compute_efficiency`].
    /// None: the curve is the trainer's own (what `calibrate` measures), no framework's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<Framework>,
    /// Whether the stack has a fused scale-mask-softmax kernel for the attention scores (without
    /// flash attention): Megatron's `--masked-softmax-fusion`, on by default since 2020, and
    /// taken only where its shape constraints hold ([`Framework::fused_softmax_fits`]). false:
    /// the unfused PyTorch chain (scale, mask, softmax as separate passes), as Megatron-LM ran
    /// in 2019 and runs with `--no-masked-softmax-fusion`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub fused_softmax: bool,
    /// Whether the stack overlaps the column-parallel linears' backward TP collectives with
    /// their GEMMs where its framework does ([`Framework::overlaps_tp_backward`]; never for
    /// the trainer, whose collectives block). false: the code before that overlap (Megatron-LM
    /// before September 2021, the Megatron-DeepSpeed forks that trained BLOOM and MT-NLG).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub async_tp: bool,
    /// Whether the linears' biases are added inside the next kernel: Megatron's
    /// `--bias-gelu-fusion` and `--bias-dropout-fusion` (both on by default since September
    /// 2020; the trainer's kernels too). false: a pass of its own for each bias, and the dropout
    /// apart from the residual add, as Megatron-LM ran in 2019 (`F.linear` on 3-D inputs adds the
    /// bias separately, `output_ + self.bias` after the row-parallel reduction,
    /// `torch.nn.Dropout`, then `+`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub bias_fusion: bool,
    /// Whether the stack overlaps the pipeline's sends and receives with the next chunk's
    /// compute where its framework does ([`Framework::overlaps_pp_comm`]: Megatron-LM's
    /// interleaved schedule, `overlap_p2p_comm`, on by default since megatron-core of 2023).
    /// false: the code before it (Narayanan 2021's and Korthikanti 2022's interleaved runs).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub overlap_p2p: bool,
    /// Whether Megatron-LM reduces and keeps the data-parallel gradients in bf16
    /// (`--grad-reduce-in-bf16`, which exatrain's export passes when dp · cp > 1; see
    /// [`Framework::dp_reduction`]). false: Megatron-LM's default for bf16, fp32 `main_grad`
    /// buffers and reductions (a log whose arguments print `grad_reduce_in_bf16 False`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub grad_reduce_bf16: bool,
}

impl Default for StackSpec {
    fn default() -> Self {
        StackSpec {
            compute_efficiency: 1.0,
            framework: None,
            fused_softmax: true,
            async_tp: true,
            bias_fusion: true,
            overlap_p2p: true,
            grad_reduce_bf16: true,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl StackSpec {
    fn is_default(&self) -> bool {
        *self == StackSpec::default()
    }
}

/// What one run's code did where it may differ from its cluster's stack: the stack's on/off
/// switches, each `None` where the run does not say (the cluster's setting stays). A published
/// run's CSV row names all four; a Megatron-LM log's argument dump names what it printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackSwitches {
    pub fused_softmax: Option<bool>,
    pub async_tp: Option<bool>,
    pub bias_fusion: Option<bool>,
    pub overlap_p2p: Option<bool>,
    pub grad_reduce_bf16: Option<bool>,
}

impl StackSwitches {
    /// Every switch of `s`, as it is.
    pub fn of(s: &StackSpec) -> Self {
        StackSwitches {
            fused_softmax: Some(s.fused_softmax),
            async_tp: Some(s.async_tp),
            bias_fusion: Some(s.bias_fusion),
            overlap_p2p: Some(s.overlap_p2p),
            grad_reduce_bf16: Some(s.grad_reduce_bf16),
        }
    }

    /// Set the switches this run names on `s`.
    pub fn apply(&self, s: &mut StackSpec) {
        let set = |field: &mut bool, v: Option<bool>| {
            if let Some(v) = v {
                *field = v;
            }
        };
        set(&mut s.fused_softmax, self.fused_softmax);
        set(&mut s.async_tp, self.async_tp);
        set(&mut s.bias_fusion, self.bias_fusion);
        set(&mut s.overlap_p2p, self.overlap_p2p);
        set(&mut s.grad_reduce_bf16, self.grad_reduce_bf16);
    }
}

fn one() -> f64 {
    1.0
}

/// A machine: devices, nodes, network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    pub device: DeviceSpec,
    pub node: NodeSpec,
    pub network: NetworkSpec,
    /// Memory the framework keeps per device outside the model's tensors (context, communication
    /// buffers, GEMM workspaces), GiB.
    #[serde(default = "default_reserved")]
    pub reserved_gib: f64,
    /// Fraction of tensor memory lost to allocator fragmentation.
    #[serde(default = "default_frag")]
    pub fragmentation: f64,
    #[serde(default)]
    pub system: SystemSpec,
    #[serde(default)]
    pub launch: LaunchSpec,
    /// The software stack's efficiency on this hardware (default: the spec's curve as it is).
    #[serde(default, skip_serializing_if = "StackSpec::is_default")]
    pub stack: StackSpec,
}

fn default_reserved() -> f64 {
    1.0
}
fn default_frag() -> f64 {
    0.05
}

fn pos(v: f64, field: &str) -> Result<(), SpecError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(SpecError::new(format!(
            "cluster: `{field}` must be a positive number, got {v}"
        )))
    }
}

/// A positive quantity given in units of `unit` base units (TFLOP/s: 1e12, GB/s: 1e9) that
/// stays finite in base units: `1e308` TFLOP/s would be an infinite FLOP/s and an MFU of 0.
fn rate(v: f64, unit: f64, field: &str) -> Result<(), SpecError> {
    pos(v, field)?;
    if (v * unit).is_finite() {
        Ok(())
    } else {
        Err(SpecError::new(format!(
            "cluster: `{field}` must be a positive number below {:.3e}, got {v:e}",
            f64::MAX / unit
        )))
    }
}

fn nonneg(v: f64, field: &str) -> Result<(), SpecError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(SpecError::new(format!(
            "cluster: `{field}` must be a finite number ≥ 0, got {v}"
        )))
    }
}

fn fraction(v: f64, field: &str) -> Result<(), SpecError> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(SpecError::new(format!("cluster: `{field}` must be in (0, 1], got {v}")))
    }
}

impl ClusterSpec {
    /// This cluster as framework `f` runs it: the stack's compute efficiency carried from the
    /// framework it was measured with to `f` by their [`Framework::compute_efficiency`] ratio.
    /// Unchanged when the stack names no framework (a trainer calibration) or names `f`.
    pub fn for_framework(&self, f: Framework) -> ClusterSpec {
        let mut c = self.clone();
        if let Some(g) = c.stack.framework {
            if g != f {
                c.stack.compute_efficiency *= f.compute_efficiency() / g.compute_efficiency();
                c.stack.framework = Some(f);
            }
        }
        c
    }

    /// This cluster as exatrain's own trainer runs on it: no framework (its TP collectives and
    /// context-parallel all-gathers block, fp32 gradients, one loss chunk), whatever framework
    /// the stack names; the stack's efficiency and switches as they are.
    pub fn for_trainer(&self) -> ClusterSpec {
        let mut c = self.clone();
        c.stack.framework = None;
        c
    }

    /// [`ClusterSpec::for_framework`] when a framework is named, else this cluster as it is.
    pub fn for_framework_opt(&self, f: Option<Framework>) -> ClusterSpec {
        f.map_or_else(|| self.clone(), |f| self.for_framework(f))
    }

    /// Check every field; the cost model assumes a validated spec.
    pub fn validate(&self) -> Result<(), SpecError> {
        let d = &self.device;
        rate(d.peak_tflops_bf16, 1e12, "device.peak_tflops_bf16")?;
        rate(d.peak_tflops_fp32, 1e12, "device.peak_tflops_fp32")?;
        if let Some(p) = d.peak_tflops_fp8 {
            rate(p, 1e12, "device.peak_tflops_fp8")?;
        }
        if let Some(g) = d.gemm_fp8 {
            fraction(g.max_efficiency, "device.gemm_fp8.max_efficiency")?;
            nonneg(g.half_size, "device.gemm_fp8.half_size")?;
        }
        rate(d.hbm_gib, (1u64 << 30) as f64, "device.hbm_gib")?;
        rate(d.hbm_gbps, 1e9, "device.hbm_gbps")?;
        fraction(d.memory_efficiency, "device.memory_efficiency")?;
        fraction(d.gemm.max_efficiency, "device.gemm.max_efficiency")?;
        nonneg(d.gemm.half_size, "device.gemm.half_size")?;
        if d.gemm_table.len() > GEMM_TABLE_MAX {
            return Err(SpecError::new(format!(
                "cluster: `device.gemm_table` holds {} entries (at most {GEMM_TABLE_MAX})",
                d.gemm_table.len()
            )));
        }
        for (i, t) in d.gemm_table.iter().enumerate() {
            for (v, f) in [(t.m, "m"), (t.n, "n"), (t.k, "k")] {
                if !(v.is_finite() && v >= 1.0) {
                    return Err(SpecError::new(format!(
                        "cluster: `device.gemm_table[{i}].{f}` must be a size ≥ 1, got {v}"
                    )));
                }
            }
            fraction(t.efficiency, &format!("device.gemm_table[{i}].efficiency"))?;
        }
        let n = &self.node;
        if n.devices == 0 {
            return Err(SpecError::new("cluster: `node.devices` must be a positive integer"));
        }
        if n.nics == 0 {
            return Err(SpecError::new("cluster: `node.nics` must be a positive integer"));
        }
        rate(n.nic_gbps, 1e9, "node.nic_gbps")?;
        if n.links.is_empty() && n.devices > 1 {
            return Err(SpecError::new("cluster: `node.links` needs at least one link class"));
        }
        let mut last = 0;
        for (i, l) in n.links.iter().enumerate() {
            rate(l.gbps, 1e9, &format!("node.links[{i}].gbps"))?;
            if l.span <= last || !n.devices.is_multiple_of(l.span) {
                return Err(SpecError::new(format!(
                    "cluster: `node.links[{i}].span` {} must grow from class to class and divide node.devices {}",
                    l.span, n.devices
                )));
            }
            last = l.span;
        }
        if n.devices > 1 && last != n.devices {
            return Err(SpecError::new(format!(
                "cluster: the last `node.links` class must span the whole node ({} devices), got {last}",
                n.devices
            )));
        }
        let w = &self.network;
        nonneg(w.intra_latency_us, "network.intra_latency_us")?;
        nonneg(w.inter_latency_us, "network.inter_latency_us")?;
        fraction(w.efficiency, "network.efficiency")?;
        let x = self.stack.compute_efficiency;
        if !(x.is_finite() && x > 0.0 && x <= 10.0) {
            return Err(SpecError::new(format!(
                "cluster: `stack.compute_efficiency` must be in (0, 10], got {x}"
            )));
        }
        if !(self.reserved_gib >= 0.0 && self.reserved_gib < d.hbm_gib) {
            return Err(SpecError::new(format!(
                "cluster: `reserved_gib` must be ≥ 0 and less than `device.hbm_gib` ({}), got {}",
                d.hbm_gib, self.reserved_gib
            )));
        }
        if !(0.0..1.0).contains(&self.fragmentation) {
            return Err(SpecError::new("cluster: `fragmentation` must be in [0, 1)"));
        }
        let s = &self.system;
        for (v, unit, f) in [
            (s.node_mtbf_hours, 3600.0, "system.node_mtbf_hours"),
            (s.checkpoint_write_gbps, 1e9, "system.checkpoint_write_gbps"),
            (s.node_power_kw, 1e3, "system.node_power_kw"),
        ] {
            if let Some(v) = v {
                rate(v, unit, f)?;
            }
        }
        if let Some(r) = s.restart_s {
            nonneg(r, "system.restart_s")?;
        }
        Ok(())
    }

    /// Bandwidth (GB/s per direction per device) for a group whose members lie inside an aligned
    /// block of `span` devices of one node: the smallest link class that contains the block.
    pub fn intra_gbps(&self, span: u32) -> f64 {
        for l in &self.node.links {
            if span <= l.span {
                return l.gbps;
            }
        }
        self.node.links.last().map_or(f64::INFINITY, |l| l.gbps)
    }

    /// Total NIC bandwidth of one node, GB/s per direction.
    pub fn node_nic_gbps(&self) -> f64 {
        self.node.nics as f64 * self.node.nic_gbps
    }

    /// HBM capacity in bytes.
    pub fn capacity_bytes(&self) -> f64 {
        self.device.hbm_gib * (1u64 << 30) as f64
    }
}
