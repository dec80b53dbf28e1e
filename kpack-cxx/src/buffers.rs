//! Who owns the code objects the C API hands out (docs/runtime.md, "Who
//! owns a code object"), and the buffers that are recycled.
//!
//! - A code object stored uncompressed (scheme `none`) is handed out as its
//!   own private copy-on-write mapping of the archive's pages
//!   ([`kpack_loader::PrivateMap`]): no copy, writable, and valid until it
//!   is released, whatever happens to the cache or archive it came from.
//! - A decompressed one is a `calloc`ed buffer (so `free()` may release it,
//!   as before). A load takes it from its cache's [`Pool`] when one there is
//!   big enough, and `kpack_free_code_object` gives it back to that pool
//!   (while the cache lives, and within the pool's bounds).
//!
//! Every pointer handed out is recorded in one process-wide registry, so
//! that `kpack_free_code_object` / `kpack_free_kernel`, which get only the
//! pointer, know what it is: a mapping (unmapped), a pooled buffer (back to
//! its pool) or a plain one (`free()`). A pointer the registry does not know
//! is `free()`d, as before. A buffer released with `free()` leaves its entry
//! behind until a later buffer at the same address replaces it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock, Weak};

use kpack_loader::PrivateMap;

use crate::sync::PMutex;

/// A `calloc`ed buffer of `cap` bytes (all initialized) holding a code
/// object of `len` bytes: `free()`d on drop unless handed out.
pub struct CBuffer {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: a CBuffer owns its allocation outright; the C allocator may free
// it from any thread.
unsafe impl Send for CBuffer {}

impl CBuffer {
    /// `len` zeroed bytes (at least one byte is allocated, so the pointer of
    /// an empty code object is still a unique, freeable pointer).
    pub fn zeroed(len: usize) -> Option<CBuffer> {
        let cap = len.max(1);
        // SAFETY: calloc has no preconditions; it returns NULL or memory for
        // `cap` zeroed bytes that we now own.
        let p = unsafe { libc::calloc(cap, 1) };
        NonNull::new(p.cast::<u8>()).map(|ptr| CBuffer { ptr, len, cap })
    }

    #[cfg(test)]
    fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr().cast()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Give up ownership: `(pointer, allocated bytes)`.
    fn into_raw(self) -> (NonNull<u8>, usize) {
        let me = std::mem::ManuallyDrop::new(self);
        (me.ptr, me.cap)
    }
}

impl AsMut<[u8]> for CBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `cap >= len` initialized
        // bytes (calloc'ed, then only ever written), owned by `self` and
        // borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for CBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from calloc and is freed exactly once.
        unsafe { libc::free(self.ptr.as_ptr().cast()) }
    }
}

/// Most buffers a cache's pool keeps.
pub const POOL_MAX_BUFFERS: usize = 4;
/// Most bytes a cache's pool keeps, all buffers together; a larger buffer
/// is freed rather than pooled.
pub const POOL_MAX_BYTES: usize = 32 << 20;

/// Whether a pooled buffer of `cap` bytes may hold a code object of `len`:
/// big enough, and not more than twice (64 KiB) bigger, so a small code
/// object does not pin a large buffer.
fn fits(cap: usize, len: usize) -> bool {
    len <= cap && cap <= len.saturating_mul(2).max(len.saturating_add(64 << 10))
}

/// Buffers a cache's loads gave back through `kpack_free_code_object`,
/// for its next loads to decompress into (bounded: [`POOL_MAX_BUFFERS`],
/// [`POOL_MAX_BYTES`]). Freed when the cache is destroyed.
pub struct Pool {
    free: PMutex<Vec<CBuffer>>,
}

impl Pool {
    pub fn new() -> Arc<Pool> {
        Arc::new(Pool {
            free: PMutex::new(Vec::new()),
        })
    }

    /// A pooled buffer for a code object of `len` bytes (the smallest that
    /// fits), or a new one; `None` when out of memory.
    pub fn buffer(&self, len: usize) -> Option<CBuffer> {
        let taken = {
            let mut free = self.free.lock();
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| fits(b.cap, len))
                .min_by_key(|(_, b)| b.cap)
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        match taken {
            Some(mut b) => {
                b.len = len;
                Some(b)
            }
            None => CBuffer::zeroed(len),
        }
    }

    /// Keep `b` for a later load, making room by freeing the oldest; a
    /// buffer over the byte bound is freed at once.
    fn put(&self, b: CBuffer) {
        if b.cap > POOL_MAX_BYTES {
            return;
        }
        let evicted = {
            let mut free = self.free.lock();
            let mut evicted = Vec::new();
            let mut total: usize = free.iter().map(|x| x.cap).sum::<usize>() + b.cap;
            while !free.is_empty() && (free.len() >= POOL_MAX_BUFFERS || total > POOL_MAX_BYTES) {
                let old = free.remove(0);
                total -= old.cap;
                evicted.push(old);
            }
            free.push(b);
            evicted
        };
        // Freed outside the lock.
        drop(evicted);
    }

    /// `(buffers, bytes)` held now.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let free = self.free.lock();
        (free.len(), free.iter().map(|b| b.cap).sum())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Taken under the lock: buffers put by other threads are visible.
        let all = std::mem::take(&mut *self.free.lock());
        drop(all);
    }
}

/// What a handed-out pointer is.
enum Handed {
    /// A private mapping (scheme `none`): unmapped on release.
    Mapped(PrivateMap),
    /// A `calloc`ed buffer of `cap` bytes; on release back to `pool` if
    /// that still exists, else freed.
    Heap {
        cap: usize,
        pool: Option<Weak<Pool>>,
    },
}

