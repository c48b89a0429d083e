//! Built-in models and clusters, parsed from the TOML files in `presets/` (which cite the source of
//! every number).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::{ClusterSpec, ModelFile, ModelSpec, SpecError};

const MODELS_TOML: &str = include_str!("../presets/models.toml");
const CLUSTERS_TOML: &str = include_str!("../presets/clusters.toml");

fn models() -> &'static BTreeMap<String, ModelSpec> {
    static M: OnceLock<BTreeMap<String, ModelSpec>> = OnceLock::new();
    M.get_or_init(|| {
        let raw: BTreeMap<String, ModelFile> =
            toml::from_str(MODELS_TOML).expect("presets/models.toml is valid (tested)");
        raw.into_iter()
            .map(|(k, f)| {
                let spec = f.resolve(&k).expect("every model preset resolves (tested)");
                (k, spec)
            })
            .collect()
    })
}

fn clusters() -> &'static BTreeMap<String, ClusterSpec> {
    static C: OnceLock<BTreeMap<String, ClusterSpec>> = OnceLock::new();
    C.get_or_init(|| toml::from_str(CLUSTERS_TOML).expect("presets/clusters.toml is valid (tested)"))
}

/// Names of the model presets, sorted.
pub fn model_names() -> Vec<&'static str> {
    models().keys().map(String::as_str).collect()
}

/// Names of the cluster presets, sorted.
pub fn cluster_names() -> Vec<&'static str> {
    clusters().keys().map(String::as_str).collect()
}

/// A model preset by name.
pub fn model(name: &str) -> Result<ModelSpec, SpecError> {
    models().get(name).cloned().ok_or_else(|| {
        SpecError::new(format!(
            "--model {name} is not a preset or a file (known presets: {})",
            model_names().join(", ")
        ))
    })
}

/// A cluster preset by name.
pub fn cluster(name: &str) -> Result<ClusterSpec, SpecError> {
    clusters().get(name).cloned().ok_or_else(|| {
        SpecError::new(format!(
            "--cluster {name} is not a preset or a file (known presets: {})",
            cluster_names().join(", ")
        ))
    })
}
