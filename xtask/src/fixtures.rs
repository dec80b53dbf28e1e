//! The test fixtures: HIP fat binaries (and one host-only library) built with
//! Debian's clang-19 and lld-19 from the sources in `integration/hip`, without
//! a GPU or a ROCm install.
//!
//! [`FIXTURES`] is the list; [`build_all`] builds it into `target/fixtures`,
//! checks every result against its entry and writes `fixtures.json` for the
//! test suite. A fixture is rebuilt only when its sources, its commands or
//! the compiler change (a stamp file per fixture records all three, plus a
//! hash of the output so that a modified output is rebuilt too).

use std::fmt::Write as _;
use std::path::Path;

use std::borrow::Cow;

use anyhow::{bail, Context, Result};
use kpack_testkit::manifest::{self, Entry, Host, HostCheck, Kind, Manifest};
use kpack_testkit::{oracle, shards};
use xshell::{cmd, Shell};

use crate::verify;

/// The C++ compiler driver that builds the fixtures.
pub const CLANGXX: &str = "clang++-19";
/// The C compiler driver (for the `dlcheck` helper).
pub const CLANG: &str = "clang-19";
/// Sources of the fixtures, relative to the workspace root.
pub const HIP_DIR: &str = "integration/hip";
/// Output directory, relative to the workspace root.
pub const FIXTURES_DIR: &str = "target/fixtures";
/// The committed demo library, relative to the workspace root.
pub const SAMPLE_DIR: &str = "integration/sample";
/// Name of the helper that dlopen()s a library and calls `int f(void)`.
pub const DLCHECK: &str = "dlcheck";

const COMMON_FLAGS: &[&str] = &["-O2", "-Wall"];

/// How a fixture is compiled and linked.
pub enum Build {
    /// One `clang++` call compiles and links all sources.
    Single {
        sources: &'static [&'static str],
        flags: &'static [&'static str],
    },
    /// Each unit is compiled alone with `-c`; a last call links the objects.
    PerObject { units: &'static [Unit] },
    /// Bundles made by `clang-offload-bundler` from [`Device`] code of our
    /// choosing (targets clang 19 cannot compile for: `gfx1250-strict`,
    /// `amdgcnspirv`), embedded in each unit's host object by clang
    /// (`--cuda-host-only -fcuda-include-gpubinary`, which also emits the
    /// wrapper and its registration, as a normal HIP compile does); a last
    /// call links the objects. Every unit's bundle holds `entries`.
    Bundled {
        units: &'static [Unit],
        entries: &'static [(&'static str, Device)],
        bundler: Bundler,
    },
}

/// Who writes a [`Build::Bundled`] bundle.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Bundler {
    /// LLVM 19's `clang-offload-bundler` (a unit's `compress` asks for a
    /// compressed bundle).
    Llvm,
    /// `cargo xtask bundle` ([`write_bundle`]): triples exactly as given,
    /// for processors LLVM 19 does not know (its bundler writes
    /// `...--gfx1250-strict-`); never compressed.
    Own,
}

/// `cargo xtask bundle`: an uncompressed bundle of a host entry and the
/// `inputs`, one per triple of `triples` (comma-separated).
pub fn write_bundle(triples: &str, inputs: &[std::path::PathBuf], output: &Path) -> Result<()> {
    let triples: Vec<&str> = triples.split(',').collect();
    if triples.len() != inputs.len() {
        bail!("{} triples for {} inputs", triples.len(), inputs.len());
    }
    let data = inputs
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<Vec<_>>>()?;
    let mut entries: Vec<(&str, &[u8])> = vec![("host-x86_64-unknown-linux--", &[])];
    entries.extend(triples.iter().copied().zip(data.iter().map(Vec::as_slice)));
    std::fs::write(output, oracle::write_bundle(&entries))
        .with_context(|| format!("writing {}", output.display()))
}

/// What one entry of a [`Build::Bundled`] bundle holds.
pub enum Device {
    /// The unit's source compiled by clang for this processor, with these
    /// extra flags (the bundle's triple may name another target: LLVM 19
    /// knows no gfx1250).
    Compiled {
        arch: &'static str,
        flags: &'static [&'static str],
    },
    /// A file in `integration/hip`.
    File(&'static str),
}

/// A HIP source compiled to an object of its own.
pub struct Unit {
    pub source: &'static str,
    pub compress: bool,
}

/// One fixture and what the build must produce.
pub struct Fixture {
    /// File name in `target/fixtures` (or in a shard's directory there).
    pub name: &'static str,
    /// Shared libraries: `DT_SONAME`, if not the file name.
    pub soname: Option<&'static str>,
    pub kind: Kind,
    /// What the host code is built for (foreign hosts: compiled by clang,
    /// linked by the host's GNU toolchain, see [`Fixture::cross_commands`]).
    pub host: Host,
    /// Offload target IDs; every bundle holds exactly these.
    pub targets: &'static [&'static str],
    pub build: Build,
    /// Number of bundles in `.hip_fatbin` (0: no such section).
    pub bundles: usize,
    /// Number of wrappers in `.hipFatBinSegment`.
    pub wrappers: usize,
    /// How many of the bundles are compressed (CCOB).
    pub compressed_bundles: usize,
    /// Linked with packed relative relocations (`.relr.dyn`).
    pub relr: bool,
    /// For libraries: a host function the tests can call after dlopen().
    /// Executables instead run and exit 0.
    pub host_check: Option<HostCheck>,
    pub description: &'static str,
}

const VADD_CHECK: Option<HostCheck> = host_check("vadd_host_check", 1_571_328);
const RDC_CHECK: Option<HostCheck> = host_check("rdc_host_check", 123);
const REDUCE_CHECK: Option<HostCheck> = host_check("reduce_host_check", 500_500);

const fn host_check(symbol: &'static str, value: i32) -> Option<HostCheck> {
    Some(HostCheck {
        symbol: Cow::Borrowed(symbol),
        value,
    })
}

