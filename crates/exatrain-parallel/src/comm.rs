//! Communicators: the collectives the trainer needs behind one trait, and in-process ranks
//! (threads) that implement it for tests and single-machine runs; the MPI implementation
//! (`mpi_comm`, feature `mpi`) implements the same trait.
//!
//! Every collective is deterministic: contributions are combined in rank order, so each rank
//! gets bit-identical results, run after run. A rank that fails calls [`Communicator::abort`],
//! and a rank that never arrives is noticed after the group's timeout: the others return an
//! error naming what they waited for, never hang.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why a collective did not complete.
#[derive(Debug, Clone, PartialEq)]
pub struct CommError(pub String);

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommError {}

/// The collectives of data, tensor and pipeline parallelism over f32 buffers.
pub trait Communicator {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank ends with the elementwise sum of all ranks' `buf`.
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError>;
    /// `out` (size × mine.len()) ends as every rank's `mine`, in rank order.
    fn all_gather(&self, mine: &[f32], out: &mut [f32]) -> Result<(), CommError>;
    /// `mine` ends as the sum over ranks of chunk `rank` of `full` (size equal chunks).
    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError>;
    /// Every rank's `buf` ends as `root`'s.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Send `buf` to rank `to` without waiting for the receiver (the buffer is copied); messages
    /// between a pair of ranks with the same `tag` arrive in the order sent.
    fn send(&self, to: usize, tag: u32, buf: &[f32]) -> Result<(), CommError>;
    /// Receive the next message from `from` with `tag` into `buf` (its length must match).
    fn recv(&self, from: usize, tag: u32, buf: &mut [f32]) -> Result<(), CommError>;
    fn barrier(&self) -> Result<(), CommError>;
    /// Ranks with the same `color` form a new group, ordered by `key` (MPI_Comm_split).
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError>;
    /// Fail every pending and future collective of the group with `why`.
    fn abort(&self, why: &str);

    /// Start an all-reduce of `buf` and return at once; [`Started::wait`] gives the sum.
    /// Collectives started on a group complete in the order they were started, on every rank;
    /// do not call the group's blocking collectives while started ones are pending.
    /// The default runs it now (correct, with nothing to overlap).
    fn start_all_reduce(&self, mut buf: Vec<f32>) -> Result<Started, CommError> {
        self.all_reduce(&mut buf)?;
        Ok(Started::done(buf))
    }

    /// Start a reduce-scatter of `full` (size equal chunks); [`Started::wait`] gives this
    /// rank's summed chunk. Ordering as for [`Communicator::start_all_reduce`].
    fn start_reduce_scatter(&self, full: Vec<f32>) -> Result<Started, CommError> {
        let mut mine = vec![0.0f32; full.len() / self.size().max(1)];
        self.reduce_scatter(&full, &mut mine)?;
        Ok(Started::done(mine))
    }
}

/// Completes a collective that an implementation started (e.g. an MPI request).
pub trait Finish {
    fn finish(self: Box<Self>) -> Result<Vec<f32>, CommError>;
    /// Let the collective progress without waiting for it (MPI_Test): a library that moves
    /// data only inside its calls (Open MPI's shared memory and rendezvous protocols) advances
    /// a started collective only when the rank calls into it. The default does nothing.
    fn poke(&mut self) {}
}

/// A collective in flight; `wait` blocks until it is done and gives its result.
#[must_use = "a started collective must be waited on"]
pub struct Started(Inner);

enum Inner {
    Done(Vec<f32>),
    Reply(Receiver<Result<Vec<f32>, CommError>>),
    Other(Box<dyn Finish>),
}

impl Started {
    /// One that already completed.
    pub fn done(result: Vec<f32>) -> Started {
        Started(Inner::Done(result))
    }

    /// One that `f` completes.
    pub fn with(f: Box<dyn Finish>) -> Started {
        Started(Inner::Other(f))
    }

    /// Let it progress while the caller computes (see [`Finish::poke`]); never blocks.
    pub fn poke(&mut self) {
        if let Inner::Other(f) = &mut self.0 {
            f.poke();
        }
    }

    pub fn wait(self) -> Result<Vec<f32>, CommError> {
        match self.0 {
            Inner::Done(v) => Ok(v),
            Inner::Reply(rx) => rx
                .recv()
                .unwrap_or_else(|_| Err(CommError("a started collective's worker thread died".into()))),
            Inner::Other(f) => f.finish(),
        }
    }
}

/// A collective for an in-process rank's worker thread, and where its result goes.
enum Job {
    AllReduce(Vec<f32>),
    ReduceScatter(Vec<f32>),
}
type Work = (Job, Sender<Result<Vec<f32>, CommError>>);

