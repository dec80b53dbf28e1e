//! A mutex over `pthread_mutex_t`, for the state that code objects pass
//! through between threads (the buffer pool, the registry of handed-out
//! code objects).
//!
//! Rust's `std::sync::Mutex` is built on futexes, which valgrind's helgrind
//! and DRD do not see: a buffer freed by one thread into the pool and
//! filled by another would look like a data race to them, and `cargo xtask
//! sanitize` runs both. A pthread mutex gives them the happens-before edge
//! they understand; uncontended it costs about the same.

#[cfg(not(unix))]
pub use fallback::PMutex;
#[cfg(unix)]
pub use pthread::PMutex;

/// Elsewhere than on Unix (not built or tested yet: docs/runtime.md), the
/// standard mutex, with the same interface.
#[cfg(not(unix))]
mod fallback {
    use std::sync::{Mutex, MutexGuard, PoisonError};

    pub struct PMutex<T>(Mutex<T>);

    impl<T> PMutex<T> {
        pub fn new(value: T) -> PMutex<T> {
            PMutex(Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }
}

#[cfg(unix)]
mod pthread {
    use std::cell::UnsafeCell;
    use std::ops::{Deref, DerefMut};

    /// A value behind a `pthread_mutex_t`.
    pub struct PMutex<T> {
        /// Boxed: a pthread mutex must not move once used.
        lock: Box<UnsafeCell<libc::pthread_mutex_t>>,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is only reached through a guard, which holds the
    // pthread mutex; the mutex itself is made for sharing between threads.
    unsafe impl<T: Send> Send for PMutex<T> {}
    // SAFETY: as above: `&PMutex<T>` gives access to `T` under the lock only.
    unsafe impl<T: Send> Sync for PMutex<T> {}

    impl<T> PMutex<T> {
        pub fn new(value: T) -> PMutex<T> {
            PMutex {
                lock: Box::new(UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER)),
                value: UnsafeCell::new(value),
            }
        }

        pub fn lock(&self) -> PGuard<'_, T> {
            // SAFETY: the mutex is initialized (statically) and never moves
            // (boxed); a default mutex locked by this thread is never locked
            // again before the guard unlocks it (no re-entry from here).
            let r = unsafe { libc::pthread_mutex_lock(self.lock.get()) };
            // Only EINVAL/EDEADLK are possible for a default mutex, and neither
            // can happen here; continuing without the lock would be unsound.
            assert_eq!(r, 0, "pthread_mutex_lock failed");
            PGuard {
                m: self,
                _not_send: std::marker::PhantomData,
            }
        }
    }

    impl<T> Drop for PMutex<T> {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: nobody holds the mutex.
            unsafe { libc::pthread_mutex_destroy(self.lock.get()) };
        }
    }

    /// Access to the value while the mutex is held. Not `Send`: a pthread
    /// mutex is unlocked by the thread that locked it.
    pub struct PGuard<'a, T> {
        m: &'a PMutex<T>,
        _not_send: std::marker::PhantomData<*const ()>,
    }

    impl<T> Deref for PGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: this guard holds the mutex.
            unsafe { &*self.m.value.get() }
        }
    }

    impl<T> DerefMut for PGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: this guard holds the mutex, and `&mut self` makes this the
            // only reference through it.
            unsafe { &mut *self.m.value.get() }
        }
    }

    impl<T> Drop for PGuard<'_, T> {
        fn drop(&mut self) {
            // SAFETY: locked by this guard, on this thread.
            unsafe { libc::pthread_mutex_unlock(self.m.lock.get()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_under_the_lock() {
        let m = std::sync::Arc::new(PMutex::new(0u64));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let m = m.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        *m.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*m.lock(), 40_000);
    }
}
