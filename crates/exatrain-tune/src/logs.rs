//! Framework logs as measurements: the iteration lines of Megatron-LM and Megatron-DeepSpeed and
//! the step lines of torchtitan, read into step times (plus TFLOP/s, memory, out-of-memory), and
//! Megatron's argument dump into the layout the run used. Pure text in, values out: the files
//! are read at the CLI's edge.
//!
//! Formats, as the frameworks print them:
//! - Megatron-LM (`training_log`): ` [2026-08-22 12:00:00.000000] iteration       10/     100 |
//!   consumed samples: ... | elapsed time per iteration (ms): 1234.5 | throughput per GPU
//!   (TFLOP/s/GPU): 123.4 | learning rate: ... | global batch size:    64 | lm loss: ... |`
//! - Megatron-DeepSpeed: the same without the time stamp, with `consumed tokens:` and
//!   `TFLOPs: 123.45 |`.
//! - torchtitan (`MetricsProcessor.log`): `step: 10  loss:  7.12345  grad_norm:  1.2345  memory:
//!   23.45GiB(29.67%)  tps: 1,234  tflops: 123.45  mfu: 12.34%` (possibly with ANSI colours);
//!   `tps` is tokens per second per device.
//! - Megatron's arguments: `  tensor_model_parallel_size ........ 8` between
//!   `---- arguments ----` lines; ` > padded vocab (size: 50257) with 943 dummy tokens (new size: 51200)`;
//!   `[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 2345.6 | ...`.

use std::collections::BTreeMap;

/// Which framework wrote a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    MegatronLm,
    MegatronDeepspeed,
    Torchtitan,
}

impl std::fmt::Display for LogFormat {
    /// The framework's name as the command line spells it (`megatron-lm`, …).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::MegatronLm => "megatron-lm",
            LogFormat::MegatronDeepspeed => "megatron-deepspeed",
            LogFormat::Torchtitan => "torchtitan",
        })
    }
}

/// One logged iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Iteration {
    pub step: u64,
    /// Wall time per step, seconds (Megatron: its elapsed time per iteration; torchtitan: from
    /// tokens per second per device, see [`FrameworkLog::step_times`]).
    pub step_time_s: Option<f64>,
    /// torchtitan's tokens per second per device.
    pub tokens_per_s_per_device: Option<f64>,
    /// The framework's own model TFLOP/s per device.
    pub tflops: Option<f64>,
    pub global_batch: Option<u32>,
    pub loss: Option<f64>,
}

/// What a log says.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameworkLog {
    pub format: LogFormat,
    pub iterations: Vec<Iteration>,
    /// Megatron's argument dump (name → printed value).
    pub args: BTreeMap<String, String>,
    /// The padded vocabulary Megatron built.
    pub padded_vocab: Option<u32>,
    /// Peak device memory the framework reported, bytes.
    pub max_memory_bytes: Option<f64>,
    /// The run died of an out-of-memory error.
    pub out_of_memory: bool,
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number after `key` (up to the next `|` or two spaces), without thousands separators.
fn number_after(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(rest.len());
    let v: f64 = rest[..end].replace(',', "").parse().ok()?;
    v.is_finite().then_some(v)
}

const OOM: [&str; 4] = [
    "CUDA out of memory",
    "HIP out of memory",
    "OutOfMemoryError",
    "out of memory. Tried to allocate",
];

