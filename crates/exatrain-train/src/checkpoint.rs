//! Checkpoints: `ckpt-NNNNNN/` holding `model.safetensors` (parameters), `optimizer.safetensors`
//! (AdamW moments), `state.json` (step, optimizer step, sequences drawn, the run's config and
//! model) and the tokenizer. Written into `ckpt-NNNNNN.tmp/`, fsync'd, then renamed; `latest`
//! names the newest, replaced atomically. Loading checks every tensor's name, type and size, so a
//! truncated or corrupt checkpoint is rejected whole, never half-loaded. The data folder is stored
//! relative to the run folder when it lies inside it (else absolute), so a run resumes from any
//! working directory. `retract` takes back checkpoints a diverged run wrote after its last good
//! loss (renamed `*.diverged`, never deleted); `prune` keeps the newest N.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use exatrain_spec::{ModelSpec, SpecError};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::model::ParamLayout;

/// What a checkpoint remembers besides tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub format: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// AdamW's bias-correction step.
    pub opt_step: u64,
    /// Training sequences drawn so far (the sampler's position).
    pub sequences: u64,
    pub seed: u64,
    pub model: ModelSpec,
    pub config: serde_json::Value,
    /// The tokenized data: relative to the run folder (the checkpoint's parent) or absolute;
    /// `load` returns it resolved.
    pub data_dir: PathBuf,
    /// The run's layout and engine settings (the CLI's, as JSON), so a resume keeps them.
    #[serde(default)]
    pub run: serde_json::Value,
    /// The lowest training loss seen so far (the divergence guard's reference).
    #[serde(default)]
    pub min_loss: Option<f64>,
}

/// `data` as stored in a checkpoint of the run folder `out`: relative when inside it.
fn portable(data: &Path, out: &Path) -> PathBuf {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (d, o) = (abs(data), abs(out));
    match d.strip_prefix(&o) {
        Ok(rel) => rel.to_path_buf(),
        Err(_) => d,
    }
}

/// A stored data path made usable: relative to the run folder, or (checkpoints written before
/// paths were stored relative to it) to the working directory.
fn resolved_data(stored: &Path, ckpt_dir: &Path) -> PathBuf {
    if stored.is_absolute() {
        return stored.to_path_buf();
    }
    let run = ckpt_dir.parent().unwrap_or(Path::new("."));
    let inside = run.join(stored);
    if inside.join("data.json").is_file() || !stored.join("data.json").is_file() {
        inside
    } else {
        stored.to_path_buf()
    }
}

fn err(what: impl std::fmt::Display) -> SpecError {
    SpecError::new(what.to_string())
}

fn to_bytes(x: &[f32]) -> Vec<u8> {
    let mut v = Vec::with_capacity(x.len() * 4);
    for f in x {
        v.extend_from_slice(&f.to_le_bytes());
    }
    v
}

/// Write named f32 tensors (name, shape, values) to a safetensors file and fsync it.
pub fn write_tensors(path: &Path, tensors: &[(String, Vec<usize>, &[f32])]) -> Result<(), SpecError> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| to_bytes(t.2)).collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            Ok((
                t.0.clone(),
                TensorView::new(Dtype::F32, t.1.clone(), b).map_err(|e| err(format!("{}: {e}", t.0)))?,
            ))
        })
        .collect::<Result<_, SpecError>>()?;
    let data = safetensors::serialize(views, &None::<HashMap<String, String>>)
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    let mut f = File::create(path).map_err(|e| err(format!("{}: cannot create: {e}", path.display())))?;
    f.write_all(&data)
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    f.sync_all().map_err(|e| err(format!("{}: {e}", path.display())))
}

