//! API tests: gateways on port 0 with a temp config, in this process or as the real binary, driven over HTTP
//! as curl would.

mod answers;
mod approvals;
mod audit;
mod auth;
mod bounds;
mod calls;
#[allow(dead_code, reason = "the durable server and its counts are for the bench")]
#[path = "../../src/test_postgres.rs"]
mod cluster;
mod connections;
mod edits;
mod events;
mod front_door;
mod grants;
mod helpers;
mod history;
mod hostile;
mod injection;
mod integrity;
mod lifecycle;
mod limits;
mod links;
mod notify;
mod oidc;
mod openapi;
mod operations;
mod peers;
mod posted;
mod postgres;
mod races;
mod replicas;
mod restart;
mod sessions;
mod store;
mod tasks;
mod ui;
mod waits;
mod webhooks;
