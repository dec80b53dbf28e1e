//! Path discovery on Windows (formats.md §5.6): the module (DLL or EXE) that holds
//! an address, through `GetModuleHandleExW` (from an address, without
//! touching its reference count) and `GetModuleFileNameW`, its path as
//! UTF-8, and the address's offset from the module base (an RVA: Windows
//! maps images by section, not by file offset as Linux's `/proc/self/maps`
//! reports).
//!
//! The Win32 declarations come from `windows-sys` (features
//! `Win32_Foundation`, `Win32_System_LibraryLoader`). Never run: CI is
//! Linux only. This file was type-checked for `x86_64-pc-windows-gnu` on
//! its own; the crate as a whole does not build for Windows yet (see
//! docs/runtime.md).

use std::os::windows::ffi::OsStringExt;
use std::path::PathBuf;

use kpack_loader::{DiscoverError, MappedFile};
use windows_sys::Win32::Foundation::HMODULE;
use windows_sys::Win32::System::LibraryLoader::{
    GetModuleFileNameW, GetModuleHandleExW, GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS,
    GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
};

/// Longest path `GetModuleFileNameW` can return (`\\?\` paths).
const MAX_WIDE_PATH: usize = 32_768;

/// The module holding `address` and the address's offset from its base.
pub fn discover_binary_path(address: usize) -> Result<MappedFile, DiscoverError> {
    let mut module: HMODULE = std::ptr::null_mut();
    // SAFETY: with FROM_ADDRESS the "name" is only used as an address to
    // look up, never read; `module` is a valid out pointer.
    let ok = unsafe {
        GetModuleHandleExW(
            GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
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
