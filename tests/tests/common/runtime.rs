//! The C runtime called as the HIP runtime calls it.

use std::ffi::CString;
use std::path::Path;
use std::ptr;

use kpack_format::hipk::MAX_METADATA_SIZE;
use rocm_kpack::{
    kpack_cache_create, kpack_cache_destroy, kpack_free_code_object, kpack_load_code_object,
    KpackError,
};

use super::cpath;

/// `kpack_load_code_object` for code object `co` of the offloaded ELF
/// `binary` with `archs` (target IDs as CLR passes them): the code object,
/// or the error. The environment of the test process is the runtime's.
pub fn c_runtime_load(binary: &Path, co: u32, archs: &[&str]) -> Result<Vec<u8>, KpackError> {
    let bytes = std::fs::read(binary).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&bytes).unwrap();
    let meta = elf.section(".rocm_kpack_ref").unwrap().unwrap();
    let mut window = meta.data.to_vec();
    window.resize(MAX_METADATA_SIZE, 0);
    let path = cpath(&std::fs::canonicalize(binary).unwrap());
    let names: Vec<CString> = archs.iter().map(|a| CString::new(*a).unwrap()).collect();
    let ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|c| c.as_ptr()).collect();
    let mut cache = ptr::null_mut();
    let (mut p, mut size) = (ptr::null_mut(), 0usize);
    // SAFETY: valid out-pointers, a 64 KiB metadata window, C strings that
    // outlive the calls; the cache is destroyed once.
    unsafe {
        assert_eq!(kpack_cache_create(&mut cache), KpackError::Success);
        let e = kpack_load_code_object(
            cache,
            window.as_ptr().cast(),
            path.as_ptr(),
            co,
            ptrs.as_ptr(),
            ptrs.len(),
            &mut p,
            &mut size,
        );
        let out = if e == KpackError::Success {
            let v = std::slice::from_raw_parts(p.cast::<u8>(), size).to_vec();
            kpack_free_code_object(p);
            Ok(v)
        } else {
            Err(e)
        };
        kpack_cache_destroy(cache);
        out
    }
}
