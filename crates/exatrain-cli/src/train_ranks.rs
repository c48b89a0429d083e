//! `exatrain train` over several ranks: one rank's run with its callbacks (progress, checkpoints
//! of the whole model, evaluations, the divergence guard's retraction), in-process ranks
//! (threads, on the CPU or sharing a GPU) and MPI ranks, and the measured report beside the
//! planner's.

use std::path::{Path, PathBuf};

use exatrain_parallel::comm::Communicator;
use exatrain_spec::{load, SpecError};
use exatrain_train::checkpoint;
use exatrain_train::parallel::{self, Options, RankReport, RankResult, Start};
use exatrain_train::{Backend, Cpu};

use crate::run_folder::{self, Progress};
#[cfg(feature = "mpi")]
use crate::train_cmd::resolve;
use crate::train_cmd::{start, summary_line, Given, Run, TrainArgs};

/// The measured breakdown of a parallel run beside the planner's prediction for its layout.
fn report_json(a: &TrainArgs, run: &Run, reports: &[RankReport]) -> Result<serde_json::Value, SpecError> {
    let cluster = load::cluster(&a.cluster)?.for_trainer();
    let (trained, layout) = parallel::as_trained(&run.spec, &run.pc);
    let planned = exatrain_cost::plan(&trained, &cluster, &layout)?;
    let measured = parallel::aggregate(reports);
    Ok(serde_json::json!({
        "tokens_per_s": (run.pc.global_batch as f64 * run.spec.seq_len as f64) / measured.step_s,
        "model": run.spec.name,
        "model_spec": run.spec,
        "layout": run.pc,
        "schedule": run.layout.schedule,
        "cluster": cluster.name,
        "ranks": reports,
        "measured": measured,
        "planned": crate::reports::planned(&planned),
    }))
}

/// `--report FILE`, written atomically (its folder made if missing).
fn write_report(path: &Path, rep: &serde_json::Value) -> Result<(), SpecError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| SpecError::new(format!("--report {}: {e}", path.display())))?;
    }
    exatrain_tune::store::write_atomic(path, serde_json::to_string_pretty(rep).expect("json").as_bytes())
}

/// `--bucket-mb` as fp32 elements.
pub(crate) fn bucket_elems(mb: f64) -> Result<usize, SpecError> {
    if !(mb.is_finite() && (0.0..=1e6).contains(&mb)) {
        return Err(SpecError::new(format!(
            "--bucket-mb {mb}: must be a size in MB in [0, 1e6] (0: one bucket per chunk)"
        )));
    }
    Ok((mb * 1e6 / 4.0) as usize)
}

/// Run this rank of the job: world rank 0 writes the progress and checkpoints (the whole
/// model, so any layout can resume them).
fn run_rank<B: Backend<R = f32> + Clone>(
    be: B,
    a: &TrainArgs,
    run: &Run,
    progress: Option<&Progress>,
    world: &dyn Communicator,
) -> Result<RankResult, SpecError> {
    let flops = exatrain_cost::flops::model_step(&run.spec, run.cfg.global_batch as u32);
    let print = |l: &parallel::StepLine| {
        let line = serde_json::json!({
            "step": l.step, "loss": l.loss, "grad_norm": l.grad_norm, "lr": l.lr, "seconds": l.seconds,
            "tokens_per_s": l.tokens_per_s, "model_tflops": flops / l.seconds / 1e12,
            "val_loss": l.val_loss, "sample": l.sample,
            "ranks": run.pc.gpus(), "tp": run.pc.tp, "pp": run.pc.pp, "dp": run.pc.dp, "zero": run.pc.zero,
        });
        if let Some(p) = progress {
            if let Err(e) = p.step(l.step, &line, summary_line(l.loss, l.lr, l.tokens_per_s)) {
                p.say(format!("warning: {e}"));
            }
            if !a.json {
                if let Some(v) = l.val_loss {
                    p.say(format!(
                        "step {:>5}: train {:.3} | val {v:.3} | {:.0} tok/s",
                        l.step, l.loss, l.tokens_per_s
                    ));
                }
                if let Some(text) = &l.sample {
                    p.say(format!(
                        "  sample: {}{}",
                        run.cfg.sample_prompt,
                        text.replace('\n', " ")
                    ));
                }
            }
        }
    };
    // rank 0 evaluates the gathered whole model as one process would (built at the first use)
    let evaluation: std::sync::Mutex<Option<exatrain_train::train::Evaluation>> = std::sync::Mutex::new(None);
    let eval = |st: &Start| -> Result<(f64, Option<String>), SpecError> {
        let mut e = evaluation
            .lock()
            .map_err(|_| SpecError::new("evaluation: a rank thread panicked"))?;
        if e.is_none() {
            *e = Some(exatrain_train::train::Evaluation::new(&run.spec, &run.cfg, &run.data)?);
        }
        e.as_mut().expect("built").run(&st.params, st.step)
    };
    let save = |st: &Start| -> Result<(), SpecError> {
        let shape = exatrain_train::GptShape::from_spec(&run.spec)?;
        let state = checkpoint::State {
            format: "exatrain-ckpt-v1".into(),
            step: st.step,
            opt_step: st.opt_step,
            sequences: st.step * run.cfg.global_batch as u64,
            seed: run.cfg.seed,
            model: run.spec.clone(),
            config: serde_json::to_value(&run.cfg).expect("json"),
            data_dir: run.data.clone(),
            run: serde_json::to_value(&run.layout).expect("json"),
            min_loss: st.min_loss,
        };
        let layout = exatrain_train::model::ParamLayout::new(&shape);
        let dir = checkpoint::save(
            &run.out,
            &state,
            &layout,
            &st.params,
            &st.m,
            &st.v,
            &run.data.join("tokenizer.json"),
        )?;
        checkpoint::prune(&run.out, run.cfg.keep_last)?;
        if let Some(p) = progress {
            p.say(format!("  checkpoint {}", dir.display()));
        }
        Ok(())
    };
    let checkpoints = !a.no_ckpt;
    let retract = |from: u64| -> Result<Option<PathBuf>, SpecError> {
        if checkpoints {
            checkpoint::retract(&run.out, from)
        } else {
            Ok(None)
        }
    };
    let opts = Options {
        schedule: run.layout.schedule.parse()?,
        start: run.resumed.as_ref().map(|r| r.start.clone()),
        on_checkpoint: if checkpoints { Some(&save) } else { None },
        on_step: Some(&print),
        on_eval: Some(&eval),
        on_diverge: Some(&retract),
    };
    parallel::train_on(be, &run.spec, &run.cfg, &run.pc, &opts, &run.data, world)
}

