//! `fixtures.json`: what `cargo xtask fixtures` built into
//! `target/fixtures`, written by xtask and read by the tests as this one
//! type.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The manifest's file name, in the fixtures directory.
pub const FILE_NAME: &str = "fixtures.json";

/// What the linker produced (PE: a DLL is `Shared`, an EXE `Exec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Shared library (`ET_DYN`, no interpreter).
    Shared,
    /// Position-independent executable (`ET_DYN` with an interpreter).
    Pie,
    /// Position-dependent executable (`ET_EXEC`).
    Exec,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Shared => "shared",
            Kind::Pie => "pie",
            Kind::Exec => "exec",
        }
    }
}

/// The machine a fixture's host code is built for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Host {
    /// x86-64 Linux (clang++-19 and lld-19): runs on this machine.
    #[default]
    X86_64Linux,
    /// AArch64 Linux: clang-19 compiles, Debian's `aarch64-linux-gnu-gcc`
    /// (GNU ld, 64 KiB segment alignment) links, `qemu-aarch64` runs.
    Aarch64Linux,
    /// Little-endian POWER Linux: clang-19 compiles,
    /// `powerpc64le-linux-gnu-gcc` links, `qemu-ppc64le` runs.
    Ppc64leLinux,
    /// x86-64 Windows (PE32+ DLLs and EXEs): clang-19 compiles for
    /// `x86_64-pc-windows-msvc`, lld links against a stand-in
    /// `amdhip64.dll`, Wine (`wine64`) runs.
    X86_64Windows,
}

impl Host {
    /// Every host, native first.
    pub const ALL: [Host; 4] = [
        Host::X86_64Linux,
        Host::Aarch64Linux,
        Host::Ppc64leLinux,
        Host::X86_64Windows,
    ];

    /// The GNU triple (clang's `--target`, the cross tools' prefix).
    pub fn triple(self) -> &'static str {
        match self {
            Host::X86_64Linux => "x86_64-linux-gnu",
            Host::Aarch64Linux => "aarch64-linux-gnu",
            Host::Ppc64leLinux => "powerpc64le-linux-gnu",
            Host::X86_64Windows => "x86_64-pc-windows-msvc",
        }
    }

    /// Short name, used as the fixtures' directory for foreign hosts.
    pub fn dir(self) -> &'static str {
        match self {
            Host::X86_64Linux => "x86_64",
            Host::Aarch64Linux => "aarch64",
            Host::Ppc64leLinux => "ppc64le",
            Host::X86_64Windows => "windows",
        }
    }

    pub fn is_native(self) -> bool {
        self == Host::X86_64Linux
    }

    /// PE/COFF binaries, run under Wine.
    pub fn is_windows(self) -> bool {
        self == Host::X86_64Windows
    }

    /// `e_machine` of its ELF files (Windows: the COFF machine,
    /// `IMAGE_FILE_MACHINE_AMD64`).
    pub fn e_machine(self) -> u16 {
        match self {
            Host::X86_64Linux => 62,
            Host::Aarch64Linux => 183,
            Host::Ppc64leLinux => 21,
            Host::X86_64Windows => 0x8664,
        }
    }

    /// A cross tool of this host's binutils/gcc (`strip`, `objcopy`,
    /// `gcc`...), or the native one.
    pub fn tool(self, name: &str) -> String {
        if self.is_native() {
            name.to_owned()
        } else {
            format!("{}-{name}", self.triple())
        }
    }

    /// The program (below the fixtures directory) that dlopen()s a library
    /// built for this host and calls `int SYMBOL(void)`: `dlcheck` here,
    /// `<dir>/crossload` elsewhere (with a stand-in for the HIP runtime's
    /// registration that logs the wrappers to `$KPACK_SHIM_LOG`); on
    /// Windows `windows/winload.exe`, which prints the wrappers the
    /// stand-in `amdhip64.dll` saw after the value.
    pub fn loader(self) -> String {
        if self.is_native() {
            "dlcheck".to_owned()
        } else if self.is_windows() {
            format!("{}/winload.exe", self.dir())
        } else {
            format!("{}/crossload", self.dir())
        }
    }

    /// A command running `program` built for this host: directly here,
    /// through qemu-user with the cross sysroot elsewhere, through Wine
    /// for Windows (the caller sets `WINEPREFIX`; see [`wine_path`]).
    pub fn command(self, program: &Path) -> std::process::Command {
        if self.is_native() {
            return std::process::Command::new(program);
        }
        if self.is_windows() {
            let mut c = std::process::Command::new(WINE);
            c.arg(program).env("WINEDEBUG", "-all");
            return c;
        }
        let qemu = match self {
            Host::Aarch64Linux => "qemu-aarch64",
            _ => "qemu-ppc64le",
        };
        let mut c = std::process::Command::new(qemu);
        c.arg("-L")
            .arg(format!("/usr/{}", self.triple()))
            .arg(program);
        c
    }
}

/// Debian's Wine loader for 64-bit Windows programs (package `wine64`).
pub const WINE: &str = "/usr/lib/wine/wine64";

/// A Unix path as Windows programs under Wine name it (drive `Z:` is `/`).
pub fn wine_path(path: &Path) -> String {
    format!("Z:{}", path.display())
}

/// A host function `extern "C" int symbol(void)` of a library and the
/// value it returns (called through the `dlcheck` helper).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCheck {
    pub symbol: Cow<'static, str>,
    pub value: i32,
}

