//! Where the store keeps its state, as `[store] url` names it.

use std::path::PathBuf;

/// Where the store keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// In process memory: lost when the process ends.
    Memory,
    /// In a SQLite database file.
    Sqlite(PathBuf),
    /// In a PostgreSQL database, by its `postgres://` URL.
    Postgres(String),
}

/// Why a store URL is refused. It does not quote the URL: a database URL holds a password, and in one that does
/// not parse nothing shows where the password is, to mask it.
const NOT_A_LOCATION: &str =
    "expected \"memory\", \"sqlite:PATH\" (a database file) or \"postgres://…\" (a PostgreSQL database)";

impl Location {
    /// Parses `memory`, `sqlite:PATH`, or a `postgres://` (`postgresql://`) URL; the error does not quote `url`.
    pub fn parse(url: &str) -> Result<Self, String> {
        if url == "memory" {
            return Ok(Location::Memory);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Location::Postgres(url.to_owned()));
        }
        match url.strip_prefix("sqlite:") {
            Some(path) if !path.is_empty() => Ok(Location::Sqlite(PathBuf::from(path))),
            _ => Err(NOT_A_LOCATION.to_owned()),
        }
    }

    /// The URL that parses back to this location.
    pub fn url(&self) -> String {
        match self {
            Location::Memory => "memory".to_owned(),
            Location::Sqlite(path) => format!("sqlite:{}", path.display()),
            Location::Postgres(url) => url.clone(),
        }
    }
}
