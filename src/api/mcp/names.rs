//! The names the front door gives upstream tools: `{server}__{tool}`, fitted to what LLM APIs accept
//! (`^[A-Za-z0-9_-]{1,64}$`), and the map back from each name to its server and tool.

use std::collections::HashMap;

use rmcp::model::Tool;
use sha2::{Digest, Sha256};

/// The longest name LLM APIs accept.
pub const MAX_LEN: usize = 64;
/// Hex digits of the hash that ends a shortened name.
const HASH_LEN: usize = 8;

/// The name a tool gets: `{server}__{tool}` (just the tool without a server), every character outside
/// `A-Z a-z 0-9 _ -` replaced by `_`, and a name longer than 64 cut to 55 characters, `_` and 8 hex digits of
/// the SHA-256 of the whole name before it was fitted, so that two long names stay apart.
pub fn exposed(server: Option<&str>, tool: &str) -> String {
    let whole = match server {
        Some(server) => format!("{server}__{tool}"),
        None => tool.to_owned(),
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut name: String = whole.chars().map(|c| if allowed(c) { c } else { '_' }).collect();
    if name.len() > MAX_LEN {
        let digest = Sha256::digest(whole.as_bytes());
        let hash: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        name.truncate(MAX_LEN - HASH_LEN - 1);
        name.push('_');
        name.push_str(&hash[..HASH_LEN]);
    }
    name
}

/// Where a front-door tool name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub server: String,
    pub tool: String,
}

/// Two upstream tools (or an upstream tool and one of the gateway's own) that would get the same name;
/// neither is offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub name: String,
    pub first: String,
    pub second: String,
}

impl std::fmt::Display for Collision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} and {} would both be named {:?}; neither is offered",
            self.first, self.second, self.name
        )
    }
}

/// The tools the front door offers, renamed, and the map back from each name.
#[derive(Debug, Default)]
pub struct Catalog {
    pub tools: Vec<Tool>,
    routes: HashMap<String, Route>,
}

impl Catalog {
    /// The catalog of each server's tools, in order, with `reserved` names (the gateway's own tools) kept
    /// out; `prefixed` puts the server's name in front of each tool's. Tools whose names collide are left out
    /// and reported.
    pub fn build<'a>(
        lists: impl IntoIterator<Item = (&'a str, &'a [Tool])>,
        prefixed: bool,
        reserved: &[&str],
    ) -> (Self, Vec<Collision>) {
        let mut named: HashMap<String, (Route, Tool)> = HashMap::new();
        let mut order = Vec::new();
        let mut collisions = Vec::new();
        let mut withheld = std::collections::HashSet::new();
        let described = |route: &Route| format!("tool {:?} of server {:?}", route.tool, route.server);
        for (server, tools) in lists {
            for tool in tools {
                let name = exposed(prefixed.then_some(server), &tool.name);
                let route = Route {
                    server: server.to_owned(),
                    tool: tool.name.to_string(),
                };
                if reserved.contains(&name.as_str()) {
                    collisions.push(Collision {
                        first: format!("the gateway's own tool {name:?}"),
                        second: described(&route),
                        name,
                    });
                    continue;
                }
                if let Some((taken, _)) = named.get(&name) {
                    collisions.push(Collision {
                        first: described(taken),
                        second: described(&route),
                        name: name.clone(),
                    });
                    withheld.insert(name);
                    continue;
                }
                let mut renamed = tool.clone();
                renamed.name = name.clone().into();
                order.push(name.clone());
                named.insert(name, (route, renamed));
            }
        }
        let mut catalog = Catalog::default();
        for name in order {
            if withheld.contains(&name) {
                continue;
            }
            if let Some((route, tool)) = named.remove(&name) {
                catalog.tools.push(tool);
                catalog.routes.insert(name, route);
            }
        }
        (catalog, collisions)
    }

    /// The server and tool a name leads to.
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
    }

    /// Whether `tool` of `server`, as offered, declares an `outputSchema`.
    pub fn declares_output(&self, server: &str, tool: &str) -> bool {
        self.tools.iter().any(|offered| {
            offered.output_schema.is_some()
                && self
                    .route(&offered.name)
                    .is_some_and(|route| route.server == server && route.tool == tool)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tool(name: &str) -> Tool {
        Tool::new(name.to_owned(), "d", Arc::new(serde_json::Map::new()))
    }

    fn fits(name: &str) -> bool {
        (1..=MAX_LEN).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn names_are_prefixed_and_fitted_to_what_llm_apis_accept() {
        assert_eq!(exposed(Some("demo"), "echo"), "demo__echo");
        assert_eq!(exposed(None, "echo"), "echo");
        assert_eq!(exposed(Some("files.v2"), "read.file"), "files_v2__read_file");
        let long = "x".repeat(100);
        let shortened = exposed(Some("demo"), &long);
        assert_eq!(shortened.len(), MAX_LEN);
        assert!(fits(&shortened), "{shortened}");
        assert_eq!(shortened, exposed(Some("demo"), &long), "the same name every time");
        let other = exposed(Some("demo"), &format!("{long}y"));
        assert_ne!(shortened, other, "long names that differ only past the cut stay apart");
        assert!(fits(&exposed(Some("s"), &"é".repeat(70))));
        assert_eq!(exposed(None, &"a".repeat(MAX_LEN)), "a".repeat(MAX_LEN));
    }

    #[test]
    fn the_map_leads_back_to_server_and_tool_without_splitting_names() {
        let demo = [tool("echo"), tool("a__b")];
        let files = [tool("read.file")];
        let (catalog, collisions) = Catalog::build([("demo", &demo[..]), ("files", &files[..])], true, &[]);
        assert!(collisions.is_empty());
        let names: Vec<&str> = catalog.tools.iter().map(|tool| tool.name.as_ref()).collect();
        assert_eq!(names, ["demo__echo", "demo__a__b", "files__read_file"]);
        let route = catalog.route("demo__a__b").unwrap();
        assert_eq!((route.server.as_str(), route.tool.as_str()), ("demo", "a__b"));
        assert_eq!(catalog.route("files__read_file").unwrap().tool, "read.file");
        assert!(catalog.route("files__read.file").is_none());
        let (unprefixed, _) = Catalog::build([("demo", &demo[..])], false, &[]);
        assert_eq!(unprefixed.route("echo").unwrap().server, "demo");
    }

    #[test]
    fn colliding_names_are_withheld_and_reported_naming_both() {
        let tools = [tool("read.file"), tool("read_file"), tool("other")];
        let gateway = [tool("await_call")];
        let (catalog, collisions) = Catalog::build(
            [("s", &tools[..]), ("gateway", &gateway[..])],
            true,
            &["gateway__await_call"],
        );
        let names: Vec<&str> = catalog.tools.iter().map(|tool| tool.name.as_ref()).collect();
        assert_eq!(names, ["s__other"]);
        assert_eq!(collisions.len(), 2);
        let message = collisions[0].to_string();
        assert!(
            message.contains("\"read.file\"") && message.contains("\"read_file\""),
            "{message}"
        );
        assert!(collisions[1].to_string().contains("gateway's own"), "{}", collisions[1]);
    }
}
