//! The executor: one rank's training run — the pipeline schedule's steps in order, activations
//! and their gradients sent between neighbouring stages, then the data-parallel reduction, the
//! tied embedding, clipping and AdamW, logging and checkpoints.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use exatrain_cost::Times;
use exatrain_parallel::comm::{CommError, Communicator, Meter, Metered, Started};
use exatrain_parallel::schedule::{self, Kind, Pass};
use exatrain_spec::{ModelSpec, ParallelConfig, SpecError};

use crate::backend::Backend;
use crate::data::{self, Dataset};
use crate::guard::Guard;
use crate::model::{GptShape, Model, Part};
use crate::optim::{lr_at, AdamW, AdamWConfig};
use crate::train::TrainConfig;

use super::groups::{split_groups, TpComm};
use super::zero::{decay_within, finish, gather_whole, start_bucket, Chunk, Regions};
use super::{check, comm_err, CommBytes, MemoryBytes, Options, RankReport, RankResult, Schedule, StepLine, Stop};

/// How many microbatches of each chunk are in flight at most in `steps`.
fn slots_needed(steps: &[schedule::Step], chunks: usize) -> Vec<usize> {
    let (mut now, mut peak) = (vec![0usize; chunks], vec![0usize; chunks]);
    for s in steps {
        let c = s.chunk as usize;
        match s.pass {
            Pass::Forward => {
                now[c] += 1;
                peak[c] = peak[c].max(now[c]);
            }
            Pass::Backward => now[c] -= 1,
        }
    }
    peak
}

