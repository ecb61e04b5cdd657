//! A small HDR-style latency histogram: log buckets with linear sub-buckets.
//!
//! Values below 128 are counted exactly; above that every power of two is split into
//! 128 sub-buckets, so a reported percentile is within 1/128 (< 0.8 %) of the true
//! value. The histogram is mergeable (threads and worker processes each keep one) and
//! serialises sparsely so worker processes can send it over a pipe.

use serde::{Deserialize, Serialize};

/// log2 of the number of sub-buckets per power of two; 7 gives < 0.8 % relative error.
const SUB_BUCKET_BITS: u32 = 7;
const SUB_BUCKET_COUNT: u64 = 1 << SUB_BUCKET_BITS;
/// Exact buckets 0..128, then 128 sub-buckets for each exponent 7..=63.
const BUCKET_COUNT: usize =
    (SUB_BUCKET_COUNT + (64 - SUB_BUCKET_BITS as u64) * SUB_BUCKET_COUNT) as usize;

/// Latency histogram in nanoseconds (the unit is the caller's choice; all math is unitless).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_index(value: u64) -> usize {
    if value < SUB_BUCKET_COUNT {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros(); // >= SUB_BUCKET_BITS
    let shift = exponent - SUB_BUCKET_BITS;
    let sub = (value >> shift) - SUB_BUCKET_COUNT;
    (SUB_BUCKET_COUNT + (shift as u64) * SUB_BUCKET_COUNT + sub) as usize
}

/// The smallest and largest value that land in bucket `index`.
fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB_BUCKET_COUNT {
        return (index, index);
    }
    let shift = (index - SUB_BUCKET_COUNT) / SUB_BUCKET_COUNT;
    let sub = (index - SUB_BUCKET_COUNT) % SUB_BUCKET_COUNT;
    let low = (SUB_BUCKET_COUNT + sub) << shift;
    let width = 1u64 << shift;
    (low, low.saturating_add(width - 1))
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKET_COUNT],
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    pub fn record(&mut self, value: u64) {
        self.counts[bucket_index(value)] += 1;
        self.total += 1;
        self.sum += value as u128;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// Exact mean (the sum is kept exactly, not reconstructed from buckets).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at `percentile` (0..=100): the smallest recorded value `v` such that at
    /// least `ceil(p/100 * n)` samples are `<= v`. Inside a bucket the midpoint is
    /// reported, clamped to the exact min and max so p0/p100 are exact.
    pub fn percentile(&self, percentile: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let fraction = (percentile / 100.0).clamp(0.0, 1.0);
        let rank = ((fraction * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let (low, high) = bucket_range(index);
                let middle = low + (high - low) / 2;
                return middle.clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// Summary figures for reports.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.total,
            avg_ns: self.mean(),
            min_ns: self.min(),
            p50_ns: self.percentile(50.0),
            p99_ns: self.percentile(99.0),
            p999_ns: self.percentile(99.9),
            max_ns: self.max(),
        }
    }

    /// Sparse form for the worker pipe: only non-empty buckets.
    pub fn to_sparse(&self) -> SparseHistogram {
        SparseHistogram {
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (i as u32, c))
                .collect(),
            sum: self.sum.to_string(),
            min: self.min,
            max: self.max,
        }
    }

    pub fn from_sparse(sparse: &SparseHistogram) -> Result<Histogram, String> {
        let mut histogram = Histogram::new();
        for &(index, count) in &sparse.buckets {
            let slot = histogram
                .counts
                .get_mut(index as usize)
                .ok_or_else(|| format!("histogram bucket {index} out of range"))?;
            *slot += count;
            histogram.total += count;
        }
        histogram.sum = sparse
            .sum
            .parse()
            .map_err(|_| format!("bad histogram sum '{}'", sparse.sum))?;
        histogram.min = sparse.min;
        histogram.max = sparse.max;
        Ok(histogram)
    }
}

/// Non-empty buckets as (index, count); the sum is a string because JSON numbers lose
/// precision above 2^53 and a u128 sum of nanoseconds can exceed that.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SparseHistogram {
    pub buckets: Vec<(u32, u64)>,
    pub sum: String,
    pub min: u64,
    pub max: u64,
}

/// Latency figures as they appear in text and JSON reports (nanoseconds).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub avg_ns: f64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_ranges_cover_values() {
        for value in [
            0u64,
            1,
            127,
            128,
            129,
            255,
            256,
            1000,
            123_456_789,
            u64::MAX,
        ] {
            let (low, high) = bucket_range(bucket_index(value));
            assert!(
                low <= value && value <= high,
                "value {value} not in [{low},{high}]"
            );
        }
        assert_eq!(bucket_index(u64::MAX), BUCKET_COUNT - 1);
    }

    #[test]
    fn exact_percentiles_for_small_values() {
        let mut histogram = Histogram::new();
        for value in 1..=100 {
            histogram.record(value);
        }
        assert_eq!(histogram.count(), 100);
        assert_eq!(histogram.percentile(50.0), 50);
        assert_eq!(histogram.percentile(99.0), 99);
        assert_eq!(histogram.percentile(99.9), 100);
        assert_eq!(histogram.percentile(0.0), 1);
        assert_eq!(histogram.percentile(100.0), 100);
        assert!((histogram.mean() - 50.5).abs() < 1e-9);
        assert_eq!(histogram.min(), 1);
        assert_eq!(histogram.max(), 100);
    }

    #[test]
    fn large_values_within_relative_error() {
        // 1..=100_000 microseconds expressed in ns: p50 = 50_000 us, p99 = 99_000 us.
        let mut histogram = Histogram::new();
        for value in 1..=100_000u64 {
            histogram.record(value * 1000);
        }
        let check = |p: f64, expected: f64| {
            let got = histogram.percentile(p) as f64;
            assert!(
                (got - expected).abs() / expected < 1.0 / 128.0,
                "p{p}: got {got}, expected {expected}"
            );
        };
        check(50.0, 50_000_000.0);
        check(99.0, 99_000_000.0);
        check(99.9, 99_900_000.0);
        assert!((histogram.mean() - 50_000_500.0).abs() < 1e-3);
    }

    #[test]
    fn skewed_tail_is_seen() {
        // 990 fast ops and 10 slow ones: p50 is fast, p99.9 is slow.
        let mut histogram = Histogram::new();
        for _ in 0..990 {
            histogram.record(10);
        }
        for _ in 0..10 {
            histogram.record(1_000_000);
        }
        assert_eq!(histogram.percentile(50.0), 10);
        assert_eq!(histogram.percentile(99.0), 10);
        let p999 = histogram.percentile(99.9) as f64;
        assert!((p999 - 1e6).abs() / 1e6 < 1.0 / 128.0);
    }

    #[test]
    fn merge_and_sparse_round_trip() {
        let mut first = Histogram::new();
        let mut second = Histogram::new();
        for value in 0..500 {
            first.record(value * 3);
            second.record(value * 7 + 1_000_000);
        }
        let mut merged = first.clone();
        merged.merge(&second);
        assert_eq!(merged.count(), 1000);
        let back = Histogram::from_sparse(&merged.to_sparse()).unwrap();
        assert_eq!(back, merged);
        let empty = Histogram::new();
        assert_eq!(empty.percentile(50.0), 0);
        assert_eq!(empty.summary().count, 0);
    }
}
