//! The records the gateway keeps, as the REST API shows them: Requests, Calls, Sessions and the events that
//! report their changes.

mod call;
mod event;
mod grant;
mod request;
mod session;

pub use call::{
    Allowed, Arguments, CallError, CallFailure, CallFilter, CallStatus, CallTask, CallView, Finish, ToolName, Via,
};
pub use event::{Event, EventKind, Tags};
pub use grant::{Asked, GrantUse, GrantView, NewGrant, SESSION_GRANT_LIMIT};
pub use request::{Answerer, DecisionFilter, Filter, RequestView, Signoff, Status};
pub use session::{SessionFilter, SessionStatus, SessionView};

/// The length of `value` as JSON, without writing it out.
pub fn json_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