/// Read the named tensors of `layout` into `dst` (prefixing names with `prefix`).
fn read_into(
    st: &SafeTensors,
    prefix: &str,
    layout: &ParamLayout,
    dst: &mut [f32],
    origin: &Path,
) -> Result<(), SpecError> {
    for (name, r) in layout.named() {
        let key = format!("{prefix}{name}");
        let t = st.tensor(&key).map_err(|_| {
            err(format!(
                "{}: corrupt checkpoint: tensor {key} is missing",
                origin.display()
            ))
        })?;
        if t.dtype() != Dtype::F32 || t.data().len() != r.len() * 4 {
            return Err(err(format!(
                "{}: corrupt checkpoint: tensor {key} has {} bytes of {:?}, expected {} f32 (does the model match?)",
                origin.display(),
                t.data().len(),
                t.dtype(),
                r.len()
            )));
        }
        for (d, c) in dst[r].iter_mut().zip(t.data().chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    Ok(())
}

fn named_views<'a>(layout: &ParamLayout, prefix: &str, buf: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
    layout
        .named()
        .into_iter()
        .map(|(n, r)| (format!("{prefix}{n}"), vec![r.len()], &buf[r]))
        .collect()
}

/// Save a checkpoint for `state.step` into `out`; returns its folder.
pub fn save(
    out: &Path,
    state: &State,
    layout: &ParamLayout,
    params: &[f32],
    m: &[f32],
    v: &[f32],
    tokenizer: &Path,
) -> Result<PathBuf, SpecError> {
    let name = format!("ckpt-{:06}", state.step);
    let dir = out.join(&name);
    let tmp = out.join(format!("{name}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| err(format!("--out {}: cannot create: {e}", tmp.display())))?;
    write_tensors(&tmp.join("model.safetensors"), &named_views(layout, "", params))?;
    let mut opt = named_views(layout, "m.", m);
    opt.extend(named_views(layout, "v.", v));
    write_tensors(&tmp.join("optimizer.safetensors"), &opt)?;
    let st = tmp.join("state.json");
    let mut f = File::create(&st).map_err(|e| err(format!("{}: {e}", st.display())))?;
    let stored = State {
        data_dir: portable(&state.data_dir, out),
        ..state.clone()
    };
    f.write_all(serde_json::to_string_pretty(&stored).expect("json").as_bytes())
        .map_err(|e| err(format!("{}: {e}", st.display())))?;
    f.sync_all().map_err(|e| err(format!("{}: {e}", st.display())))?;
    std::fs::copy(tokenizer, tmp.join("tokenizer.json")).map_err(|e| err(format!("{}: {e}", tokenizer.display())))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    set_latest(out, Some(&name))?;
    Ok(dir)
}

/// Point `out/latest` at `name` (written to a temporary file and renamed), or remove it.
fn set_latest(out: &Path, name: Option<&str>) -> Result<(), SpecError> {
    let latest = out.join("latest");
    let Some(name) = name else {
        return match std::fs::remove_file(&latest) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(format!("{}: {e}", latest.display()))),
            _ => Ok(()),
        };
    };
    let latest_tmp = out.join("latest.tmp");
    let mut f = File::create(&latest_tmp).map_err(|e| err(format!("{}: {e}", latest_tmp.display())))?;
    f.write_all(name.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| err(format!("{}: {e}", latest_tmp.display())))?;
    std::fs::rename(&latest_tmp, &latest).map_err(|e| err(format!("{}: {e}", out.display())))
}

/// The finished checkpoints in run folder `out`, oldest first, as (step, folder name).
pub fn list(out: &Path) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("ckpt-")?.parse::<u64>().ok()?;
            e.path().join("state.json").is_file().then_some((step, name))
        })
        .collect();
    v.sort();
    v
}

