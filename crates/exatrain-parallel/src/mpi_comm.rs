//! The MPI communicator (rsmpi): one rank per process, launched with `mpirun -n N` or `srun`.
//! Sub-communicators come from `MPI_Comm_split`; `abort` is `MPI_Abort`, which ends the whole
//! job, so a failing rank never leaves the others hanging. A watchdog thread ends the process
//! (and so the job: mpirun stops the others) when one blocking call — MPI_Init, a collective, a
//! receive, a wait — has waited longer than the job's timeout: a rank that stops participating
//! gives an error naming the call, never a hang.

use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mpi::collective::SystemOperation;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use crate::comm::{CommError, Finish, Started};

/// When the blocking call in progress started (ms since the epoch; 0: none), which one, and
/// this process's rank (-1 before MPI_Init).
static ENTERED_MS: AtomicU64 = AtomicU64::new(0);
static WHAT: Mutex<&str> = Mutex::new("");
static RANK: AtomicI64 = AtomicI64::new(-1);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
}

/// A blocking MPI call watched by the watchdog while it lasts.
struct Watch;

impl Watch {
    fn enter(what: &'static str) -> Watch {
        *WHAT.lock().unwrap_or_else(|e| e.into_inner()) = what;
        ENTERED_MS.store(now_ms(), Ordering::SeqCst);
        Watch
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        ENTERED_MS.store(0, Ordering::SeqCst);
    }
}

/// Start the watchdog: a blocking call that lasts longer than `timeout` ends the process.
fn start_watchdog(timeout: Duration) {
    let tick = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    std::thread::spawn(move || loop {
        std::thread::sleep(tick);
        let t = ENTERED_MS.load(Ordering::SeqCst);
        if t != 0 && now_ms().saturating_sub(t) > timeout.as_millis() as u64 {
            let what = *WHAT.lock().unwrap_or_else(|e| e.into_inner());
            let rank = RANK.load(Ordering::SeqCst);
            let who = if rank >= 0 {
                format!("rank {rank}")
            } else {
                "a rank".into()
            };
            eprintln!(
                "error: {who}: {what} waited more than {:.0} s (--comm-timeout) for the other ranks: one of them stopped participating (crashed, hung or was started with a different command); ending the job",
                timeout.as_secs_f64()
            );
            // SAFETY: _exit ends the process at once without running exit handlers, which
            // could block on the MPI call the main thread is stuck in.
            unsafe { libc::_exit(3) };
        }
    });
}

/// A non-blocking collective (MPI_Iallreduce, MPI_Ireduce_scatter_block) in flight, with the
/// leaked buffers it reads and writes until it completes; its result once a poke saw it done.
struct MpiStarted {
    request: Option<Request<'static, [f32], StaticScope>>,
    send: *mut [f32],
    recv: *mut [f32],
    result: Option<Vec<f32>>,
}

impl MpiStarted {
    /// Free the send buffer and take the result. SAFETY: only once the request is complete
    /// (MPI no longer touches the two buffers, which were leaked from Boxes in `start`), and
    /// only once (the request was taken).
    unsafe fn reclaim(&mut self) -> Vec<f32> {
        unsafe {
            drop(Box::from_raw(self.send));
            Box::from_raw(self.recv).into_vec()
        }
    }

    fn complete(&mut self) -> Option<Vec<f32>> {
        let Some(request) = self.request.take() else {
            return self.result.take();
        };
        let _w = Watch::enter("waiting for a non-blocking collective");
        request.wait();
        // SAFETY: the request is complete and was taken.
        Some(unsafe { self.reclaim() })
    }
}

impl Finish for MpiStarted {
    fn finish(mut self: Box<Self>) -> Result<Vec<f32>, CommError> {
        Ok(self.complete().expect("completed once"))
    }

    fn poke(&mut self) {
        if let Some(request) = self.request.take() {
            match request.test() {
                // SAFETY: the request is complete and was taken.
                Ok(_) => self.result = Some(unsafe { self.reclaim() }),
                Err(request) => self.request = Some(request),
            }
        }
    }
}

impl Drop for MpiStarted {
    fn drop(&mut self) {
        // never free buffers MPI may still use: complete first (an unwaited request on an
        // error path)
        self.complete();
    }
}

/// A send in flight: its request and the copy of the data it reads (freed when it completes).
struct Pending {
    request: Request<'static, [f32], StaticScope>,
    data: *mut [f32],
}

/// One MPI rank of a communicator. Sends are non-blocking (`MPI_Isend` of a copy), so a
/// pipeline schedule never deadlocks on two neighbours sending to each other at once, as it
/// would with blocking sends above the eager limit; they are completed as later calls pass.
pub struct Mpi {
    comm: SimpleCommunicator,
    pending: RefCell<Vec<Pending>>,
}

impl Mpi {
    fn new(comm: SimpleCommunicator) -> Mpi {
        Mpi {
            comm,
            pending: RefCell::new(Vec::new()),
        }
    }

