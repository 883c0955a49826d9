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

    /// These caps with room left for `held` more: each count cap `held.count` lower, each byte cap
    /// `held.bytes` lower.
    pub fn less(&self, held: Held) -> Self {
        Self {
            total: self.total.saturating_sub(held.count),
            per_principal: self.per_principal.saturating_sub(held.count),
            per_server: self.per_server.saturating_sub(held.count),
            bytes: self.bytes.saturating_sub(held.bytes),
            bytes_per_principal: self.bytes_per_principal.saturating_sub(held.bytes),
        }
    }

    /// The caps that `new` must fit, in the order they are checked: on pending Requests in all, then on the share
    /// of each principal and each server that `new` adds to.
    pub fn limits(&self, new: &[NewRequest]) -> Vec<Limit> {
        let mut limits = vec![Limit {
            holder: Holder::All,
            adds: Held::default(),
            most: Held {
                count: self.total,
                bytes: self.bytes,
            },
        }];
        for request in new {
            let principal = Holder::Principal(request.owner.clone());
            let server = request
                .server
                .is_some()
                .then(|| Holder::Server(server_key(request).to_owned()));
            for holder in [Some(principal), server].into_iter().flatten() {
                if limits.iter().any(|limit| limit.holder == holder) {
                    continue;
                }
                let most = match holder {
                    Holder::Server(_) => Held {
                        count: self.per_server,
                        bytes: usize::MAX,
                    },
                    _ => Held {
                        count: self.per_principal,
                        bytes: self.bytes_per_principal,
                    },
                };
                limits.push(Limit {
                    holder,
                    adds: Held::default(),
                    most,
                });
            }
        }
        for request in new {
            for limit in limits.iter_mut().filter(|limit| limit.holder.holds(request)) {
                limit.adds.add(request.bytes);
            }
        }
        limits
    }
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub count: usize,
    pub bytes: usize,
}

impl Held {
    /// What `times` of this hold.
    pub fn times(self, times: usize) -> Held {
        Held {
            count: self.count.saturating_mul(times),
            bytes: self.bytes.saturating_mul(times),
        }
    }

    /// What this and `other` hold together.
    pub fn plus(self, other: Held) -> Held {
        Held {
            count: self.count.saturating_add(other.count),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }

    /// What this holds beyond `other`.
    pub fn less(self, other: Held) -> Held {
        Held {
            count: self.count.saturating_sub(other.count),
            bytes: self.bytes.saturating_sub(other.bytes),
        }
    }

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

    /// Whether `new` fits the caps on top of what is held.
    pub fn admit(&self, new: &[NewRequest], caps: &PendingCaps) -> Result<(), PendingCap> {
        caps.limits(new)
            .iter()
            .try_for_each(|limit| limit.admits(self.held(&limit.holder)))
    }

    /// What `holder`'s pending Requests hold.
    fn held(&self, holder: &Holder) -> Held {
        let held = match holder {
            Holder::All => Some(&self.total),
            Holder::Principal(owner) => self.principals.get(owner),
            Holder::Server(server) => self.servers.get(server),
        };
        held.copied().unwrap_or_default()
    }
}

/// Whose pending Requests a cap counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    All,
    /// A principal's (`None`: the owner-less ones, as one more principal).
    Principal(Option<String>),
    /// A server's.
    Server(String),
}

impl Holder {
    /// Whether it holds `request` once pending.
    fn holds(&self, request: &NewRequest) -> bool {
        match self {
            Holder::All => true,
            Holder::Principal(owner) => request.owner == *owner,
            Holder::Server(server) => request.server.is_some() && server_key(request) == server,
        }
    }

    /// The cap passed when it would hold more than `most`, in bytes or in count.
    fn over(&self, most: Held, bytes: bool) -> PendingCap {
        match (self, bytes) {
            (Holder::All, false) => PendingCap::Total(most.count),
            (Holder::All, true) => PendingCap::Bytes(most.bytes),
            (Holder::Principal(_), false) => PendingCap::Principal(most.count),
            (Holder::Principal(_), true) => PendingCap::PrincipalBytes(most.bytes),
            // A server's share has no cap in bytes.
            (Holder::Server(_), _) => PendingCap::Server(most.count),
        }
    }
}

/// A cap that new Requests must fit: what they add to `holder`'s share, and the most that share may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub holder: Holder,
    pub adds: Held,
    pub most: Held,
}

