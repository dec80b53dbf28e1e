//! `cargo xtask malformed`: regenerates the malformed-input corpus
//! (`tests/malformed/`, run by `tests/tests/malformed.rs`) from committed
//! inputs only, so that a rerun writes the same bytes: the smallest fat
//! fixture as committed for the golden tests
//! (`tests/golden/inputs/libvadd_compressed.so`), its offloaded form
//! (written by the `kpack` binary given), and bundles, CCOB headers,
//! archives and TOCs built here (`archive`; ELF cases: `elf`). `cases.txt`
//! and `README.md` are written by hand.
//!
//! ELF headers are read and patched with `object`'s types and TOCs with
//! `rmpv`, not with kpack's own parsers or writers: the corpus is made to
//! break those.

mod archive;
mod elf;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::Shell;

use archive::archives;
use elf::{elf_files, metadata};

/// The corpus, relative to the workspace root.
pub const CORPUS_DIR: &str = "tests/malformed";
/// The fat binary the ELF and metadata cases are made from.
const FAT_INPUT: &str = "tests/golden/inputs/libvadd_compressed.so";

/// Writes files below the corpus directory.
pub(super) struct Corpus {
    root: PathBuf,
}

impl Corpus {
    pub(super) fn put(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().context("no parent")?)?;
        fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    }
}

/// Regenerate the corpus below `root` (the workspace); `kpack` is the
/// command that offloads the fat input for the metadata cases.
pub fn run(sh: &Shell, root: &Path, kpack: &Path) -> Result<()> {
    let corpus = Corpus {
        root: root.join(CORPUS_DIR),
    };
    let fat = fs::read(root.join(FAT_INPUT)).with_context(|| format!("reading {FAT_INPUT}"))?;
    bundles(&corpus)?;
    ccobs(&corpus)?;
    archives(&corpus)?;
    elf_files(&corpus, &fat)?;
    metadata(&corpus, sh, kpack, &root.join(FAT_INPUT))?;
    trees(&corpus, &fat)?;
    configs(&corpus)?;
    println!("regenerated {CORPUS_DIR} (check `git status {CORPUS_DIR}`)");
    Ok(())
}

pub(super) fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// An uncompressed bundle from raw (triple, data) entries, data right
/// after the table (no alignment).
fn bundle(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let table: usize = 32 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
    let mut out = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    out.extend(le64(entries.len() as u64));
    let mut pos = table as u64;
    for (t, d) in entries {
        out.extend(le64(pos));
        out.extend(le64(d.len() as u64));
        out.extend(le64(t.len() as u64));
        out.extend_from_slice(t);
        pos += d.len() as u64;
    }
    for (_, d) in entries {
        out.extend_from_slice(d);
    }
    out
}

const HOST: &[u8] = b"host-x86_64-unknown-linux--";
const GFX1100: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx1100";
const GFX942: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";

fn good_bundle() -> Vec<u8> {
    bundle(&[
        (HOST, b""),
        (GFX1100, b"\x7fELF code object for gfx1100"),
        (GFX942, b"\x7fELF code object for gfx942"),
    ])
}

/// A CCOB header (v1: 20 bytes, v2: 24, v3: 32) and payload.
fn ccob(version: u16, method: u16, total: u64, size: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = b"CCOB".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(method.to_le_bytes());
    match version {
        1 => {
            out.extend((size as u32).to_le_bytes());
            out.extend(le64(0));
        }
        2 => {
            out.extend((total as u32).to_le_bytes());
            out.extend((size as u32).to_le_bytes());
            out.extend(le64(0));
        }
        _ => {
            out.extend(le64(total));
            out.extend(le64(size));
            out.extend(le64(0));
        }
    }
    out.extend_from_slice(payload);
    out
}

/// A v2 zstd CCOB of `inner`, with correct sizes.
fn ccob_of(inner: &[u8]) -> Result<Vec<u8>> {
    let payload = zstd::bulk::compress(inner, 3)?;
    Ok(ccob(
        2,
        1,
        24 + payload.len() as u64,
        inner.len() as u64,
        &payload,
    ))
}