type Contributions = Arc<Vec<Vec<f32>>>;

#[derive(Default)]
struct State {
    deposits: Vec<Option<Vec<f32>>>,
    count: usize,
    round: u64,
    result: Option<Contributions>,
    readers: usize,
    failed: Option<String>,
    splits: HashMap<(u64, usize), Arc<Hub>>,
}

type Message = (u32, Vec<f32>);

/// The receiving end of one (from → to) channel, with the messages that arrived ahead of a
/// receive for another tag.
struct Mailbox {
    rx: Receiver<Message>,
    early: Vec<Message>,
}

/// The shared meeting point of one group of in-process ranks.
struct Hub {
    n: usize,
    /// the group this one was split from: an abort anywhere fails the whole job
    parent: Option<Arc<Hub>>,
    state: Mutex<State>,
    cv: Condvar,
    timeout: Duration,
    /// mailboxes[to][from]
    senders: Vec<Vec<Mutex<Sender<Message>>>>,
    receivers: Vec<Vec<Mutex<Mailbox>>>,
}

impl Hub {
    fn new(n: usize, timeout: Duration, parent: Option<Arc<Hub>>) -> Arc<Hub> {
        let mut senders: Vec<Vec<Mutex<Sender<Message>>>> = (0..n).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Mutex<Mailbox>>> = (0..n).map(|_| Vec::new()).collect();
        for to in 0..n {
            for _from in 0..n {
                let (s, rx) = channel();
                senders[to].push(Mutex::new(s));
                receivers[to].push(Mutex::new(Mailbox { rx, early: Vec::new() }));
            }
        }
        let state = State {
            deposits: vec![None; n],
            ..Default::default()
        };
        Arc::new(Hub {
            n,
            parent,
            state: Mutex::new(state),
            cv: Condvar::new(),
            timeout,
            senders,
            receivers,
        })
    }
}

impl Hub {
    /// Why an enclosing group failed, if one did.
    fn ancestor_failure(&self) -> Option<String> {
        let mut h = self.parent.clone();
        while let Some(p) = h {
            if let Some(f) = &p.state.lock().expect("comm lock").failed {
                return Some(f.clone());
            }
            h = p.parent.clone();
        }
        None
    }

    /// The outermost group (the world).
    fn root(self: &Arc<Hub>) -> Arc<Hub> {
        let mut h = self.clone();
        while let Some(p) = h.parent.clone() {
            h = p;
        }
        h
    }
}

/// One in-process rank of a group.
pub struct InProcess {
    rank: usize,
    hub: Arc<Hub>,
    /// the thread that runs this rank's started collectives, made on the first one
    worker: std::cell::OnceCell<Sender<Work>>,
}

/// A group of `n` in-process ranks, one per thread; collectives give up after `timeout`.
pub fn in_process(n: usize, timeout: Duration) -> Vec<InProcess> {
    let hub = Hub::new(n, timeout, None);
    (0..n).map(|rank| InProcess::new(rank, hub.clone())).collect()
}

impl InProcess {
    fn new(rank: usize, hub: Arc<Hub>) -> InProcess {
        InProcess {
            rank,
            hub,
            worker: std::cell::OnceCell::new(),
        }
    }

    /// Hand `job` to this rank's worker thread: it runs the collectives in the order given,
    /// on the same group, while this thread goes on.
    fn start(&self, job: Job) -> Result<Started, CommError> {
        let worker = self.worker.get_or_init(|| {
            let (tx, rx) = channel::<Work>();
            let me = InProcess::new(self.rank, self.hub.clone());
            std::thread::spawn(move || {
                for (job, reply) in rx {
                    let r = match job {
                        Job::AllReduce(mut buf) => me.all_reduce(&mut buf).map(|_| buf),
                        Job::ReduceScatter(full) => {
                            let mut mine = vec![0.0f32; full.len() / me.hub.n];
                            me.reduce_scatter(&full, &mut mine).map(|_| mine)
                        }
                    };
                    let _ = reply.send(r);
                }
            });
            tx
        });
        let (tx, rx) = channel();
        worker
            .send((job, tx))
            .map_err(|_| CommError(format!("rank {}: the collective worker thread is gone", self.rank)))?;
        Ok(Started(Inner::Reply(rx)))
    }