/// The fixtures. The names are a contract with the test suite.
pub const FIXTURES: &[Fixture] = &[
    Fixture {
        name: "libvadd.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx1101", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip"],
            flags: &[],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: false,
        host_check: VADD_CHECK,
        description: "vector add and SAXPY kernels, one uncompressed bundle",
    },
    Fixture {
        name: "vadd_pie",
        soname: None,
        kind: Kind::Pie,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip", "vadd_main.cpp"],
            flags: &[],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: false,
        host_check: None,
        description: "PIE executable; runs on the host and exits 0",
    },
    Fixture {
        name: "vadd_nopie",
        soname: None,
        kind: Kind::Exec,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip", "vadd_main.cpp"],
            flags: &[],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: false,
        host_check: None,
        description: "ET_EXEC executable (-no-pie); runs on the host and exits 0",
    },
    Fixture {
        name: "libvadd_compressed.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx1101", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip"],
            flags: &["--offload-compress"],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 1,
        relr: false,
        host_check: VADD_CHECK,
        description: "libvadd with a compressed bundle (CCOB v2, zstd)",
    },
    Fixture {
        name: "librdc.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::Single {
            sources: &["rdc_a.hip", "rdc_b.hip", "rdc_c.hip"],
            flags: &["-fgpu-rdc"],
        },
        bundles: 1,
        wrappers: 3,
        compressed_bundles: 0,
        relr: false,
        host_check: RDC_CHECK,
        description: "-fgpu-rdc, 3 translation units device-linked into 1 bundle, 3 wrappers",
    },
    Fixture {
        name: "libmulti.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::PerObject {
            units: &[
                Unit {
                    source: "vadd.hip",
                    compress: false,
                },
                Unit {
                    source: "reduce.hip",
                    compress: true,
                },
                Unit {
                    source: "stencil.hip",
                    compress: false,
                },
                Unit {
                    source: "histogram.hip",
                    compress: true,
                },
            ],
        },
        bundles: 4,
        wrappers: 4,
        compressed_bundles: 2,
        relr: false,
        host_check: REDUCE_CHECK,
        description: "4 objects with device code (2nd and 4th compressed): 4 bundles, 4 wrappers",
    },
    Fixture {
        name: "libwide.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &[
            "gfx900",
            "gfx906",
            "gfx908",
            "gfx90a:xnack+",
            "gfx90a:xnack-",
            "gfx1030",
            "gfx1100",
            "gfx1201",
        ],
        build: Build::Single {
            sources: &["vadd.hip"],
            flags: &[],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: false,
        host_check: VADD_CHECK,
        description: "8 targets, including feature flags (xnack+/xnack-)",
    },
    Fixture {
        name: "libvadd_relr.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip"],
            flags: &["-Wl,-z,pack-relative-relocs"],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: true,
        host_check: VADD_CHECK,
        description: "packed relative relocations (.relr.dyn, DT_RELR)",
    },
    Fixture {
        name: "libvadd_dwarf4.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &["gfx1100", "gfx942"],
        build: Build::Single {
            sources: &["vadd.hip"],
            flags: &["-g", "-gdwarf-4"],
        },
        bundles: 1,
        wrappers: 1,
        compressed_bundles: 0,
        relr: false,
        host_check: VADD_CHECK,
        description: "DWARF 4 debug info (what dwz, Debian's dh_dwz, rewrites)",
    },
    Fixture {
        name: "libhostonly.so",
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets: &[],
        build: Build::Single {
            sources: &["hostonly.cpp"],
            flags: &[],
        },
        bundles: 0,
        wrappers: 0,
        compressed_bundles: 0,
        relr: false,
        host_check: host_check("hostonly_host_check", 4950),
        description: "host-only C++ library: no .hip_fatbin",
    },
];

/// Targets of the large foreign fixtures: twelve code objects per unit,
/// so that `.hip_fatbin` spans several whole 64 KiB pages.
const MANY_TARGETS: &[&str] = &[
    "gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
    "gfx1151", "gfx1200", "gfx1201",
];

const FOUR_UNITS: &[Unit] = &[
    Unit {
        source: "vadd.hip",
        compress: false,
    },
    Unit {
        source: "stencil.hip",
        compress: false,
    },
    Unit {
        source: "histogram.hip",
        compress: false,
    },
    Unit {
        source: "reduce.hip",
        compress: false,
    },
];

/// The fixtures of one foreign host (AArch64, ppc64le): a small library,
/// a large one whose `.hip_fatbin` spans several 64 KiB pages (GNU ld's
/// segment alignment there) without starting on one, and a PIE executable
/// with the stand-in HIP runtime linked in. Names are `<host dir>/<file>`.
pub fn foreign_fixtures(host: Host) -> Vec<Fixture> {
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let d = host.dir();
    let lib = |file: &'static str, targets, units, bundles, description| Fixture {
        name: leak(format!("{d}/{file}")),
        soname: Some(file),
        kind: Kind::Shared,
        host,
        targets,
        build: Build::PerObject { units },
        bundles,
        wrappers: bundles,
        compressed_bundles: 0,
        relr: false,
        host_check: VADD_CHECK,
        description,
    };
    vec![
        lib(
            "libvadd.so",
            &["gfx1100", "gfx942"],
            &FOUR_UNITS[..1],
            1,
            "linked by GNU ld: .hip_fatbin smaller than a 64 KiB page",
        ),
        lib(
            "libbig.so",
            MANY_TARGETS,
            FOUR_UNITS,
            4,
            "linked by GNU ld: four bundles of twelve targets over several 64 KiB pages",
        ),
        Fixture {
            name: leak(format!("{d}/vadd_pie")),
            soname: None,
            kind: Kind::Pie,
            host,
            targets: &["gfx1100", "gfx942"],
            build: Build::Single {
                sources: &["vadd.hip", "vadd_main.cpp", "hipstub.c"],
                flags: &["-g", "-gdwarf-4"],
            },
            bundles: 1,
            wrappers: 1,
            compressed_bundles: 0,
            relr: false,
            host_check: None,
            description: "PIE executable with the stand-in HIP runtime linked in, DWARF 4",
        },
    ]
}

/// Targets of the TheRock tree's rocBLAS: features, and a generic
/// processor (code object v6, which LLVM 19 only emits when asked).
const ROCBLAS_ENTRIES: &[(&str, Device)] = &[
    (
        "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
        compiled("gfx90a:xnack-"),
    ),
    (
        "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+",
        compiled("gfx90a:xnack+"),
    ),
    ("hipv4-amdgcn-amd-amdhsa--gfx942", compiled("gfx942")),
    ("hipv4-amdgcn-amd-amdhsa--gfx1100", compiled("gfx1100")),
    (
        "hipv4-amdgcn-amd-amdhsa--gfx11-generic",
        Device::Compiled {
            arch: "gfx11-generic",
            flags: &["-mcode-object-version=6", "-Wno-unknown-warning-option"],
        },
    ),
    ("hipv4-amdgcn-amd-amdhsa--gfx1201", compiled("gfx1201")),
];

/// Targets of the TheRock tree's MIOpen: a strict target beside its
/// non-strict one, and SPIR-V. LLVM 19 knows no gfx1250: those entries
/// hold gfx1200/gfx1201 code (distinct bytes, so that a mix-up shows); the
/// SPIR-V entry is a minimal module (`integration/hip/amdgcnspirv.spv`:
/// header, `OpCapability Addresses`, `OpCapability Kernel`,
/// `OpMemoryModel Physical64 OpenCL`), as clang 19 emits SPIR-V only with
/// llvm-spirv.
const MIOPEN_ENTRIES: &[(&str, Device)] = &[
    ("hipv4-amdgcn-amd-amdhsa--gfx942", compiled("gfx942")),
    ("hipv4-amdgcn-amd-amdhsa--gfx1250", compiled("gfx1200")),
    (
        "hipv4-amdgcn-amd-amdhsa--gfx1250-strict",
        compiled("gfx1201"),
    ),
    (
        "hip-spirv64-amd-amdhsa--amdgcnspirv",
        Device::File("amdgcnspirv.spv"),
    ),
];

const fn compiled(arch: &'static str) -> Device {
    Device::Compiled { arch, flags: &[] }
}

