//! Where the time of a cold first load goes, step by step, on one archive:
//!
//! ```sh
//! cargo run --release -p kpack-bench --example cold_load -- ARCHIVE KEY TARGET [N]
//! # after `cargo xtask bench --only runtime --keep-work`:
//! cargo run --release -p kpack-bench --example cold_load -- \
//!     target/bench/work/runtime/sparse/librocsparse_all.kpack librocsparse.so.0.1#104 gfx1030
//! ```
//!
//! Each step is timed on its own, N times (default 50), in this process,
//! the archive's pages in the page cache; medians in µs. The steps are
//! those of `kpack_cache_create` + `kpack_load_code_object` +
//! `kpack_cache_destroy` on an archive that is not open yet: map the file,
//! decode the TOC's MessagePack, validate it into entries (`toc.rs`), look
//! the key up (builds the key index), locate the frame (walks the length
//! prefixes up to it), decompress, drop everything.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kpack_format::msgpack;
use kpack_loader::ArchiveFile;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        bail!("usage: cold_load ARCHIVE KEY TARGET [N]");
    }
    let path = Path::new(&args[0]);
    let (key, target) = (&args[1], &args[2]);
    let n: usize = args.get(3).map_or(Ok(50), |s| s.parse())?;
    let mut steps: Vec<(&str, Vec<f64>)> = [
        "map the file",
        "open: header + TOC (MessagePack decode + validation)",
        "  of which: MessagePack decode into values",
        "first lookup (builds the key index)",
        "locate the frame (length prefixes up to it)",
        "decompress",
        "drop (unmap, free the entries)",
        "total",
    ]
    .into_iter()
    .map(|s| (s, Vec::new()))
    .collect();
    for _ in 0..n {
        let t0 = Instant::now();
        let m = kpack_loader::map_file_with_handle(path)?;
        let t_map = t0.elapsed();
        let toc_offset = u64::from_le_bytes(m[8..16].try_into().context("short file")?) as usize;
        let t1 = Instant::now();
        let v = msgpack::decode(&m[toc_offset..])?;
        let t_decode = t1.elapsed();
        drop(v);
        drop(m);

        let t0 = Instant::now();
        let a = ArchiveFile::open(path)?;
        let t_open = t0.elapsed();
        let t1 = Instant::now();
        let entry = a.entry(key, target).context("no such kernel")?.clone();
        let t_lookup = t1.elapsed();
        let t2 = Instant::now();
        a.check(&entry)?;
        let t_frame = t2.elapsed();
        let mut buf = vec![0u8; entry.original_size as usize];
        let t3 = Instant::now();
        a.read_into(&entry, &mut buf)?;
        let t_read = t3.elapsed();
        let t4 = Instant::now();
        drop(a);
        let t_drop = t4.elapsed();
        let total = t_open + t_lookup + t_frame + t_read + t_drop;
        for (i, d) in [
            t_map, t_open, t_decode, t_lookup, t_frame, t_read, t_drop, total,
        ]
        .into_iter()
        .enumerate()
        {
            steps[i].1.push(d.as_secs_f64() * 1e6);
        }
    }
    let a = ArchiveFile::open(path)?;
    let e = a.entry(key, target).context("no such kernel")?;
    println!(
        "{}: {key} @ {target}, ordinal {} of {} frames, {} bytes ({n} runs, medians):",
        path.display(),
        e.ordinal,
        a.kernel_count(),
        e.original_size
    );
    for (name, v) in steps {
        println!("  {:>9.1} µs  {name}", median(v));
    }
    Ok(())
}
