//! Evaluators: what a trial of a layout measures. The search maximizes `value` (a throughput).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use exatrain_cost::plan;
use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig, SpecError};
use serde::{Deserialize, Serialize};

/// How one trial ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// It ran; `value` is its throughput (larger is better).
    Ok { value: f64 },
    /// It ran out of device memory.
    OutOfMemory { message: String },
    /// It crashed, printed no number, or could not start.
    Failed { message: String },
    /// It ran past the time limit and was killed.
    Timeout { seconds: f64 },
}

impl Outcome {
    pub fn value(&self) -> Option<f64> {
        match self {
            Outcome::Ok { value } => Some(*value),
            _ => None,
        }
    }

    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Outcome::OutOfMemory { .. })
    }
}

/// Something that measures a layout. Implementations must be safe to call from several worker
/// threads at once (`--parallel-trials q`).
pub trait Evaluator: Sync {
    fn evaluate(&self, cfg: &ParallelConfig, trial: u64) -> Outcome;
}

/// The cost model as a black box: predicted tokens/s, or out of memory when it does not fit.
pub struct CostModel<'a> {
    pub model: &'a ModelSpec,
    pub cluster: &'a ClusterSpec,
}

impl Evaluator for CostModel<'_> {
    fn evaluate(&self, cfg: &ParallelConfig, _trial: u64) -> Outcome {
        match plan(self.model, self.cluster, cfg) {
            Ok(p) if p.fits => Outcome::Ok { value: p.tokens_per_s },
            Ok(p) => Outcome::OutOfMemory {
                message: format!(
                    "predicted {:.1} GiB > {:.1} GiB",
                    p.memory_bytes.total / 1073741824.0,
                    p.capacity_bytes / 1073741824.0
                ),
            },
            Err(e) => Outcome::Failed { message: e.to_string() },
        }
    }
}

/// Placeholders a command template may use.
pub const PLACEHOLDERS: &[&str] = &[
    "gpus",
    "nodes",
    "tp",
    "pp",
    "cp",
    "dp",
    "micro_batch",
    "global_batch",
    "zero",
    "recompute",
    "sequence_parallel",
    "virtual_stages",
    "flash_attention",
    "dtype",
    "order",
    "trial",
];

/// A template cut into literal text and `{name}` placeholders; `{{` and `}}` are literal braces
/// (so a command can print JSON). `what` names the template in errors.
enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Field(&'a str),
}

