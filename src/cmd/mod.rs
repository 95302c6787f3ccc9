//! One file per subcommand.

pub mod convert;
pub mod dataset;
pub mod fit;
pub mod max_batch;
pub mod merge;
pub mod predict;
pub mod probe;
pub mod probe_backward;
pub mod ranks;
pub mod report;
pub mod run;
pub mod selftest;

use crate::cli::{Cli, Command, ProbeCommand};

/// Runs the parsed command line.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Convert(args) => convert::convert(&args),
        Command::Predict(args) => predict::predict(&args),
        Command::Fit(args) => fit::fit_cmd(&args),
        Command::MaxBatch(args) => max_batch::max_batch(&args),
        Command::Merge(args) => merge::merge(&args),
        Command::Report(args) => report::report(&args),
        Command::Probe(ProbeCommand::Matmul(args)) => probe::probe(&args),
        Command::Probe(ProbeCommand::Backward(args)) => probe_backward::probe(&args),
        Command::Selftest(args) => selftest::selftest(&args),
        Command::Ranks(args) => ranks::ranks(&args),
        Command::Dataset(cmd) => dataset::dataset(&cmd),
        Command::DataloadWorker(a) => {
            let storage = crate::data::Storage::parse(&a.storage)
                .ok_or_else(|| anyhow::anyhow!("unknown storage {}", a.storage))?;
            crate::data::workers::serve(&a.dataset, storage, a.crop, a.seed)
        }
    }
}
