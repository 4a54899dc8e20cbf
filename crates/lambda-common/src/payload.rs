//! A state machine's JSON payload, validated field by field into the core's input types.
//!
//! Payloads arrive as `serde_json::Value` (any JSON deserializes into it), so a payload of the
//! wrong shape is answered by `SemaphoreInvalidInput` with a message naming the field, never by
//! the runtime's own deserialization error.

use aws_sdk_dynamodb::primitives::{DateTime, DateTimeFormat as Format};
use semaphore_core::{AcquisitionId, HolderId, Identity, InputError, Limit, LockName};
use serde_json::{Map, Value};

use crate::error::HandlerError;

/// What to pass for each field, quoted in the error when the field is missing.
pub mod hint {
    pub const LOCK: &str = "pass the semaphore's name, e.g. \"lock\": \"demo-lock\"";
    pub const LIMIT: &str =
        "pass the number of slots as a JSON number, a whole number from 1 to 1000, e.g. \"limit\": 5";
    pub const HOLDER: &str = "pass the execution ARN, e.g. \"holder.$\": \"$$.Execution.Id\"";
    pub const ACQUISITION: &str =
        "pass an id made once per logical acquire, e.g. \"acquisition.$\": \"States.UUID()\"";
    pub const REQUESTED_AT: &str = "pass when the acquire was asked for, as RFC 3339 text: the \
        acquire state's entry time, \"requested_at.$\": \"$$.State.EnteredTime\"";
}

/// Longest excerpt of a wrong value quoted back in an error message.
const MAX_QUOTED: usize = 80;

