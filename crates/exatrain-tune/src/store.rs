//! The results store: `DIR/search.json` (what is being searched, written once, atomically) and
//! `DIR/trials.jsonl` (one finished trial per line, appended and fsync'd before the search moves
//! on). A crash loses at most the trials that were running; `open` resumes from what is there.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use exatrain_spec::{ParallelConfig, SpecError};
use serde::{Deserialize, Serialize};

use crate::eval::Outcome;

/// One finished trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// Proposal number, from 0.
    pub id: u64,
    pub config: ParallelConfig,
    pub outcome: Outcome,
    /// Wall time of the trial, seconds.
    pub seconds: f64,
}

/// An open results store.
pub struct Store {
    file: File,
    path: PathBuf,
}

const META: &str = "search.json";
const TRIALS: &str = "trials.jsonl";

fn io_err(path: &Path, what: &str, e: std::io::Error) -> SpecError {
    SpecError::new(format!("{}: cannot {what}: {e}", path.display()))
}

/// Write `bytes` to `path` atomically: a temp file in the same folder, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SpecError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| io_err(&tmp, "create", e))?;
    f.write_all(bytes).map_err(|e| io_err(&tmp, "write", e))?;
    f.sync_all().map_err(|e| io_err(&tmp, "sync", e))?;
    fs::rename(&tmp, path).map_err(|e| io_err(path, "rename into place", e))?;
    Ok(())
}

impl Store {
    /// Start a new store in `dir` (created if missing); refuses a folder that already holds one.
    pub fn create<M: Serialize>(dir: &Path, meta: &M) -> Result<Store, SpecError> {
        fs::create_dir_all(dir).map_err(|e| io_err(dir, "create the folder", e))?;
        let trials = dir.join(TRIALS);
        if trials.exists() {
            return Err(SpecError::new(format!(
                "--out {}: a search is already stored there (continue it with --resume {0}, or pick another folder)",
                dir.display()
            )));
        }
        let json = serde_json::to_vec_pretty(meta).expect("meta serializes");
        write_atomic(&dir.join(META), &json)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&trials)
            .map_err(|e| io_err(&trials, "open", e))?;
        Ok(Store { file, path: trials })
    }

    /// Reopen a store: its meta and every finished trial. A last line cut short by a crash is
    /// dropped (and cut from the file); any other unreadable line is an error.
    pub fn open<M: for<'de> Deserialize<'de>>(dir: &Path) -> Result<(Store, M, Vec<Trial>), SpecError> {
        let meta_path = dir.join(META);
        let meta_text =
            fs::read_to_string(&meta_path).map_err(|e| io_err(&meta_path, "read (is this a tune --out folder?)", e))?;
        let meta: M = serde_json::from_str(&meta_text)
            .map_err(|e| SpecError::new(format!("{}: corrupt search description: {e}", meta_path.display())))?;
        let path = dir.join(TRIALS);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err(&path, "open", e))?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| io_err(&path, "read", e))?;
        let mut trials = Vec::new();
        let mut good_len = 0usize;
        let mut offset = 0usize;
        let mut newline_missing = false;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for (i, line) in lines.iter().enumerate() {
            offset += line.len();
            let last = i + 1 == lines.len();
            if line.trim().is_empty() {
                good_len = offset;
                continue;
            }
            match serde_json::from_str::<Trial>(line.trim_end()) {
                Ok(t) => {
                    trials.push(t);
                    good_len = offset;
                    newline_missing = !line.ends_with('\n');
                }
                Err(_) if last && !line.ends_with('\n') => break, // a write torn by a crash
                Err(e) => {
                    return Err(SpecError::new(format!(
                        "{} line {}: corrupt trial record: {e} (fix or remove that line to resume)",
                        path.display(),
                        i + 1
                    )))
                }
            }
        }
        if good_len < text.len() {
            file.set_len(good_len as u64)
                .map_err(|e| io_err(&path, "truncate a torn last line", e))?;
        }
        file.seek(SeekFrom::End(0)).map_err(|e| io_err(&path, "seek", e))?;
        if newline_missing {
            file.write_all(b"\n").map_err(|e| io_err(&path, "append", e))?;
        }
        Ok((Store { file, path }, meta, trials))
    }

    /// Append one trial durably.
    pub fn append(&mut self, t: &Trial) -> Result<(), SpecError> {
        let mut line = serde_json::to_string(t).expect("trial serializes");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| io_err(&self.path, "append", e))?;
        self.file.sync_data().map_err(|e| io_err(&self.path, "sync", e))
    }
}
