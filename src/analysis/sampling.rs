//! Estimates from a sampled snapshot: how much memory and how many blocks the sampled traces
//! stand for.
//!
//! The tracer samples by bytes (see `crate::hooks::sampler`): every byte of a request is a sampling
//! point with probability 1/R, and a request of `size` bytes is charged `size + 1` (so that
//! zero-byte requests can be sampled too). A block is therefore sampled with probability
//! `p = 1 - exp(-(size + 1) / R)`, independently of every other block, and weighting each
//! sample by `1 / p` makes `Σ size/p` and `Σ 1/p` unbiased estimates of the true bytes and
//! block count (Horvitz–Thompson). The weight depends only on the stored size and R, so the
//! snapshot keeps raw traces plus the interval and nothing else.
//!
//! Weighting by "bytes since the previous sample" instead would be cheaper but biased between
//! small and large blocks; this per-sample weight is exact in expectation for every size.
//!
//! Integer results: a trace's estimated bytes are rounded once per trace (so the live
//! tracer's running total and the statistics of a snapshot add up to the same figure), and
//! counts are accumulated in fixed point ([`COUNT_SCALE`]) and rounded only when a row is
//! reported, so that many small fractional weights do not each lose up to half a block.

/// Largest interval accepted: keeps `(size + 1) / R` and the countdown comfortably in range
/// (1 TiB between samples is already more than anyone can use).
pub const MAX_INTERVAL: u64 = 1 << 40;

/// Fixed-point scale of accumulated counts: a weight of 1.0 is `COUNT_SCALE` units.
pub const COUNT_SCALE: u64 = 1 << 16;

/// Probability that a block of `size` bytes is sampled at interval `interval`.
pub fn probability(size: u64, interval: u64) -> f64 {
    // `-expm1(-x)` is `1 - exp(-x)` without cancellation for small x.
    -(-((size as f64 + 1.0) / interval as f64)).exp_m1()
}

/// How traces of a snapshot are weighted: 1 each (exact), or by inverse sampling
/// probability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    Exact,
    Sampled { interval: u64 },
}

impl Weights {
    pub fn new(sample_interval: Option<u64>) -> Self {
        match sample_interval {
            Some(interval) if interval > 0 => Weights::Sampled { interval },
            _ => Weights::Exact,
        }
    }

    pub fn is_exact(self) -> bool {
        self == Weights::Exact
    }

    /// Estimated bytes a trace of `size` stands for, rounded to an integer.
    #[inline]
    pub fn bytes(self, size: u64) -> u64 {
        match self {
            Weights::Exact => size,
            Weights::Sampled { interval } => {
                let estimate = size as f64 / probability(size, interval);
                // Saturating float-to-int conversion; a block near 2^64 bytes has weight 1.
                estimate.round() as u64
            }
        }
    }

    /// Estimated blocks a trace of `size` stands for, in `1 / COUNT_SCALE` units.
    #[inline]
    pub fn count_units(self, size: u64) -> u64 {
        match self {
            Weights::Exact => COUNT_SCALE,
            Weights::Sampled { interval } => {
                (COUNT_SCALE as f64 / probability(size, interval)).round() as u64
            }
        }
    }
}

/// A count accumulated in [`COUNT_SCALE`] units, rounded to whole blocks.
#[inline]
pub fn count_from_units(units: u64) -> u64 {
    (units + COUNT_SCALE / 2) / COUNT_SCALE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_and_weights() {
        // (size, interval, expected probability)
        let r = 512 * 1024;
        let cases: &[(u64, u64, f64)] = &[
            (0, r, 1.0 - (-1.0 / r as f64).exp()),
            (r - 1, r, 1.0 - (-1.0f64).exp()),
            (64 * r, r, 1.0),
            (31, 32, 1.0 - (-1.0f64).exp()),
        ];
        for &(size, interval, p) in cases {
            let got = probability(size, interval);
            assert!((got - p).abs() < 1e-12, "{size}/{interval}: {got} vs {p}");
        }
        let w = Weights::new(Some(r));
        // A block far larger than the interval is always sampled: weight 1.
        assert_eq!(w.bytes(64 * r), 64 * r);
        assert_eq!(w.count_units(64 * r), COUNT_SCALE);
        // A block of R - 1 bytes: weight 1 / (1 - 1/e).
        let weight = 1.0 / (1.0 - (-1.0f64).exp());
        assert_eq!(w.bytes(r - 1), ((r - 1) as f64 * weight).round() as u64);
        // Zero-byte blocks estimate no bytes, but about R blocks each (1/p = R + 1/2 + ...).
        assert_eq!(w.bytes(0), 0);
        assert_eq!(count_from_units(w.count_units(0)), r + 1);
        // Small blocks: about R / (size + 1) + 1/2 blocks each.
        assert_eq!(count_from_units(w.count_units(31)), r / 32 + 1);
        assert_eq!(Weights::new(None), Weights::Exact);
        assert_eq!(Weights::new(Some(0)), Weights::Exact);
        assert_eq!(Weights::Exact.bytes(17), 17);
        assert_eq!(count_from_units(Weights::Exact.count_units(17)), 1);
    }

    #[test]
    fn count_rounding() {
        let s = COUNT_SCALE;
        // (units, rounded count)
        for &(units, count) in &[
            (0, 0),
            (s / 2 - 1, 0),
            (s / 2, 1),
            (3 * s, 3),
            (s + s / 3, 1),
        ] {
            assert_eq!(count_from_units(units), count, "{units}");
        }
    }

    /// The estimator is unbiased: simulate sampling of a known population (sizes from 8 B to
    /// 4 MiB) with a fixed generator and check every estimated total against its true value
    /// within four standard deviations of the estimator (Var = n·S²·(1-p)/p for n blocks of
    /// S bytes), which a biased weight (e.g. 1/p computed from `size` instead of `size + 1`,
    /// or no weight) misses by far more.
    #[test]
    fn estimates_are_unbiased_in_simulation() {
        let interval = 64 * 1024u64;
        let weights = Weights::new(Some(interval));
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 1.0) / (1u64 << 53) as f64
        };
        // (size, blocks): small blocks dominate the count, big ones the bytes.
        let population: &[(u64, u64)] = &[
            (8, 2_000_000),
            (500, 200_000),
            (70_000, 2_000),
            (4 << 20, 5),
        ];
        for &(size, blocks) in population {
            let p = probability(size, interval);
            let (mut bytes, mut units) = (0u64, 0u64);
            for _ in 0..blocks {
                if uniform() < p {
                    bytes += weights.bytes(size);
                    units += weights.count_units(size);
                }
            }
            let n = blocks as f64;
            let sd_count = (n * (1.0 - p) / p).sqrt();
            let count = count_from_units(units) as f64;
            assert!(
                (count - n).abs() <= 4.0 * sd_count + 1.0,
                "size {size}: estimated {count} blocks for {n} (sd {sd_count:.0})"
            );
            let sd_bytes = size as f64 * sd_count;
            let true_bytes = size as f64 * n;
            assert!(
                (bytes as f64 - true_bytes).abs() <= 4.0 * sd_bytes + size as f64,
                "size {size}: estimated {bytes} bytes for {true_bytes} (sd {sd_bytes:.0})"
            );
        }
    }
}