/// Take back the checkpoints of `out` at step `from` and later (a diverged run's: their
/// parameters gave the bad loss): each is renamed `ckpt-NNNNNN.diverged` (kept for inspection,
/// never deleted) and `latest` moves to the newest earlier one, or is removed if there is none.
/// Returns the folder `latest` names now.
pub fn retract(out: &Path, from: u64) -> Result<Option<PathBuf>, SpecError> {
    let all = list(out);
    let good = all.iter().rev().find(|(s, _)| *s < from).map(|(_, n)| n.clone());
    set_latest(out, good.as_deref())?;
    for (_, name) in all.iter().filter(|(s, _)| *s >= from) {
        let bad = out.join(format!("{name}.diverged"));
        let _ = std::fs::remove_dir_all(&bad);
        std::fs::rename(out.join(name), &bad).map_err(|e| err(format!("{}: {e}", bad.display())))?;
    }
    Ok(good.map(|n| out.join(n)))
}

/// Keep the newest `keep` checkpoints of `out` (0: all) and never the one `latest` names;
/// each older one is renamed away first, so a crash leaves whole checkpoints or none.
pub fn prune(out: &Path, keep: usize) -> Result<(), SpecError> {
    if keep == 0 {
        return Ok(());
    }
    let latest = std::fs::read_to_string(out.join("latest")).unwrap_or_default();
    let all = list(out);
    for (_, name) in all.iter().rev().skip(keep) {
        if *name == latest.trim() {
            continue;
        }
        let gone = out.join(format!("{name}.deleting"));
        std::fs::rename(out.join(name), &gone).map_err(|e| err(format!("{}: {e}", gone.display())))?;
        std::fs::remove_dir_all(&gone).map_err(|e| err(format!("{}: {e}", gone.display())))?;
    }
    Ok(())
}

/// A checkpoint folder, or a run folder whose `latest` names one.
pub fn resolve(path: &Path) -> Result<PathBuf, SpecError> {
    if path.join("state.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("latest");
    let name = std::fs::read_to_string(&latest).map_err(|_| {
        err(format!(
            "{}: neither a checkpoint (state.json) nor a run folder with a `latest` checkpoint",
            path.display()
        ))
    })?;
    Ok(path.join(name.trim()))
}

/// Adam's first and second moments, whole-model order.
pub type Moments = (Vec<f32>, Vec<f32>);

/// Read a checkpoint's state and parameters (and, when asked, the optimizer moments).
pub fn load(dir: &Path, with_optimizer: bool) -> Result<(State, Vec<f32>, Option<Moments>), SpecError> {
    let sp = dir.join("state.json");
    let text = std::fs::read_to_string(&sp).map_err(|e| err(format!("{}: cannot read: {e}", sp.display())))?;
    let mut state: State =
        serde_json::from_str(&text).map_err(|e| err(format!("{}: corrupt checkpoint state: {e}", sp.display())))?;
    state.data_dir = resolved_data(&state.data_dir, dir);
    let shape = crate::GptShape::from_spec(&state.model)?;
    let layout = ParamLayout::new(&shape);
    let read = |file: &str| -> Result<Vec<u8>, SpecError> {
        let p = dir.join(file);
        std::fs::read(&p).map_err(|e| err(format!("{}: cannot read: {e}", p.display())))
    };
    let mbytes = read("model.safetensors")?;
    let st = SafeTensors::deserialize(&mbytes).map_err(|e| {
        err(format!(
            "{}: corrupt checkpoint: {e}",
            dir.join("model.safetensors").display()
        ))
    })?;
    let mut params = vec![0.0f32; layout.total];
    read_into(&st, "", &layout, &mut params, &dir.join("model.safetensors"))?;
    let opt = if with_optimizer {
        let obytes = read("optimizer.safetensors")?;
        let ot = SafeTensors::deserialize(&obytes).map_err(|e| {
            err(format!(
                "{}: corrupt checkpoint: {e}",
                dir.join("optimizer.safetensors").display()
            ))
        })?;
        let (mut m, mut v) = (vec![0.0f32; layout.total], vec![0.0f32; layout.total]);
        read_into(&ot, "m.", &layout, &mut m, &dir.join("optimizer.safetensors"))?;
        read_into(&ot, "v.", &layout, &mut v, &dir.join("optimizer.safetensors"))?;
        Some((m, v))
    } else {
        None
    };
    Ok((state, params, opt))
}
