//! Debian's ROCm libraries ([`ROCRAND`], [`ROCSPARSE`]) as inputs: laid out
//! as a split input ([`make_artifact`]), their device code as files
//! ([`write_device_code`]), copies sharing no code object ([`write_copy`]);
//! and the system's host-only libraries ([`host_libraries`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use object::{Object, ObjectSection};

use crate::oracle::{entry_table, split_bundles, target_of};
use crate::tree::{link_or_copy, remove};

/// A ROCm library of the system, and how a split input holds it.
pub struct SystemLib {
    /// Its name in the table (`librocsparse`).
    pub name: &'static str,
    pub path: &'static str,
    /// The Debian package that installs it.
    pub package: &'static str,
    /// The split input: one artifact holding the library.
    pub artifact: &'static str,
    pub artifact_prefix: &'static str,
    /// Symlinks next to the library in the artifact: (name, target).
    pub links: &'static [(&'static str, &'static str)],
}

pub const ROCRAND: SystemLib = SystemLib {
    name: "librocrand",
    path: "/usr/lib/x86_64-linux-gnu/librocrand.so.1.1",
    package: "librocrand1",
    artifact: "rand_lib_gfx-all",
    artifact_prefix: "rand_lib",
    links: &[("librocrand.so.1", "librocrand.so.1.1")],
};

pub const ROCSPARSE: SystemLib = SystemLib {
    name: "librocsparse",
    path: "/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1",
    package: "librocsparse0",
    artifact: "sparse_lib_gfx-all",
    artifact_prefix: "sparse_lib",
    links: &[("librocsparse.so.0", "librocsparse.so.0.1")],
};

impl SystemLib {
    pub fn file_name(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }

    /// Its path, or an error naming the package that installs it.
    pub fn installed(&self) -> Result<&'static Path> {
        let p = Path::new(self.path);
        if !p.is_file() {
            bail!("{} missing (Debian package {})", self.path, self.package);
        }
        Ok(p)
    }
}

/// Lay out the split input: `<dir>/<artifact>/artifact_manifest.txt` and
/// `stage/lib/<library>` (a hard link to the system file) with its links.
pub fn make_artifact(lib: &SystemLib, dir: &Path) -> Result<PathBuf> {
    let a = dir.join(lib.artifact);
    std::fs::create_dir_all(a.join("stage/lib"))?;
    std::fs::write(a.join("artifact_manifest.txt"), "stage\n")?;
    link_or_copy(
        Path::new(lib.path),
        &a.join("stage/lib").join(lib.file_name()),
    )?;
    for (name, target) in lib.links {
        let at = a.join("stage/lib").join(name);
        remove(&at)?;
        std::os::unix::fs::symlink(target, &at)?;
    }
    Ok(a)
}

/// A device code object of a plain bundle, where it lies in its file.
#[derive(Debug, Clone)]
pub struct CodeObject {
    /// Its bundle's index in `.hip_fatbin`.
    pub bundle: usize,
    pub triple: String,
    /// Its bytes' range in the file.
    pub range: Range<u64>,
}

impl CodeObject {
    /// The target ID (text after the triple's last `--`).
    pub fn target(&self) -> &str {
        target_of(&self.triple)
    }
}

/// A file mapped read-only.
pub struct Mapped(memmap2::Mmap);

impl Mapped {
    pub fn open(path: &Path) -> Result<Mapped> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the inputs are system libraries and files of the bench's
        // cache, which nothing writes while they are read.
        let map = unsafe { memmap2::Mmap::map(&f) }
            .with_context(|| format!("mapping {}", path.display()))?;
        Ok(Mapped(map))
    }

    pub fn bytes(&self, r: &Range<u64>) -> &[u8] {
        &self.0[r.start as usize..r.end as usize]
    }
}

