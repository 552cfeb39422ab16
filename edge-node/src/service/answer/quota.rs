//! Per-tenant bound on answers in progress, so that one client cannot fill the queue the
//! others wait in: a tenant holds one place from admission until its answer ends (or its
//! client leaves), whether it waits for the model or is being generated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::tenants::Tenant;

/// Answers each tenant has in progress, against `limit`.
pub struct TenantQuota {
    /// `None`: only the edge's own queue bounds a tenant.
    limit: Option<usize>,
    held: Mutex<HashMap<Tenant, usize>>,
}

/// A tenant's place, given back when dropped.
pub struct TenantPlace {
    quota: Arc<TenantQuota>,
    tenant: Tenant,
}

impl TenantQuota {
    pub fn new(limit: Option<usize>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a place for `tenant`; `Err(limit)` when it already holds `limit`.
    pub fn take(self: &Arc<Self>, tenant: &Tenant) -> Result<TenantPlace, usize> {
        // A panic while the map was held leaves counts that are still whole numbers.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(tenant.clone()).or_default();
        if let Some(limit) = self.limit
            && *count >= limit
        {
            return Err(limit);
        }
        *count += 1;
        Ok(TenantPlace {
            quota: Arc::clone(self),
            tenant: tenant.clone(),
        })
    }
}

impl Drop for TenantPlace {
    fn drop(&mut self) {
        let mut held = self
            .quota
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_bounded_alone_and_its_places_come_back() {
        let quota = TenantQuota::new(Some(2));
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
        let quota = TenantQuota::new(None);
        let acme = Tenant::new("acme");
        let places: Vec<_> = (0..100).map(|_| quota.take(&acme).unwrap()).collect();
        assert_eq!(places.len(), 100);
    }
}
