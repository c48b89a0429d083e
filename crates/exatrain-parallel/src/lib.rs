//! The parallel machinery the trainer is built on, one module per concern:
//!
//! - [`comm`]: the [`Communicator`](comm::Communicator) trait for the collectives the trainer needs
//!   and an in-process implementation (threads as ranks) with sub-groups split from the rank grid;
//!   with the `mpi` feature, [`mpi_comm::Mpi`] implements it over MPI (rsmpi);
//! - [`schedule`]: pipeline schedules as data — per rank, a list of (microbatch, chunk,
//!   forward | backward) steps for GPipe, 1F1B and interleaved 1F1B — and a simulator that runs
//!   them against their send/recv dependencies (deadlock-free, in-flight counts, bubble).

pub mod comm;
#[cfg(feature = "mpi")]
pub mod mpi_comm;
pub mod schedule;
