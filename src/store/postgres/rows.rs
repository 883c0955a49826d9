//! Records as PostgreSQL rows: a row's columns as `store::rows` reads them, the columns of a call's read, and ids
//! bound as their text.

use std::error::Error;

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql, Type};

use crate::ids::{CallId, GrantId, RequestId, SessionId};
pub use crate::store::rows::{
    CALL_COLUMNS, EVENT, EVENT_COLUMNS, SESSION, call, decisions_json, event, session, to_json, to_json_opt,
};
use crate::store::rows::{Columns, Parse, call_columns, postgres_requests_of_call};

/// The columns `call` reads, in order (from `calls AS c`).
pub const CALL: &str = crate::store::sql::CALL_COLUMN_LIST.postgres;

/// [`CALL`], with the call's Requests gathered only where `condition` holds (NULL elsewhere): for a statement
/// that changes the call at each of its Requests' answers but returns it only when its status changed, so
/// that an answer to one of 20 000 does not gather all 20 000.
pub fn call_where(condition: &str) -> String {
    format!(
        call_columns!("CASE WHEN {} THEN {} END"),
        condition,
        postgres_requests_of_call!()
    )
}

impl Columns for Row {
    type Error = tokio_postgres::Error;

    fn text(&self, at: usize) -> Result<String, tokio_postgres::Error> {
        self.try_get(at)
    }

    fn text_opt(&self, at: usize) -> Result<Option<String>, tokio_postgres::Error> {
        self.try_get(at)
    }

    fn integer(&self, at: usize) -> Result<i64, tokio_postgres::Error> {
        self.try_get(at)
    }

    fn integer_opt(&self, at: usize) -> Result<Option<i64>, tokio_postgres::Error> {
        self.try_get(at)
    }

    fn parsed<P: Parse>(&self, at: usize) -> Result<P::Value, tokio_postgres::Error> {
        Ok(self.try_get::<_, Parsed<P>>(at)?.0)
    }

    fn parsed_opt<P: Parse>(&self, at: usize) -> Result<Option<P::Value>, tokio_postgres::Error> {
        Ok(self.try_get::<_, Option<Parsed<P>>>(at)?.map(|parsed| parsed.0))
    }
}

/// A column's text as `P` reads it: the driver reports what `P` refuses as the column's conversion error.
struct Parsed<P: Parse>(P::Value);

impl<'a, P: Parse> FromSql<'a> for Parsed<P> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        P::parse(<&str as FromSql>::from_sql(ty, raw)?).map(Parsed)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// The version of the row `table` names (a table or its alias) in a statement, as text: the transaction that wrote
/// it (`xmin`) and its place (`ctid`). Any write of the row after it, in another transaction or the same one,
/// leaves a version in another place, and the place of a version is free again only once its transaction has
/// ended, so a row whose version is still the one read or written is as it was then.
pub fn version(table: &str) -> String {
    format!("({table}.xmin::TEXT || {table}.ctid::TEXT)")
}

/// Ids are kept as their text.
macro_rules! id_columns {
    ($($id:ty),*) => {$(
        impl<'a> FromSql<'a> for $id {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
                <String as FromSql>::from_sql(ty, raw).map(<$id>::stored)
            }

            fn accepts(ty: &Type) -> bool {
                <String as FromSql>::accepts(ty)
            }
        }

        impl ToSql for $id {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }

            fn accepts(ty: &Type) -> bool {
                <&str as ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }
    )*};
}

id_columns!(CallId, GrantId, RequestId, SessionId);

#[cfg(test)]
mod tests {
    use crate::store::tests::connect_raw;

    /// A write of a row after the version read, in the same transaction, leaves another version.
    #[tokio::test]
    async fn a_second_write_in_the_same_transaction_is_another_version() {
        let client = connect_raw(&crate::test_postgres::shared().database()).await;
        client
            .batch_execute("CREATE TEMPORARY TABLE versioned (id INTEGER, n INTEGER); BEGIN")
            .await
            .unwrap();
        let version = super::version("versioned");
        let written: String = client
            .query_one(&format!("INSERT INTO versioned VALUES (1, 0) RETURNING {version}"), &[])
            .await
            .unwrap()
            .get(0);
        let same = format!("SELECT count(*) FROM versioned WHERE id = 1 AND {version} = $1");
        let count = async || -> i64 { client.query_one(&same, &[&written]).await.unwrap().get(0) };
        assert_eq!(count().await, 1);
        client
            .batch_execute("UPDATE versioned SET n = 1 WHERE id = 1")
            .await
            .unwrap();
        assert_eq!(count().await, 0, "the same transaction wrote the row again");
        client.batch_execute("COMMIT").await.unwrap();
        assert_eq!(count().await, 0);
    }
}