fn pieces<'a>(template: &'a str, what: &str) -> Result<Vec<Piece<'a>>, SpecError> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push(Piece::Text(&rest[..i]));
        let after = &rest[i + 1..];
        if rest[i..].starts_with("{{") || rest[i..].starts_with("}}") {
            out.push(Piece::Brace(rest.as_bytes()[i] as char));
            rest = &after[1..];
            continue;
        }
        if rest.as_bytes()[i] == b'}' {
            return Err(SpecError::new(format!(
                "{what}: unmatched '}}' in `{template}` (write '}}}}' for a literal brace)"
            )));
        }
        let Some(close) = after.find('}') else {
            return Err(SpecError::new(format!(
                "{what}: unclosed '{{' in `{template}` (write '{{{{' for a literal brace)"
            )));
        };
        let name = &after[..close];
        if !PLACEHOLDERS.contains(&name) {
            return Err(SpecError::new(format!(
                "{what}: unknown placeholder {{{name}}} (allowed: {}; '{{{{' and '}}}}' are literal braces)",
                PLACEHOLDERS
                    .iter()
                    .map(|p| format!("{{{p}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        out.push(Piece::Field(name));
        rest = &after[close + 1..];
    }
    out.push(Piece::Text(rest));
    Ok(out)
}

/// Every `{name}` in `template` is one of [`PLACEHOLDERS`].
fn check_placeholders(template: &str, what: &str) -> Result<(), SpecError> {
    pieces(template, what).map(|_| ())
}

/// Where the throughput is in a command's output.
#[derive(Debug, Clone)]
pub enum Metric {
    /// The last line that is a JSON object with this numeric key.
    JsonKey(String),
    /// The last match of this regex; its first capture group (or the whole match) is the number.
    Regex(regex::Regex),
    /// The number at JSON `pointer` (e.g. `/tokens_per_s`) in the file the trial wrote at `path`
    /// (a template with the command's placeholders, e.g. `runs/{trial}/report.json`).
    JsonFile { path: String, pointer: String },
}

/// An external command per trial, e.g.
/// `srun -N {nodes} ./pretrain.sh --tp {tp} --pp {pp} --mbs {micro_batch}`, run with `sh -c`.
pub struct CommandEval {
    template: String,
    devices_per_node: u32,
    timeout: Duration,
    metric: Metric,
}

impl CommandEval {
    /// Check the template's placeholders up front.
    pub fn new(template: &str, devices_per_node: u32, timeout: Duration, metric: Metric) -> Result<Self, SpecError> {
        check_placeholders(template, "--eval-cmd")?;
        if let Metric::JsonFile { path, .. } = &metric {
            check_placeholders(path, "the report path")?;
        }
        if timeout.is_zero() {
            return Err(SpecError::new("--timeout must be positive"));
        }
        Ok(CommandEval {
            template: template.to_string(),
            devices_per_node: devices_per_node.max(1),
            timeout,
            metric,
        })
    }

    /// The command line for one trial.
    pub fn render(&self, c: &ParallelConfig, trial: u64) -> String {
        self.fill(&self.template, c, trial)
    }

    /// `template` with the placeholders of one trial filled in.
    fn fill(&self, template: &str, c: &ParallelConfig, trial: u64) -> String {
        let b = |x: bool| if x { "1" } else { "0" }.to_string();
        let values = [
            ("gpus", c.gpus().to_string()),
            ("nodes", c.gpus().div_ceil(self.devices_per_node).to_string()),
            ("tp", c.tp.to_string()),
            ("pp", c.pp.to_string()),
            ("cp", c.cp.to_string()),
            ("dp", c.dp.to_string()),
            ("micro_batch", c.micro_batch.to_string()),
            ("global_batch", c.global_batch.to_string()),
            ("zero", c.zero.to_string()),
            ("recompute", c.recompute.to_string()),
            ("sequence_parallel", b(c.sequence_parallel)),
            ("virtual_stages", c.virtual_stages.to_string()),
            ("flash_attention", b(c.flash_attention)),
            ("dtype", c.dtype.as_str().to_string()),
            ("order", c.order.to_string()),
            ("trial", trial.to_string()),
        ];
        let Ok(parts) = pieces(template, "template") else {
            return template.to_string(); // checked in `new`
        };
        let mut s = String::with_capacity(template.len());
        for p in parts {
            match p {
                Piece::Text(t) => s.push_str(t),
                Piece::Brace(c) => s.push(c),
                Piece::Field(k) => s.push_str(values.iter().find(|(n, _)| *n == k).map_or("", |(_, v)| v.as_str())),
            }
        }
        s
    }

    fn parse(&self, out: &str, c: &ParallelConfig, trial: u64) -> Option<f64> {
        match &self.metric {
            Metric::JsonFile { path, pointer } => {
                let text = std::fs::read_to_string(self.fill(path, c, trial)).ok()?;
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                v.pointer(pointer)?.as_f64()
            }
            Metric::JsonKey(key) => out.lines().rev().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l.trim()).ok()?;
                v.get(key)?.as_f64()
            }),
            Metric::Regex(re) => re.captures_iter(out).last().and_then(|c| {
                c.get(1)
                    .or_else(|| c.get(0))
                    .and_then(|m| m.as_str().trim().parse::<f64>().ok())
            }),
        }
    }
}

/// "CUDA out of memory", "HIP out of memory", "OutOfMemoryError", or the word "OOM".
pub fn looks_like_oom(s: &str) -> bool {
    let l = s.to_ascii_lowercase();
    l.contains("out of memory")
        || l.contains("outofmemory")
        || s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "OOM")
}

/// How a shell command ended.
pub enum Ran {
    /// It exited: whether successfully, its exit code, stdout, stderr.
    Exited {
        success: bool,
        code: Option<i32>,
        out: String,
        err: String,
    },
    /// It ran past the limit; its process group was killed.
    TimedOut,
    /// It could not start.
    NotStarted(String),
}

