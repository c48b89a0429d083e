//! The analytical cost model of exatrain: for a model, a cluster and a parallel layout, the FLOPs,
//! the memory each device holds (by category) and the time of one optimizer step (by term).
//!
//! Pure functions over the shared spec types, no IO, no allocation on the hot path, so the tuner
//! can evaluate millions of layouts per second. It is composed of small pieces:
//!
//! - [`flops`]: model FLOPs (MFU) and hardware FLOPs incl. recomputation (HFU), and Megatron's
//!   closed form for comparison;
//! - [`memory`]: weights, gradients, optimizer state (ZeRO 0-3), activations (Korthikanti et al.
//!   2022, generalised to GQA, SwiGLU and flash attention) times the microbatches in flight;
//! - [`compute`]: per-GEMM roofline with the device's efficiency curve, memory-bound element-wise
//!   ops, per block and per pipeline stage;
//! - [`comm`]: where a process group lies on the machine (which link it crosses, how many ranks
//!   share a node's NICs) and ring/tree collective costs;
//! - [`plan()`]: the composition into one [`Plan`];
//! - [`fit`]: the spec's efficiency factors fitted to measured runs (least squares on the
//!   measured time terms).

pub mod comm;
pub mod compute;
pub mod fit;
pub mod flops;
pub mod memory;
mod plan;

pub use plan::{plan, trainer_buckets, Memory, Plan, Times};
