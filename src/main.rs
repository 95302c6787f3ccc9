use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = memfit::cli::Cli::parse();
    match memfit::cmd::dispatch(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
