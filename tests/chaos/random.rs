//! The runner's seeded randomness: splitmix64, so that one seed gives one schedule of operations and faults.

use std::time::Duration;

/// A splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose whole sequence `seed` decides.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator of its own for stream `stream` (a client, the nemeses), independent of the others.
    pub fn fork(&self, stream: u64) -> Self {
        let mut forked = Self(self.0 ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        forked.next();
        forked
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// One of `items`, each as likely as its weight.
    pub fn weighted<T: Copy>(&mut self, items: &[(T, u64)]) -> T {
        let total: u64 = items.iter().map(|(_, weight)| weight).sum();
        let mut pick = self.below(total);
        for (item, weight) in items {
            if pick < *weight {
                return *item;
            }
            pick -= weight;
        }
        items[items.len() - 1].0
    }

    /// A duration between `low` and `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }
}
