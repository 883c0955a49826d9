//! `GET /openapi.json` describes every route, and every route it describes exists.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, spawn_app};

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
        let concrete = path.replace("{id}", "x").replace("{name}", "legacy");
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
            if status == 404 {
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
        let content = &answer[status]["content"]["application/problem+json"]["schema"];
        assert_eq!(content["$ref"], "#/components/schemas/Problem", "{status}");
    }
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let bad_request = &operation["responses"]["400"];
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
