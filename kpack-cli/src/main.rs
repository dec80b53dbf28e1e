//! `kpack`: the command-line face of kpack-core. Flags become calls, results
//! become text or JSON; all the work happens in kpack-core.

#![forbid(unsafe_code)]

mod artifacts;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kpack_core::archive::Scheme;
use kpack_core::inspect::{self, Listing};
use kpack_core::offload::{self, OffloadOptions};

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
    /// Move the device code of a fat binary into per-target .kpack archives
    /// and write a host-only binary that points at them.
    Offload {
        input: PathBuf,
        /// The host-only binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Directory for the archives (`<group>_<target>.kpack`).
        #[arg(long)]
        archive_dir: PathBuf,
        /// The binary's key in the archives (default: OUTPUT's file name).
        #[arg(long)]
        kernel_name: Option<String>,
        /// Archive path written into the binary, relative to its directory
        /// unless absolute; `@GFXARCH@` stands for a target ID. Repeatable.
        /// Default: `<path from OUTPUT's dir to ARCHIVE_DIR>/<group>_@GFXARCH@.kpack`.
        #[arg(long = "search-path", value_name = "PATTERN")]
        search_paths: Vec<String>,
        /// A search path written after the others (default or given);
        /// repeatable. For an installed layout that differs from the build
        /// tree's.
        #[arg(long = "extra-search-path", value_name = "PATTERN")]
        extra_search_paths: Vec<String>,
        /// Archive name prefix (default: OUTPUT's name up to its first `.`).
        #[arg(long)]
        group: Option<String>,
        #[arg(long, value_enum, default_value = "zstd")]
        compression: Compression,
        /// zstd level (1-22).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=22))]
        compression_level: i32,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// Check an offloaded host binary (ELF, or PE: `verify-binary` is the
    /// same command): segments or sections, headers, HIPK metadata,
    /// wrappers and relocations.
    #[command(visible_alias = "verify-binary")]
    VerifyElf {
        file: PathBuf,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Artifact(artifacts::ArtifactCommand),
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Compression {
    None,
    Zstd,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Artifact(c) => artifacts::run(c),
        command => run(Cli { command }).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("kpack: error: {e}");
            let mut src = e.source();
            // The top error already includes its direct source; print deeper causes.
            if let Some(s) = src {
                src = s.source();
            }
            while let Some(s) = src {
                // Some errors print their source in their own message too.
                let text = s.to_string();
                if !msg.contains(&text) {
                    msg.push_str(&format!(": {text}"));
                }
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> kpack_core::Result<()> {
    match cli.command {
        Command::Ls { file, json } => ls(&file, json),
        Command::Extract {
            file,
            output,
            target,
            json,
        } => extract(&file, &output, target.as_deref(), json),
        Command::Offload {
            input,
            output,
            archive_dir,
            kernel_name,
            search_paths,
            extra_search_paths,
            group,
            compression,
            compression_level,
            json,
        } => {
            let mut opts = OffloadOptions::new(archive_dir);
            opts.kernel_name = kernel_name;
            opts.search_paths = search_paths;
            opts.extra_search_paths = extra_search_paths;
            opts.group = group;
            opts.scheme = match compression {
                Compression::None => Scheme::None,
                Compression::Zstd => Scheme::ZstdPerKernel,
            };
            opts.level = compression_level;
            offload(&input, &output, &opts, json)
        }
        Command::VerifyElf { file, json } => verify_elf(&file, json),
        Command::Artifact(_) => unreachable!("dispatched in main"),
    }
}

fn print_json(v: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("output serializes")
    );
}

fn ls(file: &Path, json: bool) -> kpack_core::Result<()> {
    let listing = inspect::list(file)?;
    if json {
        print_json(&listing);
    } else {
        print_listing(&listing);
    }
    Ok(())
}

fn extract(file: &Path, output: &Path, target: Option<&str>, json: bool) -> kpack_core::Result<()> {
    let files = kpack_core::extract::extract(file, output, target)?;
    if json {
        print_json(&files);
    } else {
        for f in &files {
            println!("{}\t{} bytes", output.join(&f.file).display(), f.size);
        }
    }
    Ok(())
}

fn offload(
    input: &Path,
    output: &Path,
    opts: &OffloadOptions,
    json: bool,
) -> kpack_core::Result<()> {
    let s = offload::offload(input, output, opts)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    if let Some(note) = &s.note {
        eprintln!("kpack: note: {}: {note}", input.display());
    }
    if s.outcome == offload::Outcome::Offloaded {
        println!(
            "{} -> {}: {} -> {} bytes, {} bundle(s), {} wrapper(s)",
            input.display(),
            output.display(),
            s.input_size,
            s.output_size,
            s.bundles,
            s.wrappers.len()
        );
        for a in &s.archives {
            println!(
                "  {}: {} code object(s), {} -> {} bytes",
                a.path.display(),
                a.kernels,
                a.bytes_in,
                a.bytes_out
            );
        }
    }
    Ok(())
}

fn verify_elf(file: &Path, json: bool) -> kpack_core::Result<()> {
    let v = offload::verify_file(file)?;
    if json {
        print_json(&v);
    } else {
        println!(
            "{}: ok: {} wrapper(s), kernel name {}, search paths {}",
            file.display(),
            v.co_indices.len(),
            v.metadata.kernel_name,
            v.metadata.search_paths.join(", ")
        );
    }
    Ok(())
}

fn print_listing(listing: &Listing) {
    match listing {
        Listing::FatBinary(f) => print_fat_binary(f),
        Listing::Archive(a) => print_archive(a),
        Listing::Offloaded(o) => print_offloaded(o),
    }
}

fn print_fat_binary(f: &inspect::FatBinaryListing) {
    match f.section_offset {
        Some(off) => println!(
            "{}: fat binary ({}), {} bytes; {}: {} bytes at offset {:#x}",
            f.file,
            f.container,
            f.file_size,
            f.section_name.as_deref().unwrap_or(".hip_fatbin"),
            f.section_size,
            off
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

fn print_archive(a: &inspect::ArchiveListing) {
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

fn print_offloaded(o: &inspect::OffloadedListing) {
    println!(
        "{}: offloaded host binary ({}), {} bytes",
        o.file,
        match (&o.elf_type, &o.pe_kind) {
            (Some(t), _) => format!("{t:?}"),
            (None, Some(k)) => format!("{k:?}").to_uppercase(),
            (None, None) => "?".into(),
        },
        o.file_size
    );
    println!("kernel name: {}", o.kernel_name);
    println!("search paths:");
    for p in &o.search_paths {
        println!("  {p}");
    }
    println!("metadata at address {:#x}", o.metadata_address);
    print_wrappers(&o.wrappers);
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