/// Read a log. Errors name what was expected when no format is recognized.
pub fn parse(text: &str) -> Result<FrameworkLog, String> {
    let mut iterations = Vec::new();
    let mut args = BTreeMap::new();
    let mut in_args = false;
    let mut format = None;
    let mut padded_vocab = None;
    let mut max_memory_mb: Option<f64> = None;
    let mut out_of_memory = false;
    for raw in text.lines() {
        let line = strip_ansi(raw);
        if OOM.iter().any(|k| line.contains(k)) {
            out_of_memory = true;
        }
        if line.contains("---- arguments ----") || line.contains("-- arguments --") {
            in_args = true;
            continue;
        }
        if in_args {
            if line.contains("end of arguments") {
                in_args = false;
            } else if let Some((k, v)) = line.trim().split_once(" .") {
                let v = v.trim_start_matches('.').trim();
                args.insert(k.trim().to_string(), v.to_string());
            }
            continue;
        }
        if line.contains("> padded vocab (size:") {
            padded_vocab = number_after(&line, "(new size:").map(|v| v as u32);
        }
        if line.contains("memory (MB)") {
            if let Some(m) = number_after(&line, "max allocated:") {
                max_memory_mb = Some(max_memory_mb.map_or(m, |x| x.max(m)));
            }
        }
        if line.contains(" iteration ") && line.contains("elapsed time per iteration (ms):") {
            let f = if line.contains("consumed tokens:") || line.contains("TFLOPs:") {
                LogFormat::MegatronDeepspeed
            } else {
                LogFormat::MegatronLm
            };
            format.get_or_insert(f);
            let step = number_after(&line, " iteration ").map_or(0, |v| v as u64);
            let loss = number_after(&line, "lm loss:");
            iterations.push(Iteration {
                step,
                step_time_s: number_after(&line, "elapsed time per iteration (ms):").map(|ms| ms / 1e3),
                tokens_per_s_per_device: None,
                tflops: number_after(&line, "throughput per GPU (TFLOP/s/GPU):")
                    .or_else(|| number_after(&line, "TFLOPs:")),
                global_batch: number_after(&line, "global batch size:").map(|v| v as u32),
                loss,
            });
        } else if line.contains("step:") && line.contains("tps:") {
            format.get_or_insert(LogFormat::Torchtitan);
            if let Some(m) = number_after(&line, "memory:") {
                let mb = m * 1024.0; // GiB → MiB
                max_memory_mb = Some(max_memory_mb.map_or(mb, |x| x.max(mb)));
            }
            iterations.push(Iteration {
                step: number_after(&line, "step:").map_or(0, |v| v as u64),
                step_time_s: None,
                tokens_per_s_per_device: number_after(&line, "tps:"),
                tflops: number_after(&line, "tflops:"),
                global_batch: None,
                loss: number_after(&line, "loss:"),
            });
        }
    }
    let Some(format) = format else {
        return Err(if out_of_memory {
            "the run ran out of memory before its first logged iteration".into()
        } else {
            "no iteration lines of a known format (Megatron-LM / Megatron-DeepSpeed `iteration N/M | ... elapsed time per iteration (ms): T |`, torchtitan `step: N  loss: ...  tps: T`)".into()
        });
    };
    Ok(FrameworkLog {
        format,
        iterations,
        args,
        padded_vocab,
        max_memory_bytes: max_memory_mb.map(|mb| mb * 1024.0 * 1024.0),
        out_of_memory,
    })
}

/// A Megatron argument as a number.
pub fn arg_u32(log: &FrameworkLog, name: &str) -> Option<u32> {
    log.args.get(name).and_then(|v| v.parse().ok())
}

/// A Megatron argument as a flag (Python prints `True` / `False`).
pub fn arg_bool(log: &FrameworkLog, name: &str) -> Option<bool> {
    match log.args.get(name).map(String::as_str) {
        Some("True" | "true") => Some(true),
        Some("False" | "false") => Some(false),
        _ => None,
    }
}

/// A Megatron argument as a number with a fraction.
pub fn arg_f64(log: &FrameworkLog, name: &str) -> Option<f64> {
    log.args
        .get(name)
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite())
}

impl FrameworkLog {
    /// Per-step wall times after the first `warmup` logged iterations (the first steps include
    /// compilation, allocator warm-up and data-loader start). torchtitan's come from tokens per
    /// second per device: a step moves `tokens_per_step` tokens over `devices` devices.
    pub fn step_times(&self, warmup: usize, tokens_per_step: f64, devices: u32) -> Vec<f64> {
        self.iterations
            .iter()
            .skip(warmup.min(self.iterations.len().saturating_sub(1)))
            .filter_map(|i| {
                i.step_time_s.or_else(|| {
                    i.tokens_per_s_per_device
                        .filter(|t| *t > 0.0)
                        .map(|t| tokens_per_step / (t * devices as f64))
                })
            })
            .filter(|t| t.is_finite() && *t > 0.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // excerpts in the frameworks' formats (written here from their logging code)
    const MEGATRON_LM: &str = "\
------------------------ arguments ------------------------
  bf16 ............................................ True
  global_batch_size ............................... 64
  micro_batch_size ................................ 1
  num_layers ...................................... 24
  pipeline_model_parallel_size .................... 2
  tensor_model_parallel_size ...................... 2
  world_size ...................................... 16
-------------------- end of arguments ---------------------
 > padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)
 [2026-08-22 12:00:01.000000] iteration        1/     100 | consumed samples:           64 | elapsed time per iteration (ms): 9000.0 | throughput per GPU (TFLOP/s/GPU): 20.0 | learning rate: 1.000000E-05 | global batch size:    64 | lm loss: 1.100000E+01 | loss scale: 1.0 | grad norm: 9.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 1 iterations) memory (MB) | allocated: 1000.00 | max allocated: 20480.00 | reserved: 22000.00 | max reserved: 22000.00
 [2026-08-22 12:00:02.000000] iteration        2/     100 | consumed samples:          128 | elapsed time per iteration (ms): 1200.0 | throughput per GPU (TFLOP/s/GPU): 150.0 | learning rate: 2.000000E-05 | global batch size:    64 | lm loss: 1.050000E+01 |
 [2026-08-22 12:00:03.000000] iteration        3/     100 | consumed samples:          192 | elapsed time per iteration (ms): 1000.0 | throughput per GPU (TFLOP/s/GPU): 180.0 | learning rate: 3.000000E-05 | global batch size:    64 | lm loss: 1.000000E+01 |
";

