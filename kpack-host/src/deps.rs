//! The libraries a host binary needs and where its loader looks for them
//! (`kpack bundle --with-deps`): ELF `DT_NEEDED` names with the
//! `DT_RUNPATH`/`DT_RPATH` directories (`$ORIGIN` is the binary's own
//! directory), PE import DLL names (the directory of the binary).

use std::path::{Path, PathBuf};

use object::elf::{DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_STRSZ, DT_STRTAB};
use object::read::elf::{Dyn as _, FileHeader as _};
use object::Object as _;

use crate::elf::LE;
use crate::error::{Error, Result};

/// What a binary needs: library file names, and the directories its
/// loader searches (besides the system's), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needed {
    pub libraries: Vec<String>,
    pub search_dirs: Vec<PathBuf>,
}

/// The libraries the binary `bytes` at `path` needs.
pub fn needed(path: &Path, bytes: &[u8]) -> Result<Needed> {
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    if crate::pe::is_pe(bytes) {
        return pe_needed(path, bytes, dir);
    }
    let bad =
        |e: object::Error| Error::request(path, format!("cannot read its dynamic section: {e}"));
    let elf = object::elf::FileHeader64::<object::LittleEndian>::parse(bytes).map_err(bad)?;
    let sections = elf.sections(LE, bytes).map_err(bad)?;
    let Some((entries, _)) = sections.dynamic(LE, bytes).map_err(bad)? else {
        return Ok(Needed::default());
    };
    // The strings as the dynamic loader finds them: at DT_STRTAB's address.
    let value = |tag: u32| {
        (entries.iter())
            .find(|d| d.d_tag(LE) as u32 == tag)
            .map(|d| d.d_val(LE))
    };
    let strtab = value(DT_STRTAB).and_then(|addr| file_offset(elf, bytes, addr));
    let (Some(strtab), Some(size)) = (strtab, value(DT_STRSZ)) else {
        return Ok(Needed::default());
    };
    let table = bytes.get(strtab as usize..).unwrap_or_default();
    let table = &table[..(size as usize).min(table.len())];
    let string = |at: u64| -> String {
        let s = table.get(at as usize..).unwrap_or_default();
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        String::from_utf8_lossy(&s[..end]).into_owned()
    };
    let mut out = Needed::default();
    for d in entries {
        match d.d_tag(LE) as u32 {
            DT_NEEDED => out.libraries.push(string(d.d_val(LE))),
            DT_RUNPATH | DT_RPATH => (out.search_dirs).extend(
                string(d.d_val(LE))
                    .split(':')
                    .map(|e| expand_origin(e, &dir)),
            ),
            _ => {}
        }
    }
    out.search_dirs.push(dir);
    Ok(out)
}

/// The file offset of the virtual address `addr` (through the PT_LOAD
/// that maps it).
fn file_offset(
    elf: &object::elf::FileHeader64<object::LittleEndian>,
    bytes: &[u8],
    addr: u64,
) -> Option<u64> {
    use object::read::elf::ProgramHeader as _;
    elf.program_headers(LE, bytes).ok()?.iter().find_map(|p| {
        let (va, off, size) = (p.p_vaddr(LE), p.p_offset(LE), p.p_filesz(LE));
        let load = p.p_type(LE) == object::elf::PT_LOAD;
        (load && (va..va + size).contains(&addr)).then(|| off + (addr - va))
    })
}

/// A run path entry with `$ORIGIN` (`${ORIGIN}`) as the binary's directory.
fn expand_origin(entry: &str, dir: &Path) -> PathBuf {
    let d = dir.display().to_string();
    PathBuf::from(entry.replace("${ORIGIN}", &d).replace("$ORIGIN", &d))
}

/// A PE image's import DLLs, found beside it.
fn pe_needed(path: &Path, bytes: &[u8], dir: PathBuf) -> Result<Needed> {
    let bad = |e: object::Error| Error::request(path, format!("cannot read its imports: {e}"));
    let pe = object::read::pe::PeFile64::parse(bytes).map_err(bad)?;
    let mut libraries: Vec<String> = Vec::new();
    for i in pe.imports().map_err(bad)? {
        let name = String::from_utf8_lossy(i.library()).into_owned();
        if !libraries.contains(&name) {
            libraries.push(name);
        }
    }
    Ok(Needed {
        libraries,
        search_dirs: vec![dir],
    })
}

/// Where the loader finds `library` in `dirs` (the first that has it; PE
/// names match without regard to case, as on Windows).
pub fn find(library: &str, dirs: &[PathBuf], pe: bool) -> Option<PathBuf> {
    for d in dirs {
        let p = d.join(library);
        if p.is_file() {
            return Some(p);
        }
        if pe {
            let found = std::fs::read_dir(d).ok()?.filter_map(|e| e.ok()).find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .eq_ignore_ascii_case(library)
            });
            if let Some(e) = found {
                return Some(e.path());
            }
        }
    }
    None
}
