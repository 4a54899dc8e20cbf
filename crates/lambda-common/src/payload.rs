//! A state machine's JSON payload, validated field by field into the core's input types.
//!
//! Payloads arrive as `serde_json::Value` (any JSON deserializes into it), so a payload of the
//! wrong shape is answered by `SemaphoreInvalidInput` with a message naming the field, never by
//! the runtime's own deserialization error. A field of a nested object (the execution input,
//! say) is named by its path, `input.lock`, so the message says where the bad value came from.

use aws_sdk_dynamodb::primitives::{DateTime, DateTimeFormat as Format};
use semaphore_core::{
    AcquisitionId, FencingToken, HolderId, InputError, Lease, Limit, LockName, Rate, Weight,
};
use serde_json::{Map, Number, Value};

use crate::error::HandlerError;

/// Longest excerpt of a wrong value quoted back in an error message.
const MAX_QUOTED: usize = 80;

/// A payload, or an object inside one, that is a JSON object.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    fields: &'a Map<String, Value>,
    /// Prepended to a field's name in messages: "" for the payload, "input." for the input.
    prefix: &'static str,
}

/// "a string", "an array"...: what a wrong value is, for messages.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The value as JSON text, cut to a readable length.
pub fn quoted(value: &Value) -> String {
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
            Value::Object(fields) => Ok(Self { fields, prefix: "" }),
            other => Err(HandlerError::InvalidInput(format!(
                "the payload must be a JSON object {expected}; got {} {}",
                kind(other),
                quoted(other)
            ))),
        }
    }

    /// The object under `field`, its fields named `<prefix><name>` in messages; `None` when
    /// absent or null. `what` says what the object is, for the error when it is not one.
    pub fn object(
        &self,
        field: &str,
        prefix: &'static str,
        what: &str,
    ) -> Result<Option<Payload<'a>>, HandlerError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(fields)) => Ok(Some(Self { fields, prefix })),
            Some(other) => Err(HandlerError::InvalidInput(format!(
                "{} must be a JSON object ({what}); got {} {}",
                self.name(field),
                kind(other),
                quoted(other)
            ))),
        }
    }

    /// The field's name as messages give it, e.g. `input.lock`.
    pub fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    /// Whether the object has the field (even if null).
    pub fn has(&self, field: &str) -> bool {
        self.fields.contains_key(field)
    }

    /// The field, or `None` when it is absent or null.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    /// A core input error about `field`: as it is for a payload field, prefixed by the field's
    /// path for a nested one, so the message says where the value came from.
    fn input_error(&self, field: &str, e: InputError) -> HandlerError {
        if self.prefix.is_empty() {
            e.into()
        } else {
            HandlerError::InvalidInput(format!("{}: {e}", self.name(field)))
        }
    }

    /// The error for a required field that is missing, with `hint`: what to pass.
    pub fn missing(&self, field: &str, hint: &str) -> HandlerError {
        HandlerError::InvalidInput(format!("{} is missing: {hint}", self.name(field)))
    }

    /// A string field, `None` when absent or null.
    pub fn optional_string(&self, field: &str) -> Result<Option<&'a str>, HandlerError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(HandlerError::InvalidInput(format!(
                "{} must be a JSON string; got {} {}",
                self.name(field),
                kind(other),
                quoted(other)
            ))),
        }
    }

    /// A required string field.
    pub fn string(&self, field: &str, hint: &str) -> Result<&'a str, HandlerError> {
        self.optional_string(field)?
            .ok_or_else(|| self.missing(field, hint))
    }

    /// A string field parsed by `parse` (its error named after the field), `None` when absent
    /// or null.
    fn optional_parsed<T>(
        &self,
        field: &str,
        parse: impl Fn(&'a str) -> Result<T, InputError>,
    ) -> Result<Option<T>, HandlerError> {
        self.optional_string(field)?
            .map(|s| parse(s).map_err(|e| self.input_error(field, e)))
            .transpose()
    }

    pub fn optional_lock(&self, field: &str) -> Result<Option<LockName>, HandlerError> {
        self.optional_parsed(field, LockName::new)
    }

    pub fn optional_holder(&self, field: &str) -> Result<Option<HolderId>, HandlerError> {
        self.optional_parsed(field, HolderId::new)
    }

    pub fn optional_acquisition(&self, field: &str) -> Result<Option<AcquisitionId>, HandlerError> {
        self.optional_parsed(field, AcquisitionId::new)
    }

    /// An RFC 3339 date-time (any offset, any fraction of a second) as milliseconds since the
    /// Unix epoch; `None` when absent or null. `source` names where Step Functions has it, e.g.
    /// `$$.State.EnteredTime`, for the error.
    pub fn optional_time_ms(&self, field: &str, source: &str) -> Result<Option<u64>, HandlerError> {
        let Some(text) = self.optional_string(field)? else {
            return Ok(None);
        };
        let invalid = |problem: String| {
            HandlerError::InvalidInput(format!(
                "{} must be an RFC 3339 date-time such as \"2026-12-03T10:15:30.123Z\" \
                 (Step Functions' {source}); got {}: {problem}",
                self.name(field),
                quoted(&Value::String(text.to_owned()))
            ))
        };
        let at = DateTime::from_str(text, Format::DateTimeWithOffset)
            .map_err(|e| invalid(e.to_string()))?;
        let ms = at.to_millis().map_err(|e| invalid(e.to_string()))?;
        u64::try_from(ms)
            .map(Some)
            .map_err(|_| invalid("it is before 1970".to_owned()))
    }

    /// A boolean field, `None` when absent or null.
    pub fn optional_bool(&self, field: &str) -> Result<Option<bool>, HandlerError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(HandlerError::InvalidInput(format!(
                "{} must be true or false; got {} {}",
                self.name(field),
                kind(other),
                quoted(other)
            ))),
        }
    }

    /// A whole number from 0, such as a redrive count; `None` when absent or null. `source`
    /// names where Step Functions has it, for the error.
    pub fn optional_count(&self, field: &str, source: &str) -> Result<Option<u32>, HandlerError> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(count) => Ok(Some(count)),
            None => Err(HandlerError::InvalidInput(format!(
                "{} must be a whole number from 0 (Step Functions' {source}); got {} {}",
                self.name(field),
                kind(value),
                quoted(value)
            ))),
        }
    }

    /// A JSON number read by `number` and made by `make`; `None` when absent or null. Anything
    /// else (a string, a number `number` does not read) is refused with `invalid`'s error: never
    /// taken from a string, never rounded.
    fn optional_number<N, T>(
        &self,
        field: &str,
        number: impl Fn(&Number) -> Option<N>,
        make: impl Fn(N) -> Result<T, InputError>,
        invalid: impl Fn(String) -> InputError,
    ) -> Result<Option<T>, HandlerError> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        let got = match value {
            Value::Number(n) => match number(n) {
                Some(n) => return make(n).map(Some).map_err(|e| self.input_error(field, e)),
                None => n.to_string(),
            },
            Value::String(_) => format!("the string {}", quoted(value)),
            other => format!("{} {}", kind(other), quoted(other)),
        };
        Err(self.input_error(field, invalid(got)))
    }

    /// `limit` as a JSON integer from 1 to the core's maximum; `None` when absent or null.
    /// `0`, `-1`, `2.5`, `"5"` and `"five"` are all refused: a limit is never taken from a string
    /// or rounded.
    pub fn optional_limit(&self, field: &str) -> Result<Option<Limit>, HandlerError> {
        self.optional_number(field, Number::as_i64, Limit::new, |got| {
            InputError::InvalidLimit { got }
        })
    }

    /// `weight` as a JSON integer from 1 to the core's maximum limit; `None` when absent or
    /// null. Refused like a limit: never from a string, never rounded.
    pub fn optional_weight(&self, field: &str) -> Result<Option<Weight>, HandlerError> {
        self.optional_number(field, Number::as_i64, Weight::new, |got| {
            InputError::InvalidWeight { got }
        })
    }

    /// `lease` as a JSON integer of seconds (1 to a day); `None` when absent or null. Refused
    /// like a limit: never from a string, never rounded.
    pub fn optional_lease(&self, field: &str) -> Result<Option<Lease>, HandlerError> {
        // Refused with the seconds given, not the milliseconds they make (saturated past a
        // u64).
        self.optional_number(
            field,
            Number::as_u64,
            |seconds| {
                Lease::ms(seconds.saturating_mul(1000)).map_err(|_| InputError::InvalidLease {
                    got: seconds.to_string(),
                })
            },
            |got| InputError::InvalidLease { got },
        )
    }

    /// A fencing token as a JSON integer from 1 to the largest a lock gives; `None` when absent
    /// or null. Refused like a limit: never from a string, never rounded.
    pub fn optional_token(&self, field: &str) -> Result<Option<FencingToken>, HandlerError> {
        self.optional_number(field, Number::as_u64, FencingToken::new, |got| {
            InputError::InvalidToken { got }
        })
    }

    /// `rate` as a JSON number of acquisitions per second (`2`, `0.5`); `None` when absent or
    /// null. A string, zero, a negative or an absurd rate is refused.
    pub fn optional_rate(&self, field: &str) -> Result<Option<Rate>, HandlerError> {
        self.optional_number(field, Number::as_f64, Rate::per_second, |got| {
            InputError::InvalidRate { got }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limit(v: Value) -> Result<Option<Limit>, HandlerError> {
        let payload = json!({ "limit": v });
        Payload::new(&payload, "{}")
            .unwrap()
            .optional_limit("limit")
    }

    #[test]
    fn only_json_integers_in_range_are_limits() {
        assert_eq!(limit(json!(5)).unwrap().map(Limit::get), Some(5));
        let message = |v: Value| limit(v).unwrap_err().to_string();
        assert_eq!(
            message(json!(0)),
            "limit must be a whole number from 1 to 10000; got 0"
        );
        assert_eq!(
            message(json!(-1)),
            "limit must be a whole number from 1 to 10000; got -1"
        );
        assert_eq!(
            message(json!(2.5)),
            "limit must be a whole number from 1 to 10000; got 2.5"
        );
        assert_eq!(
            message(json!("5")),
            "limit must be a whole number from 1 to 10000; got the string \"5\""
        );
        assert_eq!(
            message(json!("five")),
            "limit must be a whole number from 1 to 10000; got the string \"five\""
        );
        assert_eq!(
            message(json!(u64::MAX)),
            format!(
                "limit must be a whole number from 1 to 10000; got {}",
                u64::MAX
            )
        );
        assert_eq!(
            message(json!(true)),
            "limit must be a whole number from 1 to 10000; got a boolean true"
        );
        assert_eq!(limit(Value::Null).unwrap(), None);
    }

    #[test]
    fn request_times_are_rfc_3339_in_any_offset_and_precision() {
        let at = |v: Value| {
            let payload = json!({ "requested_at": v });
            Payload::new(&payload, "{}")
                .unwrap()
                .optional_time_ms("requested_at", "$$.State.EnteredTime")
        };
        // Step Functions writes milliseconds and Z; moto writes microseconds and +00:00.
        assert_eq!(
            at(json!("2026-12-03T10:15:30.123Z")).unwrap(),
            Some(1_796_292_930_123)
        );
        assert_eq!(
            at(json!("2026-12-03T10:15:30.123456+00:00")).unwrap(),
            Some(1_796_292_930_123)
        );
        assert_eq!(
            at(json!("2026-12-03T11:15:30+01:00")).unwrap(),
            Some(1_796_292_930_000)
        );
        for bad in [json!("yesterday"), json!("2026-13-03T10:15:30Z"), json!(5)] {
            let err = at(bad.clone()).unwrap_err();
            assert_eq!(err.error_type(), "SemaphoreInvalidInput", "{bad}");
            assert!(err.message().starts_with("requested_at must be"), "{err}");
        }
        assert_eq!(at(Value::Null).unwrap(), None);
        let err = at(json!("soon")).unwrap_err();
        assert!(err.message().contains("$$.State.EnteredTime"), "{err}");
    }

    #[test]
    fn strings_must_be_present_and_strings() {
        let payload = json!({ "lock": 7, "holder": null });
        let p = Payload::new(&payload, "{}").unwrap();
        assert_eq!(
            p.optional_lock("lock").unwrap_err().to_string(),
            "lock must be a JSON string; got a number 7"
        );
        assert_eq!(
            p.string("holder", "pass it").unwrap_err().to_string(),
            "holder is missing: pass it"
        );
        let long = json!(["x".repeat(200)]);
        let err = Payload::new(&long, "{\"lock\"}").unwrap_err().to_string();
        assert!(
            err.starts_with("the payload must be a JSON object {\"lock\"}; got an array [\"xxx")
        );
        assert!(err.ends_with("..."), "{err}");
        assert!(err.len() < 200, "{err}");
    }

    #[test]
    fn a_nested_objects_fields_are_named_by_their_path() {
        let payload = json!({ "input": { "lock": "", "limit": "5", "n": -1 }, "bad": [1] });
        let p = Payload::new(&payload, "{}").unwrap();
        let input = p.object("input", "input.", "the input").unwrap().unwrap();
        assert_eq!(
            input.optional_lock("lock").unwrap_err().to_string(),
            "input.lock: lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\""
        );
        assert_eq!(
            input.optional_limit("limit").unwrap_err().to_string(),
            "input.limit: limit must be a whole number from 1 to 10000; got the string \"5\""
        );
        assert_eq!(
            input.optional_count("n", "$$.X").unwrap_err().to_string(),
            "input.n must be a whole number from 0 (Step Functions' $$.X); got a number -1"
        );
        assert_eq!(
            p.object("bad", "bad.", "a test object")
                .unwrap_err()
                .to_string(),
            "bad must be a JSON object (a test object); got an array [1]"
        );
        assert!(p.object("absent", "absent.", "").unwrap().is_none());
    }
}
