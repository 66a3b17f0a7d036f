//! The `threadgate` binary: everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    threadgate::cli::run()
}
