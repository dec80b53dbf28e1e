//! An archive over 4 GiB, both schemes, written and read for real
//! (formats.md §3.5: upstream has met a 4.1 GB archive): 4.5 GiB of
//! incompressible kernels (64 MiB each, pseudo-random bytes in a file the
//! writer maps),
//! written by kpack-host's `ArchiveWriter` and then read back kernel by
//! kernel (each decompressed and checked against its size), every step a
//! child process (`kpack-bench bench-archive`) timed with its peak RSS.
//! Disk: the input and one archive at a time (about 9 GiB).

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::context::Ctx;
use crate::measure::{resident, timed, Runs};
use crate::report::Row;
use kpack_testkit::tree::remove;

/// Total kernel bytes: past 4 GiB.
const TOTAL: u64 = 4608 << 20;
const KERNEL: u64 = 64 << 20;

/// `kpack-bench bench-archive` (the section's child process).
#[derive(Debug, Clone, clap::Args)]
pub struct ArchiveArgs {
    /// `write` (INPUT's bytes as 64 MiB kernels into OUTPUT) or `read`
    /// (every kernel of INPUT, decompressed and checked).
    pub action: String,
    pub input: PathBuf,
    pub output: Option<PathBuf>,
    /// none or zstd.
    #[arg(long, default_value = "zstd")]
    pub scheme: String,
}

/// The child: write or read, print a JSON line.
pub fn child(a: &ArchiveArgs) -> Result<()> {
    use kpack_format::archive::Scheme;
    use kpack_host::ArchiveWriter;
    let start = Instant::now();
    match a.action.as_str() {
        "write" => {
            let out = a.output.as_ref().context("write needs OUTPUT")?;
            let scheme = match a.scheme.as_str() {
                "none" => Scheme::None,
                "zstd" => Scheme::ZstdPerKernel,
                s => bail!("--scheme {s}: none or zstd"),
            };
            let input = kpack_loader::map_file(&a.input)?;
            let data: &[u8] = &input;
            let mut w = ArchiveWriter::new("big", "gfx942", vec!["gfx942".into()]).scheme(scheme);
            for (i, k) in data.chunks(KERNEL as usize).enumerate() {
                let range =
                    kpack_host::FileRange::of_slice(&input, k).context("a chunk of the input")?;
                w.add(format!("lib/libbig.so#{i}"), "gfx942", range, None)?;
            }
            let s = w.write(out)?;
            println!(
                "{}",
                json!({"kernels": s.kernels, "bytes_in": s.bytes_in, "bytes_out": s.bytes_out,
                       "seconds": start.elapsed().as_secs_f64()})
            );
        }
        "read" => {
            let archive = kpack_loader::open_archive(&a.input)?;
            let (mut bytes, mut sum, mut anon) = (0u64, 0u64, 0u64);
            for e in archive.entries() {
                let k = archive.read(e)?;
                if k.len() as u64 != e.original_size {
                    bail!("{}: {} bytes, expected {}", e.key, k.len(), e.original_size);
                }
                // Every byte is looked at (scheme none borrows from the map).
                sum = k
                    .chunks_exact(8)
                    .fold(sum, |s, w| s ^ u64::from_le_bytes(w.try_into().unwrap()));
                bytes += k.len() as u64;
                anon = anon.max(rss_anon_kib());
            }
            println!(
                "{}",
                json!({"kernels": archive.kernel_count(), "bytes": bytes, "xor": sum,
                       "max_rss_anon_kib": anon,
                       "seconds": start.elapsed().as_secs_f64()})
            );
        }
        other => bail!("bench-archive {other}: write or read"),
    }
    Ok(())
}

/// This process's anonymous resident memory (`RssAnon`), KiB: the peak
/// RSS of a reader also counts the touched pages of the archive's memory
/// map (page cache, not memory the reader holds).
fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Pseudo-random (incompressible) bytes: xorshift64*.
fn write_input(path: &Path) -> Result<()> {
    let mut w = BufWriter::with_capacity(8 << 20, File::create(path)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..TOTAL / buf.len() as u64 {
        for c in buf.chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        w.write_all(&buf)?;
    }
    w.flush()?;
    Ok(())
}

section!(
    "large",
    "an archive over 4 GiB, both schemes, written and read (child processes)",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let dir = ctx.work.join("large");
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("kernels.bin");
    eprintln!(
        "large: writing {} of kernels to {}",
        TOTAL >> 20,
        input.display()
    );
    write_input(&input)?;
    let bench = std::env::current_exe()?;
    let mut rows = Vec::new();
    for scheme in ["none", "zstd"] {
        let archive = dir.join(format!("big_{scheme}.kpack"));
        let (mut write, mut read) = (Runs::default(), Runs::default());
        let mut size = 0;
        for rep in 0..ctx.reps {
            eprintln!("large: {scheme} run {}/{}", rep + 1, ctx.reps);
            remove(&archive)?;
            let a: Vec<OsString> = vec![
                "bench-archive".into(),
                "write".into(),
                input.clone().into(),
                archive.clone().into(),
                "--scheme".into(),
                scheme.into(),
            ];
            let r = resident(&[&input]);
            write.push(timed(&bench, &a, &dir)?, r);
            size = std::fs::metadata(&archive)?.len();
            let a: Vec<OsString> = vec![
                "bench-archive".into(),
                "read".into(),
                archive.clone().into(),
            ];
            let r = resident(&[&archive]);
            read.push(timed(&bench, &a, &dir)?, r);
        }
        for (id, runs, what) in [
            ("write", &write, "write"),
            ("read", &read, "read every kernel of"),
        ] {
            let mut row = Row::new(
                NAME,
                &format!("{id}_{scheme}"),
                format!(
                    "{what} a {:.1} GiB archive, scheme {scheme} (64 MiB kernels)",
                    size as f64 / (1u64 << 30) as f64
                ),
            );
            runs.fill(&mut row);
            row.bytes_in = Some(TOTAL);
            row.bytes_out = Some(size);
            row.details = json!({"child": serde_json::from_str::<serde_json::Value>(runs.last_stdout.trim()).ok()});
            rows.push(row);
        }
        remove(&archive)?;
    }
    remove(&dir)?;
    Ok(rows)
}
