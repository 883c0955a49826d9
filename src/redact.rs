//! Secrets in configured URLs: a URL's userinfo and query values (`https://user:pass@host/?key=…`) are
//! credentials, so wherever a URL is shown or logged it appears masked, and a message that quotes it (an HTTP
//! client's error names the URL it failed on) has the secrets taken out.

const MASK: &str = "***";

/// `url` with its userinfo and the value of each query parameter replaced by `***`.
pub fn url(url: &str) -> String {
    let parts = Parts::of(url);
    let mut shown = String::with_capacity(url.len());
    shown.push_str(parts.scheme);
    if parts.userinfo.is_some() {
        shown.push_str(MASK);
        shown.push('@');
    }
    shown.push_str(parts.rest);
    if let Some(query) = parts.query {
        shown.push('?');
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}={MASK}"),
                None if pair.is_empty() => String::new(),
                None => MASK.to_owned(),
            })
            .collect();
        shown.push_str(&masked.join("&"));
    }
    if let Some(fragment) = parts.fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

/// The secrets of one URL, to take out of any text that may quote it.
#[derive(Debug, Clone, Default)]
pub struct Secrets(Vec<String>);

impl Secrets {
    /// The userinfo and query values of `url`.
    pub fn of_url(url: &str) -> Self {
        let parts = Parts::of(url);
        let mut secrets = Vec::new();
        if let Some(userinfo) = parts.userinfo {
            secrets.push(userinfo.to_owned());
            secrets.extend(userinfo.split(':').map(str::to_owned));
        }
        if let Some(query) = parts.query {
            secrets.push(query.to_owned());
            for pair in query.split('&') {
                secrets.push(pair.split_once('=').map_or(pair, |(_, value)| value).to_owned());
            }
        }
        // Longest first, so that a whole query goes before the values within it; a character or two is no secret
        // and masking it would mangle the text.
        secrets.retain(|secret| secret.len() >= 3);
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        secrets.dedup();
        Self(secrets)
    }

    /// The secrets of a database URL: its password and query values, not its user name, which is no secret and
    /// often a word (`postgres`) that masking would take out of every line.
    pub fn of_database_url(url: &str) -> Self {
        let parts = Parts::of(url);
        let password = parts
            .userinfo
            .and_then(|userinfo| userinfo.split_once(':'))
            .map(|(_, password)| password);
        let without_user = format!("{}:{}@{}", parts.scheme, password.unwrap_or_default(), parts.rest);
        let query = parts.query.map(|query| format!("?{query}")).unwrap_or_default();
        Self::of_url(&format!("{without_user}{query}"))
    }

    /// Adds the secrets of `other`.
    pub fn and(mut self, other: Self) -> Self {
        self.0.extend(other.0);
        self.0.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        self.0.dedup();
        self
    }

    /// The secrets of every URL in `urls`.
    pub fn of_urls<'a>(urls: impl IntoIterator<Item = &'a str>) -> Self {
        let mut secrets: Vec<String> = urls.into_iter().flat_map(|url| Self::of_url(url).0).collect();
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        secrets.dedup();
        Self(secrets)
    }

    /// `text` with every secret replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), MASK);
            }
        }
        text
    }
}

/// A writer that takes the configured URLs' secrets out of what it writes (libraries log the URLs they fail
/// on, and their errors quote them). Each write is taken whole: the log formatter writes one event at once.
pub struct Scrubbed<W> {
    secrets: std::sync::Arc<Secrets>,
    inner: W,
}

impl<W> Scrubbed<W> {
    pub fn new(secrets: &std::sync::Arc<Secrets>, inner: W) -> Self {
        Self {
            secrets: secrets.clone(),
            inner,
        }
    }
}

impl<W: std::io::Write> std::io::Write for Scrubbed<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.secrets.0.is_empty() {
            self.inner.write_all(bytes)?;
        } else {
            let text = String::from_utf8_lossy(bytes);
            self.inner.write_all(self.secrets.scrub(&text).as_bytes())?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A URL cut where its secrets begin and end: `scheme://` `userinfo@` `host/path` `?query` `#fragment`.
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    rest: &'a str,
    query: Option<&'a str>,
    fragment: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn of(url: &'a str) -> Self {
        let (before_fragment, fragment) = match url.split_once('#') {
            Some((before, fragment)) => (before, Some(fragment)),
            None => (url, None),
        };
        let (before_query, query) = match before_fragment.split_once('?') {
            Some((before, query)) => (before, Some(query)),
            None => (before_fragment, None),
        };
        let scheme_end = before_query.find("://").map_or(0, |at| at + 3);
        let (scheme, after_scheme) = before_query.split_at(scheme_end);
        let authority_end = after_scheme.find('/').unwrap_or(after_scheme.len());
        let (userinfo, rest) = match after_scheme[..authority_end].rfind('@') {
            Some(at) => (Some(&after_scheme[..at]), &after_scheme[at + 1..]),
            None => (None, after_scheme),
        };
        Self {
            scheme,
            userinfo,
            rest,
            query,
            fragment,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_credentials_or_query_values() {
        assert_eq!(
            url("https://ada:pw@example.com:8443/mcp?key=s3cret&flag&x=1#top"),
            "https://***@example.com:8443/mcp?key=***&***&x=***#top"
        );
        assert_eq!(url("http://127.0.0.1:9/mcp"), "http://127.0.0.1:9/mcp");
        assert_eq!(
            url("http://host/a@b"),
            "http://host/a@b",
            "an @ in the path is no userinfo"
        );
    }

    #[test]
    fn a_message_quoting_the_url_loses_its_secrets() {
        let secrets = Secrets::of_url("https://ada:pw-123@example.com/mcp?key=s3cret&other=abcd");
        let message = "error sending request for url (https://ada:pw-123@example.com/mcp?key=s3cret&other=abcd)";
        let scrubbed = secrets.scrub(message);
        for secret in ["pw-123", "s3cret", "abcd", "ada:"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("example.com/mcp"), "{scrubbed}");
    }

    #[test]
    fn a_database_url_gives_up_its_password_and_keeps_its_user_name() {
        let secrets = Secrets::of_database_url("postgres://postgres:hunter-22@db:5432/gw?sslmode=disable");
        let scrubbed = secrets.scrub("postgres: password hunter-22 refused; sslmode disable");
        assert_eq!(scrubbed, "postgres: password *** refused; sslmode ***");
        let none = Secrets::of_database_url("postgres://postgres@db/gw");
        assert_eq!(none.scrub("postgres@db"), "postgres@db");
    }
}
