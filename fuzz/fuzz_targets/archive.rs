//! The `.kpack` archive reader on arbitrary bytes: header, TOC, every
//! query, and every kernel read both ways (`read`, `read_into`).
//!
//! Invariants: no panic and no allocation the file does not justify; the
//! two read paths agree; the queries are consistent with each other; and
//! the kernels that read back, written to a new archive, read back the
//! same.
#![no_main]

use kpack_format::archive::{Archive, Scheme};
use kpack_host::ArchiveWriter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = Archive::from_bytes(data) else {
        return;
    };
    let _ = (
        a.group_name(),
        a.gfx_arch_family(),
        a.scheme(),
        a.format_version(),
    );
    let keys: Vec<&str> = a.binaries().collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "keys sorted and unique"
    );
    let mut count = 0;
    for key in &keys {
        for target in a.targets_of(key) {
            count += 1;
            assert!(a.entry(key, target).is_some());
        }
    }
    assert_eq!(count, a.kernel_count());
    assert_eq!(a.entries_by_ordinal().count(), a.kernel_count());
    assert_eq!(a.keys_and_targets().count(), a.kernel_count());

    let mut good = Vec::new();
    for (key, target, e) in a.entries_by_ordinal() {
        let read = a.read(e);
        let by_name = a.kernel(key, target);
        assert_eq!(read.is_ok(), by_name.is_ok(), "read and kernel disagree");
        // read_into needs a caller buffer of original_size bytes: only small
        // ones here (the C API target covers the real allocation path).
        if e.original_size <= 1 << 20 {
            let mut buf = vec![0u8; e.original_size as usize];
            let into = a.read_into(e, &mut buf);
            match (&read, into) {
                (Ok(r), Ok(())) => assert_eq!(&r[..], &buf[..], "read and read_into differ"),
                (Err(_), Err(_)) => {}
                (r, i) => panic!("read {:?} but read_into {:?}", r.is_ok(), i),
            }
        }
        if let Ok(bytes) = read {
            assert_eq!(bytes.len() as u64, e.original_size);
            good.push((key.to_owned(), target.to_owned(), bytes.into_owned()));
        }
    }

    // Round trip through the writer (keys the writer refuses are skipped).
    let mut w = ArchiveWriter::new(a.group_name(), a.gfx_arch_family(), a.gfx_arches().to_vec())
        .scheme(if good.len() % 2 == 0 {
            Scheme::ZstdPerKernel
        } else {
            Scheme::None
        })
        .zstd_level(1);
    let mut added = Vec::new();
    for (k, t, b) in &good {
        if w.add(k.clone(), t.clone(), &b[..], None).is_ok() {
            added.push((k, t, b));
        }
    }
    let bytes = w.to_vec().expect("writing kernels that were read");
    let b = Archive::from_bytes(bytes).expect("a written archive reads");
    assert_eq!(b.kernel_count(), added.len());
    for (k, t, data) in added {
        assert_eq!(&b.kernel(k, t).expect("written kernel reads"), data);
    }
});