/// The fat binaries of the TheRock-shaped tree (`therock/`; the tests lay
/// the tree out around them, with synthetic database files): several
/// bundles (one compressed), strict, generic and SPIR-V targets, and
/// MIOpen's per-target CK libraries (fat binaries of one target each).
pub fn therock_fixtures() -> Vec<Fixture> {
    vec![
        therock_rocblas(),
        therock_miopen(),
        therock_ck(
            "therock/libMIOpenCKGroupedConv_gfx942.so",
            "libMIOpenCKGroupedConv_gfx942.so",
            &["gfx942"],
        ),
        therock_ck(
            "therock/libMIOpenCKGroupedConv_gfx1100.so",
            "libMIOpenCKGroupedConv_gfx1100.so",
            &["gfx1100"],
        ),
    ]
}

/// The units of the TheRock tree's rocBLAS: the second compressed.
const ROCBLAS_UNITS: &[Unit] = &[
    Unit {
        source: "vadd.hip",
        compress: false,
    },
    Unit {
        source: "reduce.hip",
        compress: true,
    },
];

/// The units of the TheRock tree's MIOpen, none compressed.
const MIOPEN_UNITS: &[Unit] = &[
    Unit {
        source: "vadd.hip",
        compress: false,
    },
    Unit {
        source: "stencil.hip",
        compress: false,
    },
];

/// A TheRock library: an x86-64 Linux shared library with `soname`, one
/// wrapper per bundle and vadd's host check.
fn therock_lib(
    name: &'static str,
    soname: &'static str,
    targets: &'static [&'static str],
    build: Build,
    bundles: usize,
    compressed_bundles: usize,
    description: &'static str,
) -> Fixture {
    Fixture {
        name,
        soname: Some(soname),
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets,
        build,
        bundles,
        wrappers: bundles,
        compressed_bundles,
        relr: false,
        host_check: VADD_CHECK,
        description,
    }
}

/// rocBLAS: two bundles (the second compressed) by clang-offload-bundler.
fn therock_rocblas() -> Fixture {
    therock_lib(
        "therock/librocblas.so.4.4",
        "librocblas.so.4",
        &[
            "gfx90a:xnack-",
            "gfx90a:xnack+",
            "gfx942",
            "gfx1100",
            "gfx11-generic",
            "gfx1201",
        ],
        Build::Bundled {
            units: ROCBLAS_UNITS,
            entries: ROCBLAS_ENTRIES,
            bundler: Bundler::Llvm,
        },
        2,
        1,
        "two bundles (the second compressed): xnack± and a generic target",
    )
}

/// MIOpen: two bundles by our own bundler (targets clang 19 does not know).
fn therock_miopen() -> Fixture {
    therock_lib(
        "therock/libMIOpen.so.1",
        "libMIOpen.so.1",
        &["gfx942", "gfx1250", "gfx1250-strict", "amdgcnspirv"],
        Build::Bundled {
            units: MIOPEN_UNITS,
            entries: MIOPEN_ENTRIES,
            bundler: Bundler::Own,
        },
        2,
        0,
        "two bundles: gfx1250 and gfx1250-strict side by side, and amdgcnspirv",
    )
}

/// MIOpen's per-target CK library: one bundle of `target`, from vadd.
fn therock_ck(
    name: &'static str,
    soname: &'static str,
    target: &'static [&'static str],
) -> Fixture {
    therock_lib(
        name,
        soname,
        target,
        Build::Single {
            sources: &["vadd.hip"],
            flags: &[],
        },
        1,
        0,
        "MIOpen's per-target CK library: a fat binary of one target",
    )
}

/// Linux hosts other than this machine's (Windows fixtures:
/// [`windows_fixtures`]).
pub fn foreign_hosts() -> impl Iterator<Item = Host> {
    Host::ALL
        .into_iter()
        .filter(|h| !h.is_native() && !h.is_windows())
}

// Windows fixtures: PE32+ DLLs and an EXE, built by clang-19 for
// x86_64-pc-windows-msvc and lld against a stand-in amdhip64.dll (no HIP
// runtime, no MSVC runtime here: integration/hip/windows has the few
// pieces needed), run under Wine.

/// The Windows sources, relative to [`HIP_DIR`].
const WINDOWS_DIR: &str = "windows";
/// Compiled into every Windows fixture: the support job's outputs.
const WINDOWS_SUPPORT: &[&str] = &[
    "windows/crt.c",
    "windows/crtexe.c",
    "windows/amdhip64.c",
    "windows/kernel32.def",
];

/// A Windows fixture: the common description plus what only a PE link
/// needs.
pub struct WinFixture {
    pub fixture: Fixture,
    /// Extra linker flags (`-Wl,...`).
    pub link_flags: &'static [&'static str],
    /// A file (below [`HIP_DIR`]) appended to the linked image: data after
    /// the last section.
    pub append: Option<&'static str>,
}

/// The Windows fixtures. Names are `windows/<file>`.
pub fn windows_fixtures() -> Vec<WinFixture> {
    vec![
        WinFixture::plain(windows_dll(
            "windows/vadd.dll",
            &["gfx1100", "gfx942"],
            windows_vadd(&[]),
            1,
            0,
            VADD_CHECK,
            "PE32+ DLL, one bundle",
        )),
        windows_multi(),
        WinFixture::plain(windows_dll(
            "windows/vadd_compressed.dll",
            &["gfx1100", "gfx1101", "gfx942"],
            windows_vadd(&["--offload-compress"]),
            1,
            1,
            VADD_CHECK,
            "a compressed bundle (CCOB v2, zstd)",
        )),
        windows_overlay(),
        WinFixture::plain(windows_dll(
            "windows/big.dll",
            MANY_TARGETS,
            Build::PerObject { units: FOUR_UNITS },
            4,
            0,
            VADD_CHECK,
            "four bundles of twelve targets: 48 code objects",
        )),
        WinFixture::plain(windows_dll(
            "windows/small.dll",
            &["gfx1100"],
            windows_vadd(&["--offload-compress"]),
            1,
            1,
            VADD_CHECK,
            ".hip_fat smaller than a page",
        )),
        WinFixture::plain(windows_exe()),
    ]
}

/// A Windows DLL (PE32+, x86-64): one wrapper per bundle.
fn windows_dll(
    name: &'static str,
    targets: &'static [&'static str],
    build: Build,
    bundles: usize,
    compressed_bundles: usize,
    host_check: Option<HostCheck>,
    description: &'static str,
) -> Fixture {
    Fixture {
        name,
        soname: None,
        kind: Kind::Shared,
        host: Host::X86_64Windows,
        targets,
        build,
        bundles,
        wrappers: bundles,
        compressed_bundles,
        relr: false,
        host_check,
        description,
    }
}

/// vadd.hip compiled and linked at once, with `flags`.
fn windows_vadd(flags: &'static [&'static str]) -> Build {
    Build::Single {
        sources: &["vadd.hip"],
        flags,
    }
}

