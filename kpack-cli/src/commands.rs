//! The library calls behind the commands other than `artifact`,
//! `split-wheels`, `doctor` and `bundle` (which have modules of their own):
//! flags in, results out as text or JSON.

use std::path::{Path, PathBuf};

use kpack_host::inspect;
use kpack_host::offload::{self, OffloadOptions};

use crate::capture::print_json;
use crate::cli::Command;
use crate::print::*;

/// Run a subcommand other than `artifact` and `split-wheels` (dispatched in
/// [`main`]).
pub(crate) fn run(command: Command) -> kpack_host::Result<()> {
    match command {
        c @ (Command::Offload { .. } | Command::Prune { .. } | Command::Restore { .. }) => {
            run_rewrite(c)
        }
        Command::Artifact(_)
        | Command::SplitWheels(_)
        | Command::Doctor(_)
        | Command::Bundle(_) => {
            unreachable!("dispatched in main")
        }
        c => run_inspect(c),
    }
}

/// The commands that write a rewritten binary: offload, prune, restore.
pub(crate) fn run_rewrite(command: Command) -> kpack_host::Result<()> {
    match command {
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
            let opts = OffloadOptions {
                kernel_name,
                search_paths,
                extra_search_paths,
                group,
                scheme: compression.scheme(),
                level: compression_level,
                ..OffloadOptions::new(archive_dir)
            };
            offload(&input, &output, &opts, json)
        }
        Command::Prune {
            input,
            output,
            targets,
            keep_generic,
            json,
        } => prune(&input, &output, targets, keep_generic, json),
        Command::Restore {
            input,
            output,
            targets,
            keep_generic,
            compression,
            json,
        } => {
            let opts = kpack_host::restore::RestoreOptions {
                targets,
                keep_generic,
                compression: compression.restore(),
            };
            restore(&input, &output, &opts, json)
        }
        _ => unreachable!("not a rewriting command"),
    }
}

/// The commands that read and report: ls, extract, verify-elf, why, size,
/// diff.
pub(crate) fn run_inspect(command: Command) -> kpack_host::Result<()> {
    match command {
        Command::Ls { file, json } => ls(&file, json),
        Command::Extract {
            file,
            output,
            target,
            json,
        } => extract(&file, &output, target.as_deref(), json),
        Command::VerifyElf {
            file,
            offloaded,
            json,
        } => verify_elf(&file, offloaded, json),
        Command::Why {
            binary,
            archs,
            json,
        } => why(&binary, &archs, json),
        Command::Size { paths, json, svg } => size(&paths, json, svg.as_deref()),
        Command::Diff { a, b, json } => diff(&a, &b, json),
        _ => unreachable!("not an inspection command"),
    }
}

pub(crate) fn ls(file: &Path, json: bool) -> kpack_host::Result<()> {
    let listing = inspect::list(file)?;
    if json {
        print_json(&listing);
    } else {
        print_listing(&listing);
    }
    Ok(())
}

pub(crate) fn extract(
    file: &Path,
    output: &Path,
    target: Option<&str>,
    json: bool,
) -> kpack_host::Result<()> {
    let files = kpack_host::extract::extract(file, output, target)?;
    if json {
        print_json(&files);
    } else {
        for f in &files {
            outln!("{}\t{} bytes", output.join(&f.file).display(), f.size);
        }
    }
    Ok(())
}