// SAFETY: a registry entry owns what it describes (a mapping, or the right
// to pool an allocation); both may be released from any thread.
unsafe impl Send for Handed {}

/// Every pointer handed out and not released yet, by address.
fn registry() -> &'static PMutex<HashMap<usize, Handed>> {
    static REGISTRY: OnceLock<PMutex<HashMap<usize, Handed>>> = OnceLock::new();
    REGISTRY.get_or_init(|| PMutex::new(HashMap::new()))
}

/// A code object of `len` bytes to hand out: a mapping or a buffer.
pub enum Out {
    Mapped(PrivateMap),
    /// With the pool it goes back to when released, if any.
    Heap(CBuffer, Option<Arc<Pool>>),
}

impl Out {
    /// Hand it out: `(pointer, size)`, recorded so that [`release`] knows it.
    pub fn hand_out(self) -> (*mut c_void, usize) {
        let (key, len, handed) = match self {
            Out::Mapped(mut m) => {
                let p = m.as_mut_ptr();
                (p as usize, m.len(), Handed::Mapped(m))
            }
            Out::Heap(b, pool) => {
                let len = b.len;
                let (p, cap) = b.into_raw();
                let pool = pool.as_ref().map(Arc::downgrade);
                (p.as_ptr() as usize, len, Handed::Heap { cap, pool })
            }
        };
        // A stale entry at this address (a buffer released with free()) is
        // replaced.
        let stale = registry().lock().insert(key, handed);
        // A stale entry's buffer was freed by its owner already: drop the
        // entry, releasing nothing. (A mapping is never stale: its entry
        // goes before it is unmapped; were one found, it is forgotten, not
        // unmapped over the new code object.)
        match stale {
            Some(Handed::Mapped(m)) => std::mem::forget(m),
            other => drop(other),
        }
        (key as *mut c_void, len)
    }
}

/// `kpack_free_code_object` / `kpack_free_kernel`: unmap a mapping, give a
/// pooled buffer back to its pool, `free()` anything else.
///
/// # Safety
/// `p` is NULL or a pointer this library handed out and that was not
/// released yet (or a pointer from `malloc`, which is `free()`d).
pub unsafe fn release(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let handed = registry().lock().remove(&(p as usize));
    match handed {
        Some(Handed::Mapped(m)) => drop(m),
        Some(Handed::Heap {
            cap,
            pool: Some(pool),
        }) => match (pool.upgrade(), NonNull::new(p.cast::<u8>())) {
            // SAFETY: the caller's contract: `p` is the live allocation of
            // `cap` initialized bytes that was handed out (a buffer released
            // with free() and reallocated at the same address has a new
            // entry).
            (Some(pool), Some(ptr)) if usable_size(p) >= cap => {
                pool.put(CBuffer { ptr, len: 0, cap })
            }
            // SAFETY: a live allocation from calloc, released once.
            _ => unsafe { libc::free(p) },
        },
        // SAFETY: a live allocation from the C allocator (caller's
        // contract), released once.
        _ => unsafe { libc::free(p) },
    }
}

/// What the C allocator says `p`'s allocation holds; 0 where it cannot
/// tell (such a buffer is freed, never pooled).
fn usable_size(p: *mut c_void) -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `p` is a live allocation of the C allocator.
        unsafe { libc::malloc_usable_size(p) }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = p;
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_bounds_and_reuse() {
        let pool = Pool::new();
        // Recycled: the same allocation comes back for the same size.
        let (p, n) = Out::Heap(pool.buffer(100_000).unwrap(), Some(pool.clone())).hand_out();
        assert_eq!(n, 100_000);
        unsafe { release(p) };
        assert_eq!(pool.held(), (1, 100_000));
        let b = pool.buffer(90_000).unwrap();
        assert_eq!((b.as_ptr(), b.len()), (p, 90_000));
        assert_eq!(pool.held(), (0, 0));
        drop(b);
        // A small code object does not take a large buffer.
        let (p, _) = Out::Heap(pool.buffer(1 << 20).unwrap(), Some(pool.clone())).hand_out();
        unsafe { release(p) };
        let small = pool.buffer(1000).unwrap();
        assert_ne!(small.as_ptr(), p);
        assert_eq!(pool.held().0, 1);
        drop(small);
        // At most POOL_MAX_BUFFERS buffers and POOL_MAX_BYTES bytes.
        let handed: Vec<_> = (0..POOL_MAX_BUFFERS + 3)
            .map(|i| Out::Heap(pool.buffer(4096 * (i + 1)).unwrap(), Some(pool.clone())).hand_out())
            .collect();
        for (p, _) in handed {
            unsafe { release(p) };
        }
        let (count, bytes) = pool.held();
        assert!(
            count <= POOL_MAX_BUFFERS && bytes <= POOL_MAX_BYTES,
            "{count} {bytes}"
        );
        let (p, _) =
            Out::Heap(pool.buffer(POOL_MAX_BYTES + 1).unwrap(), Some(pool.clone())).hand_out();
        unsafe { release(p) };
        assert!(pool.held().1 <= POOL_MAX_BYTES);
        // The pool gone (cache destroyed): buffers out are freed on release.
        let (p, _) = Out::Heap(pool.buffer(10).unwrap(), Some(pool.clone())).hand_out();
        drop(pool);
        unsafe { release(p) };
        // Unknown pointers are free()d; NULL is nothing.
        unsafe {
            release(libc::malloc(10));
            release(std::ptr::null_mut());
        }
    }
}