fn bundles(c: &Corpus) -> Result<()> {
    let good = good_bundle();
    c.put("bundle/truncated-count.bin", &good[..28])?;
    let mut b = good.clone();
    b[24..32].copy_from_slice(&le64(u64::MAX / 2));
    c.put("bundle/too-many-entries.bin", &b)?;
    c.put("bundle/entry-past-end.bin", &good[..good.len() - 5])?;
    let mut b = bundle(&[(GFX1100, b"abc")]);
    b[32..40].copy_from_slice(&le64(u64::MAX - 1)); // offset + size overflows
    c.put("bundle/entry-offset-overflow.bin", &b)?;
    c.put(
        "bundle/triple-not-ascii.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--gfx11\xff0", b"x")]),
    )?;
    c.put(
        "bundle/duplicate-target.bin",
        &bundle(&[(GFX1100, b"one"), (GFX1100, b"two")]),
    )?;
    let mut b = good.clone();
    b.extend_from_slice(b"\0\0\0\0__CLANG_OFFLOAD_BUNDLX__");
    c.put("bundle/bad-magic-after-first.bin", &b)?;
    let mut b = bundle(&[(GFX1100, b"x")]);
    b[48..56].copy_from_slice(&le64(1 << 40)); // triple length
    c.put("bundle/triple-length-huge.bin", &b)?;
    c.put(
        "bundle/target-escapes-dir.bin",
        &bundle(&[
            (HOST, b""),
            (b"hipv4-amdgcn-amd-amdhsa--../../../evil", b"PWNED"),
        ]),
    )?;
    c.put(
        "bundle/target-absolute-path.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--/tmp/kpack-evil", b"PWNED")]),
    )?;
    c.put(
        "bundle/no-target.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa-gfx1100", b"x")]),
    )
}

fn ccobs(c: &Corpus) -> Result<()> {
    let good = good_bundle();
    let z = ccob_of(&good)?;
    c.put("ccob/truncated-header.bin", &z[..14])?;
    let with = |at: usize, bytes: &[u8]| {
        let mut b = z.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    c.put("ccob/unknown-version.bin", &with(4, &9u16.to_le_bytes()))?;
    c.put("ccob/unknown-method.bin", &with(6, &7u16.to_le_bytes()))?;
    c.put(
        "ccob/total-smaller-than-header.bin",
        &with(8, &10u32.to_le_bytes()),
    )?;
    c.put(
        "ccob/total-past-end.bin",
        &with(8, &((z.len() + 100) as u32).to_le_bytes()),
    )?;
    c.put(
        "ccob/size-mismatch.bin",
        &with(12, &((good.len() + 1) as u32).to_le_bytes()),
    )?;
    let mut b = z.clone();
    let n = b.len();
    for x in &mut b[30..n - 4] {
        *x ^= 0x5a;
    }
    c.put("ccob/corrupt-zstd.bin", &b)?;
    c.put(
        "ccob/corrupt-zlib.bin",
        &ccob(2, 0, 24 + 8, 100, b"\x78\x9c\xff\xff\xff\xff\xff\xff"),
    )?;
    let junk = b"this is not an offload bundle at all".repeat(3);
    c.put("ccob/payload-not-a-bundle.bin", &ccob_of(&junk)?)?;
    c.put("ccob/payload-all-zero.bin", &ccob_of(&[0u8; 64])?)?;
    c.put(
        "ccob/v3-too-large.bin",
        &ccob(3, 1, 32 + 4, 1 << 40, b"abcd"),
    )?;
    c.put(
        "ccob/inner-bundle-truncated.bin",
        &ccob_of(&good[..good.len() - 3])?,
    )
}

/// One case of [`trees`]: a directory below the corpus, made afresh. An
/// entry's content is text, `@junk`/`@fat` for the bad/good fat binary,
/// `->target` for a symlink, `/` for an empty directory.
fn tree(c: &Corpus, case: &str, files: &[(&str, &str)], fat: &[u8]) -> Result<()> {
    let dir = c.root.join(case);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    let junk = fs::read(c.root.join("elf/fatbin-junk.so"))?;
    for (rel, content) in files {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().context("no parent")?)?;
        if let Some(t) = content.strip_prefix("->") {
            std::os::unix::fs::symlink(t, &p)?;
        } else if *content == "/" {
            fs::create_dir_all(&p)?;
        } else {
            let bytes = match *content {
                "@junk" => &junk[..],
                "@fat" => fat,
                text => text.as_bytes(),
            };
            fs::write(&p, bytes)?;
        }
    }
    Ok(())
}

