//! Pipeline schedules as data. A schedule gives each pipeline rank the ordered list of steps it
//! runs; one executor runs any of them. With `v` model chunks per rank (interleaving), chunk `c`
//! of rank `r` holds virtual stage `c·p + r`, so activations flow rank 0 → p−1, then wrap to
//! rank 0's next chunk.

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// One unit of pipeline work: a pass of one microbatch through one model chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    pub microbatch: u32,
    pub chunk: u32,
    pub pass: Pass,
}

fn f(microbatch: u32, chunk: u32) -> Step {
    Step {
        microbatch,
        chunk,
        pass: Pass::Forward,
    }
}

fn b(microbatch: u32, chunk: u32) -> Step {
    Step {
        microbatch,
        chunk,
        pass: Pass::Backward,
    }
}

/// The schedule kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// All forwards, then all backwards (GPipe).
    GPipe,
    /// One forward, one backward after a warm-up of p − r − 1 forwards (PipeDream-flush / Megatron).
    OneFOneB,
    /// Megatron's interleaved 1F1B over v chunks per rank.
    Interleaved { chunks: u32 },
}

/// Steps of every rank: `schedule(kind, p, m)[r]` is rank r's list.
pub fn schedule(kind: Kind, pp: u32, microbatches: u32) -> Vec<Vec<Step>> {
    (0..pp).map(|r| rank_schedule(kind, pp, microbatches, r)).collect()
}

/// The (microbatch, chunk) of the k-th forward (or backward) of an interleaved rank: groups of p
/// microbatches go through chunk 0, then chunk 1, …; backwards visit chunks in reverse.
fn interleaved_unit(k: u32, pp: u32, v: u32, forward: bool) -> (u32, u32) {
    let group = k / (pp * v);
    let in_group = k % (pp * v);
    let chunk = in_group / pp;
    let chunk = if forward { chunk } else { v - 1 - chunk };
    (group * pp + in_group % pp, chunk)
}

fn rank_schedule(kind: Kind, pp: u32, m: u32, r: u32) -> Vec<Step> {
    match kind {
        Kind::GPipe => (0..m).map(|i| f(i, 0)).chain((0..m).map(|i| b(i, 0))).collect(),
        Kind::OneFOneB => {
            let warm = (pp - r - 1).min(m);
            let mut s: Vec<Step> = (0..warm).map(|i| f(i, 0)).collect();
            for i in 0..m - warm {
                s.push(f(warm + i, 0));
                s.push(b(i, 0));
            }
            s.extend((m - warm..m).map(|i| b(i, 0)));
            s
        }
        Kind::Interleaved { chunks: v } => {
            let total = m * v;
            // Megatron: warm-up = (p − r − 1)·2 + (v − 1)·p forwards, capped by the total.
            let warm = ((pp - r - 1) * 2 + (v - 1) * pp).min(total);
            let unit_f = |k| interleaved_unit(k, pp, v, true);
            let unit_b = |k| interleaved_unit(k, pp, v, false);
            let mut s: Vec<Step> = (0..warm)
                .map(|k| {
                    let (i, c) = unit_f(k);
                    f(i, c)
                })
                .collect();
            for k in 0..total - warm {
                let (i, c) = unit_f(warm + k);
                s.push(f(i, c));
                let (i, c) = unit_b(k);
                s.push(b(i, c));
            }
            s.extend((total - warm..total).map(|k| {
                let (i, c) = unit_b(k);
                b(i, c)
            }));
            s
        }
    }
}

/// What running a schedule against its dependencies shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Time units until the last rank finishes, with every step taking one unit.
    pub makespan: u32,
    /// Per rank, the most microbatch-chunks whose forward ran and backward did not yet.
    pub peak_in_flight: Vec<u32>,
    /// Idle units of the busiest-to-idlest rank: makespan − steps of a rank.
    pub bubble_units: u32,
}

/// Run the ranks' lists in lock-step time units, each step taking one unit and starting only
/// when its inputs exist: the forward of virtual stage s needs stage s−1's forward of the same
/// microbatch; the backward of stage s needs stage s+1's backward (the last stage needs its own
/// forward). Returns an error naming the stuck ranks if the schedule deadlocks or breaks a
/// dependency order.
pub fn simulate(steps: &[Vec<Step>], pp: u32, chunks: u32) -> Result<Simulation, String> {
    use std::collections::HashSet;
    let stage = |r: u32, c: u32| c * pp + r;
    let last = pp * chunks - 1;
    let mut done_f: HashSet<(u32, u32)> = HashSet::new(); // (microbatch, virtual stage)
    let mut done_b: HashSet<(u32, u32)> = HashSet::new();
    let mut pos = vec![0usize; steps.len()];
    let mut in_flight = vec![0u32; steps.len()];
    let mut peak = vec![0u32; steps.len()];
    let mut time = 0;
    while pos.iter().zip(steps).any(|(p, s)| *p < s.len()) {
        let mut progressed = Vec::new();
        for (r, list) in steps.iter().enumerate() {
            let Some(st) = list.get(pos[r]) else { continue };
            let s = stage(r as u32, st.chunk);
            let ready = match st.pass {
                Pass::Forward => s == 0 || done_f.contains(&(st.microbatch, s - 1)),
                Pass::Backward => {
                    done_f.contains(&(st.microbatch, s)) && (s == last || done_b.contains(&(st.microbatch, s + 1)))
                }
            };
            if ready {
                progressed.push((r, *st, s));
            }
        }
        if progressed.is_empty() {
            let stuck: Vec<String> = pos
                .iter()
                .enumerate()
                .filter(|(r, p)| **p < steps[*r].len())
                .map(|(r, p)| format!("rank {r} at {:?}", steps[r][*p]))
                .collect();
            return Err(format!("deadlock at time {time}: {}", stuck.join(", ")));
        }
        for (r, st, s) in progressed {
            match st.pass {
                Pass::Forward => {
                    done_f.insert((st.microbatch, s));
                    in_flight[r] += 1;
                    peak[r] = peak[r].max(in_flight[r]);
                }
                Pass::Backward => {
                    done_b.insert((st.microbatch, s));
                    in_flight[r] -= 1;
                }
            }
            pos[r] += 1;
        }
        time += 1;
    }
    let busiest = steps.iter().map(|s| s.len() as u32).max().unwrap_or(0);
    Ok(Simulation {
        makespan: time,
        peak_in_flight: peak,
        bubble_units: time - busiest,
    })
}
