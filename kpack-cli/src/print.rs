//! The text output of `ls`, `why` and `size`.

use kpack_host::inspect::{self, Listing};

/// One wrapper of `kpack why`: the targets each agent tries, the candidate
/// archives with what each gave, and the result.
pub(crate) fn print_wrapper_why(x: &kpack_host::why::WrapperWhy) {
    use kpack_host::why::Outcome;
    outln!("wrapper {}: key {}", x.wrapper, x.trace.key);
    for a in &x.trace.agents {
        outln!("  {} tries {}", a.arch, a.targets.join(", "));
    }
    for (i, c) in x.trace.candidates.iter().enumerate() {
        outln!(
            "  {}. {}: {}",
            i + 1,
            c.path.display(),
            candidate_status(&c.status)
        );
        for t in x.trace.attempts.iter().filter(|t| t.candidate == i) {
            outln!("       {}: {}", t.target, attempt_outcome(&t.outcome));
        }
    }
    match &x.result {
        Outcome::Loaded {
            archive,
            target,
            size,
        } => outln!(
            "  => loads {target} from {} ({size} bytes)",
            archive.display()
        ),
        Outcome::Failed {
            code,
            error,
            message,
        } => outln!("  => {error} ({code}): {message}"),
    }
    if let Some(note) = &x.note {
        outln!("  note: {note}");
    }
}

/// What a candidate archive gave the loader, in words.
pub(crate) fn candidate_status(status: &kpack_loader::CandidateStatus) -> String {
    use kpack_loader::CandidateStatus;
    match status {
        CandidateStatus::NotReached => "not reached (found before it)".to_string(),
        CandidateStatus::Missing { error } => format!("missing ({error})"),
        CandidateStatus::Unusable { error } => format!("does not open: {error}"),
        CandidateStatus::SameAs { candidate } => {
            format!("the same archive as candidate {}", candidate + 1)
        }
        CandidateStatus::Opened { targets, .. } => {
            format!("opens, lists [{}]", targets.join(", "))
        }
    }
}

/// What looking up the key for one target of a candidate gave, in words.
pub(crate) fn attempt_outcome(outcome: &kpack_loader::AttemptOutcome) -> String {
    use kpack_loader::AttemptOutcome;
    match outcome {
        AttemptOutcome::KeyMissing => "listed, but no entry for the key".to_string(),
        AttemptOutcome::OtherBuild { binary, archive } => format!(
            "has the key, but of another build: {}",
            kpack_format::provenance::builds(binary, archive)
        ),
        AttemptOutcome::ReadFailed { error } => format!("has the key, read failed: {error}"),
        AttemptOutcome::Loaded { size } => format!("has the key: loaded, {size} bytes"),
    }
}

/// One path of `kpack size`: its totals, a table of its targets, and its
/// binaries, largest first.
pub(crate) fn print_size_root(r: &kpack_engine::size::Root) {
    use kpack_format::bytes::format_size as fs;
    outln!(
        "{}: {}, {} file(s), {}{}: host {}, device {} (stored), headers/padding/TOCs {}, other files {}",
        r.path,
        r.kind.name(),
        r.files,
        fs(r.bytes),
        r.unpacked_bytes
            .map(|u| format!(" ({} unpacked)", fs(u)))
            .unwrap_or_default(),
        fs(r.host_bytes),
        fs(r.device_bytes),
        fs(r.overhead_bytes),
        fs(r.other_bytes)
    );
    outln!(
        "  {:<24} {:>6} {:>12} {:>14} {:>7} {:>12}",
        "target",
        "codes",
        "stored",
        "uncompressed",
        "shared",
        "saved"
    );
    for (t, v) in &r.targets {
        outln!(
            "  {:<24} {:>6} {:>12} {:>14} {:>7} {:>12}",
            t,
            v.code_objects,
            fs(v.stored),
            fs(v.uncompressed),
            v.shared,
            fs(v.bytes_saved)
        );
    }
    print_size_binaries(&r.binaries);
}

/// The binaries of one path of `kpack size`, largest (host and stored
/// device bytes) first, then by name.
pub(crate) fn print_size_binaries(binaries: &[kpack_engine::size::BinaryBytes]) {
    use kpack_engine::size::BinaryBytes;
    use kpack_format::bytes::format_size as fs;
    let device = |b: &BinaryBytes| -> u64 { b.targets.values().map(|t| t.stored).sum() };
    let total = |b: &BinaryBytes| b.host_bytes + device(b);
    let mut bins: Vec<&BinaryBytes> = binaries.iter().collect();
    bins.sort_by(|a, b| total(b).cmp(&total(a)).then(a.name.cmp(&b.name)));
    for b in bins {
        outln!(
            "  {} ({}): host {}, device {} in {} target(s)",
            b.name,
            b.kind,
            fs(b.host_bytes),
            fs(device(b)),
            b.targets.len()
        );
    }
}

pub(crate) fn print_listing(listing: &Listing) {
    match listing {
        Listing::FatBinary(f) => print_fat_binary(f),
        Listing::Archive(a) => print_archive(a),
        Listing::Offloaded(o) => print_offloaded(o),
        Listing::CodeObject(c) => print_code_object(c),
        Listing::LinkInput(l) => print_link_input(l),
    }
}

