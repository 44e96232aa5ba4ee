//! Counters and conditional cache writes, on the pooled cache streams like `cache_put`.
//! The requests and their answers are `core::cache_features`. In a cluster each goes to the
//! cache's owner like `cache_put`: reads are re-sent on an unknown outcome, writes (a
//! counter add, a conditional write) are not.

use bytes::Bytes;

use super::Client;
use crate::core::cache_features::{
    condition_answer, counter_add_answer, counter_get_answer, versioned_value_answer, Condition,
    ConditionResult,
};
use crate::core::Target;
use crate::error::ClientError;

impl Client {
    /// Adds `delta` to a counter and returns the sum including it (at least once: a retry
    /// after a lost answer counts twice).
    pub async fn counter_add(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        delta: i64,
    ) -> Result<i64, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        self.on_cache_owner(namespace, cache, key, false, move |node| {
            Box::pin(async move {
                counter_add_answer(
                    node.cache_call(|core| core.counter_add(target, key, delta))
                        .await?,
                )
            })
        })
        .await
    }

    /// A counter's sum; `None` if it was never written (which is not zero).
    pub async fn counter_get(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<i64>, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        self.on_cache_owner(namespace, cache, key, true, move |node| {
            Box::pin(async move {
                counter_get_answer(
                    node.cache_call(|core| core.counter_get(target, key))
                        .await?,
                )
            })
        })
        .await
    }

    /// Reads `key` with its version (the offset of the put that wrote it), for a
    /// conditional write to compare against.
    pub async fn cache_get_versioned(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<(Bytes, u64)>, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        self.on_cache_owner(namespace, cache, key, true, move |node| {
            Box::pin(async move {
                versioned_value_answer(node.cache_call(|core| core.cache_get(target, key)).await?)
            })
        })
        .await
    }

    /// Stores `value` only if the key's live entry meets `condition`.
    pub async fn cache_put_if(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
        condition: Condition,
    ) -> Result<ConditionResult, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        self.on_cache_owner(namespace, cache, key, false, move |node| {
            let value = value.clone();
            Box::pin(async move {
                condition_answer(
                    node.cache_call(|core| {
                        core.cache_put_if(target, key, value, ttl_ms, condition)
                    })
                    .await?,
                )
            })
        })
        .await
    }

    /// Removes the key only if its live entry has `version`.
    pub async fn cache_delete_if(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        version: u64,
    ) -> Result<ConditionResult, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        self.on_cache_owner(namespace, cache, key, false, move |node| {
            Box::pin(async move {
                condition_answer(
                    node.cache_call(|core| core.cache_delete_if(target, key, version))
                        .await?,
                )
            })
        })
        .await
    }
}
