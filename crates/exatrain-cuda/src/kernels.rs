//! The CUDA C kernel modules and the source NVRTC compiles for each. Every module starts with
//! `common.cuh` (inlined here, so NVRTC needs no include path), then its kernels; the precision
//! mode is a macro (`EXA_BF16`) that sets the storage type `floatX` of activations.

/// One compilation unit of kernels, mirroring one CPU kernel pair (or a few small ones).
#[derive(Debug, Clone, Copy)]
pub struct Module {
    pub name: &'static str,
    /// The CUDA C source without the common header.
    pub body: &'static str,
    /// The `extern "C"` kernels it defines, checked against the compiled code.
    pub kernels: &'static [&'static str],
}

/// The shared header: warp size, warp/block reductions, bf16 by bit operations, `floatX`.
pub const COMMON: &str = include_str!("../kernels/common.cuh");

pub const MODULES: &[Module] = &[
    Module {
        name: "encoder",
        body: include_str!("../kernels/encoder.cu"),
        kernels: &["encoder_forward", "encoder_backward_wte", "encoder_backward_wpe"],
    },
    Module {
        name: "layernorm",
        body: include_str!("../kernels/layernorm.cu"),
        kernels: &["layernorm_forward", "layernorm_backward", "layernorm_backward_params"],
    },
    Module {
        name: "pointwise",
        body: include_str!("../kernels/pointwise.cu"),
        kernels: &[
            "gelu_forward",
            "gelu_backward",
            "residual_forward",
            "residual_backward",
            "to_floatx",
            "to_f32",
            "scale_f32",
        ],
    },
    Module {
        name: "attention",
        body: include_str!("../kernels/attention.cu"),
        kernels: &["softmax_causal_forward", "softmax_causal_backward"],
    },
    Module {
        name: "crossentropy",
        body: include_str!("../kernels/crossentropy.cu"),
        kernels: &[
            "crossentropy_max",
            "crossentropy_exp",
            "crossentropy_normalize",
            "crossentropy_backward",
            "mean_loss",
        ],
    },
    Module {
        name: "optimizer",
        body: include_str!("../kernels/optimizer.cu"),
        kernels: &["adamw_update", "norm_squared_partial", "norm_squared_finish"],
    },
];

/// The storage type of activations and of the GEMM copy of the weights. Master weights, weight
/// gradients, optimizer state, norm statistics and the loss are fp32 in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Everything fp32 (the mode the kernels are checked in against the CPU at 1e-5).
    Fp32,
    /// bf16 activations and GEMM inputs, fp32 accumulation (checked at 1e-2).
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        }
    }
    /// Bytes of one activation element.
    pub fn bytes(self) -> usize {
        match self {
            Precision::Fp32 => 4,
            Precision::Bf16 => 2,
        }
    }
}

/// The module by name.
pub fn module(name: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.name == name)
}

/// The full source NVRTC compiles for `m` in precision `p`.
pub fn source(m: &Module, p: Precision) -> String {
    let mode = match p {
        Precision::Fp32 => "",
        Precision::Bf16 => "#define EXA_BF16 1\n",
    };
    format!(
        "// exatrain kernel module `{}` ({})\n{mode}{COMMON}\n{}",
        m.name,
        p.name(),
        m.body
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_its_module_and_no_other_is() {
        for m in MODULES {
            let defined: Vec<&str> = m
                .body
                .split("__global__ void ")
                .skip(1)
                .map(|rest| rest.split('(').next().unwrap_or("").trim())
                .collect();
            let mut listed = m.kernels.to_vec();
            listed.sort();
            let mut got = defined.clone();
            got.sort();
            assert_eq!(got, listed, "module {}", m.name);
            assert!(
                m.body.matches("extern \"C\" __global__").count() == defined.len(),
                "module {}: every kernel is extern \"C\" (unmangled names)",
                m.name
            );
        }
    }

    #[test]
    fn kernels_stay_portable_to_hip() {
        for m in MODULES {
            let src = source(m, Precision::Bf16);
            for banned in ["asm(", "asm volatile", "#include", "atomicAdd", "__nv_bfloat16"] {
                assert!(!src.contains(banned), "module {} uses {banned}", m.name);
            }
            // the warp size is EXA_WARP everywhere, never a literal 32 in a kernel body
            let code: String = m.body.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
            let literal_32 = code
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '.')
                .any(|tok| tok == "32");
            assert!(!literal_32, "module {}: a literal 32 (use EXA_WARP)", m.name);
        }
    }

    #[test]
    fn the_precision_mode_is_one_macro() {
        let m = module("pointwise").expect("listed");
        assert!(source(m, Precision::Bf16).contains("#define EXA_BF16"));
        assert!(!source(m, Precision::Fp32).contains("#define EXA_BF16"));
        assert!(module("nope").is_none());
    }
}
