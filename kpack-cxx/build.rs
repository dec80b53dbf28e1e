//! The C++ half of the C++ API: cxx-build generates the bridge's C++ code
//! from `src/bridge.rs` and compiles it, with cxx's own runtime (`cxx.cc`),
//! into `$OUT_DIR/librocm_kpack_cxx.a`: an archive of its own, not linked
//! into the Rust library, so that C programs linking `librocm_kpack.a`
//! need no C++ runtime. It is compiled with hidden visibility, so a shared
//! library linking it exports none of its symbols.
//!
//! The glue calls Rust functions of the bridge and of cxx
//! (`cxxbridge1$...`). They must be global for it to find them, but no
//! shared library should export them: `$OUT_DIR/hidden.s` lists them as
//! `.hidden` (lib.rs assembles it beside the zstd hooks), so the linker
//! gives them hidden visibility in `librocm_kpack.so`, in the prelinked
//! archive and in anything linking it.
//!
//! cxx's own copy of that runtime, compiled by the `cxx` crate, must stay
//! out of every C artifact: cxx's Rust code references it (from functions
//! kpack never calls), which would pull it, its static constructor and
//! libstdc++ into `librocm_kpack.so`, Rust programs and the prelinked
//! archive. `$OUT_DIR/libkpack_cxx_stubs.a` holds a hidden, one-byte
//! stand-in for each of its C-linkage functions, each in a section of its
//! own; linked whole before the dependencies, they satisfy those
//! references and are garbage-collected as unreachable. (The prelink step
//! fails if one survives: that would be Rust calling C++.)
//!
//! `KPACK_CXX_OUT_DIR` tells the crate's programs where the archive, the
//! generated header and `rust/cxx.h` are (`rocm-kpack-prelink` installs
//! them, see `src/prelink.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::read::archive::ArchiveFile;
use object::write::{Object as WriteObject, Symbol, SymbolSection};
use object::{Object, ObjectSymbol, SymbolFlags, SymbolKind, SymbolScope};

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    // cxx's build script publishes its header (links = "cxxbridge1");
    // cxx.cc sits in ../src beside include/.
    let cxx_h = PathBuf::from(std::env::var_os("DEP_CXXBRIDGE1_HEADER").expect("cxx's header"));
    let cxx_cc = cxx_h
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("src/cxx.cc"))
        .expect("cxx's source directory");

    cxx_build::bridge("src/bridge.rs")
        .file(&cxx_cc)
        .std("c++17")
        .flag_if_supported("-fvisibility=hidden")
        .flag_if_supported("-fvisibility-inlines-hidden")
        // The archive is installed, not linked into the Rust library.
        .cargo_metadata(false)
        .compile("rocm_kpack_cxx");

    let glue = out_dir.join("librocm_kpack_cxx.a");
    let (names, runtime) = symbols_of(&glue);
    let mut asm = String::new();
    let mut list = String::new();
    for name in &names {
        asm.push_str(&format!(".hidden \"{name}\"\n"));
        list.push_str(name);
        list.push('\n');
    }
    std::fs::write(out_dir.join("hidden.s"), asm).expect("write hidden.s");
    // The same names for the prelink step, which keeps them global.
    std::fs::write(out_dir.join("bridge_symbols.txt"), list).expect("write bridge_symbols.txt");

    if let Some(stubs) = stub_object(&runtime) {
        let object = out_dir.join("kpack_cxx_stubs.o");
        std::fs::write(&object, stubs).expect("write kpack_cxx_stubs.o");
        cc::Build::new()
            .object(&object)
            .cargo_metadata(false)
            .compile("kpack_cxx_stubs");
        println!("cargo:rustc-link-search=native={}", out_dir.display());
        println!("cargo:rustc-link-lib=static:+whole-archive=kpack_cxx_stubs");
    }

    println!("cargo:rerun-if-changed=src/bridge.rs");
    println!("cargo:rustc-env=KPACK_CXX_OUT_DIR={}", out_dir.display());
}

/// The Rust functions the glue archive calls (its undefined `cxxbridge1$`
/// symbols), and the C-linkage functions of cxx's runtime it defines.
fn symbols_of(archive: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let data = std::fs::read(archive).expect("read the glue archive");
    let file = ArchiveFile::parse(&*data).expect("parse the glue archive");
    let mut defined = BTreeSet::new();
    let mut undefined = BTreeSet::new();
    for member in file.members() {
        let member = member.expect("archive member");
        let bytes = member.data(&*data).expect("member data");
        let obj = object::File::parse(bytes).expect("parse a glue object");
        for sym in obj.symbols() {
            let Ok(name) = sym.name() else { continue };
            if !name.starts_with("cxxbridge1$") && !name.contains("$cxxbridge1$") {
                continue;
            }
            if sym.is_undefined() {
                undefined.insert(name.to_owned());
            } else if sym.is_global() {
                defined.insert(name.to_owned());
            }
        }
    }
    let calls = &undefined - &defined;
    (calls, defined)
}

/// An ELF object with a hidden one-byte stand-in for each of `symbols`,
/// each in its own section (`.text.kpack_cxx_stub.N`); `None` off ELF
/// targets, which need no such care.
fn stub_object(symbols: &BTreeSet<String>) -> Option<Vec<u8>> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let arch = match var("CARGO_CFG_TARGET_ARCH").as_str() {
        "x86_64" => object::Architecture::X86_64,
        "aarch64" => object::Architecture::Aarch64,
        "powerpc64" => object::Architecture::PowerPc64,
        _ => return None,
    };
    if var("CARGO_CFG_TARGET_OS") != "linux" {
        return None;
    }
    let endian = if var("CARGO_CFG_TARGET_ENDIAN") == "big" {
        object::Endianness::Big
    } else {
        object::Endianness::Little
    };
    let mut obj = WriteObject::new(object::BinaryFormat::Elf, arch, endian);
    for (i, name) in symbols.iter().enumerate() {
        let section = obj.add_section(
            Vec::new(),
            format!(".text.kpack_cxx_stub.{i}").into_bytes(),
            object::SectionKind::Text,
        );
        let offset = obj.append_section_data(section, &[0], 1);
        obj.add_symbol(Symbol {
            name: name.clone().into_bytes(),
            value: offset,
            size: 1,
            kind: SymbolKind::Text,
            scope: SymbolScope::Linkage,
            weak: false,
            section: SymbolSection::Section(section),
            flags: SymbolFlags::None,
        });
    }
    // No executable stack.
    let note = obj.add_section(
        Vec::new(),
        b".note.GNU-stack".to_vec(),
        object::SectionKind::Elf(object::elf::SHT_PROGBITS),
    );
    obj.append_section_data(note, &[], 1);
    Some(obj.write().expect("write the stub object"))
}
