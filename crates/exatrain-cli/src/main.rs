//! `exatrain`: plan, validate and tune parallel layouts for training large language models.

mod args;
mod calibrate_cmd;
mod fidelity_cmd;
mod plan_cmd;
mod reports;
mod study_cmd;
mod table;
mod train_cmd;
mod tune_cmd;
mod validate;

use clap::{Parser, Subcommand};

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
    /// Turn a layout into a launch script: megatron-lm, megatron-deepspeed, slurm or exatrain.
    Export(study_cmd::ExportArgs),
    /// Train a GPT model for real on this machine (default: gpt-mini on the bundled corpus).
    Train(train_cmd::TrainArgs),
    /// Generate text from a checkpoint.
    Sample(train_cmd::SampleArgs),
    /// Write a checkpoint as a Hugging Face GPT-2 model (config.json + model.safetensors).
    ExportHf(train_cmd::ExportHfArgs),
    /// Measure this machine (GEMM curve, memory bandwidth, collectives) and write it as a cluster
    /// TOML; --fit fits its efficiency factors to trainer reports.
    Calibrate(calibrate_cmd::CalibrateArgs),
    /// Predicted vs measured, term by term, for trainer runs' --report files (HTML with --out).
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(a) => plan_cmd::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Tune(a) => tune_cmd::run(a),
        Command::Study(a) => study_cmd::run_study(a),
        Command::Export(a) => study_cmd::run_export(a),
        Command::Train(a) => train_cmd::run_train(a),
        Command::Sample(a) => train_cmd::run_sample(a),
        Command::ExportHf(a) => train_cmd::run_export_hf(a),
        Command::Calibrate(a) => calibrate_cmd::run(a),
        Command::Fidelity(a) => fidelity_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
