use std::time::{Duration, Instant};

use exatrain_parallel::comm::{in_process, Communicator};
use exatrain_parallel::schedule::{schedule, simulate, Kind, Pass};
use exatrain_spec::ParallelConfig;

#[test]
fn schedules_run_every_unit_once_without_deadlock() {
    for (pp, m) in [(1u32, 1u32), (2, 2), (4, 4), (4, 8), (3, 7), (8, 3)] {
        for kind in [Kind::GPipe, Kind::OneFOneB] {
            let s = schedule(kind, pp, m);
            for r in &s {
                assert_eq!(r.len(), 2 * m as usize, "{kind:?} p {pp} m {m}");
                for i in 0..m {
                    let fi = r
                        .iter()
                        .position(|x| x.microbatch == i && x.pass == Pass::Forward)
                        .unwrap();
                    let bi = r
                        .iter()
                        .position(|x| x.microbatch == i && x.pass == Pass::Backward)
                        .unwrap();
                    assert!(fi < bi);
                }
            }
            let sim = simulate(&s, pp, 1).unwrap_or_else(|e| panic!("{kind:?} p {pp} m {m}: {e}"));
            // each unit step: the pipeline needs 2m steps plus 2(p-1) of fill and drain
            assert_eq!(sim.makespan, 2 * m + 2 * (pp - 1), "{kind:?} p {pp} m {m}");
        }
    }
}

#[test]
fn in_flight_microbatches_match_the_planner() {
    use exatrain_cost::memory::chunks_in_flight;
    for (pp, v, m) in [
        (4u32, 1u32, 8u32),
        (4, 1, 2),
        (8, 1, 16),
        (2, 2, 4),
        (4, 2, 8),
        (4, 3, 12),
        (3, 2, 6),
    ] {
        let kind = if v == 1 {
            Kind::OneFOneB
        } else {
            Kind::Interleaved { chunks: v }
        };
        let s = schedule(kind, pp, m);
        for r in &s {
            assert_eq!(r.len(), (2 * m * v) as usize);
        }
        let sim = simulate(&s, pp, v).unwrap_or_else(|e| panic!("p {pp} v {v} m {m}: {e}"));
        let cfg = ParallelConfig {
            virtual_stages: v,
            ..ParallelConfig::new(1, pp, 1, 1, m)
        };
        for r in 0..pp {
            assert_eq!(
                sim.peak_in_flight[r as usize] as f64,
                chunks_in_flight(&cfg, r),
                "p {pp} v {v} m {m} rank {r}"
            );
        }
    }
    // GPipe holds every microbatch
    let sim = simulate(&schedule(Kind::GPipe, 4, 8), 4, 1).unwrap();
    assert!(sim.peak_in_flight.iter().all(|&x| x == 8));
}

#[test]
fn interleaving_shrinks_the_bubble() {
    let (pp, m) = (4, 8);
    let plain = simulate(&schedule(Kind::OneFOneB, pp, m), pp, 1).unwrap();
    // one chunk of work per unit: split each stage into v chunks → each unit is 1/v of the work
    let v = 2;
    let inter = simulate(&schedule(Kind::Interleaved { chunks: v }, pp, m), pp, v).unwrap();
    let plain_frac = plain.bubble_units as f64 / plain.makespan as f64;
    let inter_frac = inter.bubble_units as f64 / inter.makespan as f64;
    assert!(inter_frac < plain_frac, "interleaved {inter_frac} vs 1F1B {plain_frac}");
}

#[test]
fn collectives_are_correct_and_bit_identical_on_every_rank() {
    let n = 4;
    let ranks = in_process(n, Duration::from_secs(10));
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let mut a = vec![0.1 * r, 1.0 + r, 1e-3];
                    c.all_reduce(&mut a).unwrap();
                    let mut g = vec![0.0; 2 * n];
                    c.all_gather(&[r, -r], &mut g).unwrap();
                    let full: Vec<f32> = (0..2 * n).map(|i| i as f32 + r).collect();
                    let mut mine = vec![0.0; 2];
                    c.reduce_scatter(&full, &mut mine).unwrap();
                    let mut bc = vec![r; 3];
                    c.broadcast(&mut bc, 2).unwrap();
                    // a ring of send/recv
                    let next = (c.rank() + 1) % n;
                    let prev = (c.rank() + n - 1) % n;
                    c.send(next, 0, &[r]).unwrap();
                    let mut got = [0.0];
                    c.recv(prev, 0, &mut got).unwrap();
                    c.barrier().unwrap();
                    (a, g, mine, bc, got[0])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (a, g, mine, bc, got)) in results.iter().enumerate() {
        assert_eq!(a[1], 4.0 + 6.0);
        assert!(
            a.iter().zip(&results[0].0).all(|(x, y)| x.to_bits() == y.to_bits()),
            "identical on every rank"
        );
        assert_eq!(g, &vec![0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0]);
        let base = (2 * rank) as f32;
        assert_eq!(mine, &vec![4.0 * base + 6.0, 4.0 * (base + 1.0) + 6.0]);
        assert_eq!(bc, &vec![2.0; 3]);
        assert_eq!(*got, ((rank + n - 1) % n) as f32);
    }
}