/// libmulti's units as a DLL whose image base is the loader EXE's.
fn windows_multi() -> WinFixture {
    WinFixture {
        link_flags: &["-Wl,-base:0x140000000"],
        ..WinFixture::plain(windows_dll(
            "windows/multi.dll",
            &["gfx1100", "gfx942"],
            Build::PerObject {
                units: libmulti_units(),
            },
            4,
            2,
            REDUCE_CHECK,
            "4 objects (2nd and 4th compressed): 4 bundles; its image base is the loader EXE's, so Windows relocates it",
        ))
    }
}

/// A DLL with a COFF symbol table and data appended after its image.
fn windows_overlay() -> WinFixture {
    WinFixture {
        link_flags: &["-Wl,-debug:symtab"],
        append: Some("windows/crt.c"),
        ..WinFixture::plain(windows_dll(
            "windows/overlay.dll",
            &["gfx1100", "gfx942"],
            windows_vadd(&[]),
            1,
            0,
            VADD_CHECK,
            "a COFF symbol table and appended data after the last section",
        ))
    }
}

/// The EXE: vadd and a `main` that reports what the stand-in runtime saw.
fn windows_exe() -> Fixture {
    Fixture {
        kind: Kind::Exec,
        ..windows_dll(
            "windows/vadd.exe",
            &["gfx1100", "gfx942"],
            Build::Single {
                sources: &["vadd.hip", "windows/exemain.cpp"],
                flags: &[],
            },
            1,
            0,
            None,
            "PE32+ EXE; prints what the stand-in runtime saw and exits 0",
        )
    }
}

/// libmulti.so's four units, the second and fourth compressed.
fn libmulti_units() -> &'static [Unit] {
    match &FIXTURES
        .iter()
        .find(|f| f.name == "libmulti.so")
        .expect("libmulti")
        .build
    {
        Build::PerObject { units } => units,
        _ => unreachable!("libmulti is built per object"),
    }
}

/// The directory of the Windows support files and fixtures.
fn windows_out() -> String {
    format!("{FIXTURES_DIR}/{}", Host::X86_64Windows.dir())
}

impl WinFixture {
    /// `fixture` with no extra link flags and nothing appended.
    fn plain(fixture: Fixture) -> WinFixture {
        WinFixture {
            fixture,
            link_flags: &[],
            append: None,
        }
    }

    /// Compile (per object or at once) and link with lld against the
    /// support objects and the stand-in runtime's import library; append
    /// data where asked.
    fn commands(&self) -> Vec<Vec<String>> {
        let f = &self.fixture;
        let (w, target) = (windows_out(), format!("--target={}", f.host.triple()));
        let output = format!("{FIXTURES_DIR}/{}", f.name);
        let mut link = strings(&[CLANGXX, &target, "-fuse-ld=lld", "-nostdlib"]);
        link.extend(strings(match f.kind {
            Kind::Exec => &["-Wl,-entry:mainCRTStartup", "-Wl,-subsystem:console"][..],
            _ => &["-shared", "-Wl,-entry:_DllMainCRTStartup"][..],
        }));
        link.extend(
            f.host_check
                .iter()
                .map(|c| format!("-Wl,-export:{}", c.symbol)),
        );
        link.extend(strings(self.link_flags));
        let mut commands = Vec::new();
        let compile = |extra: &[String]| {
            let mut c = strings(&[CLANGXX, &target]);
            c.extend(strings(COMMON_FLAGS));
            c.extend(f.offload_flags());
            c.extend(extra.iter().cloned());
            c
        };
        match &f.build {
            Build::Single { sources, flags } => {
                let mut c = compile(&strings(flags));
                c.extend(link.drain(2..));
                c.extend(strings(&["-o", &output]));
                c.extend(inputs(sources));
                link = c;
            }
            Build::PerObject { units } => {
                link.extend(strings(&["-o", &output]));
                for unit in units.iter() {
                    let stem = unit.source.trim_end_matches(".hip");
                    let file = f.name.rsplit('/').next().unwrap_or(f.name);
                    let object = format!("{w}/obj/{file}/{stem}.o");
                    let mut extra = Vec::new();
                    if unit.compress {
                        extra.push("--offload-compress".into());
                    }
                    extra.extend(strings(&["-c", "-o", &object, "-x", "hip"]));
                    extra.push(hip_path(unit.source));
                    commands.push(compile(&extra));
                    link.push(object);
                }
            }
            Build::Bundled { .. } => unreachable!("no Windows fixture is bundled by hand"),
        }
        link.extend(strings(&["-x", "none", &format!("{w}/crt.o")]));
        if f.kind == Kind::Exec {
            link.extend([format!("{w}/crtexe.o"), format!("{w}/kernel32.lib")]);
        }
        link.push(format!("{w}/amdhip64.lib"));
        commands.push(link);
        if let Some(file) = self.append {
            let append = format!("cat {} >> {output}", hip_path(file));
            commands.push(strings(&["sh", "-c", &append]));
        }
        commands
    }

    fn job(&self) -> Job {
        let mut inputs = self.fixture.sources();
        inputs.extend(WINDOWS_SUPPORT.iter().map(|s| hip_path(s)));
        inputs.extend(self.append.map(hip_path));
        Job {
            name: self.fixture.name.to_owned(),
            inputs,
            commands: self.commands(),
            output: format!("{FIXTURES_DIR}/{}", self.fixture.name),
            expect: format!(
                "{} link={} append={:?}",
                self.fixture.expectation(),
                self.link_flags.join(","),
                self.append
            ),
        }
    }
}

impl Job {
    /// The Windows support files: the C runtime pieces (`crt.o`,
    /// `crtexe.o`), kernel32's import library (llvm-dlltool), the stand-in
    /// `amdhip64.dll` and its import library, and the loader `winload.exe`.
    fn windows_support() -> Job {
        let w = windows_out();
        let target = format!("--target={}", Host::X86_64Windows.triple());
        let src = |f: &str| hip_path(&format!("{WINDOWS_DIR}/{f}"));
        let cc = |args: &[&str]| {
            let mut c = strings(&[CLANG, &target, "-O2", "-Wall"]);
            c.extend(strings(args));
            c
        };
        let commands = vec![
            cc(&["-c", "-o", &format!("{w}/crt.o"), &src("crt.c")]),
            cc(&["-c", "-o", &format!("{w}/crtexe.o"), &src("crtexe.c")]),
            strings(&[
                "llvm-dlltool-19",
                "-m",
                "i386:x86-64",
                "-d",
                &src("kernel32.def"),
                "-l",
                &format!("{w}/kernel32.lib"),
            ]),
            cc(&[
                "-fuse-ld=lld",
                "-shared",
                "-nostdlib",
                "-Wl,-noentry",
                "-o",
                &format!("{w}/amdhip64.dll"),
                &src("amdhip64.c"),
            ]),
            cc(&[
                "-fuse-ld=lld",
                "-nostdlib",
                "-Wl,-entry:mainCRTStartup",
                "-Wl,-subsystem:console",
                "-o",
                &format!("{w}/winload.exe"),
                &src("winload.c"),
                &format!("{w}/crt.o"),
                &format!("{w}/crtexe.o"),
                &format!("{w}/kernel32.lib"),
                &format!("{w}/amdhip64.lib"),
            ]),
        ];
        let mut inputs: Vec<String> = WINDOWS_SUPPORT.iter().map(|s| hip_path(s)).collect();
        inputs.push(src("winload.c"));
        Job {
            name: Host::X86_64Windows.loader(),
            inputs,
            commands,
            output: format!("{w}/winload.exe"),
            expect: String::new(),
        }
    }
}

