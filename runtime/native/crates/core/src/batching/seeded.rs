//! A small deterministic generator (xorshift64) for the batching tests' generated cases:
//! seeded, so a failing case replays exactly, and no crate for it.

/// The generator's state; never zero (xorshift stays at zero).
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Seeded {
        Seeded(seed.max(1))
    }

    /// An integer in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    /// An integer in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// A float in `[0, 1)`, from the top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.below(u64::MAX) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A float in `[low, high]` spread evenly over its orders of magnitude (low > 0), so
    /// that small and large values both come up.
    pub fn log_between(&mut self, low: f64, high: f64) -> f64 {
        (low.ln() + self.unit() * (high.ln() - low.ln())).exp()
    }
}
