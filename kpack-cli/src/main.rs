//! `kpack`: the command-line face of kpack-core. Flags become calls, results
//! become text or JSON; all the work happens in kpack-core.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kpack_core::inspect::{self, Listing};

#[derive(Parser)]
#[command(
    name = "kpack",
    version,
    about = "Split GPU device code out of HIP fat binaries into .kpack archives, and inspect them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a fat binary (bundles, targets, sizes), a .kpack archive
    /// (header, scheme, targets, keys) or an offloaded host binary (its HIPK
    /// metadata).
    Ls {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write the code objects of a fat binary or archive to files:
    /// `<target>.hsaco` (`<target>#<N>.hsaco` for binaries with several
    /// bundles), or `<key>@<target>.hsaco` for archives (`/`, `%`, `@` in the
    /// key written as `%2F`, `%25`, `%40`).
    Extract {
        file: PathBuf,
        /// Output directory (created if missing).
        #[arg(short, long)]
        output: PathBuf,
        /// Only code objects for this target ID.
        #[arg(long)]
        target: Option<String>,
        /// Print a JSON list of the files written.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("kpack: error: {e}");
            let mut src = std::error::Error::source(&e);
            // The top error already includes its direct source; print deeper causes.
            if let Some(s) = src {
                src = s.source();
            }
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> kpack_core::Result<()> {
    match cli.command {
        Command::Ls { file, json } => {
            let listing = inspect::list(&file)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&listing).expect("listing serializes")
                );
            } else {
                print_listing(&listing);
            }
        }
        Command::Extract {
            file,
            output,
            target,
            json,
        } => {
            let files = kpack_core::extract::extract(&file, &output, target.as_deref())?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&files).expect("list serializes")
                );
            } else {
                for f in &files {
                    println!("{}\t{} bytes", output.join(&f.file).display(), f.size);
                }
            }
        }
    }
    Ok(())
}

fn print_listing(listing: &Listing) {
    match listing {
        Listing::FatBinary(f) => {
            match f.section_offset {
                Some(off) => println!(
                    "{}: fat binary ({}), {} bytes; .hip_fatbin: {} bytes at offset {:#x}",
                    f.file, f.container, f.file_size, f.section_size, off
                ),
                None => println!("{}: offload bundle file, {} bytes", f.file, f.file_size),
            }
            println!("targets ({}): {}", f.targets.len(), f.targets.join(", "));
            println!("bundles: {}", f.bundles.len());
            for b in &f.bundles {
                let how = match &b.compressed {
                    Some(c) => format!(
                        ", compressed (CCOB v{} {}, {} bytes uncompressed{}{})",
                        c.version,
                        c.method,
                        c.uncompressed_size,
                        if c.inner_index > 0 {
                            format!(", inner bundle {}", c.inner_index)
                        } else {
                            String::new()
                        },
                        if c.hash_matches {
                            ""
                        } else {
                            ", hash MISMATCH"
                        }
                    ),
                    None => String::new(),
                };
                println!(
                    "  bundle {} at {:#x}, {} bytes{}",
                    b.index, b.offset, b.stored_size, how
                );
                for e in &b.entries {
                    match &e.target {
                        Some(t) => println!("    {:<28} {:>10} bytes  {}", t, e.size, e.triple),
                        None => println!("    {:<28} {:>10} bytes  {}", "(host)", e.size, e.triple),
                    }
                }
            }
            print_wrappers(&f.wrappers);
        }
        Listing::Archive(a) => {
            println!(
                "{}: kpack archive version {}, {} bytes",
                a.file, a.format_version, a.file_size
            );
            println!(
                "group: {}  family: {}  scheme: {}",
                a.group_name, a.gfx_arch_family, a.compression_scheme
            );
            println!(
                "targets ({}): {}",
                a.gfx_arches.len(),
                a.gfx_arches.join(", ")
            );
            println!("kernels: {}", a.kernels.len());
            for k in &a.kernels {
                println!(
                    "  {:>5}  {:<40} {:<24} {:>10} bytes",
                    k.ordinal, k.key, k.target, k.original_size
                );
            }
        }
        Listing::Offloaded(o) => {
            println!(
                "{}: offloaded host binary ({:?}), {} bytes",
                o.file, o.elf_type, o.file_size
            );
            println!("kernel name: {}", o.kernel_name);
            println!("search paths:");
            for p in &o.search_paths {
                println!("  {p}");
            }
            println!("metadata at address {:#x}", o.metadata_address);
            print_wrappers(&o.wrappers);
        }
    }
}

fn print_wrappers(ws: &[inspect::WrapperListing]) {
    println!("wrappers: {}", ws.len());
    for w in ws {
        println!(
            "  {}: {} version {} binary {:#x} reserved1 {}",
            w.index, w.magic, w.version, w.binary, w.reserved1
        );
    }
}