/// How the fat binaries of each shard of the pipeline tests' tree
/// ([`shards::FAT_BINARIES`]: the file names are the contract) are built,
/// for the shard's targets.
fn shard_fixture(file: &str, targets: &'static [&'static str]) -> Fixture {
    let base = |name, soname, build, wrappers, host_check, description| Fixture {
        name,
        soname: Some(soname),
        kind: Kind::Shared,
        host: Host::X86_64Linux,
        targets,
        build,
        bundles: 1,
        wrappers,
        compressed_bundles: 0,
        relr: false,
        host_check,
        description,
    };
    match file {
        "librocblas.so.5.2" => base(
            "librocblas.so.5.2",
            "librocblas.so.5",
            Build::Single {
                sources: &["vadd.hip"],
                flags: &[],
            },
            1,
            VADD_CHECK,
            "the shard tree's rocBLAS: one bundle",
        ),
        "libhipblaslt.so.0.9" => base(
            "libhipblaslt.so.0.9",
            "libhipblaslt.so.0",
            Build::Single {
                sources: &["rdc_a.hip", "rdc_b.hip", "rdc_c.hip"],
                flags: &["-fgpu-rdc"],
            },
            3,
            RDC_CHECK,
            "the shard tree's hipBLASLt: -fgpu-rdc, one bundle, three wrappers",
        ),
        "librocfft_kernels.so.0.1" => Fixture {
            bundles: 2,
            compressed_bundles: 1,
            ..base(
                "librocfft_kernels.so.0.1",
                "librocfft_kernels.so.0",
                Build::PerObject {
                    units: &[
                        Unit {
                            source: "reduce.hip",
                            compress: true,
                        },
                        Unit {
                            source: "stencil.hip",
                            compress: false,
                        },
                    ],
                },
                2,
                REDUCE_CHECK,
                "the shard tree's rocFFT kernels: two objects, the first compressed",
            )
        },
        other => panic!("no recipe for the shard tree's {other}"),
    }
}

/// The fat binaries of every shard: (shard directory, fixture).
pub fn shard_fixtures() -> Vec<(&'static str, Fixture)> {
    let mut v = Vec::new();
    for (shard, _, targets) in shards::SHARDS {
        for (_, _, rel) in shards::FAT_BINARIES {
            v.push((*shard, shard_fixture(shards::file_name(rel), targets)));
        }
    }
    v
}

/// The committed demo library (`integration/sample/libkpack_sample.so`).
pub const SAMPLE: Fixture = Fixture {
    name: "libkpack_sample.so",
    soname: None,
    kind: Kind::Shared,
    host: Host::X86_64Linux,
    targets: &["gfx1100", "gfx942"],
    build: Build::Single {
        sources: &["sample.hip"],
        // A fixed compilation unit ID: otherwise clang derives it from the
        // source's absolute path, and each checkout would build other bytes.
        flags: &["-cuid=kpack_sample"],
    },
    bundles: 1,
    wrappers: 1,
    compressed_bundles: 0,
    relr: false,
    host_check: host_check("sample_host_check", 55),
    description: "demo library for `cargo xtask demo`",
};

/// The sample must stay small: it is committed.
const SAMPLE_MAX_BYTES: u64 = 64 * 1024;

impl Fixture {
    /// Paths of the sources, relative to the workspace root.
    pub fn sources(&self) -> Vec<String> {
        match &self.build {
            Build::Single { sources, .. } => sources.iter().map(|s| hip_path(s)).collect(),
            Build::PerObject { units } => units.iter().map(|u| hip_path(u.source)).collect(),
            Build::Bundled { units, entries, .. } => units
                .iter()
                .map(|u| hip_path(u.source))
                .chain(entries.iter().filter_map(|(_, d)| match d {
                    Device::File(f) => Some(hip_path(f)),
                    Device::Compiled { .. } => None,
                }))
                .collect(),
        }
    }

    /// The commands that build the fixture into `out_dir` (relative to the
    /// workspace root, where they run), in order.
    pub fn commands(&self, out_dir: &str) -> Vec<Vec<String>> {
        if !self.host.is_native() {
            return self.cross_commands(out_dir);
        }
        let output = format!("{out_dir}/{}", self.name);
        match &self.build {
            Build::Single { sources, flags } => {
                let mut c = strings(&[CLANGXX]);
                c.extend(strings(COMMON_FLAGS));
                c.extend(strings(self.code_model()));
                if sources.iter().any(|s| s.ends_with(".hip")) {
                    c.extend(self.offload_flags());
                }
                c.extend(strings(flags));
                c.extend(self.link_flags());
                c.extend(strings(&["-o", &output]));
                c.extend(inputs(sources));
                vec![c]
            }
            Build::PerObject { units } => {
                let obj_dir = format!("{out_dir}/obj/{}", self.name);
                let mut commands = Vec::new();
                let mut link = strings(&[CLANGXX]);
                link.extend(self.link_flags());
                link.extend(strings(&["-o", &output]));
                for unit in units.iter() {
                    let stem = unit.source.trim_end_matches(".hip");
                    let object = format!("{obj_dir}/{stem}.o");
                    let mut c = strings(&[CLANGXX]);
                    c.extend(strings(COMMON_FLAGS));
                    c.extend(strings(self.code_model()));
                    c.extend(self.offload_flags());
                    if unit.compress {
                        c.push("--offload-compress".into());
                    }
                    c.extend(strings(&["-c", "-o", &object, "-x", "hip"]));
                    c.push(hip_path(unit.source));
                    commands.push(c);
                    link.push(object);
                }
                // A plain C++ link of objects does not add the HIP runtime
                // (clang only does for HIP inputs or with --hip-link).
                link.push("-lamdhip64".into());
                commands.push(link);
                commands
            }
            Build::Bundled {
                units,
                entries,
                bundler,
            } => self.bundled_commands(out_dir, units, entries, *bundler),
        }
    }

    /// [`Build::Bundled`]: per unit, its device code objects, the bundle,
    /// the host object with the bundle; then the link.
    fn bundled_commands(
        &self,
        out_dir: &str,
        units: &[Unit],
        entries: &[(&str, Device)],
        bundler: Bundler,
    ) -> Vec<Vec<String>> {
        let obj_dir = format!("{out_dir}/obj/{}", self.name);
        let mut commands = Vec::new();
        let mut link = strings(&[CLANGXX]);
        link.extend(self.link_flags());
        link.extend(strings(&["-o", &format!("{out_dir}/{}", self.name)]));
        let triples: Vec<&str> = entries.iter().map(|(t, _)| *t).collect();
        for unit in units {
            let stem = unit.source.trim_end_matches(".hip");
            let mut inputs = Vec::new();
            for (i, (_, device)) in entries.iter().enumerate() {
                inputs.push(match device {
                    Device::Compiled { arch, flags } => {
                        let co = format!("{obj_dir}/{stem}-{i}.co");
                        commands.push(device_command(unit, arch, flags, &co));
                        co
                    }
                    Device::File(f) => hip_path(f),
                });
            }
            let fatbin = format!("{obj_dir}/{stem}.hipfb");
            commands.push(match bundler {
                Bundler::Llvm => llvm_bundle_command(&triples, &inputs, unit.compress, &fatbin),
                Bundler::Own => own_bundle_command(&triples, inputs, &fatbin),
            });
            let object = format!("{obj_dir}/{stem}.o");
            commands.push(self.host_object_command(unit, stem, &fatbin, &object));
            link.push(object);
        }
        link.push("-lamdhip64".into());
        commands.push(link);
        commands
    }

