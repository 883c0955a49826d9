//! The records the gateway keeps, as the REST API shows them: Requests, Calls, Sessions and the events that
//! report their changes.

mod call;
mod event;
mod request;
mod session;

pub use call::{CallError, CallFailure, CallFilter, CallStatus, CallView, Finish, ToolName};
pub use event::{Event, EventKind, Tags};
pub use request::{Filter, RequestView, Status};
pub use session::{SessionStatus, SessionView};
