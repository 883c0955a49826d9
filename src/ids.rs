//! Opaque, unguessable identifiers: a resource prefix followed by a UUID v7.

/// Prefix of Request ids minted by the elicitation bridge.
pub const REQUEST: &str = "elc-";
/// Prefix of Request ids minted for Requests posted to `POST /requests`.
pub const POSTED: &str = "req-";
/// Prefix of the ids of approval Requests, raised before a call an approval policy covers is forwarded.
pub const APPROVAL: &str = "apv-";
/// Prefix of Call ids.
pub const CALL: &str = "call-";
/// Prefix of Session ids.
pub const SESSION: &str = "ses-";

/// Mints a fresh id with the given prefix.
pub fn mint(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_unique() {
        let a = mint(CALL);
        let b = mint(CALL);
        assert!(a.starts_with("call-"));
        assert_ne!(a, b);
    }
}
