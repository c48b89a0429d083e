//! The IO edge of the spec crate: a preset name or a file path → a validated spec.

use std::path::Path;

use crate::{presets, ClusterSpec, ModelFile, ModelSpec, SpecError};

fn read(path: &Path, what: &str) -> Result<String, SpecError> {
    std::fs::read_to_string(path).map_err(|e| SpecError::new(format!("--{what} {}: cannot read: {e}", path.display())))
}

/// A TOML parse error as one line: where it is, the line's text, and what was wrong
/// (`line 45, column 20 (`nics = "x"`): invalid type: string "x", expected u32`). The toml
/// crate's own display spans five lines with a caret under the value.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(span) = e.span() else { return msg };
    let start = span.start.min(text.len());
    let before = &text.as_bytes()[..start];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let column = text[line_start..start].chars().count() + 1;
    let source: String = text[line_start..]
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .chars()
        .take(80)
        .collect();
    if source.is_empty() {
        format!("line {line}, column {column}: {msg}")
    } else {
        format!("line {line}, column {column} (`{source}`): {msg}")
    }
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
        toml::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {}", toml_error(text, &e))))?
    };
    let stem = Path::new(origin).file_stem().and_then(|s| s.to_str()).unwrap_or(origin);
    file.resolve(stem).map_err(|e| SpecError::new(format!("{origin}: {e}")))
}

/// Parse a cluster from TOML or JSON text and validate it.
pub fn cluster_from_str(text: &str, json: bool, origin: &str) -> Result<ClusterSpec, SpecError> {
    let c: ClusterSpec = if json {
        serde_json::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {e}")))?
    } else {
        toml::from_str(text).map_err(|e| SpecError::new(format!("{origin}: {}", toml_error(text, &e))))?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_toml_file_is_one_line_naming_the_line_and_its_text() {
        let cases = [
            (
                "layers = 4\nhidden = \"x\"\n",
                "m.toml: line 2, column 10 (`hidden = \"x\"`): invalid type: string \"x\"",
            ),
            (
                "layers = 4\nhidden = 5\nhidden = 6\n",
                "m.toml: line 3, column 1 (`hidden = 6`): duplicate key `hidden`",
            ),
            (
                "layers = 4\nfoo = 5\n",
                "m.toml: line 2, column 1 (`foo = 5`): unknown field `foo`, expected one of",
            ),
        ];
        for (text, want) in cases {
            let e = model_from_str(text, false, "m.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: got {e}, want {want}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = cluster_from_str("name = \"c\"\n[device]\nhbm_gib = [1\n", false, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.toml: line 4, column 1: invalid array expected `]`"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
