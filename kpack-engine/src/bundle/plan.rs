//! What a bundle holds and where each piece goes: the binaries (and their
//! dependencies), their destinations in the chosen layout, the archives
//! their search paths name for the chosen targets, and the search paths
//! each re-pointed binary gets.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{BundleOptions, Layout};
use crate::doctor::dists::lexical;
use crate::hipk::HipkMetadata;
use crate::target::TargetId;
use crate::{ArtifactError, Result};
use kpack_host::binary::{classify_parsed, Class};
use kpack_host::deps;
use kpack_host::offload::{relative_path, verify_shipped};

/// One file to copy into the bundle.
pub(crate) struct Piece {
    pub source: PathBuf,
    /// Destination, relative to the bundle directory.
    pub dest: PathBuf,
    /// Found as a library another piece needs (`--with-deps`).
    pub dependency: bool,
    /// An offloaded binary: its metadata as found, its code object
    /// indices, and what it becomes.
    pub offloaded: Option<Offloaded>,
}

pub(crate) struct Offloaded {
    pub metadata: HipkMetadata,
    pub co_indices: Vec<u32>,
    /// The metadata it gets; `None`: it stays as it is.
    pub repointed: Option<HipkMetadata>,
    /// The archives it needs: source and destination (relative).
    pub archives: Vec<(PathBuf, PathBuf)>,
    /// The code-object targets those archives serve that the chosen
    /// targets take: each code object must resolve for each of them.
    pub targets: BTreeSet<String>,
}

impl Offloaded {
    /// Does the binary record code for a target `t` takes (`false` when
    /// it records no targets: then only the archives present tell)?
    pub fn has_code_for(&self, t: &TargetId) -> bool {
        (self.metadata.targets.iter().flatten())
            .any(|r| TargetId::parse(r).is_ok_and(|r| t.takes(&r)))
    }
}

/// The binaries given and, with `--with-deps`, the libraries they need
/// from their prefix (the directory above each binary's own), each once.
pub(crate) fn inputs(opts: &BundleOptions) -> Result<Vec<(PathBuf, bool)>> {
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    for b in &opts.binaries {
        if !b.is_file() {
            return Err(ArtifactError::input(b, "no such file"));
        }
        let b = lexical(b);
        if !out.iter().any(|(p, _)| *p == b) {
            out.push((b, false));
        }
    }
    let mut i = 0;
    while opts.with_deps && i < out.len() {
        let from = out[i].0.clone();
        for dep in dependencies(&from)? {
            if !out.iter().any(|(p, _)| *p == dep) {
                out.push((dep, true));
            }
        }
        i += 1;
    }
    Ok(out)
}

/// The libraries `binary` needs that its loader finds in its prefix.
fn dependencies(binary: &Path) -> Result<Vec<PathBuf>> {
    let bytes = kpack_loader::map_file(binary)?;
    if !kpack_host::binary::could_be_binary(&bytes[..bytes.len().min(8)]) {
        return Ok(Vec::new());
    }
    let needed = deps::needed(binary, &bytes)?;
    let dir = binary.parent().unwrap_or(Path::new("/"));
    let prefix = dir.parent().unwrap_or(dir);
    let pe = kpack_host::pe::is_pe(&bytes);
    Ok(needed
        .libraries
        .iter()
        .filter_map(|lib| deps::find(lib, &needed.search_dirs, pe))
        .map(|p| lexical(&p))
        .filter(|p| p.starts_with(prefix))
        .collect())
}

/// Where each input goes: its file name (flat), or its path below the
/// inputs' common directory (keep). Two inputs at one place is an error.
pub(crate) fn destinations(
    inputs: &[(PathBuf, bool)],
    layout: Layout,
    root: &Path,
) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for (p, _) in inputs {
        let dest = match layout {
            Layout::Flat => PathBuf::from(p.file_name().unwrap_or_default()),
            Layout::Keep => p.strip_prefix(root).unwrap_or(p).to_path_buf(),
        };
        if let Some(j) = out.iter().position(|d| *d == dest) {
            return Err(ArtifactError::input(
                p,
                format!(
                    "would be copied to {} as {} is: keep the layout (--layout keep) or bundle them apart",
                    dest.display(),
                    inputs[j].0.display()
                ),
            ));
        }
        out.push(dest);
    }
    Ok(out)
}

