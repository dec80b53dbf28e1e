//! The wrapper-table layout reader (`hipk::record_offsets`, formats.md
//! §4.1): plain, padded (ASan) and mixed tables, and anything else.
//!
//! Invariants: no panic; on success the records are 8-aligned, 24 bytes,
//! in order, disjoint and inside the table, each starts with 8 bytes that
//! are not all zero, and every byte outside them is zero (padding); a
//! table with a non-zero byte outside every record is never accepted as
//! such; putting the records back into a zeroed table of the same size
//! reads back the same offsets. On failure the error names a real defect:
//! a size that is not a multiple of 8, a non-zero 8-byte word too close to
//! the end for a record, or a table of zeros.
#![no_main]

use kpack_format::hipk::{record_offsets, TableError, RECORD_ALIGN, WRAPPER_SIZE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match record_offsets(data) {
        Ok(records) => {
            let mut covered = vec![false; data.len()];
            let mut last_end = 0;
            for &at in &records {
                assert_eq!(at % RECORD_ALIGN, 0);
                assert!(at >= last_end, "records overlap or are out of order");
                assert!(at + WRAPPER_SIZE <= data.len());
                assert!(data[at..at + RECORD_ALIGN].iter().any(|&b| b != 0));
                covered[at..at + WRAPPER_SIZE].fill(true);
                last_end = at + WRAPPER_SIZE;
            }
            for (i, &b) in data.iter().enumerate() {
                assert!(covered[i] || b == 0, "non-zero padding byte at {i}");
            }
            assert!(data.is_empty() || !records.is_empty());
            let mut rebuilt = vec![0u8; data.len()];
            for &at in &records {
                rebuilt[at..at + WRAPPER_SIZE].copy_from_slice(&data[at..at + WRAPPER_SIZE]);
            }
            assert_eq!(record_offsets(&rebuilt).unwrap(), records);
        }
        Err(TableError::Unaligned { size }) => {
            assert_eq!(size, data.len());
            assert_ne!(size % RECORD_ALIGN, 0);
        }
        Err(TableError::Truncated { at, size }) => {
            assert_eq!(size, data.len());
            assert_eq!(at % RECORD_ALIGN, 0);
            assert!(at + WRAPPER_SIZE > size);
            assert!(data[at..at + RECORD_ALIGN].iter().any(|&b| b != 0));
        }
        Err(TableError::Empty { size }) => {
            assert!(size > 0 && data.iter().all(|&b| b == 0));
        }
    }
});
