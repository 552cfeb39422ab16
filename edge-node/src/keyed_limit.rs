//! A bound on what one key holds at once, so that one client cannot take what the others
//! share: answers in progress per tenant (a place from admission until the answer ends or
//! its client leaves), open HTTP connections per client address.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// What each key holds, against `limit`.
pub struct KeyedLimit<K: Hash + Eq + Clone> {
    /// `None`: no bound per key (only whatever bounds the whole).
    limit: Option<usize>,
    held: Mutex<HashMap<K, usize>>,
}

/// A key's place, given back when dropped.
pub struct Place<K: Hash + Eq + Clone> {
    quota: Arc<KeyedLimit<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone> KeyedLimit<K> {
    pub fn new(limit: Option<usize>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a place for `key`; `Err(limit)` when it already holds `limit`.
    pub fn take(self: &Arc<Self>, key: &K) -> Result<Place<K>, usize> {
        // A panic while the map was held leaves counts that are still whole numbers.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(key.clone()).or_default();
        if let Some(limit) = self.limit
            && *count >= limit
        {
            return Err(limit);
        }
        *count += 1;
        Ok(Place {
            quota: Arc::clone(self),
            key: key.clone(),
        })
    }
}

impl<K: Hash + Eq + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        let mut held = self
            .quota
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::Tenant;

    #[test]
    fn a_tenant_is_bounded_alone_and_its_places_come_back() {
        let quota = KeyedLimit::new(Some(2));
        let (acme, globex) = (Tenant::new("acme"), Tenant::new("globex"));
        let first = quota.take(&acme).unwrap();
        let _second = quota.take(&acme).unwrap();
        assert_eq!(quota.take(&acme).err(), Some(2));
        let _other = quota
            .take(&globex)
            .expect("another tenant is not bounded by acme's");
        drop(first);
        quota.take(&acme).expect("a place given back is free again");
    }

    #[test]
    fn without_a_limit_every_place_is_granted() {
        let quota = KeyedLimit::new(None);
        let acme = Tenant::new("acme");
        let places: Vec<_> = (0..100).map(|_| quota.take(&acme).unwrap()).collect();
        assert_eq!(places.len(), 100);
    }
}
