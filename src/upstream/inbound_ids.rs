//! The ids of an HTTP upstream's requests to the gateway (its elicitations), renamed on their way in.
//!
//! rmcp's client re-initializes an HTTP session whose server forgot it (a restarted server answers `404`)
//! under the same service, and the new server numbers its requests from the start again. rmcp keeps a
//! handler per request id, so the new server's request `0` would take the place of the old one's: the old
//! handler's reply would then cancel the new handler and reach the new server as its answer. Each request
//! from the upstream is therefore given an id of the gateway's own, unique for the session's life, and
//! renamed back on the reply. Once the session is re-initialized (rmcp fails the calls in flight saying so,
//! before anything of the new server comes in) or a request arrives under an id still open, the server is a
//! new one: the replies still owed to the previous one are dropped, as nobody is left to take them.

use std::collections::HashMap;

use rmcp::RoleClient;
use rmcp::model::{JsonRpcMessage, RequestId, ServerNotification};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};

/// How rmcp fails a request in flight when it re-initializes the session.
const REINITIALIZED: &str = "streamable HTTP session was re-initialized before the response arrived";

/// The upstream's requests still owed a reply, under the ids the gateway gave them.
#[derive(Default)]
pub struct InboundIds {
    /// The next id the gateway gives.
    next: i64,
    /// Which server the open requests came from: it changes with the session's re-initialization, or a request
    /// under an id still open.
    server: u64,
    /// Each open request's id as the upstream sent it, and its server, by the gateway's id.
    open: HashMap<i64, (RequestId, u64)>,
    /// The gateway's id of each open request of the current server, by the upstream's id.
    current: HashMap<RequestId, i64>,
}

impl InboundIds {
    /// Renames a request from the upstream, and the request a cancellation from it names.
    pub fn receive(&mut self, message: &mut RxJsonRpcMessage<RoleClient>) {
        match message {
            JsonRpcMessage::Request(request) => {
                if self.current.contains_key(&request.id) {
                    self.new_server();
                }
                let ours = self.next;
                self.next += 1;
                let theirs = std::mem::replace(&mut request.id, RequestId::Number(ours));
                self.current.insert(theirs.clone(), ours);
                self.open.insert(ours, (theirs, self.server));
            }
            JsonRpcMessage::Notification(notification) => {
                // rmcp drops the reply to a request its sender withdrew, so the id is free again for the upstream.
                if let ServerNotification::CancelledNotification(cancelled) = &mut notification.notification
                    && let Some(id) = &mut cancelled.params.request_id
                    && let Some(ours) = self.current.remove(id)
                {
                    self.open.remove(&ours);
                    *id = RequestId::Number(ours);
                }
            }
            JsonRpcMessage::Error(error) if error.error.message == REINITIALIZED => self.new_server(),
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
        }
    }

    /// The requests open so far are owed to a server that is gone.
    fn new_server(&mut self) {
        self.server += 1;
        self.current.clear();
    }

    /// Renames a reply back to the upstream's id; whether it is still to be sent (not if it answers a
    /// previous server).
    pub fn send(&mut self, message: &mut TxJsonRpcMessage<RoleClient>) -> bool {
        let id = match message {
            JsonRpcMessage::Response(response) => &mut response.id,
            JsonRpcMessage::Error(error) => match &mut error.id {
                Some(id) => id,
                None => return true,
            },
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => return true,
        };
        let RequestId::Number(ours) = *id else {
            return true;
        };
        let Some((theirs, server)) = self.open.remove(&ours) else {
            return true;
        };
        if server != self.server {
            return false;
        }
        self.current.remove(&theirs);
        *id = theirs;
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn elicitation(id: i64) -> RxJsonRpcMessage<RoleClient> {
        serde_json::from_value(json!({
            "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
            "params": {"message": "Confirm?", "requestedSchema": {"type": "object", "properties": {}}}
        }))
        .unwrap()
    }

    fn id_of(message: &RxJsonRpcMessage<RoleClient>) -> RequestId {
        match message {
            JsonRpcMessage::Request(request) => request.id.clone(),
            _ => panic!("not a request"),
        }
    }

    fn reply(id: RequestId) -> TxJsonRpcMessage<RoleClient> {
        serde_json::from_value(json!({"jsonrpc": "2.0", "id": id, "result": {"action": "cancel"}})).unwrap()
    }

    fn replied_id(message: &TxJsonRpcMessage<RoleClient>) -> RequestId {
        match message {
            JsonRpcMessage::Response(response) => response.id.clone(),
            _ => panic!("not a response"),
        }
    }

    #[test]
    fn a_reply_goes_back_under_the_upstreams_id() {
        let mut ids = InboundIds::default();
        let mut first = elicitation(0);
        ids.receive(&mut first);
        let mut second = elicitation(1);
        ids.receive(&mut second);
        assert_ne!(id_of(&first), id_of(&second));
        let mut answer = reply(id_of(&second));
        assert!(ids.send(&mut answer));
        assert_eq!(replied_id(&answer), RequestId::Number(1));
    }

    #[test]
    fn a_new_server_reusing_an_open_id_gets_its_own_and_the_old_reply_is_dropped() {
        let mut ids = InboundIds::default();
        let mut old = elicitation(0);
        ids.receive(&mut old);
        let mut new = elicitation(0);
        ids.receive(&mut new);
        assert_ne!(id_of(&old), id_of(&new), "rmcp would take one handler for the other");
        assert!(
            !ids.send(&mut reply(id_of(&old))),
            "the old server's reply reached the new one"
        );
        let mut answer = reply(id_of(&new));
        assert!(ids.send(&mut answer));
        assert_eq!(replied_id(&answer), RequestId::Number(0));
    }

    #[test]
    fn once_the_session_is_re_initialized_no_reply_owed_to_the_old_server_is_sent() {
        let mut ids = InboundIds::default();
        let mut old = elicitation(0);
        ids.receive(&mut old);
        let mut failed: RxJsonRpcMessage<RoleClient> = serde_json::from_value(json!({
            "jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": REINITIALIZED}
        }))
        .unwrap();
        ids.receive(&mut failed);
        assert!(!ids.send(&mut reply(id_of(&old))));
    }

    #[test]
    fn a_cancellation_names_the_gateways_id_of_the_request_and_frees_the_upstreams() {
        let mut ids = InboundIds::default();
        let mut request = elicitation(7);
        ids.receive(&mut request);
        let mut cancelled: RxJsonRpcMessage<RoleClient> = serde_json::from_value(json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}
        }))
        .unwrap();
        ids.receive(&mut cancelled);
        let JsonRpcMessage::Notification(notification) = cancelled else {
            panic!("not a notification")
        };
        let ServerNotification::CancelledNotification(cancelled) = notification.notification else {
            panic!("not a cancellation")
        };
        assert_eq!(cancelled.params.request_id, Some(id_of(&request)));

        // The upstream may use the id again, and that is not a new server: replies to others still go.
        let mut other = elicitation(8);
        ids.receive(&mut other);
        let mut again = elicitation(7);
        ids.receive(&mut again);
        let mut answer = reply(id_of(&other));
        assert!(ids.send(&mut answer));
        assert_eq!(replied_id(&answer), RequestId::Number(8));
    }
}
