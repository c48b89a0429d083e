//! Typed specs that every part of exatrain reads: what model ([`ModelSpec`]), on what machine
//! ([`ClusterSpec`]), split how ([`ParallelConfig`]).
//!
//! The planner's cost model, the tuner and the trainer all take these same types, so a layout the
//! tuner picks runs unchanged on the trainer and its measurement can be compared with the
//! prediction term by term.
//!
//! Everything here is pure data plus validation; the only IO is [`load`], which reads a preset name
//! or a TOML/JSON file and turns every problem into a [`SpecError`] that names the field.

mod cluster;
mod error;
pub mod framework;
pub mod load;
mod model;
mod parallel;
pub mod presets;

pub use cluster::{
    ClusterSpec, DeviceSpec, GemmCorrection, GemmEfficiency, GemmMeasure, LaunchSpec, LinkClass, NetworkSpec, NodeSpec,
    StackSpec, StackSwitches, SystemSpec, GEMM_TABLE_MAX,
};
pub use error::{Invalid, SpecError};
pub use framework::{DpReduction, Framework, GradBuckets, SelectiveRecompute};
pub use model::{Mlp, ModelFile, ModelSpec, Norm, Position};
pub use parallel::{Dim, Dtype, ParallelConfig, RankOrder, Recompute, StageLayers};