    fn wait<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, State>,
        deadline: Instant,
        what: &str,
        done: impl Fn(&State) -> bool,
    ) -> Result<std::sync::MutexGuard<'a, State>, CommError> {
        loop {
            if let Some(f) = st.failed.clone().or_else(|| self.hub.ancestor_failure()) {
                return Err(CommError(format!(
                    "rank {}: {what}: the group was aborted: {f}",
                    self.rank
                )));
            }
            if done(&st) {
                return Ok(st);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.hub.n).filter(|r| st.deposits[*r].is_none()).collect();
                let msg = format!(
                    "rank {}: {what} timed out after {:.0} s waiting for ranks {missing:?}",
                    self.rank,
                    self.hub.timeout.as_secs_f64()
                );
                st.failed = Some(msg.clone());
                self.hub.cv.notify_all();
                return Err(CommError(msg));
            }
            // wake now and then to notice an abort in an enclosing group
            let tick = (deadline - now).min(Duration::from_millis(50));
            st = self.hub.cv.wait_timeout(st, tick).expect("comm lock").0;
        }
    }

    /// Every rank contributes a buffer and gets all contributions, in rank order.
    fn exchange(&self, data: Vec<f32>, what: &str) -> Result<Contributions, CommError> {
        self.exchange_round(data, what).map(|r| r.0)
    }

    /// [`Self::exchange`], also returning the round number (the same on every rank).
    fn exchange_round(&self, data: Vec<f32>, what: &str) -> Result<(Contributions, u64), CommError> {
        let deadline = Instant::now() + self.hub.timeout;
        let st = self.hub.state.lock().expect("comm lock");
        // the previous round's result must be consumed by everyone first
        let mut st = self.wait(st, deadline, what, |s| s.result.is_none())?;
        let my_round = st.round;
        st.deposits[self.rank] = Some(data);
        st.count += 1;
        if st.count == self.hub.n {
            let all: Vec<Vec<f32>> = st.deposits.iter_mut().map(|d| d.take().expect("deposited")).collect();
            st.result = Some(Arc::new(all));
            st.count = 0;
            st.readers = self.hub.n;
            st.round += 1;
            self.hub.cv.notify_all();
        }
        let mut st = self.wait(st, deadline, what, |s| s.round > my_round)?;
        let res = st.result.clone().expect("result of this round");
        st.readers -= 1;
        if st.readers == 0 {
            st.result = None;
            self.hub.cv.notify_all();
        }
        Ok((res, my_round))
    }
}

impl Communicator for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.hub.n
    }

    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let all = self.exchange(buf.to_vec(), "all_reduce")?;
        for (i, x) in buf.iter_mut().enumerate() {
            let mut s = 0.0f32;
            for c in all.iter() {
                s += c[i];
            }
            *x = s;
        }
        Ok(())
    }

    fn all_gather(&self, mine: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let all = self.exchange(mine.to_vec(), "all_gather")?;
        for (r, c) in all.iter().enumerate() {
            out[r * mine.len()..(r + 1) * mine.len()].copy_from_slice(c);
        }
        Ok(())
    }

    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        let all = self.exchange(full.to_vec(), "reduce_scatter")?;
        let off = self.rank * mine.len();
        for (i, x) in mine.iter_mut().enumerate() {
            let mut s = 0.0f32;
            for c in all.iter() {
                s += c[off + i];
            }
            *x = s;
        }
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let all = self.exchange(if self.rank == root { buf.to_vec() } else { Vec::new() }, "broadcast")?;
        buf.copy_from_slice(&all[root]);
        Ok(())
    }

    fn send(&self, to: usize, tag: u32, buf: &[f32]) -> Result<(), CommError> {
        self.hub.senders[to][self.rank]
            .lock()
            .expect("mailbox")
            .send((tag, buf.to_vec()))
            .map_err(|_| CommError(format!("rank {}: send to rank {to}: the group is gone", self.rank)))
    }

    fn recv(&self, from: usize, tag: u32, buf: &mut [f32]) -> Result<(), CommError> {
        let mut mb = self.hub.receivers[self.rank][from].lock().expect("mailbox");
        let deadline = Instant::now() + self.hub.timeout;
        let got = loop {
            if let Some(i) = mb.early.iter().position(|m| m.0 == tag) {
                break mb.early.remove(i).1;
            }
            let failed = self.hub.state.lock().expect("comm lock").failed.clone();
            if let Some(f) = failed.or_else(|| self.hub.ancestor_failure()) {
                return Err(CommError(format!(
                    "rank {}: recv from rank {from}: the group was aborted: {f}",
                    self.rank
                )));
            }
            match mb.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(m) if m.0 == tag => break m.1,
                Ok(m) => mb.early.push(m),
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => continue,
                Err(_) => {
                    return Err(CommError(format!(
                        "rank {}: recv from rank {from} (tag {tag}) timed out after {:.0} s",
                        self.rank,
                        self.hub.timeout.as_secs_f64()
                    )))
                }
            }
        };
        if got.len() != buf.len() {
            return Err(CommError(format!(
                "rank {}: recv from rank {from}: got {} values, expected {}",
                self.rank,
                got.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&got);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.exchange(Vec::new(), "barrier").map(|_| ())
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError> {
        let (all, round) = self.exchange_round(vec![color as f32, key as f32, self.rank as f32], "split")?;
        let mut members: Vec<(usize, usize)> = all
            .iter()
            .filter(|c| c[0] as usize == color)
            .map(|c| (c[1] as usize, c[2] as usize))
            .collect();
        members.sort_unstable();
        let new_rank = members.iter().position(|m| m.1 == self.rank).expect("self is a member");
        let mut st = self.hub.state.lock().expect("comm lock");
        let hub = st
            .splits
            .entry((round, color))
            .or_insert_with(|| Hub::new(members.len(), self.hub.timeout, Some(self.hub.clone())))
            .clone();
        Ok(Box::new(InProcess::new(new_rank, hub)))
    }

    fn abort(&self, why: &str) {
        for hub in [self.hub.clone(), self.hub.root()] {
            let mut st = hub.state.lock().expect("comm lock");
            if st.failed.is_none() {
                st.failed = Some(format!("rank {} aborted: {why}", self.rank));
            }
            hub.cv.notify_all();
        }
    }

    fn start_all_reduce(&self, buf: Vec<f32>) -> Result<Started, CommError> {
        self.start(Job::AllReduce(buf))
    }

    fn start_reduce_scatter(&self, full: Vec<f32>) -> Result<Started, CommError> {
        self.start(Job::ReduceScatter(full))
    }
}

/// Bytes and seconds a [`Metered`] communicator recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Meter {
    /// Bytes this rank sends, by the ring algorithm's count: an all-reduce of M bytes over n
    /// ranks sends 2(n−1)/n·M, a reduce-scatter or all-gather of a full buffer M sends (n−1)/n·M,
    /// a send sends M (the planner's `comm_bytes` counts the same way).
    pub bytes: f64,
    pub seconds: f64,
    pub calls: u64,
}

/// A communicator that records what passes through it.
pub struct Metered<'a> {
    inner: &'a dyn Communicator,
    meter: std::cell::Cell<Meter>,
}