pub(super) fn run<B: Backend<R = f32> + Clone>(
    be: B,
    spec: &ModelSpec,
    cfg: &TrainConfig,
    pc: &ParallelConfig,
    opts: &Options,
    data_dir: &Path,
    world: &dyn Communicator,
) -> Result<RankResult, Stop> {
    check(spec, cfg, pc, world.size())?;
    let sched = opts.schedule;
    let shape = GptShape::from_spec(spec)?;
    let data = Dataset::open(data_dir, shape.max_seq)?;
    data.check_vocab(shape.vocab, &spec.name)?;
    let g = split_groups(world, pc).map_err(comm_err)?;
    let (tp_i, dp_i, pp_i) = pc.coords(world.rank() as u32);
    let (tp_i, dp_i, pp_i) = (tp_i as usize, dp_i as usize, pp_i as usize);
    let (pp, dp, v) = (pc.pp as usize, pc.dp as usize, pc.virtual_stages as usize);
    // context parallelism: this rank holds T/cp tokens of each of its data-parallel rank's
    // sequences; the weights are shared (and reduced, and ZeRO-sharded) over dp · cp ranks
    let (cp, cp_i) = (pc.cp as usize, pc.cp_coord(world.rank() as u32) as usize);
    let (dpc, dpc_i) = (dp * cp, dp_i * cp + cp_i);
    let stages = pp * v;
    // the layers of each (virtual) stage as the planner splits them
    let split = pc.stage_layers(spec).map_err(|e| SpecError::new(e.to_string()))?;
    let m = pc.microbatches() as usize;
    let kind = match (v, sched) {
        (1, Schedule::GPipe) => Kind::GPipe,
        (1, Schedule::OneFOneB) => Kind::OneFOneB,
        _ => Kind::Interleaved { chunks: v as u32 },
    };
    let all_steps = schedule::schedule(kind, pp as u32, m as u32);
    schedule::simulate(&all_steps, pp as u32, v as u32)
        .map_err(|e| SpecError::new(format!("pipeline schedule {kind:?}: {e}")))?;
    let steps = &all_steps[pp_i];
    let slots = slots_needed(steps, v);
    // the step at which each chunk runs its last backward: ZeRO 0 and 1 reduce its gradients then
    let last_backward: Vec<usize> = (0..v)
        .map(|c| {
            steps
                .iter()
                .rposition(|s| s.pass == Pass::Backward && s.chunk as usize == c)
                .expect("every chunk runs backward")
        })
        .collect();

    // --- this rank's chunks
    let (zero, overlap) = (pc.zero, pc.overlap_dp);
    let adam = AdamWConfig {
        lr: cfg.lr,
        weight_decay: cfg.weight_decay,
        ..Default::default()
    };
    let mut chunks: Vec<Chunk<B>> = (0..v)
        .map(|c| {
            let stage = c * pp + pp_i;
            let r = split.chunk_range(stage as u32, v as u32);
            let layers = r.start as usize..r.end as usize;
            let part = Part {
                layers,
                embed: stage == 0,
                head: stage == stages - 1,
                tp: pc.tp as usize,
                tp_rank: tp_i,
                sp: pc.sequence_parallel,
                recompute: pc.recompute,
                flash: pc.flash_attention,
                cp,
                cp_rank: cp_i,
            };
            let mut model = Model::init(be.clone(), shape, &part, cfg.seed);
            model.prepare(cfg.micro_batch, shape.max_seq / cp, slots[c]);
            // buckets of `ParallelConfig::trainer_bucket` elements, cut at block boundaries; with
            // `overlap_dp` a bucket's reduction starts as soon as its last gradient is final
            let bucket = usize::try_from(pc.trainer_bucket()).unwrap_or(usize::MAX);
            let regions = Regions::new(&model.layout, dpc, bucket);
            let decayed = model.layout.decayed();
            let pieces: Vec<Range<usize>> = if zero == 0 {
                vec![0..model.layout.total]
            } else {
                (0..regions.regions.len()).map(|k| regions.piece(k, dpc_i)).collect()
            };
            let opts = pieces
                .into_iter()
                .map(|p| {
                    let o = AdamW::new(&model.be, adam, p.len(), decay_within(&decayed, &p));
                    (p, o)
                })
                .collect();
            let tied = (part.embed || part.head) && !(part.embed && part.head);
            let mut counted = vec![true; model.layout.total];
            if tp_i > 0 {
                for r in model.layout.tp_replicated() {
                    counted[r].iter_mut().for_each(|x| *x = false);
                }
            }
            if tied && part.head {
                counted[model.layout.wte.clone()].iter_mut().for_each(|x| *x = false);
            }
            let shard_grads = if zero == 0 {
                Vec::new()
            } else {
                regions.regions.iter().map(|(_, s)| model.be.alloc(*s)).collect()
            };
            Chunk {
                model,
                stage,
                regions,
                shard_grads,
                opts,
                counted,
                tied,
                slots: slots[c],
            }
        })
        .collect();

    let first_step = match &opts.start {
        Some(st) => {
            let whole = crate::model::ParamLayout::new(&shape).total;
            if st.params.len() != whole || st.m.len() != whole || st.v.len() != whole {
                return Err(SpecError::new(format!(
                    "resume: the checkpoint holds {} parameters, model {} has {whole}",
                    st.params.len(),
                    spec.name
                ))
                .into());
            }
            for ch in &mut chunks {
                ch.restore(&shape, st);
            }
            st.step
        }
        None => 0,
    };
    let mut guard = Guard::new(cfg.divergence_factor, opts.start.as_ref().and_then(|s| s.min_loss));

    // --- meters: what passes through each group
    let tp_act = Metered::new(&*g.tp);
    let cpm = Metered::new(&*g.cp);
    let tpc = TpComm {
        act: &tp_act,
        stats: &*g.tp,
        cp: &cpm,
    };
    let pp_send = Metered::new(&*g.pp);
    let pp_recv = Metered::new(&*g.pp);
    let gather = Metered::new(&*g.tp);
    let dpm = Metered::new(&*g.dp);
    let embm = Metered::new(&*g.embedding);

    // the rank's tokens of each sequence (all of them without context parallelism)
    let (seq, t) = (shape.max_seq, shape.max_seq / cp);
    let positions = crate::flash::cp_positions(seq, cp, cp_i);
    let n_act = cfg.micro_batch * t * shape.channels;
    let per_rank = cfg.global_batch / dp;
    // each rank's mean loss is over its own tokens: the ranks of a sequence share it equally
    let scale = 1.0 / (m * dp * cp) as f32;
    let (mut tokens, mut targets) = (Vec::new(), Vec::new());
    let (mut whole_tokens, mut whole_targets) = (Vec::new(), Vec::new());
    // Megatron's scatter-gather: each tp rank sends its 1/tp slice of the activations across
    // stages, the receiving stage all-gathers them over its tp group.
    // Under sequence parallelism the boundary tensor already is this rank's rows: sent as is.
    let (tp, sp) = (pc.tp as usize, pc.sequence_parallel);
    let n_act = if sp { n_act / tp } else { n_act };
    let mut buf = vec![0.0f32; n_act];
    let mut part_buf = vec![0.0f32; if sp { n_act } else { n_act / tp }];
    let slice_n = if sp { 1 } else { tp };
    let gather_n = (slice_n > 1).then_some(&gather);
    let (mut losses, mut grad_norms, mut step_seconds) = (Vec::new(), Vec::new(), Vec::new());
    let mut sums: Vec<(Times, CommBytes)> = Vec::new();
    // the most gradient elements copied out for reductions in flight at once (workspace)
    let mut staged_peak = 0usize;
    for step in first_step..cfg.steps {
        let t_step = Instant::now();
        let mut times = Times::default();
        let mut bytes = CommBytes::default();
        for c in &mut chunks {
            c.model.zero_grad();
            for s in &mut c.shard_grads {
                let all = 0..B::len(s);
                c.model.be.zero(s, &all);
            }
        }
        let mut loss = 0.0f64;
        let mut slot_of: HashMap<(u32, u32), usize> = HashMap::new();
        let mut free: Vec<Vec<usize>> = chunks.iter().map(|c| (0..c.slots).rev().collect()).collect();
        let first = step * cfg.global_batch as u64 + (dp_i * per_rank) as u64;
        // data-parallel reductions in flight: (chunk, bucket, collective)
        let mut pending: Vec<(usize, usize, Started)> = Vec::new();
        for (si, st) in steps.iter().enumerate() {
            pending.iter_mut().for_each(|p| p.2.poke());
            let ci = st.chunk as usize;
            let ch = &mut chunks[ci];
            let s = ch.stage;
            let prev = (pp_i + pp - 1) % pp;
            let next = (pp_i + 1) % pp;
            match st.pass {
                Pass::Forward => {
                    let mb = st.microbatch as u64;
                    data::train_batch(
                        &data.train,
                        cfg.seed,
                        first + mb * cfg.micro_batch as u64,
                        cfg.micro_batch,
                        seq,
                        &mut whole_tokens,
                        &mut whole_targets,
                    );
                    let mine = |whole: &[u32], out: &mut Vec<u32>| {
                        out.clear();
                        for row in whole.chunks(seq) {
                            out.extend(positions.iter().map(|&p| row[p]));
                        }
                    };
                    mine(&whole_tokens, &mut tokens);
                    mine(&whole_targets, &mut targets);
                    let input = if s > 0 {
                        recv_activation(&pp_recv, gather_n, prev, 2 * s as u32, &mut part_buf, &mut buf)
                            .map_err(comm_err)?;
                        Some(&buf[..])
                    } else {
                        None
                    };
                    let slot = free[ci].pop().expect("slots sized from the schedule");
                    slot_of.insert((st.microbatch, st.chunk), slot);
                    let t0 = Instant::now();
                    let l = ch
                        .model
                        .forward_part(slot, &tpc, &tokens, &targets, input)
                        .map_err(comm_err)?;
                    times.compute += t0.elapsed().as_secs_f64();
                    if let Some(l) = l {
                        loss += l as f64 / m as f64;
                    }
                    if s + 1 < stages {
                        let mine = B::sub(ch.model.output(slot), &slice_of(n_act, slice_n, tp_i % slice_n));
                        ch.model
                            .be
                            .with_host(mine, |x| pp_send.send(next, 2 * (s + 1) as u32, x))
                            .map_err(comm_err)?;
                    }
                }
                Pass::Backward => {
                    let slot = slot_of.remove(&(st.microbatch, st.chunk)).expect("forward ran first");
                    let dout = if s + 1 < stages {
                        recv_activation(&pp_recv, gather_n, next, 2 * s as u32 + 1, &mut part_buf, &mut buf)
                            .map_err(comm_err)?;
                        Some(&buf[..])
                    } else {
                        None
                    };
                    if zero == 2 {
                        // this chunk's previous microbatch reductions end before new ones start
                        finish(&mut pending, Some(ci), &mut chunks, &dpm, zero).map_err(comm_err)?;
                    }
                    let ch = &mut chunks[ci];
                    // (one data-parallel rank and ZeRO-0: nothing to reduce)
                    let reduce = (zero == 2 || si == last_backward[ci]) && (dpc > 1 || zero > 0);
                    let (model, regions) = (&mut ch.model, &ch.regions);
                    // buckets ≥ next are started
                    let mut next = regions.regions.len();
                    // called as each block's gradients are final: start the buckets now
                    // complete, and let those in flight progress (an MPI library moves their
                    // data only inside its calls)
                    let mut start = |be: &B, g: &B::Buf, from: usize| -> Result<(), CommError> {
                        while reduce && next > 0 && regions.regions[next - 1].0.start >= from {
                            next -= 1;
                            pending.push((ci, next, start_bucket(be, regions, next, g, zero, &dpm)?));
                        }
                        pending.iter_mut().for_each(|p| p.2.poke());
                        Ok(())
                    };
                    let t0 = Instant::now();
                    if overlap {
                        model.backward_part(slot, &tpc, dout, scale, &mut start)
                    } else {
                        model.backward_part(slot, &tpc, dout, scale, &mut |_, _, _| Ok(()))
                    }
                    .map_err(comm_err)?;
                    times.compute += t0.elapsed().as_secs_f64();
                    if !overlap {
                        start(&model.be, &model.grads, 0).map_err(comm_err)?;
                    }
                    let staged = |p: &(usize, usize, Started)| chunks[p.0].regions.staged(p.1, zero, dpc);
                    staged_peak = staged_peak.max(pending.iter().map(staged).sum());
                    if !overlap {
                        finish(&mut pending, None, &mut chunks, &dpm, zero).map_err(comm_err)?;
                    }
                    let ch = &mut chunks[ci];
                    free[ci].push(slot);
                    if s > 0 {
                        let mine = B::sub(ch.model.input_grad(), &slice_of(n_act, slice_n, tp_i % slice_n));
                        ch.model
                            .be
                            .with_host(mine, |x| pp_send.send(prev, 2 * (s - 1) as u32 + 1, x))
                            .map_err(comm_err)?;
                    }
                    if zero == 2 {
                        // ZeRO-2: this microbatch's gradients went to the reduce-scatters
                        ch.model.zero_grad();
                    }
                }
            }
        }
        // --- the data-parallel reductions still in flight, then the tied embedding
        finish(&mut pending, None, &mut chunks, &dpm, zero).map_err(comm_err)?;
        let mut tie_wait = 0.0;
        for ch in &mut chunks {
            if ch.tied {
                // first meet the other end of the pipeline (waiting for its last backward is
                // pipeline idle time), then the all-reduce itself
                let t0 = Instant::now();
                g.embedding.barrier().map_err(comm_err)?;
                tie_wait += t0.elapsed().as_secs_f64();
                let [wte] = if zero == 0 {
                    let wte = ch.model.layout.wte.clone();
                    B::parts(&mut ch.model.grads, [&wte])
                } else {
                    let all = 0..B::len(&ch.shard_grads[0]);
                    B::parts(&mut ch.shard_grads[0], [&all]) // region 0 is the embedding
                };
                ch.model
                    .be
                    .with_host_mut(wte, |w| embm.all_reduce(w))
                    .map_err(comm_err)?;
            }
        }
        // --- the global gradient norm over every rank, each element counted once
        let t_opt = Instant::now();
        let mut sq = 0.0f64;
        let counted_sq = |g: &[f32], counted: &[bool]| {
            g.iter()
                .zip(counted)
                .filter(|(_, c)| **c)
                .map(|(g, _)| (*g as f64).powi(2))
                .sum::<f64>()
        };
        for ch in &chunks {
            let be = &ch.model.be;
            if zero == 0 {
                if dpc_i == 0 {
                    let all = 0..ch.model.layout.total;
                    sq += be.with_host(B::view(&ch.model.grads, &all), |g| counted_sq(g, &ch.counted));
                }
            } else {
                for k in 0..ch.regions.regions.len() {
                    let p = ch.regions.piece(k, dpc_i);
                    let mine = B::view(&ch.shard_grads[k], &(0..p.len()));
                    sq += be.with_host(mine, |g| counted_sq(g, &ch.counted[p]));
                }
            }
        }
        // loss from the last stage's tp rank 0 of each dp and cp rank, averaged over them
        let head_here = chunks.iter().any(|c| c.model.part().head) && tp_i == 0;
        let mut red = [sq as f32, if head_here { (loss / dpc as f64) as f32 } else { 0.0 }];
        let t_red = Instant::now();
        world.all_reduce(&mut red).map_err(comm_err)?;
        let red_s = t_red.elapsed().as_secs_f64();
        let norm = (red[0] as f64).sqrt();
        if let Err(d) = guard.check(step + 1, red[1] as f64, norm) {
            // the parameters after `step` steps gave this loss: take back their checkpoint
            let mut good = None;
            if world.rank() == 0 {
                if let Some(f) = opts.on_diverge {
                    good = f(step).map_err(Stop::Failed)?;
                }
            }
            return Err(Stop::Agreed(SpecError::new(d.message(good.as_deref()))));
        }
        losses.push(red[1] as f64);
        grad_norms.push(norm);
        let clip = if norm > cfg.grad_clip && norm.is_finite() {
            (cfg.grad_clip / norm) as f32
        } else {
            1.0
        };
        let lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps);
        for ch in &mut chunks {
            let m = &mut ch.model;
            if zero == 0 {
                let all = 0..m.layout.total;
                let [g] = B::parts(&mut m.grads, [&all]);
                m.be.scale(g, clip);
                let (p, o) = &mut ch.opts[0];
                let [params] = B::parts(&mut m.params, [&*p]);
                o.update(&m.be, params, B::view(&m.grads, p), lr);
            } else {
                for (k, (p, o)) in ch.opts.iter_mut().enumerate() {
                    let (shard, mine) = (&mut ch.shard_grads[k], 0..p.len());
                    let [gk] = B::parts(shard, [&mine]);
                    m.be.scale(gk, clip);
                    let [params] = B::parts(&mut m.params, [&*p]);
                    o.update(&m.be, params, B::view(shard, &mine), lr);
                }
            }
            m.be.check().map_err(comm_err)?;
        }
        times.optimizer += t_opt.elapsed().as_secs_f64() - red_s;
        // ZeRO ≥ 1: every rank gets the updated parameters back
        if zero >= 1 {
            for ch in &mut chunks {
                for k in 0..ch.regions.regions.len() {
                    let (r, s) = ch.regions.regions[k].clone();
                    let p = ch.regions.piece(k, dpc_i);
                    let mut send = vec![0.0f32; s];
                    let be = &ch.model.be;
                    be.with_host(B::view(&ch.model.params, &p), |x| send[..p.len()].copy_from_slice(x));
                    let mut out = vec![0.0f32; s * dpc];
                    dpm.all_gather(&send, &mut out).map_err(comm_err)?;
                    let [dst] = B::parts(&mut ch.model.params, [&r]);
                    be.with_host_mut(dst, |d| d.copy_from_slice(&out[..r.len()]));
                }
            }
        }
        let (mt, ms, mr, md, me, mg, mc): (Meter, Meter, Meter, Meter, Meter, Meter, Meter) = (
            tp_act.take(),
            pp_send.take(),
            pp_recv.take(),
            dpm.take(),
            embm.take(),
            gather.take(),
            cpm.take(),
        );
        times.compute -= mt.seconds + mc.seconds;
        times.tp_comm = mt.seconds;
        times.cp_comm = mc.seconds;
        times.pp_comm = ms.seconds + mg.seconds;
        times.bubble = mr.seconds + tie_wait;
        times.dp_comm = md.seconds + me.seconds;
        bytes.tp = mt.bytes;
        bytes.pp = ms.bytes;
        bytes.dp = md.bytes;
        bytes.embedding = me.bytes;
        bytes.pp_gather = mg.bytes;
        bytes.cp = mc.bytes;
        sums.push((times, bytes));
        let seconds = t_step.elapsed().as_secs_f64();
        step_seconds.push(seconds);
        let done = step + 1;
        let every = |k: u64| (k > 0 && done % k == 0) || done == cfg.steps;
        let evaluate = opts.on_eval.is_some() && every(cfg.eval_every);
        let save = opts.on_checkpoint.is_some() && every(cfg.ckpt_every);
        // one gather serves the evaluation and the checkpoint
        let whole = if evaluate || save {
            let mut w = gather_whole(&shape, &chunks, zero, dpc_i, done, world).map_err(comm_err)?;
            w.min_loss = guard.min_loss;
            Some(w)
        } else {
            None
        };
        if world.rank() == 0 {
            let (val_loss, sample) = match (opts.on_eval, &whole) {
                (Some(f), Some(w)) if evaluate => {
                    let (v, s) = f(w)?;
                    (Some(v), s)
                }
                _ => (None, None),
            };
            if let Some(f) = opts.on_step {
                f(&StepLine {
                    step: done,
                    loss: red[1] as f64,
                    grad_norm: norm,
                    lr,
                    seconds,
                    tokens_per_s: (cfg.global_batch * seq) as f64 / seconds,
                    val_loss,
                    sample,
                });
            }
        }
        if let (Some(f), Some(w)) = (opts.on_checkpoint, &whole) {
            if save && world.rank() == 0 {
                f(w)?;
            }
        }
    }
    if sums.is_empty() {
        return Err(Stop::Failed(SpecError::new(format!(
            "--steps {}: the run already completed {first_step} steps",
            cfg.steps
        ))));
    }

    // --- the report: means over the steps after the first
    let skip = usize::from(sums.len() > 1);
    let k = (sums.len() - skip) as f64;
    let mut time_s = Times::default();
    let mut comm_bytes = CommBytes::default();
    for (t, b) in &sums[skip..] {
        time_s.compute += t.compute / k;
        time_s.tp_comm += t.tp_comm / k;
        time_s.cp_comm += t.cp_comm / k;
        time_s.pp_comm += t.pp_comm / k;
        time_s.dp_comm += t.dp_comm / k;
        time_s.bubble += t.bubble / k;
        time_s.optimizer += t.optimizer / k;
        comm_bytes.tp += b.tp / k;
        comm_bytes.pp += b.pp / k;
        comm_bytes.dp += b.dp / k;
        comm_bytes.embedding += b.embedding / k;
        comm_bytes.pp_gather += b.pp_gather / k;
        comm_bytes.cp += b.cp / k;
    }
    let f = std::mem::size_of::<f32>();
    let mut mem = MemoryBytes {
        workspace: staged_peak * f,
        ..Default::default()
    };
    for c in &chunks {
        mem.weights += c.model.layout.total * f;
        mem.optimizer += c.opts.iter().map(|(_, o)| 2 * o.len() * f).sum::<usize>();
        mem.activations += c.model.activation_bytes();
        mem.workspace += c.model.workspace_bytes();
        if zero == 2 {
            mem.grads += c.shard_grads.iter().map(|s| B::len(s) * f).sum::<usize>();
            mem.workspace += c.model.layout.total * f;
        } else {
            mem.grads += c.model.layout.total * f;
        }
    }
    let report = RankReport {
        rank: world.rank(),
        tp: tp_i as u32,
        cp: cp_i as u32,
        dp: dp_i as u32,
        pp: pp_i as u32,
        step_s: step_seconds[skip..].iter().sum::<f64>() / k,
        time_s,
        comm_bytes,
        memory_bytes: mem,
    };
    Ok(RankResult {
        losses,
        grad_norms,
        step_seconds,
        report,
        chunks: chunks
            .into_iter()
            .map(|c| (c.model.part().clone(), c.model.be.download(&c.model.params)))
            .collect(),
    })
}

/// Rank `i`'s 1/n slice of a tensor of `len` elements.
fn slice_of(len: usize, n: usize, i: usize) -> Range<usize> {
    let k = len / n;
    i * k..(i + 1) * k
}

/// Receive one activation (or gradient) tensor: whole, or (given the tp group to gather over)
/// in 1/tp slices, one from each tp rank of the sending stage, all-gathered here.
fn recv_activation(
    recv: &Metered,
    gather: Option<&Metered>,
    from: usize,
    tag: u32,
    slice: &mut [f32],
    whole: &mut [f32],
) -> Result<(), CommError> {
    match gather {
        None => recv.recv(from, tag, whole),
        Some(g) => {
            recv.recv(from, tag, slice)?;
            g.all_gather(slice, whole)
        }
    }
}
