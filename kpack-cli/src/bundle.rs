//! `kpack bundle`: an application-local copy of offloaded binaries that
//! still finds its code.

use std::path::PathBuf;

use kpack_engine::bundle::{self, BundleOptions, Layout};

use crate::capture::print_json;

/// Copy offloaded binaries (and, with --with-deps, the libraries they need
/// from their prefix) into DIR with the archives their search paths name
/// for the chosen targets, re-pointing their search paths where the layout
/// changes them (ELF and PE); checked to resolve from the new place before
/// anything is moved into DIR. Nothing outside DIR changes.
#[derive(clap::Args)]
pub struct BundleArgs {
    #[arg(required = true, value_name = "BINARY")]
    binaries: Vec<PathBuf>,
    /// The directory to copy into (created if missing; may hold other files).
    #[arg(long, value_name = "DIR")]
    into: PathBuf,
    /// Only the archives of these targets (matched as prune matches:
    /// `gfx90a` takes `gfx90a:xnack-`); default: every target of the
    /// archives present.
    #[arg(long, num_args = 1.., value_name = "TARGET")]
    targets: Vec<String>,
    /// Also the libraries the binaries need that sit in their prefix (the
    /// directory above each binary's own).
    #[arg(long)]
    with_deps: bool,
    /// `flat`: every binary in DIR, the archives in DIR/.kpack; `keep`:
    /// the binaries' paths below their common directory kept.
    #[arg(long, value_enum, default_value = "flat")]
    layout: LayoutArg,
    /// Replace files in DIR that differ from the bundle's.
    #[arg(long)]
    overwrite: bool,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LayoutArg {
    Flat,
    Keep,
}

pub fn run(a: BundleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opts = BundleOptions {
        binaries: a.binaries,
        into: a.into,
        targets: a.targets,
        with_deps: a.with_deps,
        layout: match a.layout {
            LayoutArg::Flat => Layout::Flat,
            LayoutArg::Keep => Layout::Keep,
        },
        overwrite: a.overwrite,
    };
    let s = bundle::bundle(&opts, &kpack_engine::Silent)?;
    if a.json {
        print_json(&s);
        return Ok(());
    }
    for b in &s.binaries {
        let how = match (b.offloaded, b.repointed) {
            (true, true) => format!(", search paths now {}", b.search_paths.join(", ")),
            (true, false) => ", search paths kept".to_string(),
            (false, _) => " (no HIPK metadata: copied as it is)".to_string(),
        };
        let dep = if b.dependency { " (dependency)" } else { "" };
        outln!(
            "{} -> {}{dep}{how}",
            b.source.display(),
            s.into.join(&b.dest).display()
        );
    }
    for ar in &s.archives {
        outln!(
            "{} -> {}",
            ar.source.display(),
            s.into.join(&ar.dest).display()
        );
    }
    outln!(
        "{}: {} binar{}, {} archive(s); {} code object load(s) checked from the new place",
        s.into.display(),
        s.binaries.len(),
        if s.binaries.len() == 1 { "y" } else { "ies" },
        s.archives.len(),
        s.loads_checked
    );
    Ok(())
}