/// Run `line` with `sh -c` in `cwd` with `env` added, in its own process group (killed as a
/// whole on timeout, on the tuner's SIGINT/SIGTERM, and by the parent-death signal if the tuner
/// dies), capturing its output.
pub fn run_shell(line: &str, cwd: Option<&std::path::Path>, env: &[(String, String)], timeout: Duration) -> Ran {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(line)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    #[cfg(target_os = "linux")]
    {
        // SAFETY: between fork and exec only async-signal-safe calls: prctl and getppid.
        // The trial gets SIGKILL when the tuner dies (even by kill -9); if the tuner is
        // already gone, it does not start.
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(format!("cannot start `{line}`: {e}")),
    };
    let _running = running::Running::add(child.id() as i32);
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if start.elapsed() >= timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Ran::NotStarted(format!("waiting for `{line}`: {e}")),
        }
    };
    let Some(status) = status else {
        // Kill the whole process group, so grandchildren release the pipes too.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", child.id())])
            .status();
        let _ = child.kill();
        let _ = child.wait();
        let _ = out_t.join();
        let _ = err_t.join();
        return Ran::TimedOut;
    };
    Ran::Exited {
        success: status.success(),
        code: status.code(),
        out: out_t.join().unwrap_or_default(),
        err: err_t.join().unwrap_or_default(),
    }
}

impl Ran {
    /// (success, exit code, stdout, stderr), or the trial's outcome when it did not exit.
    pub fn exited(self, timeout: Duration) -> Result<(bool, Option<i32>, String, String), Outcome> {
        match self {
            Ran::Exited {
                success,
                code,
                out,
                err,
            } => Ok((success, code, out, err)),
            Ran::TimedOut => Err(Outcome::Timeout {
                seconds: timeout.as_secs_f64(),
            }),
            Ran::NotStarted(message) => Err(Outcome::Failed { message }),
        }
    }
}

/// The last lines of `text`, joined (what a failed trial reports).
pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

impl Evaluator for CommandEval {
    fn evaluate(&self, cfg: &ParallelConfig, trial: u64) -> Outcome {
        let line = self.render(cfg, trial);
        let (success, code, out, err) = match run_shell(&line, None, &[], self.timeout).exited(self.timeout) {
            Ok(r) => r,
            Err(outcome) => return outcome,
        };
        let all = format!("{out}\n{err}");
        if !success {
            let tail = tail(&err, 3);
            if looks_like_oom(&all) {
                return Outcome::OutOfMemory { message: tail };
            }
            return Outcome::Failed {
                message: format!("exit {}: {tail}", code.map_or("signal".into(), |c| c.to_string())),
            };
        }
        match self.parse(&all, cfg, trial) {
            Some(v) if v.is_finite() => Outcome::Ok { value: v },
            _ => Outcome::Failed {
                message: match &self.metric {
                    Metric::JsonKey(k) => {
                        format!("no JSON line with a numeric \"{k}\" in the output")
                    }
                    Metric::Regex(r) => {
                        format!("no number matching /{}/ in the output", r.as_str())
                    }
                    Metric::JsonFile { path, pointer } => {
                        format!("no number at {pointer} in {}", self.fill(path, cfg, trial))
                    }
                },
            },
        }
    }
}

/// The process groups of the trials running now, killed when the tuner gets SIGINT or SIGTERM
/// (a trial's group is its own, so the terminal's signal does not reach it).
mod running {
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Once;

    const SLOTS: usize = 256;
    static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
    static INSTALL: Once = Once::new();

    extern "C" fn on_signal(sig: libc::c_int) {
        for g in &GROUPS {
            let pg = g.load(Ordering::SeqCst);
            if pg > 0 {
                // SAFETY: kill and _exit are async-signal-safe.
                unsafe { libc::kill(-pg, libc::SIGKILL) };
            }
        }
        unsafe { libc::_exit(128 + sig) };
    }

    /// A running trial's process group, registered while it lives.
    pub struct Running(Option<usize>);

    impl Running {
        pub fn add(pgid: i32) -> Running {
            INSTALL.call_once(|| {
                // SAFETY: the handler only reads atomics and calls async-signal-safe functions.
                unsafe {
                    libc::signal(
                        libc::SIGINT,
                        on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
                    );
                    libc::signal(
                        libc::SIGTERM,
                        on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
                    );
                }
            });
            let slot = GROUPS
                .iter()
                .position(|g| g.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst).is_ok());
            Running(slot)
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(i) = self.0 {
                GROUPS[i].store(0, Ordering::SeqCst);
            }
        }
    }
}