/// Artifact trees: bad manifests, prefixes escaping the artifact, bad fat
/// binaries, incomplete or corrupt split outputs.
fn trees(c: &Corpus, fat: &[u8]) -> Result<()> {
    const A: &str = "foo_lib_gfx1100";
    let m = |rel: &str| format!("{A}/{rel}");
    let manifest = m("artifact_manifest.txt");
    let t = |case: &str, files: &[(&str, &str)]| tree(c, case, files, fat);
    t("split/no-manifest", &[(&m("stage/lib/x.txt"), "x")])?;
    t(
        "split/manifest-dotdot",
        &[(&manifest, "stage\n../outside\n"), (&m("stage/x"), "x")],
    )?;
    t("split/manifest-absolute", &[(&manifest, "/etc\n")])?;
    t(
        "split/manifest-nested",
        &[(&manifest, "stage\nstage/lib\n"), (&m("stage/lib/x"), "x")],
    )?;
    t("split/manifest-root", &[(&manifest, "./\n")])?;
    t("split/manifest-not-utf8", &[(&manifest, "")])?;
    c.put(
        &format!("split/manifest-not-utf8/{manifest}"),
        b"st\xffage\n",
    )?;
    t(
        "split/prefix-symlink-outside",
        &[(&manifest, "stage\n"), (&m("stage"), "->..")],
    )?;
    t(
        "split/prefix-is-a-file",
        &[(&manifest, "stage\n"), (&m("stage"), "not a directory")],
    )?;
    t(
        "split/bad-fat-binary",
        &[
            (&manifest, "stage\n"),
            (&m("stage/lib/libbad.so"), "@junk"),
            (&m("stage/lib/libgood.so"), "@fat"),
        ],
    )?;
    t(
        "split-batch/duplicate-prefix",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1100/stage/x", "x"),
            ("foo_lib_gfx1101/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1101/stage/x", "x"),
        ],
    )?;
    t(
        "split-batch/no-family",
        &[
            ("foolib/artifact_manifest.txt", "stage\n"),
            ("foolib/stage/x", "x"),
        ],
    )?;
    verify_trees(c, fat)?;
    t(
        "pack-tree/bad-fat-binary",
        &[("lib/libbad.so", "@junk"), ("share/doc/README", "x")],
    )?;
    t(
        "recombine-tree/no-shards",
        &[
            (
                "config.json",
                r#"{"primary_shard": "a", "architecture_groups": {"gfx110X": {"architectures": ["gfx1100"]}}}"#,
            ),
            ("shards/README", "no shard directories here"),
        ],
    )
}

/// Incomplete or corrupt split outputs, for `kpack verify`.
fn verify_trees(c: &Corpus, fat: &[u8]) -> Result<()> {
    let t = |case: &str, files: &[(&str, &str)]| tree(c, case, files, fat);
    t(
        "verify/generic-with-fat-binary",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/lib/libfat.so", "@fat"),
        ],
    )?;
    t(
        "verify/missing-manifest",
        &[("foo_lib_generic/stage/x", "x")],
    )?;
    t(
        "verify/target-without-generic",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            (
                "foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack",
                "not an archive",
            ),
        ],
    )?;
    t(
        "verify/corrupt-archive",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/README", "host files"),
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
        ],
    )?;
    let bad_archive = fs::read(c.root.join("archive/frame-corrupt.kpack"))?;
    c.put(
        "verify/corrupt-archive/foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack",
        &bad_archive,
    )
}

/// Bad packaging configs for `kpack recombine`.
fn configs(c: &Corpus) -> Result<()> {
    let group = r#""architecture_groups": {"g": {"architectures": ["gfx1100"]}}"#;
    let cases = [
        ("empty", String::new()),
        ("not-json", "{\"primary_shard\": ".into()),
        ("not-an-object", "[1, 2]".into()),
        (
            "unknown-field",
            format!(r#"{{"primary_shard": "a", {group}, "extra": 1}}"#),
        ),
        ("missing-primary", format!("{{{group}}}")),
        (
            "primary-not-string",
            format!(r#"{{"primary_shard": 3, {group}}}"#),
        ),
        (
            "groups-empty",
            r#"{"primary_shard": "a", "architecture_groups": {}}"#.into(),
        ),
        (
            "group-name-path",
            r#"{"primary_shard": "a", "architecture_groups": {"../x": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "group-name-generic",
            r#"{"primary_shard": "a", "architecture_groups": {"generic": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "architectures-empty",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": []}}}"#.into(),
        ),
        (
            "architecture-not-gfx",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["sm_90"]}}}"#.into(),
        ),
        (
            "architecture-bad-feature",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx90a:xnack"]}}}"#.into(),
        ),
        (
            "processor-in-two-groups",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}, "h": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "validation-unknown",
            format!(r#"{{"primary_shard": "a", {group}, "validation": {{"error_on_everything": true}}}}"#),
        ),
        (
            "validation-not-bool",
            format!(r#"{{"primary_shard": "a", {group}, "validation": {{"error_on_duplicate_device_code": "yes"}}}}"#),
        ),
    ];
    for (name, text) in &cases {
        c.put(&format!("config/{name}.json"), text.as_bytes())?;
    }
    Ok(())
}
