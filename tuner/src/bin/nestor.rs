//! The `nestor` binary: see `tuner::cli`.

fn main() -> std::process::ExitCode {
    tuner::cli::main()
}