    #[test]
    fn megatron_lm_iterations_arguments_vocab_and_memory() {
        let log = parse(MEGATRON_LM).unwrap();
        assert_eq!(log.format, LogFormat::MegatronLm);
        assert_eq!(log.iterations.len(), 3);
        assert_eq!(log.iterations[2].step, 3);
        assert_eq!(log.iterations[2].tflops, Some(180.0));
        assert_eq!(log.iterations[2].global_batch, Some(64));
        assert_eq!(log.iterations[2].loss, Some(10.0));
        assert_eq!(arg_u32(&log, "tensor_model_parallel_size"), Some(2));
        assert_eq!(arg_u32(&log, "world_size"), Some(16));
        assert_eq!(arg_bool(&log, "bf16"), Some(true));
        assert_eq!(log.padded_vocab, Some(50432));
        assert_eq!(log.max_memory_bytes, Some(20480.0 * 1024.0 * 1024.0));
        assert_eq!(log.step_times(1, 0.0, 1), vec![1.2, 1.0]);
        assert!(!log.out_of_memory);
    }

    #[test]
    fn megatron_deepspeed_and_torchtitan_lines() {
        let ds = " iteration       10/     100 | consumed samples:          640 | consumed tokens:      1310720 | elapsed time per iteration (ms): 2500.5 | learning rate: 1.000E-04 | global batch size:    64 | lm loss: 7.500000E+00 | loss scale: 1.0 | actual seqlen:  2048 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 25.595 | tokens per gpu per second (tgs): 3276.000 | TFLOPs: 95.50 |";
        let log = parse(ds).unwrap();
        assert_eq!(log.format, LogFormat::MegatronDeepspeed);
        assert_eq!(log.iterations[0].step_time_s, Some(2.5005));
        assert_eq!(log.iterations[0].tflops, Some(95.5));
        let tt = "[titan] 2026-08-21 10:00:00,000 - root - INFO - \u{1b}[31mstep:  5  \u{1b}[32mloss:  7.12345  \u{1b}[38;2;180;60;0mgrad_norm:  1.2345  \u{1b}[38;2;54;234;195mmemory: 23.45GiB(29.67%)  \u{1b}[34mtps: 1,234  \u{1b}[36mtflops: 123.45  \u{1b}[35mmfu: 12.34%\u{1b}[39m";
        let log = parse(tt).unwrap();
        assert_eq!(log.format, LogFormat::Torchtitan);
        let it = &log.iterations[0];
        assert_eq!(
            (it.step, it.tokens_per_s_per_device, it.tflops),
            (5, Some(1234.0), Some(123.45))
        );
        // 64 sequences of 2048 tokens over 16 devices at 1234 tokens/s each
        let t = log.step_times(0, 64.0 * 2048.0, 16)[0];
        assert!((t - 64.0 * 2048.0 / (1234.0 * 16.0)).abs() < 1e-12);
        assert_eq!(log.max_memory_bytes, Some(23.45 * 1024.0 * 1024.0 * 1024.0));
    }

    #[test]
    fn unknown_formats_and_out_of_memory_are_named() {
        let e = parse("hello\nworld\n").unwrap_err();
        assert!(e.contains("no iteration lines of a known format"), "{e}");
        let e = parse("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB").unwrap_err();
        assert!(e.contains("ran out of memory"), "{e}");
        assert_eq!(crate::median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
