//! Counts the requests an SDK client sends, exactly: an interceptor on the client sees every
//! HTTP attempt (SDK retries included, as the service bills them) and files it under the
//! operation's name (`DynamoDB.PutItem`, `SFN.DescribeExecution`, ...). Conditional writes that
//! failed their condition are counted apart: they are the conflicts (and, on AWS, they still
//! consume write capacity).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::client::orchestrator::Metadata;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Requests per operation, and failed conditional writes per operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: BTreeMap<String, u64>,
    pub condition_failed: BTreeMap<String, u64>,
}

impl Counts {
    /// Requests of one operation, e.g. `"DynamoDB.GetItem"`.
    pub fn get(&self, operation: &str) -> u64 {
        self.requests.get(operation).copied().unwrap_or(0)
    }

    /// Failed conditional writes of one operation.
    pub fn failed(&self, operation: &str) -> u64 {
        self.condition_failed.get(operation).copied().unwrap_or(0)
    }

    /// Every request to one service (`"DynamoDB"`, `"SFN"`, `"SNS"`).
    pub fn service_total(&self, service: &str) -> u64 {
        let prefix = format!("{service}.");
        self.requests
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    pub fn total_failed(&self) -> u64 {
        self.condition_failed.values().sum()
    }
}

/// Add it to any SDK client's config with `.interceptor(counter.clone())`; clones share counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<Counts>>,
}

impl RequestCounter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> Counts {
        self.counts.lock().expect("counts").clone()
    }

    /// The counts so far, and start again from zero.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut *self.counts.lock().expect("counts"))
    }

    /// A DynamoDB client for `endpoint_url` (dummy credentials) whose requests are counted.
    pub fn dynamodb_client(&self, endpoint_url: &str) -> aws_sdk_dynamodb::Client {
        let config = crate::server::client_for(endpoint_url)
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }

    /// One more in the tally `of` the counts, under the operation of `cfg`'s request.
    fn count(&self, cfg: &ConfigBag, of: fn(&mut Counts) -> &mut BTreeMap<String, u64>) {
        let operation = match cfg.load::<Metadata>() {
            Some(m) => format!("{}.{}", m.service(), m.name()),
            None => "unknown".to_owned(),
        };
        *of(&mut self.counts.lock().expect("counts"))
            .entry(operation)
            .or_default() += 1;
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.count(cfg, |counts| &mut counts.requests);
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let failed = context.response().is_some_and(|response| {
            response.status().as_u16() == 400
                && response.body().bytes().is_some_and(|body| {
                    String::from_utf8_lossy(body).contains("ConditionalCheckFailedException")
                })
        });
        if failed {
            self.count(cfg, |counts| &mut counts.condition_failed);
        }
        Ok(())
    }
}
