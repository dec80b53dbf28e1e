//! `kpack doctor`: what keeps an installation's GPU code from loading on
//! this machine, one line per problem with its fix.

use std::path::PathBuf;

use kpack_engine::doctor::{self, DoctorOptions, DoctorReport};
use kpack_engine::ArtifactError;

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
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Print `{"targets": [...], "problems": [...]}`.
    #[arg(long)]
    json: bool,
}

pub fn run(a: DoctorArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (targets, source) = targets(&a)?;
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
    if !report.ok() {
        return Err(ArtifactError::ProblemsFound {
            problems: report.problems.len(),
        }
        .into());
    }
    Ok(())
}

/// The targets to check for, and where they came from.
fn targets(a: &DoctorArgs) -> Result<(Vec<String>, String), ArtifactError> {
    if !a.archs.is_empty() {
        return Ok((a.archs.clone(), "--arch".into()));
    }
    // A topology that does not read: nothing could be checked either.
    let found = doctor::detect_targets(&a.sysfs_root, doctor::xnack_from_env()).map_err(|e| {
        ArtifactError::NothingToCheck {
            reason: kpack_host::report(&e),
        }
    })?;
    if found.is_empty() {
        let nodes = a.sysfs_root.join(doctor::gpus::NODES);
        return Err(ArtifactError::NothingToCheck {
            reason: format!(
                "no GPU found: {} lists no GPU node (no amdgpu kernel driver, or a container without /sys); give the targets with --arch, e.g. --arch gfx942:sramecc+:xnack-",
                nodes.display()
            ),
        });
    }
    let nodes = a.sysfs_root.join(doctor::gpus::NODES);
    Ok((found, format!("detected in {}", nodes.display())))
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
