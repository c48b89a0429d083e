//! `exatrain`: plan, validate and tune parallel layouts for training large language models.

mod agree;
mod args;
mod calibrate_cmd;
mod calibrate_gpu;
mod fidelity_cmd;
mod framework_logs;
mod plan_cmd;
mod reports;
mod run_folder;
mod sample_cmd;
mod study_cmd;
mod table;
mod train_cmd;
mod train_gpu;
mod train_ranks;
mod tune_cmd;
mod tune_exhaustive;
mod validate;
mod validate_sources;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Find and check the parallel strategy that trains a model fastest on a machine.
#[derive(Parser)]
#[command(name = "exatrain", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Predict memory per device and step time of one layout (default: gpt-175b on 128 Frontier nodes).
    Plan(plan_cmd::PlanArgs),
    /// Compare the planner with measured runs from a CSV file (default: the bundled published runs).
    Validate(validate::ValidateArgs),
    /// Search layouts: exhaustive over the cost model, or Bayesian/random over real runs.
    Tune(tune_cmd::TuneArgs),
    /// Scaling study: best layout per node count, weak/strong scaling, time to train, HTML report
    /// (default: gpt-22b, gpt-175b, gpt-1t on 128 and 384 Frontier nodes).
    Study(study_cmd::StudyArgs),
    /// Turn a layout into a complete job: megatron-lm, megatron-deepspeed, torchtitan (torchrun or Slurm), or an exatrain run file.
    Export(study_cmd::ExportArgs),
    /// Train a GPT model for real on this machine (default: gpt-mini on the bundled corpus).
    Train(train_cmd::TrainArgs),
    /// Generate text from a checkpoint.
    Sample(sample_cmd::SampleArgs),
    /// Write a checkpoint as a Hugging Face GPT-2 model (config.json + model.safetensors).
    ExportHf(sample_cmd::ExportHfArgs),
    /// Measure this machine (GEMM curve, memory bandwidth, collectives) and write it as a cluster
    /// TOML; --fit fits its efficiency factors to trainer reports or framework logs.
    Calibrate(calibrate_cmd::CalibrateArgs),
    /// Predicted vs measured: term by term for trainer runs' --report files, step time and peak memory for framework logs (HTML with --out).
    Fidelity(fidelity_cmd::FidelityArgs),
}

fn main() {
    // A closed pipe (`exatrain study | head`) ends the program quietly instead of panicking.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
    // Negative numbers reach the value checks (`--lr -1` is named as a bad --lr, not an
    // unknown flag); a parse error is one line naming the flag, exit code 2.
    fn negatives(c: clap::Command) -> clap::Command {
        c.allow_negative_numbers(true).mut_subcommands(negatives)
    }
    let matches = match negatives(Cli::command()).try_get_matches() {
        Ok(m) => m,
        Err(e) if e.use_stderr() => {
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: bad arguments");
            // a value enum's error names the allowed values on a later line: keep them
            let allowed = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("[possible values: "))
                .map(|v| format!(" (allowed: {})", v.trim_end_matches(']')))
                .unwrap_or_default();
            eprintln!("{first}{allowed} (see --help)");
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Plan(a) => plan_cmd::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Tune(a) => tune_cmd::run(a),
        Command::Study(a) => study_cmd::run_study(a),
        Command::Export(a) => study_cmd::run_export(a),
        Command::Train(a) => train_cmd::run_train(a, train_cmd::Given(matches.subcommand_matches("train"))),
        Command::Sample(a) => sample_cmd::run_sample(a),
        Command::ExportHf(a) => sample_cmd::run_export_hf(a),
        Command::Calibrate(a) => calibrate_cmd::run(a),
        Command::Fidelity(a) => fidelity_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
