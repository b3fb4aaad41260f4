//! Pins: which generations' objects the writer must not delete yet, and who holds them.
//! Apart from the cache ([`super::cache`]) so that a generation can hold one without the two
//! files using each other.

use std::sync::Arc;

/// How many hold each generation, by `(id, epoch)`: points in time, and every copy of a
/// generation the cache opened (see [`Pins`]).
pub(crate) type Pinned = Arc<std::sync::Mutex<std::collections::HashMap<(u64, u64), usize>>>;

/// Generations a point in time holds ([`super::cache::GenerationCache::pin`]), or the one
/// generation an opened copy reads (every copy the cache opens or builds holds its own): while
/// they live, the writer does not delete their objects, even when the cache has dropped the
/// copy a query or a stream reads and a compaction opened another.
pub(crate) struct Pins {
    pinned: Pinned,
    keys: Vec<(u64, u64)>,
}

impl Pins {
    /// Hold `keys` in `pinned` until the pins are dropped.
    pub(crate) fn new(pinned: &Pinned, keys: Vec<(u64, u64)>) -> Pins {
        let mut held = pinned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in &keys {
            *held.entry(*k).or_insert(0) += 1;
        }
        drop(held);
        Pins {
            pinned: pinned.clone(),
            keys,
        }
    }
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pins({} generations)", self.keys.len())
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut pinned = self
            .pinned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in &self.keys {
            if let Some(n) = pinned.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    pinned.remove(k);
                }
            }
        }
    }
}