/// One built binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Path relative to the fixtures directory; unique.
    pub name: String,
    pub kind: Kind,
    /// Offload target IDs; every bundle holds exactly these (none: no
    /// device code), unless `bundle_targets` says otherwise.
    pub targets: Vec<String>,
    /// Each bundle's targets, in order, when they are not all `targets`
    /// (units compiled for different targets); absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundle_targets: Vec<Vec<String>>,
    /// Bundles in `.hip_fatbin` (0: no such section).
    pub bundles: usize,
    /// Wrappers in `.hipFatBinSegment`.
    pub wrappers: usize,
    /// How many of the bundles are compressed (CCOB).
    pub compressed_bundles: usize,
    /// Linked with packed relative relocations (`.relr.dyn`).
    pub relr: bool,
    /// Libraries: a host function to call after dlopen(). Executables
    /// instead run and exit 0.
    pub host_check: Option<HostCheck>,
    /// Sources, relative to the workspace root.
    pub sources: Vec<String>,
    pub description: String,
    /// What the host code is built for.
    #[serde(default)]
    pub host: Host,
}

impl Entry {
    pub fn device_code(&self) -> bool {
        !self.targets.is_empty()
    }

    /// The targets bundle `index` holds.
    pub fn targets_of(&self, index: usize) -> &[String] {
        self.bundle_targets.get(index).unwrap_or(&self.targets)
    }

    /// The device code objects of all bundles.
    pub fn code_objects(&self) -> usize {
        (0..self.bundles).map(|i| self.targets_of(i).len()).sum()
    }

    /// The file name (the last component of [`Entry::name`]).
    pub fn file_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// The whole manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The dlopen helper (`dlcheck LIBRARY SYMBOL` prints what `int
    /// SYMBOL(void)` returns), relative to the fixtures directory.
    pub dlcheck: String,
    /// The fixtures proper: every test that walks "all fixtures" walks
    /// these.
    pub fixtures: Vec<Entry>,
    /// The fat binaries of the pipeline tests' shard tree
    /// ([`crate::shards`]), one directory per shard.
    pub shard_binaries: Vec<Entry>,
    /// Fixtures for other hosts (AArch64, ppc64le), one directory per host
    /// ([`Host::dir`]); their host code runs under qemu-user.
    pub foreign: Vec<Entry>,
    /// The fat binaries of the TheRock-shaped tree (`therock/`): strict,
    /// generic and SPIR-V targets, per-target MIOpen CK libraries.
    #[serde(default)]
    pub therock: Vec<Entry>,
}

impl Manifest {
    /// Read `dir/fixtures.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(FILE_NAME);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: run `cargo xtask fixtures` (or `cargo xtask test`)",
                path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
    }

    /// The manifest as `fixtures.json` holds it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest serializes") + "\n"
    }

    /// Every entry, fixtures first.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.fixtures
            .iter()
            .chain(&self.shard_binaries)
            .chain(&self.foreign)
            .chain(&self.therock)
    }

    /// The entry named `name`, and its path below `dir`.
    pub fn find(&self, dir: &Path, name: &str) -> Option<(&Entry, PathBuf)> {
        self.entries()
            .find(|e| e.name == name)
            .map(|e| (e, dir.join(&e.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> Entry {
        Entry {
            name: name.into(),
            kind: Kind::Shared,
            targets: vec!["gfx1100".into()],
            bundle_targets: Vec::new(),
            bundles: 1,
            wrappers: 1,
            compressed_bundles: 0,
            relr: false,
            host_check: Some(HostCheck {
                symbol: Cow::Borrowed("f"),
                value: 3,
            }),
            sources: vec!["integration/hip/vadd.hip".into()],
            description: "d".into(),
            host: Host::default(),
        }
    }

    #[test]
    fn round_trips_and_refuses_unknown_fields() {
        let m = Manifest {
            dlcheck: "dlcheck".into(),
            fixtures: vec![entry("liba.so")],
            shard_binaries: vec![entry("s/libb.so.1")],
            foreign: vec![Entry {
                host: Host::Aarch64Linux,
                ..entry("aarch64/libc.so")
            }],
            therock: vec![entry("therock/libd.so")],
        };
        let json = m.to_json();
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
        assert!(json.contains("\"kind\": \"shared\""));
        assert!(json.contains("\"host\": \"aarch64-linux\""));
        let extra = json.replacen("\"dlcheck\"", "\"extra\": 1, \"dlcheck\"", 1);
        assert!(serde_json::from_str::<Manifest>(&extra).is_err());
        assert_eq!(m.shard_binaries[0].file_name(), "libb.so.1");
        let (e, path) = m.find(Path::new("/f"), "s/libb.so.1").unwrap();
        assert_eq!((e.bundles, path), (1, PathBuf::from("/f/s/libb.so.1")));
        // No per-bundle targets: the key is not written.
        assert!(!json.contains("bundle_targets"));
    }

    #[test]
    fn bundles_of_their_own_targets() {
        let mixed = Entry {
            targets: vec!["gfx1100".into(), "gfx90a".into()],
            bundle_targets: vec![
                vec!["gfx1100".into(), "gfx90a".into()],
                vec!["gfx1100".into()],
            ],
            bundles: 2,
            ..entry("libmixed.so")
        };
        assert_eq!(mixed.code_objects(), 3);
        assert_eq!(mixed.targets_of(1), ["gfx1100".to_string()]);
        let json = serde_json::to_string(&mixed).unwrap();
        assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), mixed);
        let plain = Entry {
            bundles: 2,
            ..entry("liba.so")
        };
        assert_eq!(plain.code_objects(), 2);
        assert_eq!(plain.targets_of(1), ["gfx1100".to_string()]);
    }
}
