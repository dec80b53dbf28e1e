//! The invariants the `bundle_stream` fuzz target checks, shared with this
//! crate's tests (which run them over generated inputs where no fuzzer is
//! available). Not part of the API.

use crate::{check_fatbin, list_fatbin, parse_fatbin, BundleInfo, FatbinStream};

/// Listing, checking and streaming `data` agree with [`parse_fatbin`]:
/// - [`check_fatbin`] gives the same bundles (entries, ranges, CCOB
///   headers, hashes) or the same error text;
/// - [`list_fatbin`] gives the same bundles when `parse_fatbin` succeeds
///   (hashes possibly unchecked), and when it fails, either the same error
///   or, having read only headers, a listing;
/// - [`FatbinStream`] hands out the same device code objects (bundle, entry,
///   triple, bytes), a kept subset and the host entries when filtered (and
///   asked for host entries), and fails with the same
///   error text when `parse_fatbin` fails.
///
/// Panics on a disagreement.
///
/// zstd's reason for a corrupt frame depends on the output buffers it is
/// given ("Data corruption detected" decoding into a large one,
/// "Destination buffer is too small" into a smaller one): two decompression
/// failures of the same bundle agree whatever zstd's words.
pub fn stream_agrees(data: &[u8]) {
    let parsed = parse_fatbin(data);
    let want: Result<Vec<BundleInfo>, String> = parsed
        .as_ref()
        .map(|bs| bs.iter().map(BundleInfo::from).collect())
        .map_err(|e| e.to_string());
    let checked = check_fatbin(data).map_err(|e| e.to_string());
    match (&want, &checked) {
        (Ok(w), Ok(c)) => same_infos(w, c, true),
        (Err(w), Err(c)) => same_error(w, c, "check_fatbin error"),
        _ => panic!("parse_fatbin {want:?} but check_fatbin {checked:?}"),
    }
    // Listing reads a large compressed bundle's tables only: damage past
    // them goes unnoticed, and an error after it may be reported instead.
    match (&want, list_fatbin(data)) {
        (Ok(w), Ok(l)) => same_infos(w, &l, false),
        (Ok(_), Err(e)) => panic!("parse_fatbin succeeds, list_fatbin fails: {e}"),
        (Err(_), _) => {}
    }
    // Every code object, then only those of every other target; compressed
    // bundles read whole where they can be, then always as a stream.
    for (filtered, whole) in [(false, true), (true, true), (false, false), (true, false)] {
        let mut s = FatbinStream::new(data);
        if filtered {
            s = s
                .keep(|t: &str| t.len().is_multiple_of(2))
                .with_host_entries();
        }
        if !whole {
            s = s.whole_limit(0);
        }
        let mut got = Vec::new();
        let streamed = loop {
            match s.next() {
                Ok(Some(c)) => got.push((c.bundle, c.entry, c.triple.clone(), c.data.to_vec())),
                Ok(None) => break Ok(s.bundles()),
                Err(e) => break Err(e.to_string()),
            }
        };
        match (&parsed, streamed) {
            (Ok(bs), Ok(n)) => {
                assert_eq!(n, bs.len(), "bundles counted");
                let mut expect = Vec::new();
                for b in bs {
                    for (i, e) in b.entries.iter().enumerate() {
                        let takes = if e.is_host() {
                            filtered
                        } else {
                            !filtered || e.target().len().is_multiple_of(2)
                        };
                        if !takes {
                            continue;
                        }
                        expect.push((b.index, i, e.triple.clone(), e.data.to_vec()));
                    }
                }
                got.sort();
                assert!(got == expect, "streamed code objects differ");
            }
            (Err(w), Err(e)) => same_error(&w.to_string(), &e, "stream error"),
            (w, e) => panic!("parse_fatbin {:?} but stream {e:?}", w.as_ref().err()),
        }
    }
}

fn same_infos(want: &[BundleInfo], got: &[BundleInfo], hashes: bool) {
    assert_eq!(want.len(), got.len(), "bundle count");
    for (w, g) in want.iter().zip(got) {
        assert_eq!(w.index, g.index);
        assert_eq!(w.range, g.range, "bundle {} range", w.index);
        assert_eq!(w.entries, g.entries, "bundle {} entries", w.index);
        match (&w.compressed, &g.compressed) {
            (None, None) => {}
            (Some((wc, wi)), Some((gc, gi))) => {
                assert_eq!(wi, gi);
                let mut gc = (**gc).clone();
                if !hashes && gc.hash_matches.is_none() {
                    gc.hash_matches = wc.hash_matches;
                }
                assert_eq!(**wc, gc, "bundle {} CCOB", w.index);
            }
            _ => panic!("bundle {}: compressed or not", w.index),
        }
    }
}

/// The same error, zstd's reason for a decompression failure aside.
fn same_error(want: &str, got: &str, what: &str) {
    const ZSTD: &str = ": zstd decompression failed: ";
    let cause = |e: &str| e.find(ZSTD).map(|i| e[..i].to_string());
    match (cause(want), cause(got)) {
        (Some(w), Some(g)) => assert_eq!(w, g, "{what}: {want} / {got}"),
        _ => assert_eq!(want, got, "{what}"),
    }
}
