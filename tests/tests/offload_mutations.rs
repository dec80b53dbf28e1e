//! The offload transform and the verifier on damaged fixture binaries:
//! errors, never panics; and whatever the transform produces passes the
//! verifier.

use crate::common::*;
use kpack_format::hipk::HipkMetadata;
use kpack_host::offload::{elf, verify_elf};

#[test]
fn mutated_fixtures_never_panic() {
    let meta = HipkMetadata::new("lib/x.so", vec!["../.kpack/x_@GFXARCH@.kpack".into()]).encode();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut produced = 0;
    for f in fixtures().into_iter().filter(|f| f.device_code()) {
        let original = std::fs::read(&f.path).unwrap();
        // Headers, tables and the first page of .hip_fatbin hold what the
        // transform reads; mutate mostly there.
        let hot = original.len().min(0x2000);
        for round in 0..400 {
            let mut b = original.clone();
            let flips = 1 + rng.below(4);
            for _ in 0..flips {
                let at = if round % 4 == 0 {
                    rng.below(b.len())
                } else {
                    rng.below(hot)
                };
                let v = rng.next_u64() as u8;
                b[at] = match rng.below(3) {
                    0 => v,
                    1 => b[at] ^ (1 << (v % 8)),
                    _ => 0xff,
                };
            }
            let r = std::panic::catch_unwind(|| elf::transform(&b, &meta));
            let r = r.unwrap_or_else(|_| {
                panic!("{}: transform panicked on mutation round {round}", f.name)
            });
            if let Ok(t) = r {
                let t_bytes = t.to_vec();
                produced += 1;
                // What it writes must verify or be rejected by the verifier
                // cleanly (the offload driver never writes an unverified file).
                let v = std::panic::catch_unwind(|| verify_elf(&t_bytes, Some(t.bundles)));
                assert!(v.is_ok(), "{}: verifier panicked on round {round}", f.name);
            }
        }
    }
    assert!(
        produced > 0,
        "no mutation was transformable: the test exercises only errors"
    );
}