fn summary(run: &Run, r: &RankResult, seconds: f64) {
    let steps = r.losses.len();
    let tokens = (run.cfg.global_batch * run.spec.seq_len as usize * steps) as f64;
    let m = &r.report.memory_bytes;
    eprintln!(
        "{} ranks ({}): {steps} steps in {seconds:.1} s ({:.0} tokens/s); rank 0 holds MiB: weights {:.2}, grads {:.2}, optimizer {:.2}, activations {:.2}",
        run.pc.gpus(),
        parallel::describe(&run.pc),
        tokens / seconds,
        m.weights as f64 / 1048576.0,
        m.grads as f64 / 1048576.0,
        m.optimizer as f64 / 1048576.0,
        m.activations as f64 / 1048576.0,
    );
}

fn first_step(run: &Run) -> u64 {
    run.resumed.as_ref().map_or(0, |r| r.state.step)
}

/// `--ranks N`: the layout over in-process ranks (threads) on the CPU.
pub(crate) fn run_in_process(a: &TrainArgs, run: &Run) -> Result<(), SpecError> {
    run_folder::check_memory(&run.spec, &run.pc, run.layout.ranks)?;
    start(a, run)?;
    in_process(a, run, vec![Cpu::default(); run.layout.ranks])
}

/// The number of ranks of the run's layout.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn ranks(run: &Run) -> usize {
    run.layout.ranks
}