#[test]
fn groups_split_from_the_rank_grid() {
    let cfg = ParallelConfig::new(2, 2, 2, 1, 2); // 8 ranks, tp-dp-pp
    let ranks = in_process(8, Duration::from_secs(10));
    let out: Vec<(usize, usize, f32, f32)> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let (tp, dp, pp) = cfg.coords(c.rank() as u32);
                    // the TP group: same (dp, pp); the DP group: same (tp, pp)
                    let tpg = c.split((dp + 2 * pp) as usize, tp as usize).unwrap();
                    let dpg = c.split((tp + 2 * pp) as usize, dp as usize).unwrap();
                    let mut x = [c.rank() as f32];
                    tpg.all_reduce(&mut x).unwrap();
                    let mut y = [c.rank() as f32];
                    dpg.all_reduce(&mut y).unwrap();
                    (tpg.size(), tpg.rank(), x[0], y[0])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (size, tp_rank, x, y)) in out.iter().enumerate() {
        let (tp, dp, pp) = cfg.coords(rank as u32);
        assert_eq!((*size, *tp_rank), (2, tp as usize));
        // TP partners differ in the lowest bit (stride 1), DP partners by 2 (stride tp)
        let t0 = cfg.rank(0, dp, pp) as f32;
        assert_eq!(*x, 2.0 * t0 + 1.0);
        let d0 = cfg.rank(tp, 0, pp) as f32;
        assert_eq!(*y, 2.0 * d0 + 2.0);
    }
}

