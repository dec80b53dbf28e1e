//! `kpack-bench`: the table of `cargo xtask bench` (which builds `kpack`
//! and `librocm_kpack` in release first), and the child process of the
//! `large` section.

use clap::{Parser, Subcommand};
use kpack_bench::sections::large;
use kpack_bench::BenchArgs;

#[derive(Parser)]
#[command(
    name = "kpack-bench",
    about = "Measure kpack's speed and memory against floors (the same bytes through zstd, \
             cp, unzip...) and each row's targets: table on stdout and in target/bench/bench.md, everything in \
             target/bench/bench.json. See docs/performance.md.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
    #[command(subcommand)]
    child: Option<Child>,
}

#[derive(Subcommand)]
enum Child {
    /// The `large` section's child process that writes or reads a large
    /// archive.
    #[command(hide = true)]
    BenchArchive(large::ArchiveArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.child {
        Some(Child::BenchArchive(a)) => large::child(&a),
        None => kpack_bench::run(&kpack_bench::workspace_root(), &cli.args),
    }
}