    /// Free the sends that have completed.
    fn reap(&self) {
        let mut pending = self.pending.borrow_mut();
        let mut still = Vec::with_capacity(pending.len());
        for p in pending.drain(..) {
            match p.request.test() {
                // SAFETY: the request is complete, so MPI no longer reads the buffer that was
                // leaked from a Box in `send`.
                Ok(_) => drop(unsafe { Box::from_raw(p.data) }),
                Err(request) => still.push(Pending { request, ..p }),
            }
        }
        *pending = still;
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        for p in self.pending.get_mut().drain(..) {
            let _w = Watch::enter("completing a send");
            p.request.wait();
            // SAFETY: as in `reap`, the send is complete.
            drop(unsafe { Box::from_raw(p.data) });
        }
    }
}

impl Mpi {
    /// Start a non-blocking collective reading `send` and writing a fresh buffer of `out` floats.
    fn start(
        &self,
        send: Vec<f32>,
        out: usize,
        f: impl FnOnce(&SimpleCommunicator, &'static [f32], &'static mut [f32]) -> Request<'static, [f32], StaticScope>,
    ) -> Result<Started, CommError> {
        self.reap();
        let send: *mut [f32] = Box::leak(send.into_boxed_slice());
        let recv: *mut [f32] = Box::leak(vec![0.0f32; out].into_boxed_slice());
        // SAFETY: both point to leaked buffers that `MpiStarted` frees after the request completes.
        let request = f(&self.comm, unsafe { &*send }, unsafe { &mut *recv });
        Ok(Started::with(Box::new(MpiStarted {
            request: Some(request),
            send,
            recv,
            result: None,
        })))
    }

    /// The world communicator, every blocking call watched with `timeout` (MPI_Init too).
    /// Keep the returned `Universe` alive for the whole run.
    pub fn world(timeout: Duration) -> Result<(mpi::environment::Universe, Mpi), CommError> {
        start_watchdog(timeout);
        let universe = {
            let _w = Watch::enter("MPI_Init");
            mpi::initialize().ok_or_else(|| CommError("MPI is already initialized or not available".into()))?
        };
        let comm = universe.world();
        RANK.store(comm.rank() as i64, Ordering::SeqCst);
        Ok((universe, Mpi::new(comm)))
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
        let _w = Watch::enter("all_reduce");
        let send = buf.to_vec();
        self.comm.all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, mine: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let _w = Watch::enter("all_gather");
        self.comm.all_gather_into(mine, out);
        Ok(())
    }

    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        let _w = Watch::enter("reduce_scatter");
        self.comm.reduce_scatter_block_into(full, mine, SystemOperation::sum());
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let _w = Watch::enter("broadcast");
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn send(&self, to: usize, tag: u32, buf: &[f32]) -> Result<(), CommError> {
        self.reap();
        let data: &'static mut [f32] = Box::leak(buf.to_vec().into_boxed_slice());
        let ptr: *mut [f32] = data;
        // SAFETY: `ptr` points to the leaked copy, alive until the request completes.
        let data: &'static [f32] = unsafe { &*ptr };
        let request = self
            .comm
            .process_at_rank(to as i32)
            .immediate_send_with_tag(StaticScope, data, tag as i32);
        self.pending.borrow_mut().push(Pending { request, data: ptr });
        Ok(())
    }

    fn recv(&self, from: usize, tag: u32, buf: &mut [f32]) -> Result<(), CommError> {
        self.reap();
        let _w = Watch::enter("a pipeline receive");
        self.comm
            .process_at_rank(from as i32)
            .receive_into_with_tag(buf, tag as i32);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        let _w = Watch::enter("barrier");
        self.comm.barrier();
        Ok(())
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn crate::comm::Communicator>, CommError> {
        let _w = Watch::enter("MPI_Comm_split");
        let comm = self
            .comm
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .ok_or_else(|| {
                CommError(format!(
                    "rank {}: MPI_Comm_split gave no communicator",
                    self.comm.rank()
                ))
            })?;
        Ok(Box::new(Mpi::new(comm)))
    }

    fn start_all_reduce(&self, buf: Vec<f32>) -> Result<Started, CommError> {
        let n = buf.len();
        self.start(buf, n, |c, send, recv| {
            c.immediate_all_reduce_into(StaticScope, send, recv, SystemOperation::sum())
        })
    }

    fn start_reduce_scatter(&self, full: Vec<f32>) -> Result<Started, CommError> {
        let n = full.len() / self.size();
        self.start(full, n, |c, send, recv| {
            c.immediate_reduce_scatter_block_into(StaticScope, send, recv, SystemOperation::sum())
        })
    }

    fn abort(&self, why: &str) {
        eprintln!("error: rank {}: {why}; aborting the MPI job", self.comm.rank());
        self.comm.abort(2);
    }
}
