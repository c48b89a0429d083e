//! The IO edge of the spec crate: a preset name or a file path → a validated spec.

use std::path::Path;

use crate::{presets, ClusterSpec, ModelFile, ModelSpec, SpecError};

fn read(path: &Path, what: &str) -> Result<String, SpecError> {
    std::fs::read_to_string(path).map_err(|e| SpecError::new(format!("--{what} {}: cannot read: {e}", path.display())))
}

fn is_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Parse a model from TOML or JSON text (Calculon's model JSON included). `origin` names the
/// source in error messages.
pub fn model_from_str(text: &str, json: bool, origin: &str) -> Result<ModelSpec, SpecError> {
    let file: ModelFile = if json {
        serde_json::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {e}")))?
    } else {
        toml::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {e}")))?
    };
    let stem = Path::new(origin).file_stem().and_then(|s| s.to_str()).unwrap_or(origin);
    file.resolve(stem).map_err(|e| SpecError::new(format!("{origin}: {e}")))
}

/// Parse a cluster from TOML or JSON text and validate it.
pub fn cluster_from_str(text: &str, json: bool, origin: &str) -> Result<ClusterSpec, SpecError> {
    let c: ClusterSpec = if json {
        serde_json::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {e}")))?
    } else {
        toml::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {e}")))?
    };
    c.validate().map_err(|e| SpecError::new(format!("{origin}: {e}")))?;
    Ok(c)
}

/// `--model NAME|FILE`: a preset name, else a `.toml` / `.json` file.
pub fn model(arg: &str) -> Result<ModelSpec, SpecError> {
    let p = Path::new(arg);
    if p.is_file() {
        return model_from_str(&read(p, "model")?, is_json(p), arg);
    }
    presets::model(arg)
}

/// `--cluster NAME|FILE`: a preset name, else a `.toml` / `.json` file.
pub fn cluster(arg: &str) -> Result<ClusterSpec, SpecError> {
    let p = Path::new(arg);
    if p.is_file() {
        return cluster_from_str(&read(p, "cluster")?, is_json(p), arg);
    }
    presets::cluster(arg)
}
