//! The command line: every subcommand and flag (clap), and the flags
//! several subcommands share (archive compression, `--expect-targets`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kpack_format::archive::Scheme;

use crate::{artifacts, bundle, doctor, wheels};

#[derive(Parser)]
#[command(
    name = "kpack",
    version,
    about = "Split GPU device code out of HIP fat binaries into .kpack archives, and inspect them"
)]
pub(crate) struct Cli {
    /// fsync every output before exiting (once, at the end of the command),
    /// so that it survives a power failure; off by default, as with build
    /// tools. `KPACK_DURABLE=1` does the same. Outputs are atomic either way.
    #[arg(long, global = true)]
    pub durable: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// Check a rewritten host binary (ELF, or PE: `verify-binary` is the
    /// same command): segments or sections, headers, relocations and
    /// wrappers; for an offloaded binary its HIPK metadata, for a fat one
    /// (what prune and restore write) its bundles.
    #[command(visible_alias = "verify-binary")]
    VerifyElf {
        file: PathBuf,
        /// Only an offloaded binary passes (a fat one fails), as with the
        /// reference `verify_elf` tool.
        #[arg(long)]
        offloaded: bool,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// Keep only some targets inside a fat binary's own bundles: the output
    /// is still a fat binary (HIPF wrappers) that any HIP runtime loads,
    /// with every other target's bytes gone from the file.
    Prune {
        input: PathBuf,
        /// The pruned binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Targets to keep, matched as the loader matches: `gfx90a` keeps
        /// `gfx90a:xnack+` and `gfx90a:xnack-`; `gfx90a:xnack-` keeps
        /// `gfx90a:xnack-` and `gfx90a`.
        #[arg(long, num_args = 1.., required = true, value_name = "TARGET")]
        targets: Vec<String>,
        /// Also keep every generic target (`gfx11-generic`, ...).
        #[arg(long)]
        keep_generic: bool,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// The way back from an offloaded binary: a fat binary (HIPF wrappers,
    /// `.hip_fatbin` again) with the chosen targets' code objects, found in
    /// the archives its metadata names as the runtime finds them
    /// (ROCM_KPACK_PATH and ROCM_KPACK_PATH_PREFIX honoured).
    Restore {
        input: PathBuf,
        /// The fat binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Targets to put back, matched as prune matches them (default:
        /// every target the archives have).
        #[arg(long, num_args = 1.., value_name = "TARGET")]
        targets: Vec<String>,
        /// With --targets: also every generic target.
        #[arg(long)]
        keep_generic: bool,
        /// Bundle form: `auto` (uncompressed when they fit the original
        /// range, else compressed), `none` or `zstd` (CCOB).
        #[arg(long, value_enum, default_value = "auto")]
        compression: RestoreCompression,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// For each wrapper of an offloaded binary, what the runtime would load
    /// for a device with these ISAs and why: the candidate archives in
    /// order, whether each exists, opens, lists a compatible target and
    /// holds the key, and the winner or the error code (the loader's own
    /// search, ROCM_KPACK_* honoured). Exit 0 when every wrapper resolves.
    Why {
        binary: PathBuf,
        /// A device ISA (`gfx90a:xnack-`, `amdgcn-amd-amdhsa--gfx1100`), in
        /// priority order; repeatable.
        #[arg(long = "arch", required = true, value_name = "ISA")]
        archs: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where the bytes of a package go: fat and offloaded binaries,
    /// archives, trees (artifact or install trees) and wheels; host vs
    /// device bytes, per target and per binary, stored and uncompressed,
    /// and the code objects archives share.
    Size {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also write a treemap (binary -> host code and targets) as SVG.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Compare two paths of the same kind (two builds of a library, two
    /// trees, two wheels): targets, binaries and code objects added,
    /// removed, grown or shrunk, with totals.
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What keeps the GPU code of an installation from loading on this
    /// machine, and what fixes it: every offloaded binary under the paths
    /// resolved for every GPU (detected, or --arch) as the runtime would.
    /// Exit 0 when all resolve, 1 when problems are found, 2 when nothing
    /// could be checked.
    Doctor(doctor::DoctorArgs),
    /// Copy offloaded binaries into an application folder with the
    /// archives they need, re-pointed so that they resolve from there
    /// (checked before anything is moved in).
    Bundle(bundle::BundleArgs),
    #[command(flatten)]
    Artifact(artifacts::ArtifactCommand),
    /// Split a Python wheel whose package carries fat binaries (PyTorch)
    /// into a host wheel of the same name and one device wheel per GPU
    /// bundle (`pip install "torch[device-gfx942]"`); the flags of
    /// `python -m rocm_kpack.tools.split_python_wheels`.
    SplitWheels(Box<wheels::SplitWheelsArgs>),
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum RestoreCompression {
    Auto,
    None,
    Zstd,
}

impl RestoreCompression {
    pub(crate) fn restore(self) -> kpack_host::restore::Compression {
        use kpack_host::restore::Compression as C;
        match self {
            RestoreCompression::Auto => C::Auto,
            RestoreCompression::None => C::None,
            RestoreCompression::Zstd => C::Zstd,
        }
    }
}

/// How archives store code objects (`--compression`; `noop` is upstream's
/// name for `none`).
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Compression {
    #[value(alias = "noop")]
    None,
    Zstd,
}

impl Compression {
    pub(crate) fn scheme(self) -> Scheme {
        match self {
            Compression::None => Scheme::None,
            Compression::Zstd => Scheme::ZstdPerKernel,
        }
    }
}

/// `--expect-targets` of split, recombine, split-wheels and verify.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct ExpectTargets {
    /// Refuse to build (or pass) a partial set: fail, before any output is
    /// written, when one of these targets is missing from the inputs or
    /// present there with no code object (only database files). Targets
    /// match as whole target IDs: `gfx1250` is not satisfied by
    /// `gfx1250-strict`; `gfx90a` by any feature variant of gfx90a; a
    /// family wildcard `gfx125X` by any of gfx1250, gfx1251, ... (strict
    /// targets only when named).
    #[arg(long, value_name = "T", num_args = 1..)]
    pub expect_targets: Vec<String>,
}
