//! The OpenAPI document's finishing touches: the constraints and the responses the handlers' annotations
//! cannot state, and the responses many operations share, kept once under `components.responses`.

use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, OneOfBuilder, Type};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi, Ref, RefOr, Response, ResponseBuilder};

/// A problem+json response with this description.
pub fn problem(description: &str) -> ResponseBuilder {
    let problem = ContentBuilder::new()
        .schema(Some(RefOr::Ref(Ref::from_schema_name("Problem"))))
        .build();
    ResponseBuilder::new()
        .description(description)
        .content("application/problem+json", problem)
}

/// Keeps `response` once, as the component `name`, and returns the reference every operation answering it
/// carries.
pub fn shared(document: &mut OpenApi, name: &str, response: Response) -> RefOr<Response> {
    document
        .components
        .get_or_insert_with(Default::default)
        .responses
        .insert(name.to_owned(), RefOr::T(response));
    RefOr::Ref(Ref::from_response_name(name))
}

/// Every operation of the document, with its path.
pub fn operations(document: &mut OpenApi) -> impl Iterator<Item = (&str, &mut Operation)> {
    document.paths.paths.iter_mut().flat_map(|(path, item)| {
        [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
            .map(move |operation| (path.as_str(), operation))
    })
}

/// Adds to the document the constraints between fields that the derived schemas cannot state.
pub fn constrain(document: &mut OpenApi) {
    let string = |name: &str| {
        ObjectBuilder::new()
            .required(name)
            .property(name, ObjectBuilder::new().schema_type(Type::String))
    };
    // `POST /calls` names exactly one of `server` and `session`.
    one_of(document, "StartCall", [string("server"), string("session")]);
    let ok = |value: bool| {
        ObjectBuilder::new().property(
            "ok",
            ObjectBuilder::new()
                .schema_type(Type::Boolean)
                .enum_values(Some([value])),
        )
    };
    // An Answer gives a `reason` only when `ok` is false.
    let accept = ok(true).property("reason", ObjectBuilder::new().schema_type(Type::Null));
    one_of(document, "Answer", [ok(false), accept]);
}

/// Gives each operation an id of its own: an id that several handlers share (`list`, `get`) is suffixed with
/// the operation's tag, as in `list_requests`, so that links and generated clients name one operation.
pub fn unique_operation_ids(document: &mut OpenApi) {
    let mut count = std::collections::HashMap::<String, usize>::new();
    for (_, operation) in operations(document) {
        if let Some(id) = &operation.operation_id {
            *count.entry(id.clone()).or_default() += 1;
        }
    }
    for (_, operation) in operations(document) {
        let tag = operation.tags.as_ref().and_then(|tags| tags.first()).cloned();
        if let (Some(id), Some(tag)) = (&mut operation.operation_id, tag)
            && count.get(id.as_str()).is_some_and(|count| *count > 1)
        {
            *id = format!("{id}_{tag}");
        }
    }
}

/// The routes that never use the store (they answer without it, or swallow its errors).
const WITHOUT_STORE: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/openapi.json"];

/// Documents the `503` every route that reads or changes the store answers when the store cannot be used.
pub fn unavailable(document: &mut OpenApi) {
    let response = problem(
        "The store cannot keep or read this right now (a full disk, an I/O error); nothing was changed: try again \
         after Retry-After",
    )
    .header(
        "Retry-After",
        HeaderBuilder::new()
            .schema(Some(ObjectBuilder::new().schema_type(Type::Integer)))
            .description(Some("Seconds to wait before trying again"))
            .build(),
    )
    .build();
    let unavailable = shared(document, "StoreUnavailable", response);
    for (path, operation) in operations(document) {
        if WITHOUT_STORE.contains(&path) || path.starts_with("/ui") || path.starts_with("/servers") {
            continue;
        }
        operation
            .responses
            .responses
            .entry("503".to_owned())
            .or_insert_with(|| unavailable.clone());
    }
}

/// Narrows a component schema: a value must also match exactly one of the branches.
fn one_of(document: &mut OpenApi, name: &str, branches: impl IntoIterator<Item = ObjectBuilder>) {
    let Some(schema) = document
        .components
        .as_mut()
        .and_then(|components| components.schemas.get_mut(name))
    else {
        return;
    };
    let branches = branches
        .into_iter()
        .fold(OneOfBuilder::new(), |one_of, branch| one_of.item(branch));
    *schema = AllOfBuilder::new().item(schema.clone()).item(branches).into();
}