pub(crate) fn print_link_input(l: &kpack_host::link_input::LinkInputListing) {
    let what = match l.container {
        "static_archive" => "static archive",
        _ => "relocatable object",
    };
    outln!(
        "{}: link input ({what}), {} bytes: device code in {} object(s), not offloaded (link inputs are copied as they are)",
        l.file,
        l.file_size,
        l.members.len()
    );
    outln!("targets ({}): {}", l.targets.len(), l.targets.join(", "));
    for m in &l.members {
        outln!("  {} ({}): {} image(s)", m.name, m.section, m.images.len());
        for i in &m.images {
            outln!(
                "    {:<28} {:>10} bytes  {} ({}, {})",
                i.target,
                i.size,
                i.kind,
                i.triple,
                i.producer
            );
        }
    }
}

pub(crate) fn print_code_object(c: &inspect::CodeObjectListing) {
    let target = c.target.as_deref().unwrap_or("an unrecorded target");
    outln!(
        "{}: AMDGPU code object for {}, {} bytes (device code on its own, not a host binary)",
        c.file,
        target,
        c.file_size
    );
    outln!("kernels ({}):", c.kernels.len());
    for k in &c.kernels {
        outln!("  {k}");
    }
}

pub(crate) fn print_fat_binary(f: &inspect::FatBinaryListing) {
    match f.section_offset {
        Some(off) => outln!(
            "{}: fat binary ({}), {} bytes; {}: {} bytes at offset {:#x}",
            f.file,
            f.container,
            f.file_size,
            f.section_name.as_deref().unwrap_or(".hip_fatbin"),
            f.section_size,
            off
        ),
        None => outln!("{}: offload bundle file, {} bytes", f.file, f.file_size),
    }
    outln!("targets ({}): {}", f.targets.len(), f.targets.join(", "));
    outln!("bundles: {}", f.bundles.len());
    // Bundles that do not all hold the same targets: each says which.
    let differ = f.bundles.windows(2).any(|w| w[0].targets != w[1].targets);
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
                if c.hash_matches == Some(false) {
                    ", hash MISMATCH"
                } else {
                    ""
                }
            ),
            None => String::new(),
        };
        outln!(
            "  bundle {} at {:#x}, {} bytes{}{}",
            b.index,
            b.offset,
            b.stored_size,
            how,
            match differ {
                true => format!(", targets {}", or_none(&b.targets)),
                false => String::new(),
            }
        );
        for e in &b.entries {
            match &e.target {
                Some(t) => outln!("    {:<28} {:>10} bytes  {}", t, e.size, e.triple),
                None => outln!("    {:<28} {:>10} bytes  {}", "(host)", e.size, e.triple),
            }
        }
    }
    print_wrappers(&f.wrappers);
}

pub(crate) fn print_archive(a: &inspect::ArchiveListing) {
    outln!(
        "{}: kpack archive version {}, {} bytes",
        a.file,
        a.format_version,
        a.file_size
    );
    outln!(
        "group: {}  family: {}  scheme: {}",
        a.group_name,
        a.gfx_arch_family,
        a.compression_scheme
    );
    outln!(
        "targets ({}): {}",
        a.gfx_arches.len(),
        a.gfx_arches.join(", ")
    );
    outln!("kernels: {}", a.kernels.len());
    for k in &a.kernels {
        use kpack_format::provenance::short;
        let digests = match (&k.code_object_sha256, &k.binary_sha256) {
            (Some(c), Some(b)) => format!("  sha256 {} of binary {}", short(c), short(b)),
            (Some(c), None) => format!("  sha256 {}", short(c)),
            (None, Some(b)) => format!("  of binary {}", short(b)),
            (None, None) => String::new(),
        };
        outln!(
            "  {:>5}  {:<40} {:<24} {:>10} bytes{digests}",
            k.ordinal,
            k.key,
            k.target,
            k.original_size
        );
    }
}

pub(crate) fn print_offloaded(o: &inspect::OffloadedListing) {
    outln!(
        "{}: offloaded host binary ({}), {} bytes",
        o.file,
        match (&o.elf_type, &o.pe_kind) {
            (Some(t), _) => format!("{t:?}"),
            (None, Some(k)) => format!("{k:?}").to_uppercase(),
            (None, None) => "?".into(),
        },
        o.file_size
    );
    outln!("kernel name: {}", o.kernel_name);
    outln!("search paths:");
    for p in &o.search_paths {
        outln!("  {p}");
    }
    match &o.targets {
        Some(t) => outln!("split for targets ({}): {}", t.len(), t.join(", ")),
        None => outln!("split for targets: not recorded (no kpack_targets in the metadata)"),
    }
    if let Some(d) = &o.device_sha256 {
        outln!("device code digest: {d}");
    }
    if let Some(per) = &o.bundle_targets {
        outln!("bundles built for different targets (kpack_co_targets):");
        for c in per {
            outln!("  #{}: {}", c.co_index, or_none(&c.targets));
        }
    }
    outln!("metadata at address {:#x}", o.metadata_address);
    print_wrappers(&o.wrappers);
}

pub(crate) fn print_wrappers(ws: &[inspect::WrapperListing]) {
    outln!("wrappers: {}", ws.len());
    for w in ws {
        outln!(
            "  {}: {} version {} binary {:#x} reserved1 {}",
            w.index,
            w.magic,
            w.version,
            w.binary,
            w.reserved1
        );
    }
}

/// A list of targets, or "none".
fn or_none(targets: &[String]) -> String {
    match targets.is_empty() {
        true => "none".into(),
        false => targets.join(", "),
    }
}