/// The deepest directory holding every path (their common ancestor).
pub(crate) fn common_dir<'a>(paths: impl Iterator<Item = &'a Path>) -> PathBuf {
    let mut root: Option<PathBuf> = None;
    for p in paths {
        let dir = p.parent().unwrap_or(p);
        root = Some(match root {
            None => dir.to_path_buf(),
            Some(r) => r
                .components()
                .zip(dir.components())
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    root.unwrap_or_default()
}

/// The directory whose layout `--layout keep` keeps: the deepest one
/// holding every input and every directory their relative search paths
/// name.
pub(crate) fn layout_root(inputs: &[(PathBuf, bool)]) -> PathBuf {
    let mut paths: Vec<PathBuf> = inputs.iter().map(|(p, _)| p.clone()).collect();
    for (p, _) in inputs {
        let dir = p.parent().unwrap_or(Path::new("/"));
        for sp in search_paths(p)
            .iter()
            .filter(|sp| !Path::new(sp).is_absolute())
        {
            paths.push(lexical(&dir.join(sp)));
        }
    }
    common_dir(paths.iter().map(PathBuf::as_path))
}

/// The search paths of an offloaded binary (none for any other file).
fn search_paths(path: &Path) -> Vec<String> {
    let Ok(mapped) = kpack_loader::map_file(path) else {
        return Vec::new();
    };
    match kpack_host::fatbin::read_device_code(path, &mapped) {
        Ok(kpack_host::fatbin::DeviceCode::Offloaded(o)) => o.metadata.search_paths,
        _ => Vec::new(),
    }
}

/// The offloaded binary at `source` (going to `dest`): its archives for the
/// chosen targets and its new search paths; `None` for any other file.
pub(crate) fn offloaded(
    source: &Path,
    dest: &Path,
    layout: Layout,
    root: &Path,
    chosen: &[TargetId],
) -> Result<Option<Offloaded>> {
    let mapped = kpack_loader::map_file(source)?;
    let file = classify_parsed(&mapped);
    if file.class != Class::Offloaded {
        return Ok(None);
    }
    let v = verify_shipped(file.bytes).map_err(|e| ArtifactError::input(source, e.to_string()))?;
    let room = kpack_host::repoint::room(source, file.bytes)?;
    let mut o = Offloaded {
        co_indices: co_indices(&v.co_indices),
        metadata: v.metadata,
        repointed: None,
        archives: Vec::new(),
        targets: BTreeSet::new(),
    };
    let keys: BTreeSet<String> = (o.co_indices.iter())
        .map(|co| format!("{}#{co}", o.metadata.kernel_name))
        .collect();
    let dir = source.parent().unwrap_or(Path::new(""));
    let mut plans = Vec::new();
    // Each archive with the search path (its index) that names it.
    let mut archives: Vec<(PathBuf, usize)> = Vec::new();
    for (i, p) in o.metadata.search_paths.iter().enumerate() {
        plans.push(place(p, dir, dest, layout, root));
        for archive in kpack_loader::archives_on_search_path(dir, p) {
            let archive = lexical(&archive);
            if let Some(targets) = wanted(&archive, &keys, chosen)? {
                archives.push((archive, i));
                o.targets.extend(targets);
            }
        }
    }
    o.repointed = repointed(source, &o.metadata, &mut plans, room)?;
    o.archives = archives
        .into_iter()
        .map(|(a, i)| {
            let name = a.file_name().unwrap_or_default().to_owned();
            let dest = plans[i].archive_dir.join(name);
            (a, dest)
        })
        .collect();
    Ok(Some(o))
}

fn co_indices(cos: &[u64]) -> Vec<u32> {
    let mut v: Vec<u32> = cos.iter().filter_map(|&c| u32::try_from(c).ok()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The targets of `archive` the chosen ones take (all without a choice),
/// when it holds one of `keys`; `None` when it is not wanted.
fn wanted(
    archive: &Path,
    keys: &BTreeSet<String>,
    chosen: &[TargetId],
) -> Result<Option<Vec<String>>> {
    let a = kpack_loader::open_archive(archive)?;
    if !a.binaries().any(|k| keys.contains(k)) {
        return Ok(None);
    }
    let targets: Vec<String> = a
        .gfx_arches()
        .iter()
        .filter(|t| {
            chosen.is_empty()
                || TargetId::parse(t).is_ok_and(|t| chosen.iter().any(|c| c.takes(&t)))
        })
        .cloned()
        .collect();
    Ok((!targets.is_empty()).then_some(targets))
}

/// Where one search path's archives go, and the search path that finds
/// them there.
struct Placed {
    /// The archives' directory, relative to the bundle.
    archive_dir: PathBuf,
    /// The search path (`None`: the original, unchanged).
    path: Option<String>,
    /// The file name part of the original path (`x_@GFXARCH@.kpack`).
    name: String,
    /// Relative path from the binary's new directory to the bundle's root.
    to_root: String,
}

/// Keep layout: a relative search path whose directory stays below the
/// common root is kept (its archives keep their place relative to the
/// binary); any other is re-pointed to `.kpack/` at the bundle's root.
fn place(p: &str, dir: &Path, dest: &Path, layout: Layout, root: &Path) -> Placed {
    let name = Path::new(p)
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let to_root = match dest.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => relative_path(&Path::new("/").join(d), Path::new("/")),
        None => ".".into(),
    };
    let target_dir = lexical(&dir.join(p)).parent().map(Path::to_path_buf);
    if let (Layout::Keep, false, Some(t)) = (layout, Path::new(p).is_absolute(), target_dir) {
        if let Ok(rel) = t.strip_prefix(root) {
            return Placed {
                archive_dir: rel.to_path_buf(),
                path: None,
                name,
                to_root,
            };
        }
    }
    let path = Some(join_rel(&to_root, &format!(".kpack/{name}")));
    Placed {
        archive_dir: PathBuf::from(".kpack"),
        path,
        name,
        to_root,
    }
}

fn join_rel(base: &str, rest: &str) -> String {
    if base == "." {
        rest.to_string()
    } else {
        format!("{base}/{rest}")
    }
}

/// The binary's new metadata, if its search paths change: re-pointed to
/// `.kpack/` at the bundle's root, or, where that does not fit the
/// binary's room for metadata, to the bundle's root itself (its archives
/// move there too).
fn repointed(
    source: &Path,
    metadata: &HipkMetadata,
    plans: &mut [Placed],
    room: u64,
) -> Result<Option<HipkMetadata>> {
    if plans.iter().all(|p| p.path.is_none()) {
        return Ok(None);
    }
    let paths = |plans: &[Placed]| -> Vec<String> {
        (plans.iter().zip(&metadata.search_paths))
            .map(|(p, old)| p.path.clone().unwrap_or_else(|| old.clone()))
            .collect()
    };
    let new = metadata.clone().with_search_paths(paths(plans));
    if new.encode().len() as u64 <= room {
        return Ok(Some(new));
    }
    for p in plans.iter_mut().filter(|p| p.path.is_some()) {
        p.path = Some(join_rel(&p.to_root, &p.name));
        p.archive_dir = PathBuf::new();
    }
    let new = metadata.clone().with_search_paths(paths(plans));
    if new.encode().len() as u64 <= room {
        return Ok(Some(new));
    }
    Err(ArtifactError::input(
        source,
        format!(
            "its search paths cannot be re-pointed: the new metadata needs {} bytes, the binary has room for {room}",
            new.encode().len()
        ),
    ))
}