    /// [`Build::Bundled`]'s host object of `unit`: its host code, with the
    /// bundle `fatbin` embedded.
    fn host_object_command(
        &self,
        unit: &Unit,
        stem: &str,
        fatbin: &str,
        object: &str,
    ) -> Vec<String> {
        let mut c = strings(&[CLANGXX]);
        c.extend(strings(COMMON_FLAGS));
        c.extend(strings(self.code_model()));
        // A compilation unit ID of its own (the driver derives one only
        // when it compiles both sides).
        c.extend(strings(&["-x", "hip", "--cuda-host-only"]));
        c.extend(["-Xclang".into(), format!("-cuid={stem}")]);
        c.extend(strings(BUNDLED_HIP_FLAGS));
        c.extend(strings(&[
            "-Xclang",
            "-fcuda-include-gpubinary",
            "-Xclang",
            fatbin,
        ]));
        c.extend(strings(&["-c", "-o", object, &hip_path(unit.source)]));
        c
    }

    /// A foreign host's build: clang-19 compiles each source for the
    /// host's triple (C sources: the host's gcc), the host's gcc (GNU ld)
    /// links.
    fn cross_commands(&self, out_dir: &str) -> Vec<Vec<String>> {
        let host = self.host;
        let obj_dir = format!("{out_dir}/obj/{}", self.name);
        let target = format!("--target={}", host.triple());
        let mut link = vec![host.tool("gcc")];
        let mut commands = Vec::new();
        let (sources, flags): (Vec<&str>, &[&str]) = match &self.build {
            Build::Single { sources, flags } => (sources.to_vec(), flags),
            Build::PerObject { units } | Build::Bundled { units, .. } => {
                (units.iter().map(|u| u.source).collect(), &[])
            }
        };
        for source in sources {
            let (stem, ext) = source.rsplit_once('.').expect("sources have extensions");
            let object = format!("{obj_dir}/{stem}.o");
            let mut c = if ext == "c" {
                vec![host.tool("gcc")]
            } else {
                strings(&[CLANGXX, &target])
            };
            c.extend(strings(COMMON_FLAGS));
            c.extend(strings(self.code_model()));
            if ext == "hip" {
                c.extend(self.offload_flags());
            }
            c.extend(strings(flags));
            c.extend(strings(&["-c", "-o", &object]));
            if ext != "c" {
                c.extend(strings(&["-x", if ext == "hip" { "hip" } else { "c++" }]));
            }
            c.push(hip_path(source));
            commands.push(c);
            link.push(object);
        }
        match self.kind {
            Kind::Shared => link.extend([
                "-shared".into(),
                format!("-Wl,-soname,{}", self.soname.unwrap_or(self.name)),
            ]),
            Kind::Pie => link.push("-pie".into()),
            Kind::Exec => link.push("-no-pie".into()),
        }
        link.extend(strings(&["-o", &format!("{out_dir}/{}", self.name)]));
        commands.push(link);
        commands
    }

    /// The checked properties, in one line.
    fn expectation(&self) -> String {
        format!(
            "kind={} host={:?} targets={} bundles={} wrappers={} compressed={} relr={} host_check={}",
            self.kind.as_str(),
            self.host,
            self.targets.join(","),
            self.bundles,
            self.wrappers,
            self.compressed_bundles,
            self.relr,
            self.host_check
                .as_ref()
                .map_or("-".to_owned(), |c| format!("{}={}", c.symbol, c.value)),
        )
    }

    fn code_model(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Shared => &["-fPIC"],
            Kind::Pie => &["-fPIE"],
            Kind::Exec => &["-fno-pie"],
        }
    }

    fn link_flags(&self) -> Vec<String> {
        let mut flags = strings(&["-fuse-ld=lld"]);
        match self.kind {
            Kind::Shared => flags.extend([
                "-shared".into(),
                format!("-Wl,-soname,{}", self.soname.unwrap_or(self.name)),
            ]),
            Kind::Pie => flags.push("-pie".into()),
            Kind::Exec => flags.push("-no-pie".into()),
        }
        flags
    }

    fn offload_flags(&self) -> Vec<String> {
        let mut flags = strings(&["-nogpulib", "-nogpuinc", "-I", HIP_DIR]);
        flags.extend(self.targets.iter().map(|t| format!("--offload-arch={t}")));
        flags
    }
}

