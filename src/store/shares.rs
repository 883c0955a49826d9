//! What pending Requests hold — how many, and how many bytes — in all, per principal and per server, and
//! the caps a new Request must fit: no principal and no server can take the whole of the pending cap; and how
//! many calls each principal runs, which `limits.calls_per_principal` caps.

use std::collections::HashMap;

use super::NewRequest;

/// The caps on pending Requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCaps {
    /// Pending Requests in all.
    pub total: usize,
    /// Pending Requests owned by one principal (owner-less ones count as one more principal).
    pub per_principal: usize,
    /// Pending Requests raised by one server.
    pub per_server: usize,
    /// Bytes held by pending Requests in all.
    pub bytes: usize,
    /// Bytes held by the pending Requests of one principal.
    pub bytes_per_principal: usize,
}

impl PendingCaps {
    /// No cap at all.
    pub const NONE: Self = Self {
        total: usize::MAX,
        per_principal: usize::MAX,
        per_server: usize::MAX,
        bytes: usize::MAX,
        bytes_per_principal: usize::MAX,
    };
}

/// The cap that new Requests would pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PendingCap {
    #[error("{0} Requests are pending already, the most the gateway holds (requests.max_pending)")]
    Total(usize),
    #[error("the principal has {0} Requests pending, its share (requests.max_pending_per_principal)")]
    Principal(usize),
    #[error("the server has {0} Requests pending, its share (requests.max_pending_per_server)")]
    Server(usize),
    #[error("pending Requests hold {0} bytes, the most the gateway holds (requests.max_pending_bytes)")]
    Bytes(usize),
    #[error("the principal's pending Requests hold {0} bytes, its share of requests.max_pending_bytes")]
    PrincipalBytes(usize),
}

/// The server a Request counts against: `""` for a posted one, which no server's cap covers.
pub fn server_key(request: &NewRequest) -> &str {
    request.server.as_deref().unwrap_or_default()
}

/// How many records, and how many bytes they hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct Held {
    pub count: usize,
    pub bytes: usize,
}

impl Held {
    /// Counts one more record of `bytes`.
    pub fn add(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes;
    }

    /// Counts one record of `bytes` less.
    pub fn release(&mut self, bytes: usize) {
        self.count = self.count.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// Whether it holds more than `most` allows, in count or in bytes.
    pub fn exceeds(&self, most: &Held) -> bool {
        self.count > most.count || self.bytes > most.bytes
    }
}

/// What pending Requests hold, in all and by holder.
#[derive(Debug, Clone, Default)]
pub struct Shares {
    total: Held,
    principals: HashMap<Option<String>, Held>,
    servers: HashMap<String, Held>,
}

impl Shares {
    /// Counts one more pending Request.
    pub fn add(&mut self, owner: Option<&str>, server: &str, bytes: usize) {
        for held in [
            &mut self.total,
            self.principals.entry(owner.map(str::to_owned)).or_default(),
            self.servers.entry(server.to_owned()).or_default(),
        ] {
            held.add(bytes);
        }
    }

    /// Counts one pending Request less.
    pub fn remove(&mut self, owner: Option<&str>, server: &str, bytes: usize) {
        self.total.release(bytes);
        let owner = owner.map(str::to_owned);
        if let Some(held) = self.principals.get_mut(&owner) {
            held.release(bytes);
            if held.count == 0 {
                self.principals.remove(&owner);
            }
        }
        if let Some(held) = self.servers.get_mut(server) {
            held.release(bytes);
            if held.count == 0 {
                self.servers.remove(server);
            }
        }
    }

    /// What `total` and the `(owner, server, held)` pairs say pending Requests hold: a principal's or a
    /// server's share is the sum of its pairs, so every pair of those asked about must be given.
    pub fn from_pairs(total: Held, pairs: impl IntoIterator<Item = (Option<String>, String, Held)>) -> Self {
        let mut shares = Self {
            total,
            ..Self::default()
        };
        for (owner, server, held) in pairs {
            for into in [
                shares.principals.entry(owner).or_default(),
                shares.servers.entry(server).or_default(),
            ] {
                into.count += held.count;
                into.bytes += held.bytes;
            }
        }
        shares
    }

    /// Whether `new` fits the caps on top of what is held.
    pub fn admit(&self, new: &[NewRequest], caps: &PendingCaps) -> Result<(), PendingCap> {
        let mut after = self.clone();
        for request in new {
            after.add(request.owner.as_deref(), server_key(request), request.bytes);
        }
        if after.total.count > caps.total {
            return Err(PendingCap::Total(caps.total));
        }
        if after.total.bytes > caps.bytes {
            return Err(PendingCap::Bytes(caps.bytes));
        }
        for request in new {
            let principal = &after.principals[&request.owner];
            if principal.count > caps.per_principal {
                return Err(PendingCap::Principal(caps.per_principal));
            }
            if principal.bytes > caps.bytes_per_principal {
                return Err(PendingCap::PrincipalBytes(caps.bytes_per_principal));
            }
            if request.server.is_some() && after.servers[server_key(request)].count > caps.per_server {
                return Err(PendingCap::Server(caps.per_server));
            }
        }
        Ok(())
    }
}

/// How many calls that have not ended each principal has.
#[derive(Debug, Clone, Default)]
pub struct Running(HashMap<String, usize>);

impl Running {
    /// How many `owner` has.
    pub fn of(&self, owner: &str) -> usize {
        self.0.get(owner).copied().unwrap_or(0)
    }

    /// Counts one more call of `owner`.
    pub fn start(&mut self, owner: &str) {
        match self.0.get_mut(owner) {
            Some(running) => *running += 1,
            None => {
                self.0.insert(owner.to_owned(), 1);
            }
        }
    }

    /// Counts one call of `owner` less.
    pub fn end(&mut self, owner: &str) {
        if let Some(running) = self.0.get_mut(owner) {
            *running -= 1;
            if *running == 0 {
                self.0.remove(owner);
            }
        }
    }
}
