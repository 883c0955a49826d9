//! Validation of form-mode answer data against the elicitation's requested schema, and schema defaults.

use jsonschema::error::ValidationErrorKind;
use serde::Serialize;
use serde_json::{Map, Value};

/// What the gateway answers an elicitation whose schema it cannot show (MCP allows only flat forms).
pub const UNUSABLE_SCHEMA: &str =
    "requestedSchema must be a flat object of primitive properties (string, number, integer, boolean or enum)";

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

/// Validates answer data with a validator from [`compile`], listing every violation.
///
/// Keys outside `properties` are violations too: the schema describes the whole answer.
pub fn violations(validator: &jsonschema::Validator, data: &Map<String, Value>) -> Result<(), Vec<Violation>> {
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

/// Checks that a requested schema is an MCP form: an object whose properties are each a string, number,
/// integer, boolean, single-select enum or multi-select enum (an array of enumerated strings). The keywords'
/// values are left to the JSON Schema compiler.
fn check_flat(schema: &Value) -> Result<(), String> {
    let unusable = |why: String| format!("{UNUSABLE_SCHEMA}: {why}");
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(unusable("its type is not \"object\"".to_owned()));
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Err(unusable("it has no properties object".to_owned()));
    };
    for (name, property) in properties {
        let primitive = match property.get("type").and_then(Value::as_str) {
            Some("string" | "number" | "integer" | "boolean") => true,
            Some("array") => property.get("items").is_some_and(|items| {
                let strings =
                    items.get("type").and_then(Value::as_str) == Some("string") && items.get("enum").is_some();
                strings || items.get("anyOf").is_some() || items.get("oneOf").is_some()
            }),
            _ => false,
        };
        if !primitive {
            return Err(unusable(format!("property {name:?} is not one")));
        }
    }
    Ok(())
}

/// Compiles a requested schema as draft 2020-12 with format checks, closed to unknown properties; the error
/// says why the schema cannot validate answers.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    check_flat(schema)?;
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

/// Compiles a tool's `inputSchema` to check arguments with: its own dialect (`$schema`, else 2020-12) with format
/// checks, and no reference outside it resolved.
pub fn compile_arguments(schema: &Value) -> Result<jsonschema::Validator, String> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err("the tool's inputSchema is not of type \"object\"".to_owned());
    }
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|error| format!("the tool's inputSchema is not usable: {error}"))
}