fn hip_path(file: &str) -> String {
    format!("{HIP_DIR}/{file}")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// What both sides of a [`Build::Bundled`] unit compile with: no device
/// libraries, no HIP headers but ours.
const BUNDLED_HIP_FLAGS: &[&str] = &["-nogpulib", "-nogpuinc", "-I", HIP_DIR];

/// [`Build::Bundled`]: `unit`'s device code object `co` for `arch`.
fn device_command(unit: &Unit, arch: &str, flags: &[&str], co: &str) -> Vec<String> {
    let mut c = strings(&[CLANGXX, "-x", "hip", "--cuda-device-only"]);
    c.extend(strings(&["--no-gpu-bundle-output", "-O2"]));
    c.push(format!("--offload-arch={arch}"));
    c.extend(strings(BUNDLED_HIP_FLAGS));
    c.extend(strings(flags));
    c.extend(strings(&["-o", co, &hip_path(unit.source)]));
    c
}

/// `clang-offload-bundler` of `inputs` (one per triple, after an empty
/// host entry) into `fatbin`, compressed if asked.
fn llvm_bundle_command(
    triples: &[&str],
    inputs: &[String],
    compress: bool,
    fatbin: &str,
) -> Vec<String> {
    let mut b = vec![format!("{}/clang-offload-bundler", oracle::LLVM_BIN)];
    b.push("-type=o".into());
    b.push(format!(
        "-targets=host-x86_64-unknown-linux--,{}",
        triples.join(",")
    ));
    b.push("-input=/dev/null".into());
    b.extend(inputs.iter().map(|i| format!("-input={i}")));
    if compress {
        b.push("-compress".into());
    }
    b.push(format!("-output={fatbin}"));
    b
}

/// `xtask bundle` (our own bundler, [`write_bundle`]) of `inputs` into
/// `fatbin`.
fn own_bundle_command(triples: &[&str], inputs: Vec<String>, fatbin: &str) -> Vec<String> {
    let exe = std::env::current_exe().map_or("xtask".into(), |p| p.display().to_string());
    let mut b = vec![exe, "bundle".into(), "--triples".into(), triples.join(",")];
    for i in inputs {
        b.extend(["--input".into(), i]);
    }
    b.extend(["--output".into(), fatbin.to_owned()]);
    b
}

/// Source paths, each group preceded by its language (`-x hip`, `-x c++`).
fn inputs(sources: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = "";
    for source in sources {
        let lang = if source.ends_with(".hip") {
            "hip"
        } else {
            "c++"
        };
        if lang != current {
            out.extend(strings(&["-x", lang]));
            current = lang;
        }
        out.push(hip_path(source));
    }
    out
}

/// Something to build: its commands, inputs and output, all relative to the
/// workspace root.
struct Job {
    name: String,
    inputs: Vec<String>,
    commands: Vec<Vec<String>>,
    output: String,
    /// What the output is checked against (a change re-runs the check).
    expect: String,
}

impl Job {
    /// `name`: the stamp's name (the path below `target/fixtures`).
    fn for_fixture(fixture: &Fixture, out_dir: &str, name: String) -> Job {
        Job {
            name,
            inputs: fixture.sources(),
            commands: fixture.commands(out_dir),
            output: format!("{out_dir}/{}", fixture.name),
            expect: fixture.expectation(),
        }
    }

    fn dlcheck() -> Job {
        let source = hip_path("dlcheck.c");
        let output = format!("{FIXTURES_DIR}/{DLCHECK}");
        Job {
            name: DLCHECK.to_owned(),
            inputs: vec![source.clone()],
            commands: vec![strings(&[CLANG, "-O2", "-Wall", "-o", &output, &source])],
            output,
            expect: String::new(),
        }
    }

    /// A foreign host's loader: dlopen()s a library, calls `int SYMBOL(void)`
    /// and stands in for the HIP runtime (`hipstub.c`).
    fn crossload(host: Host) -> Job {
        let output = format!("{FIXTURES_DIR}/{}", host.loader());
        let sources = [hip_path("crossload.c"), hip_path("hipstub.c")];
        let mut c = vec![host.tool("gcc")];
        c.extend(strings(&["-O2", "-Wall", "-rdynamic", "-o", &output]));
        c.extend(sources.iter().cloned());
        c.push("-ldl".into());
        Job {
            name: host.loader(),
            inputs: sources.to_vec(),
            commands: vec![c],
            output,
            expect: String::new(),
        }
    }

    /// Stamp text without the output hash: compiler, inputs, commands.
    fn recipe(&self, sh: &Shell, compiler: &str, headers: &[String]) -> Result<String> {
        let mut s = format!("compiler {compiler}\nexpect {}\n", self.expect);
        for input in self.inputs.iter().chain(headers) {
            let bytes = sh.read_binary_file(input)?;
            writeln!(s, "input {input} {:016x}", fnv1a(&bytes))?;
        }
        for command in &self.commands {
            writeln!(s, "run {}", command.join(" "))?;
        }
        Ok(s)
    }

    fn run(&self, sh: &Shell) -> Result<()> {
        for command in &self.commands {
            if let Some(dir) = command
                .iter()
                .skip_while(|a| *a != "-o")
                .nth(1)
                .and_then(|o| Path::new(o).parent())
            {
                sh.create_dir(dir)?;
            }
            let (program, args) = command.split_first().expect("commands are not empty");
            cmd!(sh, "{program} {args...}")
                .run()
                .with_context(|| format!("building {}", self.name))?;
        }
        Ok(())
    }
}

/// What happened to one fixture.
enum Outcome {
    Built,
    UpToDate,
}

/// Builds every fixture (and the `dlcheck` helper) into `target/fixtures`,
/// checks each against its entry in [`FIXTURES`], writes `fixtures.json` and
/// prints a summary.
pub fn build_all(sh: &Shell, root: &Path, force: bool) -> Result<()> {
    let builder = Builder::new(sh, root, force)?;
    builder.helper(&Job::dlcheck())?;
    for host in foreign_hosts() {
        builder.helper(&Job::crossload(host))?;
    }

    let foreign: Vec<Fixture> = foreign_hosts().flat_map(foreign_fixtures).collect();
    let therock = therock_fixtures();
    let mut summary = Vec::new();
    for fixture in FIXTURES.iter().chain(&foreign).chain(&therock) {
        let job = Job::for_fixture(fixture, FIXTURES_DIR, fixture.name.to_owned());
        summary.push(builder.fixture(&job, fixture)?);
    }
    builder.helper(&Job::windows_support())?;
    let windows = windows_fixtures();
    for wf in &windows {
        summary.push(builder.fixture(&wf.job(), &wf.fixture)?);
    }
    let shard_fixtures = shard_fixtures();
    for (shard, fixture) in &shard_fixtures {
        let name = format!("{shard}/{}", fixture.name);
        let job = Job::for_fixture(fixture, &format!("{FIXTURES_DIR}/{shard}"), name);
        summary.push(builder.fixture(&job, fixture)?);
    }

    let manifest = root.join(FIXTURES_DIR).join(manifest::FILE_NAME);
    sh.write_file(&manifest, fixtures_manifest().to_json())?;
    print_summary(&summary);
    println!("fixtures in {}", root.join(FIXTURES_DIR).display());
    println!("manifest: {}", manifest.display());
    Ok(())
}

/// One line of [`build_all`]'s summary: the fixture's name (below
/// `target/fixtures`), what it is, what happened and its size.
type SummaryLine<'a> = (String, &'a Fixture, Outcome, u64);

/// What every [`build_job`] of one [`build_all`] shares.
struct Builder<'a> {
    sh: &'a Shell,
    root: &'a Path,
    compiler: String,
    headers: Vec<String>,
    /// The stamps' directory.
    stamps: String,
    force: bool,
}

impl<'a> Builder<'a> {
    /// Reads the compiler's version and the headers; makes the stamps'
    /// directory.
    fn new(sh: &'a Shell, root: &'a Path, force: bool) -> Result<Builder<'a>> {
        let compiler = compiler_version(sh)?;
        let headers = headers(sh)?;
        let stamps = format!("{FIXTURES_DIR}/.stamps");
        sh.create_dir(&stamps)?;
        Ok(Builder {
            sh,
            root,
            compiler,
            headers,
            stamps,
            force,
        })
    }

    /// Builds `job` with `check` run on its output.
    fn build(&self, job: &Job, check: impl Fn(&str) -> Result<()>) -> Result<Outcome> {
        let (sh, stamps) = (self.sh, &self.stamps);
        build_job(
            sh,
            job,
            &self.compiler,
            &self.headers,
            stamps,
            self.force,
            check,
        )
    }

    /// Builds a helper (nothing to check).
    fn helper(&self, job: &Job) -> Result<()> {
        self.build(job, |_| Ok(())).map(drop)
    }

    /// Builds `fixture`'s `job`, checks the output against it; its summary
    /// line.
    fn fixture<'f>(&self, job: &Job, fixture: &'f Fixture) -> Result<SummaryLine<'f>> {
        let fixtures_dir = self.root.join(FIXTURES_DIR);
        let outcome = self.build(job, |path| {
            verify::check(self.sh, &self.root.join(path), fixture, &fixtures_dir)
        })?;
        let size = std::fs::metadata(self.root.join(&job.output))?.len();
        Ok((job.name.clone(), fixture, outcome, size))
    }
}