impl<'a> Metered<'a> {
    pub fn new(inner: &'a dyn Communicator) -> Self {
        Metered {
            inner,
            meter: std::cell::Cell::new(Meter::default()),
        }
    }

    /// What was recorded since the last call, and reset.
    pub fn take(&self) -> Meter {
        self.meter.replace(Meter::default())
    }

    fn record<T>(&self, bytes: f64, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        let mut m = self.meter.get();
        m.bytes += bytes;
        m.seconds += t0.elapsed().as_secs_f64();
        m.calls += 1;
        self.meter.set(m);
        r
    }

    fn ring(&self, len: usize) -> f64 {
        let n = self.inner.size() as f64;
        (n - 1.0) / n * (len * 4) as f64
    }
}

impl Communicator for Metered<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.record(2.0 * self.ring(buf.len()), || self.inner.all_reduce(buf))
    }
    fn all_gather(&self, mine: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        self.record(self.ring(out.len()), || self.inner.all_gather(mine, out))
    }
    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        self.record(self.ring(full.len()), || self.inner.reduce_scatter(full, mine))
    }
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.record(self.ring(buf.len()), || self.inner.broadcast(buf, root))
    }
    fn send(&self, to: usize, tag: u32, buf: &[f32]) -> Result<(), CommError> {
        self.record((buf.len() * 4) as f64, || self.inner.send(to, tag, buf))
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [f32]) -> Result<(), CommError> {
        self.record(0.0, || self.inner.recv(from, tag, buf))
    }
    fn barrier(&self) -> Result<(), CommError> {
        self.record(0.0, || self.inner.barrier())
    }
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError> {
        self.inner.split(color, key)
    }
    fn abort(&self, why: &str) {
        self.inner.abort(why)
    }
    fn start_all_reduce(&self, buf: Vec<f32>) -> Result<Started, CommError> {
        self.record(2.0 * self.ring(buf.len()), || self.inner.start_all_reduce(buf))
    }
    fn start_reduce_scatter(&self, full: Vec<f32>) -> Result<Started, CommError> {
        self.record(self.ring(full.len()), || self.inner.start_reduce_scatter(full))
    }
}

impl Metered<'_> {
    /// Wait for a collective started through this communicator, recording the time waited
    /// (what the overlap left exposed) with its start.
    pub fn wait(&self, s: Started) -> Result<Vec<f32>, CommError> {
        let t0 = Instant::now();
        let r = s.wait();
        let mut m = self.meter.get();
        m.seconds += t0.elapsed().as_secs_f64();
        self.meter.set(m);
        r
    }
}
