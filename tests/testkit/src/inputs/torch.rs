//! The bench's `wheels` section's inputs: synthetic torch-like wheels
//! holding copies of Debian's librocsparse as
//! `torch/lib/libtorch_hip_<i>.so` (copies that share no code object,
//! [`write_copy`]), one target's code objects as rocBLAS database files, a
//! MIOpen database, a host-only library and Python files; the device code
//! of one copy as a file (the floor's input); and the one-copy wheel as
//! another distribution, `torchvision`. Built once, kept in
//! `target/bench/cache/`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use xshell::Shell;

use super::rocm::{code_objects, write_copy, write_device_code, Mapped, ROCSPARSE};
use super::{cache_dir, wheel};
use crate::tree::remove;

const VERSION: &str = "2.10.0+bench";
/// The target whose code objects are the rocBLAS database files.
const DATABASE_TARGET: &str = "gfx1030";

/// A torch-like wheel and the device code of one of its copies.
pub struct TorchWheel {
    pub wheel: PathBuf,
    /// One copy of librocsparse's device code, concatenated.
    pub device: PathBuf,
    pub device_bytes: u64,
}

/// The wheel with `copies` copies of librocsparse (built when missing;
/// `work` holds its tree meanwhile).
pub fn rocsparse_wheel(root: &Path, work: &Path, copies: usize) -> Result<TorchWheel> {
    let lib = ROCSPARSE.installed()?;
    let device_dir = cache_dir(root, "torch-wheel-device");
    std::fs::create_dir_all(&device_dir)?;
    let device = device_dir.join("device.bin");
    let device_bytes = match std::fs::metadata(&device) {
        Ok(m) => m.len(),
        Err(_) => {
            let files = work.join("wheels-device-files");
            let (n, _) = write_device_code(lib, &device, &files)?;
            remove(&files)?;
            n
        }
    };
    let dir = cache_dir(root, &format!("torch-wheel-distinct-{copies}"));
    let mut wheel = dir.join(wheel::file_name(VERSION));
    if !wheel.is_file() {
        wheel = build(root, work, lib, &dir, copies)?;
    }
    Ok(TorchWheel {
        wheel,
        device,
        device_bytes,
    })
}

fn build(root: &Path, work: &Path, lib: &Path, out_dir: &Path, copies: usize) -> Result<PathBuf> {
    eprintln!(
        "building the torch-like wheel with {copies} copies (once; kept in {})",
        out_dir.display()
    );
    let tree = work.join("wheels-tree");
    remove(&tree)?;
    let t = tree.join("torch");
    std::fs::create_dir_all(t.join("lib/rocblas/library"))?;
    std::fs::create_dir_all(t.join("share/miopen/db"))?;
    for i in 0..copies {
        write_copy(lib, &t.join(format!("lib/libtorch_hip_{i}.so")), i)?;
    }
    std::fs::write(t.join("__init__.py"), "# torch-like bench wheel\n")?;
    std::fs::copy(
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        t.join("lib/libz_host.so.1"),
    )?;
    write_databases(lib, &t.join("lib/rocblas/library"))?;
    std::fs::write(t.join("share/miopen/db/gfx1030.kdb"), vec![7u8; 4 << 20])?;
    let wheel = wheel::pack_torch(root, &tree, VERSION, out_dir)?;
    remove(&tree)?;
    Ok(wheel)
}

/// [`DATABASE_TARGET`]'s code objects of `lib` as rocBLAS kernel libraries
/// (`TensileLibrary_Type_<n>_gfx1030.co`, in bundle order) in `dir`.
fn write_databases(lib: &Path, dir: &Path) -> Result<()> {
    let map = Mapped::open(lib)?;
    let (cos, _) = code_objects(lib, &map)?;
    let cos = cos.iter().filter(|c| c.target() == DATABASE_TARGET);
    for (n, co) in cos.enumerate() {
        std::fs::write(
            dir.join(format!("TensileLibrary_Type_{n}_{DATABASE_TARGET}.co")),
            map.bytes(&co.range),
        )?;
    }
    Ok(())
}

/// The one-copy wheel `small` as another distribution (`torchvision`,
/// package `torchvision/`), built once into the cache.
pub fn vision_wheel(root: &Path, work: &Path, small: &Path) -> Result<PathBuf> {
    let cache = cache_dir(root, "torchvision-wheel");
    let name = format!("torchvision-{VERSION}-{}.whl", wheel::TAG);
    if cache.join(&name).is_file() {
        return Ok(cache.join(name));
    }
    let tree = work.join("wheels-vision-tree");
    remove(&tree)?;
    let sh = Shell::new()?;
    xshell::cmd!(sh, "unzip -q {small} -d {tree}").run()?;
    std::fs::rename(tree.join("torch"), tree.join("torchvision"))?;
    let di = tree.join(format!("torchvision-{VERSION}.dist-info"));
    std::fs::rename(tree.join(format!("torch-{VERSION}.dist-info")), &di)?;
    let metadata = std::fs::read_to_string(di.join("METADATA"))?;
    std::fs::write(
        di.join("METADATA"),
        metadata.replace("Name: torch\n", "Name: torchvision\n"),
    )?;
    std::fs::write(di.join("RECORD"), "")?;
    let wheel = wheel::pack(root, &tree, &name, &cache)?;
    remove(&tree)?;
    Ok(wheel)
}
