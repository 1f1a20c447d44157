//! The driver's allocator. The `nestor` binary allocates with mimalloc
//! (the driver allocates per result: metrics maps, store records), whose
//! defaults keep freed memory committed for a while before returning it to
//! the operating system. Over a long sweep those delays let every
//! transient peak linger, and the driver's resident memory grew with the
//! number of trials though what it holds does not.

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`, the same index in its
/// v2 and v3): milliseconds before freed memory is purged (1,000 by
/// default in the v3 the `mimalloc` crate builds).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc return freed memory to the operating system at once.
/// Call it first thing in `main`, before other threads start (mimalloc's
/// options are not thread safe). Harmless where mimalloc is not the
/// global allocator.
pub fn return_freed_memory_at_once() {
    // SAFETY: sets a plain integer option; called before other threads run.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_option_is_mimallocs_purge_delay() {
        // SAFETY: reads and sets an integer option; no other test touches it.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(libmimalloc_sys::mi_option_get(super::PURGE_DELAY), 1000, "mimalloc's default purge delay");
            }
            super::return_freed_memory_at_once();
            assert_eq!(libmimalloc_sys::mi_option_get(super::PURGE_DELAY), 0);
        }
    }
}
