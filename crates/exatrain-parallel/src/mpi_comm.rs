//! The MPI communicator (rsmpi): one rank per process, launched with `mpirun -n N` or `srun`.
//! Sub-communicators come from `MPI_Comm_split`; `abort` is `MPI_Abort`, which ends the whole
//! job, so a failing rank never leaves the others hanging.

use mpi::collective::SystemOperation;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use crate::comm::CommError;

/// One MPI rank of a communicator.
pub struct Mpi {
    comm: SimpleCommunicator,
}

impl Mpi {
    /// The world communicator. Keep the returned `Universe` alive for the whole run.
    pub fn world() -> Result<(mpi::environment::Universe, Mpi), CommError> {
        let universe =
            mpi::initialize().ok_or_else(|| CommError("MPI is already initialized or not available".into()))?;
        let comm = universe.world();
        Ok((universe, Mpi { comm }))
    }
}

impl crate::comm::Communicator for Mpi {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let send = buf.to_vec();
        self.comm.all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, mine: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        self.comm.all_gather_into(mine, out);
        Ok(())
    }

    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        self.comm.reduce_scatter_block_into(full, mine, SystemOperation::sum());
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn send(&self, to: usize, buf: &[f32]) -> Result<(), CommError> {
        self.comm.process_at_rank(to as i32).send(buf);
        Ok(())
    }

    fn recv(&self, from: usize, buf: &mut [f32]) -> Result<(), CommError> {
        self.comm.process_at_rank(from as i32).receive_into(buf);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.comm.barrier();
        Ok(())
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn crate::comm::Communicator>, CommError> {
        let comm = self
            .comm
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .ok_or_else(|| {
                CommError(format!(
                    "rank {}: MPI_Comm_split gave no communicator",
                    self.comm.rank()
                ))
            })?;
        Ok(Box::new(Mpi { comm }))
    }

    fn abort(&self, why: &str) {
        eprintln!("error: rank {}: {why}; aborting the MPI job", self.comm.rank());
        self.comm.abort(2);
    }
}
