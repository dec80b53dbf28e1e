//! Checks a built fixture against its [`Fixture`] entry, independently of
//! kpack's crates: the ELF type, `.hip_fatbin` and its bundles (targets listed by
//! LLVM's clang-offload-bundler), the wrappers, `.relr.dyn`, and the host
//! code (executables run, libraries' host check is called through dlcheck).

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use object::elf::{ET_DYN, ET_EXEC};
use object::read::elf::{ElfFile64, FileHeader};
use object::{Endianness, Object, ObjectSection};
use xshell::Shell;

use kpack_testkit::manifest::{wine_path, Kind};
use kpack_testkit::oracle::{bundler_triples, entry_triples, split_bundles, target_of};

use crate::fixtures::Fixture;

const CCOB_MAGIC: &[u8] = b"CCOB";
/// Size of one `__CudaFatBinaryWrapper` in `.hipFatBinSegment`.
const WRAPPER_SIZE: u64 = 24;

/// Check the fixture at `path`; its host code runs through the loader of
/// its host in `fixtures_dir` (`dlcheck`, or `<host>/crossload` under
/// qemu-user).
pub fn check(sh: &Shell, path: &Path, fixture: &Fixture, fixtures_dir: &Path) -> Result<()> {
    if fixture.host.is_windows() {
        return check_pe(sh, path, fixture, fixtures_dir);
    }
    let data = sh.read_binary_file(path)?;
    let elf = ElfFile64::<Endianness>::parse(&*data).context("not a 64-bit ELF file")?;

    let e_type = elf.elf_header().e_type(elf.endian());
    let interp = elf.section_by_name(".interp").is_some();
    let kind = match (e_type, interp) {
        (ET_DYN, false) => Kind::Shared,
        (ET_DYN, true) => Kind::Pie,
        (ET_EXEC, _) => Kind::Exec,
        _ => bail!("unexpected ELF type {e_type}"),
    };
    ensure!(
        kind == fixture.kind,
        "kind {kind:?}, expected {:?}",
        fixture.kind
    );

    let fatbin = match elf.section_by_name(".hip_fatbin") {
        Some(section) => section.data()?,
        None => &[],
    };
    check_bundles(sh, path, fixture, fatbin)?;

    let wrappers = elf
        .section_by_name(".hipFatBinSegment")
        .map_or(0, |s| s.size() / WRAPPER_SIZE);
    ensure!(
        wrappers == fixture.wrappers as u64,
        "{wrappers} wrappers, expected {}",
        fixture.wrappers
    );

    let relr = elf.section_by_name(".relr.dyn").is_some();
    ensure!(
        relr == fixture.relr,
        "has .relr.dyn: {relr}, expected {}",
        fixture.relr
    );

    ensure!(
        elf.elf_header().e_machine(elf.endian()) == fixture.host.e_machine(),
        "machine {}, expected {:?}",
        elf.elf_header().e_machine(elf.endian()),
        fixture.host
    );
    let host = fixture.host;
    match (fixture.kind, &fixture.host_check) {
        (Kind::Pie | Kind::Exec, _) => {
            run(host.command(path))?;
        }
        (Kind::Shared, Some(check)) => {
            let symbol = &*check.symbol;
            let loader = fixtures_dir.join(host.loader());
            let mut c = host.command(&loader);
            c.arg(path).arg(symbol);
            let out = run(c)?;
            let value: i32 = out.trim().parse().context("loader output")?;
            ensure!(
                value == check.value,
                "{symbol}() returned {value}, expected {}",
                check.value
            );
        }
        (Kind::Shared, None) => {}
    }
    Ok(())
}

