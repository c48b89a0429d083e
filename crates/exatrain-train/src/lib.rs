//! A real GPT trainer on one process, in the style of llm.c: every op is a pair
//! `<op>_forward` / `<op>_backward` over flat slices ([`kernels`]); parameters, gradients and
//! activations live in flat buffers addressed through offset tables ([`model`]); the optimizer is
//! a loop over a flat range ([`optim`]). Kernels are generic over [`Real`] (f32 for training,
//! f64 for the finite-difference checks), hold no global state, and parallelize over rows with
//! rayon; matrix products go through `matrixmultiply`'s sgemm/dgemm with explicit strides.
//!
//! The model reads the planner's [`ModelSpec`](exatrain_spec::ModelSpec), so the planner's memory
//! categories (weights, grads, optimizer, activations) can be compared with the bytes held here.

pub mod backend;
pub mod calibrate;
pub mod checkpoint;
pub mod data;
pub mod flash;
pub mod guard;
pub mod hf;
pub mod kernels;
pub mod model;
pub mod optim;
pub mod parallel;
mod real;
pub mod train;

pub use backend::{Backend, Cpu};
pub use model::{Gpt, GptShape, Model};
pub use real::Real;