#[test]
fn a_failing_rank_ends_the_job_with_a_message_not_a_hang() {
    let ranks = in_process(3, Duration::from_secs(2));
    let t0 = Instant::now();
    let errs: Vec<Option<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 1 {
                        c.abort("out of memory in forward");
                        return None;
                    }
                    let mut x = [1.0];
                    c.all_reduce(&mut x).err().map(|e| e.0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        errs[0].as_ref().unwrap().contains("rank 1 aborted: out of memory"),
        "{errs:?}"
    );
    assert!(errs[2].is_some());
    // a rank that silently never arrives: the others time out
    let ranks = in_process(2, Duration::from_millis(300));
    let e = std::thread::scope(|s| {
        let mut it = ranks.into_iter();
        let a = it.next().unwrap();
        let _b = it.next().unwrap(); // never calls
        s.spawn(move || {
            let mut x = [1.0];
            a.all_reduce(&mut x).err().unwrap().0
        })
        .join()
        .unwrap()
    });
    assert!(e.contains("timed out") && e.contains("[1]"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn started_collectives_complete_in_order_while_the_rank_goes_on() {
    let n = 4;
    let ranks = in_process(n, Duration::from_secs(10));
    let results: Vec<(Vec<Vec<f32>>, Vec<f32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let r = comm.rank() as f32;
                    let pair = comm.split(comm.rank() / 2, comm.rank()).unwrap();
                    // three in flight at once, a blocking collective on another group meanwhile
                    let a = comm.start_all_reduce(vec![r, 1.0]).unwrap();
                    let b = comm
                        .start_reduce_scatter((0..8).map(|i| r * 10.0 + i as f32).collect())
                        .unwrap();
                    let c = comm.start_all_reduce(vec![2.0 * r]).unwrap();
                    let mut x = vec![r];
                    pair.all_reduce(&mut x).unwrap();
                    let got = vec![a.wait().unwrap(), b.wait().unwrap(), c.wait().unwrap()];
                    (got, x)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (got, pair)) in results.iter().enumerate() {
        assert_eq!(got[0], vec![6.0, 4.0], "rank {rank}: first all-reduce");
        // chunk `rank` of the sum over ranks: Σ_r (10 r + i) = 60 + 4 i, i = 2 rank, 2 rank + 1
        let i = 2.0 * rank as f32;
        assert_eq!(
            got[1],
            vec![60.0 + 4.0 * i, 64.0 + 4.0 * i],
            "rank {rank}: reduce-scatter"
        );
        assert_eq!(got[2], vec![12.0], "rank {rank}: second all-reduce");
        let base = (rank / 2 * 2) as f32;
        assert_eq!(
            pair,
            &vec![2.0 * base + 1.0],
            "rank {rank}: the pair's blocking all-reduce"
        );
    }
}

#[test]
fn a_started_collective_fails_with_the_abort_message() {
    let ranks = in_process(2, Duration::from_secs(10));
    let t0 = Instant::now();
    let errs: Vec<Option<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    if comm.rank() == 1 {
                        comm.abort("rank 1 ran out of memory");
                        return None;
                    }
                    let started = comm.start_all_reduce(vec![1.0; 4]).unwrap();
                    started.wait().err().map(|e| e.0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let msg = errs[0].clone().expect("rank 0's started all-reduce fails");
    assert!(msg.contains("ran out of memory"), "{msg}");
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "noticed the abort, not the timeout"
    );
}

/// Run a schedule with real durations: every rank takes its steps in order, each starting when
/// the rank is free and its input exists (as `simulate`, with time), the forward of rank r's
/// chunk taking `fwd[r] / v` and its backward twice that. Returns the makespan.
fn timed_makespan(kind: Kind, fwd: &[f64], m: u32) -> f64 {
    let pp = fwd.len() as u32;
    let v = match kind {
        Kind::Interleaved { chunks } => chunks,
        _ => 1,
    };
    let steps = schedule(kind, pp, m);
    let last = pp * v - 1;
    let mut done: std::collections::HashMap<(u32, u32, bool), f64> = Default::default();
    let mut free = vec![0.0f64; pp as usize];
    let mut pos = vec![0usize; pp as usize];
    while pos.iter().zip(&steps).any(|(p, s)| *p < s.len()) {
        let mut moved = false;
        for r in 0..pp as usize {
            let Some(st) = steps[r].get(pos[r]) else { continue };
            let s = st.chunk * pp + r as u32;
            let forward = st.pass == Pass::Forward;
            let needs: Vec<(u32, u32, bool)> = if forward {
                if s == 0 {
                    vec![]
                } else {
                    vec![(st.microbatch, s - 1, true)]
                }
            } else if s == last {
                vec![(st.microbatch, s, true)]
            } else {
                vec![(st.microbatch, s, true), (st.microbatch, s + 1, false)]
            };
            if needs.iter().all(|k| done.contains_key(k)) {
                let ready = needs.iter().map(|k| done[k]).fold(free[r], f64::max);
                let t = fwd[r] / v as f64 * if forward { 1.0 } else { 2.0 };
                free[r] = ready + t;
                done.insert((st.microbatch, s, forward), free[r]);
                pos[r] += 1;
                moved = true;
            }
        }
        assert!(moved, "{kind:?} deadlocked");
    }
    free.iter().cloned().fold(0.0, f64::max)
}

/// The planner's pipeline bubble (`exatrain_cost::plan`): the slowest stage runs every
/// microbatch back to back, and the fill and the drain pass once through every other stage, so
/// a step takes m·t_slowest + Σ_other t_s (each over v with interleaving), not
/// (m + p − 1)·t_slowest: exactly what the schedules the trainer runs take, with stages of
/// equal and unequal times (a light first stage, a heavy last one, light inner ones).
#[test]
fn the_bubble_is_the_other_stages_once_each() {
    let cases: [(&[f64], Kind, u32); 6] = [
        (&[1.0, 1.0, 1.0, 1.0], Kind::OneFOneB, 8),
        (&[0.8, 1.0, 1.0, 1.3], Kind::OneFOneB, 16),
        (&[0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2], Kind::OneFOneB, 32),
        (&[1.0, 0.6, 0.6, 1.0], Kind::OneFOneB, 12),
        (&[0.8, 1.0, 1.0, 1.3], Kind::Interleaved { chunks: 2 }, 16),
        (&[1.0, 1.0, 1.0, 1.2], Kind::Interleaved { chunks: 3 }, 12),
    ];
    for (fwd, kind, m) in cases {
        let v = match kind {
            Kind::Interleaved { chunks } => chunks as f64,
            _ => 1.0,
        };
        let t: Vec<f64> = fwd.iter().map(|f| 3.0 * f).collect(); // forward + backward
        let slowest = t.iter().cloned().fold(0.0, f64::max);
        let others: f64 = t.iter().sum::<f64>() - slowest;
        let planned = m as f64 * slowest + others / v;
        let before = m as f64 * slowest + (t.len() as f64 - 1.0) * slowest / v;
        let got = timed_makespan(kind, fwd, m);
        assert!(
            (planned - got).abs() <= 1e-9 * got,
            "{fwd:?} {kind:?} m {m}: simulated {got}, planned {planned}"
        );
        // (p − 1) slowest-stage times is right only when the stages are equal
        let equal = fwd.iter().all(|f| *f == fwd[0]);
        assert_eq!(
            equal,
            (before - got).abs() <= 1e-9 * got,
            "{fwd:?} {kind:?}: {before} vs {got}"
        );
    }
}
