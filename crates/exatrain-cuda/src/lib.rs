//! exatrain's CUDA side, in the style of llm.c: the kernels are CUDA C in `kernels/` (one module
//! per CPU kernel pair of `exatrain-train`, same op names and argument order, backward ops
//! accumulating), compiled at start by NVRTC for the device's architecture; GEMMs go through
//! cuBLASLt. Everything is loaded dynamically through cudarc, so the crate builds on a machine
//! without CUDA; without the `cuda` feature it holds the kernel sources only.
//!
//! - [`kernels`]: the module table, the precision modes and the source NVRTC compiles (pure).
//! - [`ptxas`]: the register / spill report of a compile log (pure).
//! - `nvrtc` (feature `cuda`): compile a module for an architecture, with ptxas's report.
//! - `device` (feature `cuda`): open a device with clear errors when there is no driver or no
//!   device, refuse a layout that does not fit before allocating, cache compiled modules.
//! - `gemm` (feature `cuda`): cuBLASLt GEMMs with cached descriptors, bf16 or fp32 inputs, fp32
//!   compute, `beta` (accumulation into fp32 gradients) through cudarc's lower layer.
//! - `ops` (feature `cuda`): each kernel as a Rust call with the CPU kernel's name and
//!   argument order, over device addresses.
//! - `bench` (feature `cuda`): GEMM and memory-bandwidth measurements for `calibrate`.

pub mod kernels;
pub mod ptxas;

/// The cudarc this crate is built against (so the trainer's CUDA backend uses the same one).
#[cfg(feature = "cuda")]
pub use cudarc;

#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod gemm;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;

use std::fmt;

/// Why the GPU path cannot go on: one line naming what is missing or what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuError(pub String);

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GpuError {}

impl GpuError {
    pub fn new(what: impl Into<String>) -> Self {
        GpuError(what.into())
    }
}

/// Whether this build can use a GPU at all (the `cuda` feature).
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// The error a build without the `cuda` feature gives for anything on a GPU.
pub fn not_built() -> GpuError {
    GpuError::new(
        "this exatrain was built without CUDA: rebuild with `cargo install --path crates/exatrain-cli --features cuda` \
         (nothing CUDA is needed to build; the driver and libraries are loaded at run time)",
    )
}
