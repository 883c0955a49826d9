//! `GET /openapi.json` describes every route, and every route it describes exists.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, spawn_app, start_with, token_entry};

#[tokio::test]
async fn every_documented_operation_is_served() {
    let app = spawn_app(BOTH_ERAS).await;
    let document = app.get_json("/openapi.json").await;
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().unwrap();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for expected in [
        "/requests",
        "/requests/{id}/answer",
        "/calls/{id}",
        "/events",
        "/metrics",
        "/ui/",
    ] {
        assert!(paths.contains_key(expected), "{expected} is not documented");
    }
    for (path, item) in paths {
        let concrete = path
            .replace("{id}", "x")
            .replace("{name}", "legacy")
            .replace("{token}", "x");
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path} documents no response");
            let url = format!("{}{concrete}", app.address);
            let request = match method.as_str() {
                "get" => client.get(&url),
                "post" => client.post(&url).json(&json!({})),
                "delete" => client.delete(&url),
                other => panic!("undocumented method kind {other}"),
            };
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            assert!(
                responses.contains_key(&status.to_string()),
                "{method} {path} answered {status}, which it does not document"
            );
            let html = response
                .headers()
                .get("content-type")
                .is_some_and(|kind| kind.to_str().unwrap().starts_with("text/html"));
            if status == 404 && !html {
                let problem: Value = response.json().await.unwrap();
                assert_ne!(
                    problem["detail"], "no such resource",
                    "{method} {path} is documented but not routed"
                );
            }
        }
    }
}

#[tokio::test]
async fn errors_are_documented_as_problems() {
    let app = spawn_app(BOTH_ERAS).await;
    let document = app.get_json("/openapi.json").await;
    let answer = &document["paths"]["/requests/{id}/answer"]["post"]["responses"];
    for status in ["400", "404", "409", "410", "413", "415", "422"] {
        let content = &resolved(&document, &answer[status])["content"]["application/problem+json"]["schema"];
        assert_eq!(content["$ref"], "#/components/schemas/Problem", "{status}");
    }
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let bad_request = resolved(&document, &operation["responses"]["400"]);
            let description = bad_request["description"].as_str().unwrap_or_default();
            assert!(
                description.contains("more than one Host header"),
                "{method} {path}: {bad_request}"
            );
        }
    }
    let problem = &document["components"]["schemas"]["Problem"]["properties"];
    for field in ["type", "title", "status", "detail", "errors"] {
        assert!(problem.get(field).is_some(), "Problem lacks {field}");
    }
}

#[tokio::test]
async fn responses_every_route_shares_are_written_once_and_state_the_configured_limit() {
    let settings = format!("[http]\nmax_body_bytes = 4096\n{}", token_entry("admin", "admin"));
    let app = start_with(&settings, BOTH_ERAS, "");
    let document = app.get_json("/openapi.json").await;
    assert!(
        !document.to_string().contains("MiB"),
        "the document states no fixed body limit"
    );
    let shared = &document["components"]["responses"];
    let too_large = shared["BodyTooLarge"]["description"].as_str().unwrap();
    assert!(too_large.contains("4096 bytes (http.max_body_bytes)"), "{too_large}");
    let reference = |name: &str| json!({"$ref": format!("#/components/responses/{name}")});
    let mut with_body = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            let what = format!("{method} {path}");
            if let Some(body) = operation.get("requestBody") {
                with_body += 1;
                if body["content"].get("application/json").is_some() {
                    assert_eq!(responses["413"], reference("BodyTooLarge"), "{what}");
                    assert_eq!(responses["415"], reference("NotJson"), "{what}");
                } else {
                    assert!(
                        responses.get("413").is_some() && responses.get("415").is_none(),
                        "{what}"
                    );
                }
            } else {
                assert!(responses.get("413").is_none(), "{what}");
            }
            if operation.get("security").is_some() {
                assert_eq!(responses["401"], reference("Unauthorized"), "{what}");
            }
            // What every route may answer is only referred to, never written out again.
            let inline = |status: &str| responses[status]["description"].as_str().unwrap_or_default().to_owned();
            assert!(!inline("503").starts_with("The store cannot"), "{what}");
            assert!(!inline("403").starts_with("Forbidden: the role"), "{what}");
            assert!(!inline("400").starts_with("Bad Request: the request has"), "{what}");
            assert!(!inline("400").starts_with("A query parameter is invalid"), "{what}");
            assert!(
                !inline("429").starts_with("The principal holds as many responses"),
                "{what}"
            );
        }
    }
    assert_eq!(
        with_body, 5,
        "POST /requests, /requests/{{id}}/answer, /calls, /sessions and /r/{{token}} take a body"
    );
    assert_eq!(
        document["paths"]["/requests"]["get"]["responses"]["400"],
        reference("InvalidQuery")
    );
    assert_eq!(
        document["paths"]["/calls/{id}"]["get"]["responses"]["429"],
        reference("LongPollsHeld")
    );
    for name in [
        "InvalidQuery",
        "LongPollsHeld",
        "BodyTooLarge",
        "NotJson",
        "Unauthorized",
        "StoreUnavailable",
        "Forbidden",
        "MoreThanOneHost",
    ] {
        let content = &shared[name]["content"]["application/problem+json"]["schema"];
        assert_eq!(content["$ref"], "#/components/schemas/Problem", "{name}");
    }
}

/// The response a `$ref` into `#/components/responses/` names, or the response itself.
fn resolved<'a>(document: &'a Value, response: &'a Value) -> &'a Value {
    match response["$ref"].as_str() {
        Some(pointer) => document
            .pointer(pointer.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{pointer} is not in the document")),
        None => response,
    }
}

/// Links between operations name them by `operationId` (clients' generators too): two of one name would point
/// at the wrong operation.
#[tokio::test]
async fn every_operation_has_an_id_of_its_own() {
    let app = spawn_app(BOTH_ERAS).await;
    let document = app.get_json("/openapi.json").await;
    let mut seen = std::collections::HashMap::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if let Some(id) = operation["operationId"].as_str() {
                let before = seen.insert(id.to_owned(), format!("{method} {path}"));
                assert!(before.is_none(), "{id} names {method} {path} and {}", before.unwrap());
            }
        }
    }
    assert!(seen.len() > 20, "{seen:?}");
}
