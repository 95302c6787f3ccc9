use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = memfit::cli::Cli::parse();
    match memfit::cmd::dispatch(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<memfit::sweep::Interrupted>().is_some() {
                // The shell's code for "stopped by SIGINT".
                std::process::ExitCode::from(130)
            } else if e.downcast_ref::<memfit::sweep::CasesFailed>().is_some() {
                std::process::ExitCode::from(memfit::sweep::CasesFailed::EXIT)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}
