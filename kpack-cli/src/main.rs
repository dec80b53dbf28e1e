//! The `kpack` command ([`kpack_cli::main_with_args`]).

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(kpack_cli::main_with_args(
        std::env::args_os(),
        "kpack: error: ",
    ))
}