/// `.hip_fatbin` (PE: `.hip_fat`) holds the fixture's bundles, each with
/// its targets as clang-offload-bundler lists them.
fn check_bundles(sh: &Shell, path: &Path, fixture: &Fixture, fatbin: &[u8]) -> Result<()> {
    let bundles = split_bundles(fatbin)?;
    ensure!(
        bundles.len() == fixture.bundles,
        "{} bundles, expected {}",
        bundles.len(),
        fixture.bundles
    );
    let compressed = bundles.iter().filter(|b| b.starts_with(CCOB_MAGIC)).count();
    ensure!(
        compressed == fixture.compressed_bundles,
        "{compressed} compressed bundles, expected {}",
        fixture.compressed_bundles
    );
    let mut expected: Vec<&str> = fixture.targets.to_vec();
    expected.sort_unstable();
    let scratch = path.with_extension("bundle.tmp");
    for (index, bundle) in bundles.iter().enumerate() {
        sh.write_file(&scratch, bundle)?;
        let listed = bundler_triples(&scratch);
        sh.remove_path(&scratch)?;
        let listed = listed.with_context(|| format!("bundle {index}"))?;
        // The bundler misprints processors LLVM 19 does not know
        // (gfx1250-strict): targets from the entry table, the count from
        // both.
        let triples = entry_triples(bundle).with_context(|| format!("bundle {index}"))?;
        ensure!(
            listed.len() == triples.len(),
            "bundle {index}: the bundler lists {} device entries, the entry table has {}",
            listed.len(),
            triples.len()
        );
        let mut targets: Vec<&str> = triples.iter().map(|t| target_of(t)).collect();
        targets.sort_unstable();
        ensure!(
            targets == expected,
            "bundle {index} has targets {targets:?}, expected {expected:?}"
        );
    }
    Ok(())
}

/// A Windows fixture: a PE32+ image of the right kind for x86-64, its
/// bundles and wrappers, and its host code run under Wine (prefix
/// `windows/wineprefix` in the fixtures directory, which the tests use
/// too): a DLL through
/// `winload.exe`, an EXE directly; the stand-in `amdhip64.dll` must have
/// seen every wrapper, HIPF.
fn check_pe(sh: &Shell, path: &Path, fixture: &Fixture, fixtures_dir: &Path) -> Result<()> {
    use object::pe::IMAGE_FILE_DLL;
    use object::read::pe::PeFile64;
    let data = sh.read_binary_file(path)?;
    let pe = PeFile64::parse(&*data).context("not a PE32+ image")?;
    let header = &pe.nt_headers().file_header;
    let dll = header.characteristics.get(object::LittleEndian) & IMAGE_FILE_DLL != 0;
    let kind = if dll { Kind::Shared } else { Kind::Exec };
    ensure!(
        kind == fixture.kind,
        "kind {kind:?}, expected {:?}",
        fixture.kind
    );
    let machine = header.machine.get(object::LittleEndian);
    ensure!(machine == fixture.host.e_machine(), "machine {machine:#x}");
    let fatbin = match pe.section_by_name(".hip_fat") {
        Some(section) => section.data()?,
        None => &[],
    };
    check_bundles(sh, path, fixture, fatbin)?;
    let wrappers = pe
        .section_by_name(".hipFatB")
        .map_or(Ok(0), |s| s.data().map(|d| d.len() / WRAPPER_SIZE as usize))?;
    ensure!(
        wrappers == fixture.wrappers,
        "{wrappers} wrappers, expected {}",
        fixture.wrappers
    );
    let host = fixture.host;
    let prefix = fixtures_dir.join(host.dir()).join("wineprefix");
    let mut c = match &fixture.host_check {
        Some(check) => {
            let mut c = host.command(&fixtures_dir.join(host.loader()));
            c.arg(wine_path(path)).arg(&*check.symbol);
            c
        }
        None => host.command(path),
    };
    c.env("WINEPREFIX", &prefix);
    let out = run(c)?;
    let mut lines = out.lines();
    let value: i32 = lines
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .context("host output")?;
    let expected = fixture.host_check.as_ref().map_or(1_571_328, |c| c.value);
    ensure!(
        value == expected,
        "host code returned {value}, expected {expected}"
    );
    let seen: Vec<&str> = lines.collect();
    ensure!(
        seen.len() == fixture.wrappers && seen.iter().all(|l| l.starts_with("48495046 1 ")),
        "the stand-in runtime saw {seen:?}, expected {} HIPF wrappers",
        fixture.wrappers
    );
    Ok(())
}

/// Run a command; its stdout, or an error with its stderr.
fn run(mut c: std::process::Command) -> Result<String> {
    let out = c.output().with_context(|| format!("running {c:?}"))?;
    ensure!(
        out.status.success(),
        "{c:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