impl Limit {
    /// Whether the new Requests fit, on top of `held`, what the holder holds.
    pub fn admits(&self, held: Held) -> Result<(), PendingCap> {
        let after = held.plus(self.adds);
        if after.count > self.most.count {
            return Err(self.holder.over(self.most, false));
        }
        if after.bytes > self.most.bytes {
            return Err(self.holder.over(self.most, true));
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

/// One replica's part of a principal's running calls, in a store that replicas share: the calls it counts
/// (those that started there, less those that ended there: fewer than none when others' calls end there), and
/// its allowance, up to which it counts calls starting there without asking the others (`cap` is the cap it
/// was dealt under). Whatever the replicas do within their allowances, no more than the cap run at once: a row
/// never counts past its allowance, and the rows' allowances, or counts where higher, add up to the cap at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    pub replica: String,
    pub calls: i64,
    pub allowance: i64,
    pub cap: i64,
}

/// Deals a principal's cap of `cap` running calls again, for replica `me`, whose allowance is spent, from every
/// replica's part as `parts` hold it (none of which changes meanwhile). Each other replica keeps what it has not
/// used of its allowance (all calls are counted in `me`'s part from now on), unless nothing is left to deal,
/// when they give it back; `me` takes half of what is left (one at least). It returns every part as it now
/// is, or the calls the principal has running when they are `cap` already.
pub fn deal(cap: i64, parts: &[Allowance], me: &str) -> Result<Vec<Allowance>, i64> {
    let running: i64 = parts.iter().map(|part| part.calls).sum();
    if running >= cap {
        return Err(running);
    }
    let mut dealt: Vec<Allowance> = parts
        .iter()
        .filter(|part| part.replica != me)
        .map(|part| Allowance {
            calls: 0,
            allowance: (part.allowance - part.calls).max(0),
            ..part.clone()
        })
        .collect();
    let kept = dealt
        .iter()
        .fold(0_i64, |kept, part| kept.saturating_add(part.allowance));
    let mut left = cap.saturating_sub(running).saturating_sub(kept);
    if left < 1 {
        for part in &mut dealt {
            part.allowance = 0;
        }
        left = cap.saturating_sub(running);
    }
    dealt.push(Allowance {
        replica: me.to_owned(),
        calls: running,
        allowance: running.saturating_add(left - left / 2),
        cap,
    });
    Ok(dealt)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Allowance, deal};

    fn part(replica: &str, calls: i64, allowance: i64) -> Allowance {
        Allowance {
            replica: replica.to_owned(),
            calls,
            allowance,
            cap: 10,
        }
    }

    #[test]
    fn a_replica_takes_half_of_what_is_left_and_the_others_keep_what_they_have_not_used() {
        let parts = [part("a", 3, 5), part("b", 2, 2), part("c", -1, 0)];
        assert_eq!(
            deal(10, &parts, "b"),
            Ok(vec![part("a", 0, 2), part("c", 0, 1), part("b", 4, 6)])
        );
    }

    #[test]
    fn with_nothing_left_the_others_give_back_what_they_have_not_used() {
        let parts = [part("a", 3, 8), part("b", 2, 2)];
        assert_eq!(deal(10, &parts, "b"), Ok(vec![part("a", 0, 0), part("b", 5, 8)]));
    }

    #[test]
    fn at_the_cap_nothing_is_dealt() {
        let parts = [part("a", 7, 8), part("b", 3, 3)];
        assert_eq!(deal(10, &parts, "b"), Err(10));
        assert_eq!(deal(10, &[], "a"), Ok(vec![part("a", 0, 5)]));
    }

    #[test]
    fn a_cap_without_bounds_is_dealt_without_overflowing() {
        let parts = [part("a", -3, 0), part("b", 2, i64::MAX)];
        let dealt = deal(i64::MAX, &parts, "a").unwrap();
        assert_eq!(dealt[0].allowance, i64::MAX - 2);
        assert_eq!(dealt[1].calls, -1);
        assert!(dealt[1].allowance > dealt[1].calls);
    }

    /// What the parts let run at most: each counts up to its allowance, or stays where it is if higher.
    fn most(parts: &[Allowance]) -> i64 {
        parts.iter().map(|part| part.calls.max(part.allowance)).sum()
    }

    proptest! {
        /// Replicas start calls within their allowances, calls end anywhere, and allowances are dealt when one
        /// is spent: the calls running never pass the cap, and a start is refused only at the cap.
        #[test]
        fn starts_within_allowances_never_pass_the_cap(
            cap in 1i64..12,
            steps in proptest::collection::vec((0usize..3, any::<bool>(), 0usize..3), 1..200),
        ) {
            let names = ["a", "b", "c"];
            let mut parts: Vec<Allowance> = Vec::new();
            // Which replica counts each running call's start, by the replica it started on.
            let mut running: Vec<usize> = Vec::new();
            for (at, start, ends_at) in steps {
                let me = names[at];
                if start {
                    let own = parts.iter().position(|part| part.replica == me);
                    let within = own.is_some_and(|own| parts[own].cap == cap && parts[own].calls < parts[own].allowance);
                    if !within {
                        match deal(cap, &parts, me) {
                            Ok(dealt) => {
                                prop_assert!(most(&dealt) <= cap);
                                parts = dealt;
                            }
                            Err(count) => {
                                prop_assert_eq!(count, i64::try_from(running.len()).unwrap());
                                prop_assert!(count >= cap);
                                continue;
                            }
                        }
                    }
                    let own = parts.iter().position(|part| part.replica == me).unwrap();
                    prop_assert!(parts[own].calls < parts[own].allowance);
                    parts[own].calls += 1;
                    running.push(at);
                } else if !running.is_empty() {
                    running.pop();
                    let ender = names[ends_at];
                    match parts.iter_mut().find(|part| part.replica == ender) {
                        Some(part) => part.calls -= 1,
                        None => parts.push(Allowance { replica: ender.to_owned(), calls: -1, allowance: 0, cap: 0 }),
                    }
                }
                prop_assert_eq!(parts.iter().map(|part| part.calls).sum::<i64>(), i64::try_from(running.len()).unwrap());
                prop_assert!(i64::try_from(running.len()).unwrap() <= cap);
            }
        }
    }
}