/// A payload that is a JSON object.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    fields: &'a Map<String, Value>,
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn quoted(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= MAX_QUOTED {
        return text;
    }
    let mut end = MAX_QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl<'a> Payload<'a> {
    /// `expected` describes the whole payload, e.g. `{"lock", "limit", "holder", "acquisition"}`.
    pub fn new(value: &'a Value, expected: &str) -> Result<Self, HandlerError> {
        match value {
            Value::Object(fields) => Ok(Self { fields }),
            other => Err(HandlerError::InvalidInput(format!(
                "the payload must be a JSON object {expected}; got {} {}",
                kind(other),
                quoted(other)
            ))),
        }
    }

    /// The field, or `None` when it is absent or null.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    /// A required string field.
    pub fn string(&self, field: &'static str, hint: &'static str) -> Result<&'a str, HandlerError> {
        match self.get(field) {
            None => Err(InputError::Missing { field, hint }.into()),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(HandlerError::InvalidInput(format!(
                "{field} must be a JSON string; got {} {}",
                kind(other),
                quoted(other)
            ))),
        }
    }

    pub fn lock(&self) -> Result<LockName, HandlerError> {
        Ok(LockName::new(self.string("lock", hint::LOCK)?)?)
    }

    pub fn holder(&self) -> Result<HolderId, HandlerError> {
        Ok(HolderId::new(self.string("holder", hint::HOLDER)?)?)
    }

    pub fn acquisition(&self) -> Result<AcquisitionId, HandlerError> {
        Ok(AcquisitionId::new(
            self.string("acquisition", hint::ACQUISITION)?,
        )?)
    }

    /// `requested_at`: RFC 3339 text (any offset, any fraction of a second), as milliseconds
    /// since the Unix epoch.
    pub fn requested_at_ms(&self) -> Result<u64, HandlerError> {
        let text = self.string("requested_at", hint::REQUESTED_AT)?;
        let invalid = |problem: String| {
            HandlerError::InvalidInput(format!(
                "requested_at must be an RFC 3339 date-time such as \"2026-12-03T10:15:30.123Z\" \
                 (Step Functions' $$.State.EnteredTime); got {}: {problem}",
                quoted(&Value::String(text.to_owned()))
            ))
        };
        let at = DateTime::from_str(text, Format::DateTimeWithOffset)
            .map_err(|e| invalid(e.to_string()))?;
        let ms = at.to_millis().map_err(|e| invalid(e.to_string()))?;
        u64::try_from(ms).map_err(|_| invalid("it is before 1970".to_owned()))
    }

    /// `holder` and `acquisition`.
    pub fn identity(&self) -> Result<Identity, HandlerError> {
        Ok(Identity::new(self.holder()?, self.acquisition()?))
    }

    /// `limit`: a JSON integer from 1 to the core's maximum. `0`, `-1`, `2.5`, `"5"` and
    /// `"five"` are all refused: a limit is never taken from a string or rounded.
    pub fn limit(&self) -> Result<Limit, HandlerError> {
        let value = self.get("limit").ok_or(InputError::Missing {
            field: "limit",
            hint: hint::LIMIT,
        })?;
        let got = match value {
            Value::Number(n) => match n.as_i64() {
                Some(n) => return Ok(Limit::new(n)?),
                None => n.to_string(),
            },
            Value::String(_) => format!("the string {}", quoted(value)),
            other => format!("{} {}", kind(other), quoted(other)),
        };
        Err(InputError::InvalidLimit { got }.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limit(v: Value) -> Result<Limit, HandlerError> {
        let payload = json!({ "limit": v });
        Payload::new(&payload, "{}").unwrap().limit()
    }

    #[test]
    fn only_json_integers_in_range_are_limits() {
        assert_eq!(limit(json!(5)).unwrap().get(), 5);
        let message = |v: Value| limit(v).unwrap_err().to_string();
        assert_eq!(
            message(json!(0)),
            "limit must be a whole number from 1 to 1000; got 0"
        );
        assert_eq!(
            message(json!(-1)),
            "limit must be a whole number from 1 to 1000; got -1"
        );
        assert_eq!(
            message(json!(2.5)),
            "limit must be a whole number from 1 to 1000; got 2.5"
        );
        assert_eq!(
            message(json!("5")),
            "limit must be a whole number from 1 to 1000; got the string \"5\""
        );
        assert_eq!(
            message(json!("five")),
            "limit must be a whole number from 1 to 1000; got the string \"five\""
        );
        assert_eq!(
            message(json!(u64::MAX)),
            format!(
                "limit must be a whole number from 1 to 1000; got {}",
                u64::MAX
            )
        );
        assert_eq!(
            message(json!(true)),
            "limit must be a whole number from 1 to 1000; got a boolean true"
        );
        assert_eq!(
            message(Value::Null),
            format!("limit is missing: {}", hint::LIMIT)
        );
    }

    #[test]
    fn request_times_are_rfc_3339_in_any_offset_and_precision() {
        let at = |v: Value| {
            let payload = json!({ "requested_at": v });
            Payload::new(&payload, "{}").unwrap().requested_at_ms()
        };
        // Step Functions writes milliseconds and Z; moto writes microseconds and +00:00.
        assert_eq!(
            at(json!("2026-12-03T10:15:30.123Z")).unwrap(),
            1_796_292_930_123
        );
        assert_eq!(
            at(json!("2026-12-03T10:15:30.123456+00:00")).unwrap(),
            1_796_292_930_123
        );
        assert_eq!(
            at(json!("2026-12-03T11:15:30+01:00")).unwrap(),
            1_796_292_930_000
        );
        for bad in [json!("yesterday"), json!("2026-13-03T10:15:30Z"), json!(5)] {
            let err = at(bad.clone()).unwrap_err();
            assert_eq!(err.error_type(), "SemaphoreInvalidInput", "{bad}");
            assert!(err.message().starts_with("requested_at must be"), "{err}");
        }
        let err = at(Value::Null).unwrap_err();
        assert!(err.message().contains("$$.State.EnteredTime"), "{err}");
    }

    #[test]
    fn strings_must_be_present_and_strings() {
        let payload = json!({ "lock": 7, "holder": null });
        let p = Payload::new(&payload, "{}").unwrap();
        assert_eq!(
            p.lock().unwrap_err().to_string(),
            "lock must be a JSON string; got a number 7"
        );
        assert_eq!(
            p.holder().unwrap_err().to_string(),
            format!("holder is missing: {}", hint::HOLDER)
        );
        let long = json!(["x".repeat(200)]);
        let err = Payload::new(&long, "{\"lock\"}").unwrap_err().to_string();
        assert!(
            err.starts_with("the payload must be a JSON object {\"lock\"}; got an array [\"xxx")
        );
        assert!(err.ends_with("..."), "{err}");
        assert!(err.len() < 200, "{err}");
    }
}