/// The device code objects of an ELF fat binary whose bundles are all
/// plain, in table order, bundle by bundle, and the bundles' ranges in the
/// file.
pub fn code_objects(path: &Path, map: &Mapped) -> Result<(Vec<CodeObject>, Vec<Range<u64>>)> {
    let elf = object::File::parse(&*map.0).with_context(|| format!("{}", path.display()))?;
    let section = elf
        .section_by_name(".hip_fatbin")
        .with_context(|| format!("{} has no .hip_fatbin", path.display()))?;
    let (base, _) = section
        .file_range()
        .with_context(|| format!("{}: .hip_fatbin has no file bytes", path.display()))?;
    let data = section.data()?;
    let (mut cos, mut bundles) = (Vec::new(), Vec::new());
    for (i, b) in split_bundles(data)?.into_iter().enumerate() {
        ensure!(
            !b.starts_with(b"CCOB"),
            "{}: bundle {i} is compressed; plain bundles are expected",
            path.display()
        );
        let at = base + (b.as_ptr() as usize - data.as_ptr() as usize) as u64;
        bundles.push(at..at + b.len() as u64);
        for (triple, r) in entry_table(b).with_context(|| format!("bundle {i}"))? {
            cos.push(CodeObject {
                bundle: i,
                triple,
                range: at + r.start as u64..at + r.end as u64,
            });
        }
    }
    Ok((cos, bundles))
}

/// Write the device code of `input` twice: to `out`, its code objects
/// concatenated in the order per-target archives hold them (by target,
/// then bundle), and into `files`, one file per code object
/// (`<target>#<bundle>.hsaco`, as `kpack extract` names them). Returns
/// its size and the file names.
pub fn write_device_code(input: &Path, out: &Path, files: &Path) -> Result<(u64, Vec<String>)> {
    let map = Mapped::open(input)?;
    let (mut cos, _) = code_objects(input, &map)?;
    cos.sort_by(|a, b| (a.target(), a.bundle).cmp(&(b.target(), b.bundle)));
    std::fs::create_dir_all(files)?;
    let mut w = BufWriter::with_capacity(8 << 20, File::create(out)?);
    let mut n = 0u64;
    let mut names = Vec::new();
    for co in &cos {
        let data = map.bytes(&co.range);
        w.write_all(data)?;
        let name = format!("{}#{}.hsaco", co.target(), co.bundle);
        std::fs::write(files.join(&name), data)?;
        names.push(name);
        n += data.len() as u64;
    }
    w.flush()?;
    Ok((n, names))
}

/// Copy `i` of the library at `dst`: copy 0 as it is (a hard link), any
/// other with the middle byte of every code object XORed with `i` (the
/// layout and sizes unchanged, no code object shared with another copy).
pub fn write_copy(lib: &Path, dst: &Path, i: usize) -> Result<()> {
    use std::os::unix::fs::FileExt;
    if i == 0 {
        return link_or_copy(lib, dst);
    }
    std::fs::copy(lib, dst)?;
    let map = Mapped::open(lib)?;
    let (cos, _) = code_objects(lib, &map)?;
    let f = std::fs::OpenOptions::new().write(true).open(dst)?;
    for co in cos.iter().filter(|co| !co.range.is_empty()) {
        let mid = (co.range.end - co.range.start) / 2;
        let byte = map.bytes(&co.range)[mid as usize];
        f.write_all_at(&[byte ^ i as u8], co.range.start + mid)?;
    }
    Ok(f.sync_all()?)
}

/// Host-only shared libraries of the system (regular ELF files under
/// 8 MiB without a `.hip_fatbin`), the first `n` by name.
pub fn host_libraries(n: usize) -> Result<Vec<PathBuf>> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/x86_64-linux-gnu")?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_string_lossy().contains(".so"))
        .filter(|e| e.metadata().is_ok_and(|m| m.len() < 8 << 20))
        .map(|e| e.path())
        .filter(|p| host_only(p))
        .collect();
    libs.sort();
    libs.truncate(n);
    Ok(libs)
}

/// An ELF file without device code.
fn host_only(p: &Path) -> bool {
    let Ok(bytes) = std::fs::read(p) else {
        return false;
    };
    object::File::parse(&*bytes).is_ok_and(|f| {
        f.format() == object::BinaryFormat::Elf
            && f.section_by_name(".hip_fatbin").is_none()
            && f.section_by_name(".hip_fat").is_none()
    })
}
