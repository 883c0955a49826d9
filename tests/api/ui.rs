//! `/ui`: the inbox page and its assets come from the binary with their security headers.

use crate::helpers::spawn_app;

const DEMO: &str = "[[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\n";

#[tokio::test]
async fn the_inbox_and_its_assets_are_served_with_security_headers() {
    let app = spawn_app(DEMO).await;

    for (path, content_type) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/display.js", "text/javascript"),
        ("/ui/fields.js", "text/javascript"),
        ("/ui/edit.js", "text/javascript"),
        ("/ui/grants.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let response = app.get(path).await;
        assert_eq!(response.status(), 200, "GET {path}");
        let headers = response.headers();
        assert!(
            headers["content-type"].to_str().unwrap().starts_with(content_type),
            "{path}"
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        for directive in ["default-src 'none'", "script-src 'self';", "frame-ancestors 'none'"] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
    }
}

#[tokio::test]
async fn the_page_loads_only_its_own_assets() {
    let app = spawn_app(DEMO).await;

    let html = app.get("/ui/").await.text().await.unwrap();

    assert!(html.contains(r#"<script type="module" src="app.js"></script>"#));
    assert!(
        !html.contains("http:") && !html.contains("https:") && !html.contains("//"),
        "{html}"
    );
    let inline = |word: &str| word.starts_with("style=") || (word.starts_with("on") && word.contains('='));
    assert!(!html.split_whitespace().any(inline), "inline style or handler: {html}");
}

#[tokio::test]
async fn ui_without_a_slash_redirects_to_the_page() {
    let app = spawn_app(DEMO).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let response = client.get(format!("{}/ui", app.address)).send().await.unwrap();

    assert_eq!(response.status(), 308);
    assert_eq!(response.headers()["location"], "/ui/");
}