/// Regenerates `integration/sample/libkpack_sample.so` (always: it is a
/// committed file, not a build product).
pub fn refresh_sample(sh: &Shell, root: &Path) -> Result<()> {
    let job = Job::for_fixture(&SAMPLE, SAMPLE_DIR, SAMPLE.name.to_owned());
    job.run(sh)?;
    let path = root.join(&job.output);
    verify::check(sh, &path, &SAMPLE, &root.join(FIXTURES_DIR))?;
    let size = std::fs::metadata(&path)?.len();
    if size > SAMPLE_MAX_BYTES {
        bail!(
            "{} is {size} bytes; keep it under {SAMPLE_MAX_BYTES}",
            job.output
        );
    }
    println!("regenerated {} ({size} bytes)", job.output);
    Ok(())
}

fn build_job(
    sh: &Shell,
    job: &Job,
    compiler: &str,
    headers: &[String],
    stamps: &str,
    force: bool,
    check: impl Fn(&str) -> Result<()>,
) -> Result<Outcome> {
    let recipe = job.recipe(sh, compiler, headers)?;
    let stamp = format!("{stamps}/{}", job.name);
    if let Some(dir) = Path::new(&stamp).parent() {
        sh.create_dir(dir)?;
    }
    if !force && sh.path_exists(&job.output) && sh.path_exists(&stamp) {
        let output_hash = fnv1a(&sh.read_binary_file(&job.output)?);
        if sh.read_file(&stamp)? == stamp_text(&recipe, output_hash) {
            return Ok(Outcome::UpToDate);
        }
    }
    sh.remove_path(&stamp)?;
    job.run(sh)?;
    check(&job.output).with_context(|| format!("checking {}", job.output))?;
    let output_hash = fnv1a(&sh.read_binary_file(&job.output)?);
    sh.write_file(&stamp, stamp_text(&recipe, output_hash))?;
    Ok(Outcome::Built)
}

fn stamp_text(recipe: &str, output_hash: u64) -> String {
    format!("{recipe}output {output_hash:016x}\n")
}

/// The compiler's version line; an error that says what to install if
/// there is no compiler.
fn compiler_version(sh: &Shell) -> Result<String> {
    let version = cmd!(sh, "{CLANGXX} --version")
        .quiet()
        .read()
        .with_context(|| {
            format!(
                "{CLANGXX} not found: the fixtures need Debian 12's clang-19, lld-19 and \
             libamdhip64-dev (`cargo xtask test`, run as root, installs them)"
            )
        })?;
    Ok(version.lines().next().unwrap_or_default().to_owned())
}

/// The headers in `integration/hip`: every fixture's stamp covers them.
fn headers(sh: &Shell) -> Result<Vec<String>> {
    let mut headers: Vec<String> = sh
        .read_dir(HIP_DIR)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .filter_map(|p| p.file_name().map(|n| hip_path(&n.to_string_lossy())))
        .collect();
    headers.sort();
    Ok(headers)
}

/// 64-bit FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Fixture {
    /// The fixture's entry in `fixtures.json`, named by its path below
    /// `target/fixtures`.
    fn entry(&self, name: String) -> Entry {
        Entry {
            name,
            kind: self.kind,
            targets: strings(self.targets),
            bundles: self.bundles,
            wrappers: self.wrappers,
            compressed_bundles: self.compressed_bundles,
            relr: self.relr,
            host_check: self.host_check.clone(),
            sources: self.sources(),
            description: self.description.to_owned(),
            host: self.host,
        }
    }
}

/// `fixtures.json`, read by the test suite.
pub fn fixtures_manifest() -> Manifest {
    Manifest {
        dlcheck: DLCHECK.to_owned(),
        fixtures: FIXTURES
            .iter()
            .map(|f| f.entry(f.name.to_owned()))
            .collect(),
        shard_binaries: shard_fixtures()
            .iter()
            .map(|(shard, f)| f.entry(format!("{shard}/{}", f.name)))
            .collect(),
        foreign: foreign_hosts()
            .flat_map(foreign_fixtures)
            .chain(windows_fixtures().into_iter().map(|w| w.fixture))
            .map(|f| f.entry(f.name.to_owned()))
            .collect(),
        therock: therock_fixtures()
            .iter()
            .map(|f| f.entry(f.name.to_owned()))
            .collect(),
    }
}

fn print_summary(summary: &[SummaryLine]) {
    println!(
        "\n{:<40} {:<6} {:>8} {:>7} {:>8}  {:<10} targets",
        "fixture", "kind", "bytes", "bundles", "wrappers", "status"
    );
    for (name, fixture, outcome, size) in summary {
        let bundles = match fixture.compressed_bundles {
            0 => fixture.bundles.to_string(),
            n => format!("{}({n}z)", fixture.bundles),
        };
        let status = match outcome {
            Outcome::Built => "built",
            Outcome::UpToDate => "up to date",
        };
        println!(
            "{:<40} {:<6} {:>8} {:>7} {:>8}  {:<10} {}",
            name,
            fixture.kind.as_str(),
            size,
            bundles,
            fixture.wrappers,
            status,
            fixture.targets.join(",")
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = FIXTURES.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FIXTURES.len());
    }

    #[test]
    fn fnv1a_matches_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn per_object_build_compiles_each_unit_then_links() {
        let multi = FIXTURES.iter().find(|f| f.name == "libmulti.so").unwrap();
        let commands = multi.commands(FIXTURES_DIR);
        assert_eq!(commands.len(), 5);
        let compressed = commands
            .iter()
            .filter(|c| c.iter().any(|a| a == "--offload-compress"))
            .count();
        assert_eq!(compressed, multi.compressed_bundles);
        assert!(commands[4].iter().any(|a| a == "-lamdhip64"));
    }

    #[test]
    fn manifest_lists_every_fixture_and_shard_binary() {
        let m = fixtures_manifest();
        assert_eq!(m.fixtures.len(), FIXTURES.len());
        assert_eq!(
            m.shard_binaries.len(),
            shards::SHARDS.len() * shards::FAT_BINARIES.len()
        );
        let json = m.to_json();
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
        // The shard tree takes its host-only library from the fixtures.
        assert!(m
            .fixtures
            .iter()
            .any(|f| f.name == shards::HOST_ONLY_FIXTURE));
        for (shard, _, _) in shards::SHARDS {
            for (_, _, rel) in shards::FAT_BINARIES {
                let name = shards::fixture_name(shard, rel);
                assert!(m.shard_binaries.iter().any(|e| e.name == name), "{name}");
            }
        }
    }

    #[test]
    fn shard_binaries_keep_their_sonames() {
        let (_, rocblas) = &shard_fixtures()[0];
        let link = rocblas.commands("x").remove(0);
        assert!(link.iter().any(|a| a == "-Wl,-soname,librocblas.so.5"));
    }
}