pub(crate) fn offload(
    input: &Path,
    output: &Path,
    opts: &OffloadOptions,
    json: bool,
) -> kpack_host::Result<()> {
    let s = offload::offload(input, output, opts)?;
    // Limits of other readers the outputs exceed (they are written).
    for w in &s.warnings {
        eprintln!("kpack: warning: {w}");
    }
    if json {
        print_json(&s);
        return Ok(());
    }
    if let Some(note) = &s.note {
        eprintln!("kpack: note: {}: {note}", input.display());
    }
    if s.outcome == offload::Outcome::Offloaded {
        outln!(
            "{} -> {}: {} -> {} bytes, {} bundle(s), {} wrapper(s)",
            input.display(),
            output.display(),
            s.input_size,
            s.output_size,
            s.bundles,
            s.wrappers.len()
        );
        for a in &s.archives {
            outln!(
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

pub(crate) fn prune(
    input: &Path,
    output: &Path,
    targets: Vec<String>,
    keep_generic: bool,
    json: bool,
) -> kpack_host::Result<()> {
    let selection = kpack_host::prune::Selection {
        targets,
        keep_generic,
    };
    let s = kpack_host::prune::prune(input, output, &selection)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    outln!(
        "{} -> {}: {} -> {} bytes; kept {}; dropped {}",
        input.display(),
        output.display(),
        s.input_size,
        s.output_size,
        s.kept_targets.join(", "),
        if s.dropped_targets.is_empty() {
            "nothing".to_string()
        } else {
            s.dropped_targets.join(", ")
        }
    );
    for b in &s.bundles {
        outln!(
            "  bundle {}{}: {} -> {} bytes, kept [{}]",
            b.index,
            b.compressed
                .as_ref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default(),
            b.bytes_before,
            b.bytes_after,
            b.kept.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn restore(
    input: &Path,
    output: &Path,
    opts: &kpack_host::restore::RestoreOptions,
    json: bool,
) -> kpack_host::Result<()> {
    let s = kpack_host::restore::restore(input, output, opts)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    outln!(
        "{} -> {}: {} -> {} bytes; restored {} in {} bundle(s){}",
        input.display(),
        output.display(),
        s.input_size,
        s.output_size,
        s.targets.join(", "),
        s.bundles.len(),
        if s.compressed { ", compressed" } else { "" }
    );
    for b in &s.bundles {
        outln!(
            "  bundle for code object {}: {} bytes, [{}]",
            b.co_index,
            b.bytes,
            b.targets.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn why(binary: &Path, archs: &[String], json: bool) -> kpack_host::Result<()> {
    use kpack_host::why::Outcome;
    let w = kpack_host::why::why(binary, archs)?;
    if json {
        print_json(&w);
    } else {
        outln!(
            "{} (found at run time as {}): kernel name {}, search paths {}",
            binary.display(),
            w.binary_path.display(),
            w.kernel_name,
            w.search_paths.join(", ")
        );
        if let Some(t) = &w.targets {
            outln!("split for targets: {}", t.join(", "));
        }
        if let Some(d) = &w.device_digest {
            outln!("device code digest: {d}");
        }
        for x in &w.wrappers {
            print_wrapper_why(x);
        }
    }
    if w.all_resolve() {
        return Ok(());
    }
    let failing = w
        .wrappers
        .iter()
        .filter(|x| !matches!(x.result, Outcome::Loaded { .. }) && x.note.is_none())
        .count();
    // No archive can help a binary that has no code for the device.
    let no_code = match (&w.targets, w.has_code) {
        (Some(t), Some(false)) => format!(
            ": the binary has no code for them (it was split for {} only)",
            t.join(", ")
        ),
        _ => String::new(),
    };
    Err(kpack_host::Error::request(
        binary,
        format!(
            "{failing} of {} wrapper(s) do not resolve for {}{no_code}",
            w.wrappers.len(),
            archs.join(", ")
        ),
    ))
}

pub(crate) fn size(paths: &[PathBuf], json: bool, svg: Option<&Path>) -> kpack_host::Result<()> {
    let report = kpack_engine::size::size(paths)?;
    if let Some(file) = svg {
        let doc = crate::svg::treemap(&report.roots);
        kpack_host::output::write_atomically(file, |f| {
            std::io::Write::write_all(f, doc.as_bytes())
        })?;
    }
    if json {
        print_json(&report);
        return Ok(());
    }
    for r in &report.roots {
        print_size_root(r);
    }
    Ok(())
}

pub(crate) fn diff(a: &Path, b: &Path, json: bool) -> kpack_host::Result<()> {
    use kpack_format::bytes::format_size as fs;
    let d = kpack_engine::size::diff(a, b)?;
    if json {
        print_json(&d);
        return Ok(());
    }
    let delta = |x: u64, y: u64| {
        if y >= x {
            format!("+{}", fs(y - x))
        } else {
            format!("-{}", fs(x - y))
        }
    };
    outln!(
        "{} -> {} ({}): {} -> {} ({}); host {} -> {}; device {} -> {}",
        d.a,
        d.b,
        d.kind.name(),
        fs(d.bytes_a),
        fs(d.bytes_b),
        delta(d.bytes_a, d.bytes_b),
        fs(d.host_bytes_a),
        fs(d.host_bytes_b),
        fs(d.device_bytes_a),
        fs(d.device_bytes_b)
    );
    for (title, list) in [
        ("targets", &d.targets),
        ("binaries", &d.binaries),
        ("code objects", &d.code_objects),
    ] {
        outln!("{title}:");
        for c in list {
            outln!(
                "  {:<8} {}: {} -> {} stored, {} -> {} uncompressed",
                format!("{:?}", c.change).to_lowercase(),
                c.name,
                fs(c.stored_a),
                fs(c.stored_b),
                fs(c.uncompressed_a),
                fs(c.uncompressed_b)
            );
        }
    }
    Ok(())
}

pub(crate) fn verify_elf(file: &Path, offloaded_only: bool, json: bool) -> kpack_host::Result<()> {
    let mapped = kpack_loader::map_file(file)?;
    // Judged by the rules of the kind of binary it is: a fat binary's (what
    // prune and restore write) unless it carries HIPK metadata, whose
    // presence makes it an offloaded one, however damaged.
    let file_class = kpack_host::binary::classify_parsed(&mapped);
    let has_metadata = file_class
        .binary
        .as_ref()
        .is_ok_and(|b| matches!(b.metadata(), Ok(Some(m)) if m.in_file));
    if !offloaded_only && file_class.class == kpack_host::binary::Class::Fat && !has_metadata {
        let v = offload::verify_fat_file(file)?;
        if json {
            print_json(&serde_json::json!({"kind": "fat", "verified": v}));
        } else {
            outln!(
                "{}: ok: fat binary, {} wrapper(s), {} bundle(s), targets {}",
                file.display(),
                v.wrapper_bundles.len(),
                v.bundles,
                v.targets.join(", ")
            );
        }
        return Ok(());
    }
    drop(mapped);
    let v = offload::verify_file(file)?;
    // Defects of the reference tools' outputs, accepted (they load and run).
    for w in &v.warnings {
        eprintln!("kpack: warning: {}: {w}", file.display());
    }
    if json {
        print_json(&v);
    } else {
        outln!(
            "{}: ok: {} wrapper(s), kernel name {}, search paths {}",
            file.display(),
            v.co_indices.len(),
            v.metadata.kernel_name,
            v.metadata.search_paths.join(", ")
        );
    }
    Ok(())
}
