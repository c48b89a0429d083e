//! `exatrain`: plan, validate and tune parallel layouts for training large language models.

mod args;
mod plan_cmd;
mod table;
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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(a) => plan_cmd::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Tune(a) => tune_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
