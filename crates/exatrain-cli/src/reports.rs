//! Reading `exatrain train --report` files: for `fidelity` (term by term) and `calibrate --fit`
//! (the measured time terms a fit needs), with the checks that a report is what it claims.

use std::path::{Path, PathBuf};

use exatrain_cost::fit::Measured;
use exatrain_cost::Times;
use exatrain_spec::{load, ClusterSpec, ModelSpec, ParallelConfig, SpecError};
use serde_json::Value;

/// The report files `path` names: one file, or every `.json` in a folder (sorted).
pub fn files(path: &Path, flag: &str) -> Result<Vec<PathBuf>, SpecError> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| SpecError::new(format!("{flag} {}: {e}", path.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") || crate::framework_logs::is_log(p))
            .collect();
        v.sort();
        v
    } else if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        return Err(SpecError::new(format!(
            "{flag} {}: no such file or folder",
            path.display()
        )));
    };
    if files.is_empty() {
        return Err(SpecError::new(format!(
            "{flag} {}: no .json reports (write them with `exatrain train --report FILE`) and no framework logs (.log, .out, .txt)",
            path.display()
        )));
    }
    Ok(files)
}

/// Each file's (name, JSON).
pub fn read(files: &[PathBuf]) -> Result<Vec<(String, Value)>, SpecError> {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).map_err(|e| SpecError::new(format!("{}: {e}", f.display())))?;
            let v: Value =
                serde_json::from_str(&text).map_err(|e| SpecError::new(format!("{}: not JSON: {e}", f.display())))?;
            let name = f.file_stem().map_or("run".into(), |s| s.to_string_lossy().into_owned());
            Ok((name, v))
        })
        .collect()
}

fn field<T: serde::de::DeserializeOwned>(name: &str, v: &Value, ptr: &str) -> Result<T, SpecError> {
    let x = v.pointer(ptr).ok_or_else(|| {
        SpecError::new(format!(
            "report {name}: no `{ptr}` (not an `exatrain train --report` file?)"
        ))
    })?;
    serde_json::from_value(x.clone()).map_err(|e| SpecError::new(format!("report {name}: `{ptr}`: {e}")))
}

/// The model (the full spec the report carries, else its name resolved) and the layout, as the
/// planner should see them for this trainer (fp32, no dropout).
pub fn planned_setup(name: &str, v: &Value) -> Result<(ModelSpec, ParallelConfig), SpecError> {
    let model: ModelSpec = match v.get("model_spec") {
        Some(m) => serde_json::from_value(m.clone())
            .map_err(|e| SpecError::new(format!("report {name}: `model_spec`: {e}")))?,
        None => load::model(&field::<String>(name, v, "/model")?)?,
    };
    let layout: ParallelConfig = field(name, v, "/layout")?;
    Ok(exatrain_train::parallel::as_trained(&model, &layout))
}

/// A report's `planned` section: the planner's figures under the names the trainer measures.
pub fn planned(p: &exatrain_cost::Plan) -> Value {
    serde_json::json!({
        "step_time_s": p.step_time_s,
        "time_s": p.time_s,
        "comm_bytes": p.comm_bytes,
        "memory_bytes": p.memory_bytes,
    })
}

/// Replace the report's `planned` figures by the planner's under `cluster`.
pub fn replan(name: &str, v: &mut Value, cluster: &ClusterSpec) -> Result<(), SpecError> {
    let (model, layout) = planned_setup(name, v)?;
    let cluster = &cluster.for_trainer();
    let p = exatrain_cost::plan(&model, cluster, &layout).map_err(|e| SpecError::new(format!("report {name}: {e}")))?;
    v["planned"] = planned(&p);
    v["cluster"] = serde_json::json!(cluster.name);
    Ok(())
}

/// The measured run a fit uses, after checking that the report is what it claims: one rank
/// report per device of its layout, of `model` when given, and the bytes its collectives moved
/// equal to what the planner counts for that layout (bytes depend on nothing else).
pub fn measured(name: &str, v: &Value, model: Option<&str>) -> Result<Measured, SpecError> {
    let (spec, layout) = planned_setup(name, v)?;
    if let Some(m) = model {
        if spec.name != m {
            return Err(SpecError::new(format!(
                "report {name}: is a run of model `{}`, not `{m}` as --model says",
                spec.name
            )));
        }
    }
    let ranks = v.get("ranks").and_then(|r| r.as_array()).map_or(0, |r| r.len());
    if ranks != layout.gpus() as usize {
        return Err(SpecError::new(format!(
            "report {name}: {ranks} rank reports for a layout of {} ranks ({})",
            layout.gpus(),
            layout.grid()
        )));
    }
    let any = exatrain_spec::presets::cluster("frontier")?.for_trainer();
    let p = exatrain_cost::plan(&spec, &any, &layout).map_err(|e| SpecError::new(format!("report {name}: {e}")))?;
    for (kind, planned) in [
        ("tp", p.comm_bytes.tp),
        ("pp", p.comm_bytes.pp),
        ("dp", p.comm_bytes.dp),
        ("cp", p.comm_bytes.cp),
    ] {
        // reports from before context parallelism have no cp bytes: none were moved
        let got: f64 = match (kind, v.pointer("/measured/comm_bytes/cp")) {
            ("cp", None) => 0.0,
            _ => field(name, v, &format!("/measured/comm_bytes/{kind}"))?,
        };
        if (got - planned).abs() > 0.01 * planned.max(1.0) {
            return Err(SpecError::new(format!(
                "report {name}: its {kind} collectives moved {got:.0} bytes per step, its layout moves {planned:.0}: \
                 the report is not of the model and layout it names"
            )));
        }
    }
    let time_s: Times = field(name, v, "/measured/time_s")?;
    Ok(Measured {
        name: name.to_string(),
        model: spec,
        layout,
        time_s,
        step_s: None,
        stack: exatrain_cost::fit::RunStack::Trainer,
        switches: Default::default(),
    })
}
