//! What both SQL engines' migration runners decide alike: which migrations a database still needs, and the
//! refusal of one written by a newer build. Each engine runs them its own way (`sqlite::migrate`,
//! `postgres::migrate`): one transaction per migration, recording the version it brings the schema to.

/// The migrations a database at schema `version` still needs, each with the version it brings the schema to;
/// a database of a newer schema than `migrations` know is refused, `store` naming what to give instead.
pub fn pending<'m>(migrations: &[&'m str], version: i64, store: &str) -> Result<Vec<(i64, &'m str)>, String> {
    let known = i64::try_from(migrations.len()).expect("a handful of migrations");
    if version > known {
        return Err(format!(
            "its schema is version {version}, newer than this build knows ({known}): it was written by a newer \
             toolnexus-gateway; run that version, or give this one another {store}"
        ));
    }
    Ok((version.max(0)..known)
        .map(|from| (from + 1, migrations[usize::try_from(from).unwrap_or(0)]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_gets_the_migrations_past_its_version_and_one_too_new_is_refused() {
        let migrations = ["one", "two", "three"];
        assert_eq!(
            pending(&migrations, 0, "store").unwrap(),
            [(1, "one"), (2, "two"), (3, "three")]
        );
        assert_eq!(pending(&migrations, 2, "store").unwrap(), [(3, "three")]);
        assert!(pending(&migrations, 3, "store").unwrap().is_empty());
        let refused = pending(&migrations, 4, "database").unwrap_err();
        assert!(
            refused.contains("version 4, newer than this build knows (3)"),
            "{refused}"
        );
        assert!(refused.ends_with("another database"), "{refused}");
    }
}
