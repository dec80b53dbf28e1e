//! Path discovery on Windows (SPEC §9): the module (DLL or EXE) that holds
//! an address, through `GetModuleHandleExW` (from an address, without
//! touching its reference count) and `GetModuleFileNameW`, its path as
//! UTF-8, and the address's offset from the module base (an RVA: Windows
//! maps images by section, not by file offset as Linux's `/proc/self/maps`
//! reports).
//!
//! NOT COMPILED OR TESTED HERE: the machines that build kpack have no Rust
//! standard library for Windows targets. Kept small and reviewed by hand
//! against the Win32 documentation; see docs/runtime.md.

use std::ffi::c_void;
use std::os::windows::ffi::OsStringExt;
use std::path::PathBuf;

use kpack_loader::{DiscoverError, MappedFile};

/// `GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS`.
const FROM_ADDRESS: u32 = 0x4;
/// `GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT`.
const UNCHANGED_REFCOUNT: u32 = 0x2;
/// Longest path `GetModuleFileNameW` can return (`\\?\` paths).
const MAX_WIDE_PATH: usize = 32_768;

#[link(name = "kernel32")]
extern "system" {
    fn GetModuleHandleExW(flags: u32, module_name: *const u16, module: *mut *mut c_void) -> i32;
    fn GetModuleFileNameW(module: *mut c_void, filename: *mut u16, size: u32) -> u32;
}

/// The module holding `address` and the address's offset from its base.
pub fn discover_binary_path(address: usize) -> Result<MappedFile, DiscoverError> {
    let mut module: *mut c_void = std::ptr::null_mut();
    // SAFETY: with FROM_ADDRESS the "name" is only used as an address to
    // look up, never read; `module` is a valid out pointer.
    let ok = unsafe {
        GetModuleHandleExW(
            FROM_ADDRESS | UNCHANGED_REFCOUNT,
            address as *const u16,
            &mut module,
        )
    };
    if ok == 0 || module.is_null() {
        return Err(DiscoverError::NotMapped(address));
    }
    let mut buf = vec![0u16; 260];
    loop {
        // SAFETY: `buf` is valid for `buf.len()` u16s; `module` is a
        // loaded module (its reference count is not ours to drop).
        let n = unsafe { GetModuleFileNameW(module, buf.as_mut_ptr(), buf.len() as u32) } as usize;
        if n == 0 {
            return Err(DiscoverError::NotMapped(address));
        }
        // n == len: truncated; try a larger buffer.
        if n < buf.len() {
            buf.truncate(n);
            break;
        }
        if buf.len() >= MAX_WIDE_PATH {
            return Err(DiscoverError::NotMapped(address));
        }
        buf.resize(buf.len() * 4, 0);
    }
    Ok(MappedFile {
        path: PathBuf::from(std::ffi::OsString::from_wide(&buf)),
        offset: address.wrapping_sub(module as usize) as u64,
    })
}
