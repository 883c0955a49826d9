//! Validation of form-mode answer data against the elicitation's requested schema, and schema defaults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jsonschema::error::ValidationErrorKind;
use serde::Serialize;
use serde_json::{Map, Value};

/// The most distinct schemas `Validators` keeps compiled; it starts over when full.
const MAX_COMPILED: usize = 256;

/// One way an answer's data fails the requested schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Violation {
    /// JSON Pointer to the offending value, e.g. `/age`.
    pub path: String,
    /// What is wrong, in human words.
    pub message: String,
}

/// Fills properties the data leaves out with the schema's `default`, where it has one.
pub fn apply_defaults(schema: &Value, data: &mut Map<String, Value>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        if let Some(default) = property.get("default")
            && !data.contains_key(name)
        {
            data.insert(name.clone(), default.clone());
        }
    }
}

/// Checks that a requested schema can validate answers; the error says why not.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    build(schema).map(drop)
}

/// Validates answer data against the requested schema, listing every violation.
///
/// Keys outside `properties` are violations too: the schema describes the whole answer.
pub fn validate(schema: &Value, data: &Map<String, Value>) -> Result<(), Vec<Violation>> {
    let validator = build(schema).map_err(unusable)?;
    violations(&validator, data)
}

/// Compiled validators by schema text: elicitations repeat their schemas, and compiling one costs far more
/// than validating an answer with it.
#[derive(Debug, Default)]
pub struct Validators {
    compiled: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Validators {
    /// Like `check_schema`, compiling each distinct schema once.
    pub fn check(&self, schema: &Value) -> Result<(), String> {
        self.compiled(schema).map(drop)
    }

    /// Like `validate`, compiling each distinct schema once.
    pub fn validate(&self, schema: &Value, data: &Map<String, Value>) -> Result<(), Vec<Violation>> {
        let validator = self.compiled(schema).map_err(unusable)?;
        violations(&validator, data)
    }

    fn compiled(&self, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let key = schema.to_string();
        if let Some(validator) = self.lock().get(&key) {
            return Ok(validator.clone());
        }
        let validator = Arc::new(build(schema)?);
        let mut compiled = self.lock();
        if compiled.len() >= MAX_COMPILED {
            compiled.clear();
        }
        compiled.insert(key, validator.clone());
        Ok(validator)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<jsonschema::Validator>>> {
        self.compiled.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn unusable(message: String) -> Vec<Violation> {
    vec![Violation {
        path: String::new(),
        message,
    }]
}

/// Every way `data` fails a compiled schema.
fn violations(validator: &jsonschema::Validator, data: &Map<String, Value>) -> Result<(), Vec<Violation>> {
    let instance = Value::Object(data.clone());
    let mut violations = Vec::new();
    for error in validator.iter_errors(&instance) {
        let path = error.instance_path().as_str().to_owned();
        match error.kind() {
            ValidationErrorKind::Required { property } => violations.push(Violation {
                path: format!("{path}/{}", pointer_segment(property.as_str().unwrap_or_default())),
                message: "is required".to_owned(),
            }),
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                violations.extend(unexpected.iter().map(|name| Violation {
                    path: format!("{path}/{}", pointer_segment(name)),
                    message: "is not a property of the requested schema".to_owned(),
                }))
            }
            _ => violations.push(Violation {
                path,
                message: error.to_string(),
            }),
        }
    }
    if violations.is_empty() { Ok(()) } else { Err(violations) }
}

/// Compiles the schema as draft 2020-12 with format checks, closed to unknown properties.
fn build(schema: &Value) -> Result<jsonschema::Validator, String> {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        // The dialect is always 2020-12 (MCP's default); a `$schema` must not make the validator fetch anything.
        object.remove("$schema");
        object.entry("additionalProperties").or_insert(Value::Bool(false));
    }
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|error| format!("the requested schema is not usable: {error}"))
}

fn pointer_segment(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn profile_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
                "born": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "score": {"type": "number"},
                "newsletter": {"type": "boolean", "default": false},
                "color": {"type": "string", "enum": ["red", "green", "blue"]},
                "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 2},
                "labels": {"type": "array", "items": {"anyOf": [{"const": "x", "title": "X"}, {"const": "y", "title": "Y"}]}, "minItems": 1}
            },
            "required": ["name"]
        })
    }

    fn data(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    fn paths(result: Result<(), Vec<Violation>>) -> Vec<String> {
        let mut paths: Vec<_> = result.unwrap_err().into_iter().map(|v| v.path).collect();
        paths.sort();
        paths
    }

    #[test]
    fn a_valid_answer_passes() {
        let answer = data(
            json!({"name": "Ada", "email": "ada@example.com", "site": "https://example.com",
            "born": "1815-12-10", "at": "2026-01-01T00:00:00Z", "age": 36, "score": 9.5, "newsletter": true,
            "color": "red", "size": "s", "tags": ["a", "b"], "labels": ["x"]}),
        );
        assert_eq!(validate(&profile_schema(), &answer), Ok(()));
    }

    #[test]
    fn every_violation_is_listed_with_its_path() {
        let answer = data(
            json!({"name": "", "email": "not-an-email", "site": "no scheme", "born": "10/12/1815",
            "at": "yesterday", "age": 200, "score": "high", "newsletter": "yes", "color": "pink", "size": "m",
            "tags": ["a", "b", "c"], "labels": [], "extra": 1}),
        );
        assert_eq!(
            paths(validate(&profile_schema(), &answer)),
            [
                "/age",
                "/at",
                "/born",
                "/color",
                "/email",
                "/extra",
                "/labels",
                "/name",
                "/newsletter",
                "/score",
                "/site",
                "/size",
                "/tags"
            ]
        );
    }

    #[test]
    fn integer_is_not_number() {
        let answer = data(json!({"name": "Ada", "age": 36.5}));
        assert_eq!(paths(validate(&profile_schema(), &answer)), ["/age"]);
        assert_eq!(
            validate(&profile_schema(), &data(json!({"name": "Ada", "score": 3}))),
            Ok(())
        );
    }

    #[test]
    fn missing_required_keys_are_reported_by_name() {
        let violations = validate(&profile_schema(), &data(json!({}))).unwrap_err();
        assert_eq!(
            violations,
            [Violation {
                path: "/name".into(),
                message: "is required".into()
            }]
        );
    }

    #[test]
    fn multi_select_items_are_checked() {
        assert_eq!(
            paths(validate(&profile_schema(), &data(json!({"name": "A", "tags": ["z"]})))),
            ["/tags/0"]
        );
    }

    #[test]
    fn defaults_fill_only_missing_properties() {
        let mut answer = data(json!({"name": "Ada"}));
        apply_defaults(&profile_schema(), &mut answer);
        assert_eq!(answer, data(json!({"name": "Ada", "newsletter": false})));
        let mut explicit = data(json!({"newsletter": true}));
        apply_defaults(&profile_schema(), &mut explicit);
        assert_eq!(explicit["newsletter"], true);
    }

    #[test]
    fn a_foreign_dialect_is_validated_as_2020_12() {
        let schema = json!({"$schema": "https://example.com/unknown", "type": "object", "properties": {"n": {"type": "integer"}}});
        assert_eq!(paths(validate(&schema, &data(json!({"n": "one"})))), ["/n"]);
        assert_eq!(check_schema(&schema), Ok(()));
    }

    #[test]
    fn cached_validators_judge_like_fresh_ones() {
        let validators = Validators::default();
        let schema = profile_schema();
        for _ in 0..2 {
            assert_eq!(validators.check(&schema), Ok(()));
            assert_eq!(
                validators.validate(&schema, &data(json!({"name": ""}))),
                validate(&schema, &data(json!({"name": ""})))
            );
            assert_eq!(validators.validate(&schema, &data(json!({"name": "Ada"}))), Ok(()));
        }
        let unusable = json!({"type": "object", "properties": {"x": {"type": 5}}});
        assert!(validators.check(&unusable).is_err());
        assert_eq!(check_schema(&unusable), validators.check(&unusable));
    }
}