fn pointer_segment(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_schema(schema: &Value) -> Result<(), String> {
        compile(schema).map(drop)
    }

    /// Compiles and validates in one step; an unusable schema is one violation at the root.
    fn validate(schema: &Value, data: &Map<String, Value>) -> Result<(), Vec<Violation>> {
        let validator = compile(schema).map_err(|message| {
            vec![Violation {
                path: String::new(),
                message,
            }]
        })?;
        violations(&validator, data)
    }

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
    fn every_mcp_primitive_makes_a_usable_schema() {
        assert_eq!(check_schema(&profile_schema()), Ok(()));
        let legacy = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"c": {"type": "string", "enum": ["a", "b"], "enumNames": ["A", "B"]},
                "t": {"type": "array", "items": {"oneOf": [{"const": "x", "title": "X"}]}}}});
        assert_eq!(check_schema(&legacy), Ok(()));
        assert_eq!(check_schema(&json!({"type": "object", "properties": {}})), Ok(()));
    }

    #[test]
    fn schemas_that_are_not_flat_forms_are_unusable() {
        for schema in [
            json!({"type": "object", "properties": {"address": {"type": "object", "properties": {}}}}),
            json!({"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object"}}}}),
            json!({"type": "object", "properties": {"free": {"type": "array", "items": {"type": "string"}}}}),
            json!({"type": "object", "properties": {"any": {}}}),
            json!({"type": "object", "properties": {"union": {"type": ["string", "null"]}}}),
            json!({"type": "object"}),
            json!({"type": "string"}),
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}}),
        ] {
            let error = check_schema(&schema).unwrap_err();
            assert!(
                error.contains("requestedSchema") || error.contains("not usable"),
                "{schema}: {error}"
            );
        }
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

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use proptest::strategy::BoxedStrategy;

        /// One flat property of a form schema.
        #[derive(Debug, Clone)]
        enum Field {
            Text { min: usize, max: usize },
            Integer { min: i64, max: i64 },
            Number { min: i32, max: i32 },
            Boolean,
            Choice(Vec<String>),
            MultiSelect { options: Vec<String>, max: usize },
        }

        fn options() -> impl Strategy<Value = Vec<String>> {
            prop::collection::btree_set("[a-z]{1,5}", 1..5).prop_map(|set| set.into_iter().collect())
        }

        fn field() -> impl Strategy<Value = Field> {
            prop_oneof![
                (0..4usize, 0..6usize).prop_map(|(min, extra)| Field::Text { min, max: min + extra }),
                (-1000..1000i64, 0..1000i64).prop_map(|(min, span)| Field::Integer { min, max: min + span }),
                (-1000..1000i32, 1..1000i32).prop_map(|(min, span)| Field::Number { min, max: min + span }),
                Just(Field::Boolean),
                options().prop_map(Field::Choice),
                options().prop_flat_map(|options| {
                    let len = options.len();
                    (Just(options), 1..=len).prop_map(|(options, max)| Field::MultiSelect { options, max })
                }),
            ]
        }

        impl Field {
            fn schema(&self) -> Value {
                match self {
                    Field::Text { min, max } => json!({"type": "string", "minLength": min, "maxLength": max}),
                    Field::Integer { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
                    Field::Number { min, max } => json!({"type": "number", "minimum": min, "maximum": max}),
                    Field::Boolean => json!({"type": "boolean"}),
                    Field::Choice(options) => json!({"type": "string", "enum": options}),
                    Field::MultiSelect { options, max } => json!({"type": "array", "maxItems": max,
                        "items": {"type": "string", "enum": options}}),
                }
            }

            fn valid(&self) -> BoxedStrategy<Value> {
                match self.clone() {
                    Field::Text { min, max } => text(min..=max),
                    Field::Integer { min, max } => (min..=max).prop_map(Value::from).boxed(),
                    Field::Number { min, max } => (f64::from(min)..=f64::from(max)).prop_map(Value::from).boxed(),
                    Field::Boolean => any::<bool>().prop_map(Value::from).boxed(),
                    Field::Choice(options) => prop::sample::select(options).prop_map(Value::from).boxed(),
                    Field::MultiSelect { options, max } => prop::sample::subsequence(options, 0..=max)
                        .prop_map(Value::from)
                        .boxed(),
                }
            }

            /// A value that breaks this field, and the pointer suffix under the field that names it.
            fn invalid(&self) -> BoxedStrategy<(Value, String)> {
                let wrong_type = match self {
                    Field::Text { .. } | Field::Choice(_) | Field::MultiSelect { .. } => json!(7),
                    _ => json!("seven"),
                };
                let breach = match self.clone() {
                    Field::Text { min, max } if min > 0 => {
                        prop_oneof![text(max + 1..=max + 3), text(0..=min - 1)].boxed()
                    }
                    Field::Text { max, .. } => text(max + 1..=max + 3),
                    Field::Integer { min, max } => prop_oneof![max + 1..max + 100, min - 100..min]
                        .prop_map(Value::from)
                        .boxed(),
                    Field::Number { min, max } => prop_oneof![Just(f64::from(max) + 0.5), Just(f64::from(min) - 0.5)]
                        .prop_map(Value::from)
                        .boxed(),
                    Field::Boolean => Just(json!(0)).boxed(),
                    Field::Choice(options) => Just(Value::from(options.concat() + "!")).boxed(),
                    Field::MultiSelect { options, max } => {
                        let too_many: Vec<&String> = options.iter().cycle().take(max + 1).collect();
                        Just(json!(too_many)).boxed()
                    }
                };
                let mut cases = vec![
                    Just((wrong_type, String::new())).boxed(),
                    breach.prop_map(|v| (v, String::new())).boxed(),
                ];
                if let Field::MultiSelect { options, .. } = self {
                    let stranger = options.concat() + "!";
                    cases.push(Just((json!([stranger]), "/0".to_owned())).boxed());
                }
                prop::strategy::Union::new(cases).boxed()
            }
        }

        fn text(lengths: std::ops::RangeInclusive<usize>) -> BoxedStrategy<Value> {
            let chars = prop::sample::select(vec!['a', 'Z', ' ', 'é', '日', '🙂']);
            prop::collection::vec(chars, lengths)
                .prop_map(|chars| Value::from(chars.into_iter().collect::<String>()))
                .boxed()
        }

        /// A form: property names (some with `/` or `~`, to check pointer escaping), fields and which are required.
        /// Each property's name, field and whether it is required.
        type Form = Vec<(String, Field, bool)>;

        fn form() -> impl Strategy<Value = Form> {
            prop::collection::btree_map("[a-z][a-z0-9_/~]{0,6}", (field(), any::<bool>()), 1..6).prop_map(|map| {
                map.into_iter()
                    .map(|(name, (field, required))| (name, field, required))
                    .collect()
            })
        }

        fn schema(form: &[(String, Field, bool)]) -> Value {
            let properties: Map<String, Value> = form
                .iter()
                .map(|(name, field, _)| (name.clone(), field.schema()))
                .collect();
            let required: Vec<&String> = form
                .iter()
                .filter(|(_, _, required)| *required)
                .map(|(name, _, _)| name)
                .collect();
            json!({"type": "object", "properties": properties, "required": required})
        }

        /// Valid data: every required property and some optional ones.
        fn valid_data(form: &[(String, Field, bool)]) -> BoxedStrategy<Map<String, Value>> {
            let values: Vec<_> = form
                .iter()
                .map(|(name, field, required)| {
                    let name = name.clone();
                    let present = if *required {
                        Just(true).boxed()
                    } else {
                        any::<bool>().boxed()
                    };
                    (present, field.valid()).prop_map(move |(present, value)| present.then(|| (name.clone(), value)))
                })
                .collect();
            values.prop_map(|values| values.into_iter().flatten().collect()).boxed()
        }

        /// A form, valid data for it, and the index of the property to break.
        fn case() -> impl Strategy<Value = (Value, Form, Map<String, Value>, usize)> {
            form().prop_flat_map(|form| {
                let len = form.len();
                (Just(schema(&form)), valid_data(&form), 0..len, Just(form))
                    .prop_map(|(schema, data, index, form)| (schema, form, data, index))
            })
        }

        /// A form, valid data for it, and one of its properties with a value that breaks it.
        fn broken() -> impl Strategy<Value = (Value, Map<String, Value>, String, (Value, String))> {
            case().prop_flat_map(|(schema, form, data, index)| {
                let (name, field, _) = form[index].clone();
                (Just(schema), Just(data), Just(name), field.invalid())
            })
        }

        proptest! {
            #[test]
            fn valid_data_passes((schema, _form, data, _index) in case()) {
                prop_assert_eq!(check_schema(&schema), Ok(()));
                prop_assert_eq!(validate(&schema, &data), Ok(()));
            }

            #[test]
            fn one_broken_property_is_named_exactly((schema, mut data, name, (value, suffix)) in broken()) {
                data.insert(name.clone(), value.clone());
                let violations = validate(&schema, &data).unwrap_err();
                let path = format!("/{}{suffix}", pointer_segment(&name));
                prop_assert!(violations.iter().all(|violation| violation.path == path), "{path} {value}: {violations:?}");
            }

            #[test]
            fn a_missing_required_property_is_named((schema, form, mut data, index) in case()) {
                let (name, _, required) = &form[index];
                prop_assume!(*required);
                data.remove(name);
                let violations = validate(&schema, &data).unwrap_err();
                prop_assert_eq!(violations, vec![Violation { path: format!("/{}", pointer_segment(name)), message: "is required".into() }]);
            }

            #[test]
            fn an_unknown_key_is_named((schema, _form, mut data, _index) in case(), key in "[A-Z][a-z/~]{0,6}", value in any::<i64>()) {
                data.insert(key.clone(), json!(value));
                let violations = validate(&schema, &data).unwrap_err();
                prop_assert_eq!(violations.len(), 1);
                prop_assert_eq!(&violations[0].path, &format!("/{}", pointer_segment(&key)));
            }
        }
    }
}
