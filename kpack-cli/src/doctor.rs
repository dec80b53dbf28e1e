//! `kpack doctor`: what keeps an installation's GPU code from loading on
//! this machine, one line per problem with its fix.

use std::path::PathBuf;

use kpack_engine::doctor::{self, DoctorOptions, DoctorReport};

use crate::capture::print_json;

/// Resolve every offloaded binary under PATH... for every GPU target of
/// this machine (or each --arch), as the runtime would (ROCM_KPACK_*
/// honoured), and say what fails and what fixes it. Exit 0 when all
/// resolve, 1 when problems are found, 2 when nothing could be checked.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// A site-packages directory, an install prefix, an application folder
    /// or single files.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// A target ID to check for, as CLR passes it (`gfx942:sramecc+:xnack-`;
    /// the `amdgcn-amd-amdhsa--` prefix optional); repeatable. Replaces the
    /// detection of this machine's GPUs.
    #[arg(long = "arch", value_name = "TARGET")]
    archs: Vec<String>,
    /// Where sysfs is, for the kernel driver's GPU topology
    /// (`DIR/class/kfd/kfd/topology/nodes`); for tests and containers.
    #[arg(long, value_name = "DIR", default_value = doctor::gpus::SYSFS_ROOT)]
    sysfs_root: PathBuf,
    /// Print `{"targets": [...], "problems": [...]}`.
    #[arg(long)]
    json: bool,
}

pub fn run(a: DoctorArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (targets, source) = doctor::choose_targets(&a.archs, &a.sysfs_root)?;
    let opts = DoctorOptions {
        paths: a.paths.clone(),
        targets,
    };
    let report = doctor::doctor(&opts, &kpack_engine::Silent)?;
    if a.json {
        print_json(&report);
    } else {
        print(&report, &source);
    }
    Ok(report.check()?)
}

fn print(report: &DoctorReport, source: &str) {
    outln!(
        "targets ({source}): {}; {} binar{} with device code ({} offloaded), {} archive(s)",
        report.targets.join(", "),
        report.binaries,
        if report.binaries == 1 { "y" } else { "ies" },
        report.offloaded,
        report.archives
    );
    for p in &report.problems {
        let target = if p.target.is_empty() {
            String::new()
        } else {
            format!(" [{}]", p.target)
        };
        let fix = if p.fix.is_empty() {
            String::new()
        } else {
            format!("; fix: {}", p.fix)
        };
        outln!("{}{target}: {}{fix}", p.binary, p.message);
    }
    for n in &report.notes {
        outln!("{} [{}]: note: {}", n.binary, n.target, n.message);
    }
    if report.ok() {
        outln!("OK: every offloaded binary resolves for every target");
    }
}