/// The run over in-process ranks (threads), rank i on backend `backends[i]` (its folder
/// claimed and data prepared already).
pub(crate) fn in_process<B: Backend<R = f32> + Clone + Send>(
    a: &TrainArgs,
    run: &Run,
    backends: Vec<B>,
) -> Result<(), SpecError> {
    let progress = Progress::new(&run.out, first_step(run), run.cfg.steps, a.json)?;
    let n = run.layout.ranks;
    assert_eq!(backends.len(), n, "one backend per rank");
    let comms = exatrain_parallel::comm::in_process(n, std::time::Duration::from_secs_f64(a.comm_timeout));
    let t0 = std::time::Instant::now();
    let results: Vec<Result<RankResult, SpecError>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(backends)
            .map(|(comm, be)| {
                let p = (comm.rank() == 0).then_some(&progress);
                s.spawn(move || run_rank(be, a, run, p, &comm))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    progress.finish();
    // the first error that is not another rank's echo of it
    let mut firsts: Vec<&SpecError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    firsts.sort_by_key(|e| e.0.contains("was aborted"));
    if let Some(e) = firsts.first() {
        return Err((*e).clone());
    }
    let results: Vec<RankResult> = results.into_iter().map(|r| r.expect("checked")).collect();
    if let Some(path) = &a.report {
        let reports: Vec<RankReport> = results.iter().map(|r| r.report.clone()).collect();
        write_report(path, &report_json(a, run, &reports)?)?;
    }
    summary(run, &results[0], t0.elapsed().as_secs_f64());
    Ok(())
}

/// Every rank's report on every rank (JSON text carried as one f32 per byte).
#[cfg(feature = "mpi")]
fn gather_reports(world: &dyn Communicator, mine: &RankReport) -> Result<Vec<RankReport>, SpecError> {
    let text = serde_json::to_vec(mine).expect("json");
    let n = world.size();
    let mut lens = vec![0.0f32; n];
    world
        .all_gather(&[text.len() as f32], &mut lens)
        .map_err(|e| SpecError::new(e.0))?;
    let max = lens.iter().fold(0.0f32, |a, b| a.max(*b)) as usize;
    let mut mine_f = vec![0.0f32; max];
    for (d, b) in mine_f.iter_mut().zip(&text) {
        *d = *b as f32;
    }
    let mut all = vec![0.0f32; max * n];
    world.all_gather(&mine_f, &mut all).map_err(|e| SpecError::new(e.0))?;
    (0..n)
        .map(|r| {
            let bytes: Vec<u8> = all[r * max..r * max + lens[r] as usize]
                .iter()
                .map(|x| *x as u8)
                .collect();
            serde_json::from_slice(&bytes).map_err(|e| SpecError::new(format!("rank {r}'s report: {e}")))
        })
        .collect()
}

/// The settings every rank of an MPI job must agree on, as (flag, value).
#[cfg(feature = "mpi")]
fn settings(a: &TrainArgs, run: &Run) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for x in [serde_json::to_value(&run.cfg), serde_json::to_value(&run.layout)] {
        if let Ok(serde_json::Value::Object(m)) = x {
            for (k, val) in m {
                v.push((format!("--{}", k.replace('_', "-")), val.to_string()));
            }
        }
    }
    v.push(("--model".into(), serde_json::to_string(&run.spec).unwrap_or_default()));
    v.push(("--out".into(), run.out.display().to_string()));
    v.push(("--resume".into(), format!("{:?}", a.resume)));
    v.push(("--data".into(), format!("{:?}", a.data)));
    v.push(("--no-ckpt".into(), a.no_ckpt.to_string()));
    v.push(("--report".into(), format!("{:?}", a.report.is_some())));
    v.push(("--overwrite".into(), a.overwrite.to_string()));
    v
}

/// `--mpi`: this process is one rank of the MPI job; rank 0 prepares the data and prints.
#[cfg(feature = "mpi")]
pub(crate) fn run_mpi(a: &TrainArgs, given: &Given) -> Result<(), SpecError> {
    let timeout = std::time::Duration::from_secs_f64(if a.comm_timeout.is_finite() && a.comm_timeout > 0.0 {
        a.comm_timeout
    } else {
        300.0
    });
    let (_universe, comm) = exatrain_parallel::mpi_comm::Mpi::world(timeout).map_err(|e| SpecError::new(e.0))?;
    let fail = |e: SpecError| -> SpecError {
        comm.abort(&e.0);
        e
    };
    let run = resolve(a, given, Some(comm.size())).map_err(fail)?;
    // every rank must run the same settings: rank 0's digest decides
    crate::agree::agree(&comm, &settings(a, &run)).map_err(fail)?;
    let local = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1usize);
    run_folder::check_memory(&run.spec, &run.pc, local).map_err(fail)?;
    // rank 0 claims the folder and tokenizes (once); the others wait for it
    let progress = if comm.rank() == 0 {
        start(a, &run).map_err(fail)?;
        Some(Progress::new(&run.out, first_step(&run), run.cfg.steps, a.json).map_err(fail)?)
    } else {
        None
    };
    comm.barrier().map_err(|e| SpecError::new(e.0))?;
    let t0 = std::time::Instant::now();
    let r = run_rank(Cpu::default(), a, &run, progress.as_ref(), &comm);
    if let Some(p) = &progress {
        p.finish();
    }
    let r = r?;
    let reports = gather_reports(&comm, &r.report)?;
    if comm.rank() == 0 {
        if let Some(path) = &a.report {
            write_report(path, &report_json(a, &run, &reports)?)?;
        }
        summary(&run, &r, t0.elapsed().as_secs_f64());
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
pub(crate) fn run_mpi(_a: &TrainArgs, _given: &Given) -> Result<(), SpecError> {
    Err(SpecError::new(
        "--mpi: this exatrain was built without MPI (build with `cargo build --release --features exatrain-cli/mpi`; needs libopenmpi-dev and libclang-dev)",
    ))
}
