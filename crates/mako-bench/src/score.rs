//! The io500 score: bandwidth and metadata geometric means and their combination.
//!
//! Kept pure and separate so the formula can be checked by hand in the tests.

use serde::{Deserialize, Serialize};

/// The three io500 numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// Geometric mean of the bandwidth phases, GiB/s.
    pub bandwidth_gib_s: f64,
    /// Geometric mean of the metadata phases, kIOPS.
    pub metadata_kiops: f64,
    /// sqrt(bandwidth × metadata).
    pub total: f64,
}

/// Geometric mean; 0 if the list is empty or any value is 0 or negative (as io500: a
/// failed phase zeroes the score rather than being skipped).
pub fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|v| !v.is_finite() || *v <= 0.0) {
        return 0.0;
    }
    // Sum of logs instead of a product: a product of many large rates can overflow.
    let log_sum: f64 = values.iter().map(|v| v.ln()).sum();
    (log_sum / values.len() as f64).exp()
}

/// io500's score from the bandwidth phases (GiB/s) and metadata phases (kIOPS).
pub fn io500_score(bandwidth_gib_s: &[f64], metadata_kiops: &[f64]) -> Score {
    let bandwidth = geometric_mean(bandwidth_gib_s);
    let metadata = geometric_mean(metadata_kiops);
    Score {
        bandwidth_gib_s: bandwidth,
        metadata_kiops: metadata,
        total: (bandwidth * metadata).sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn geometric_mean_by_hand() {
        // (1·4·2·8)^(1/4) = 64^(1/4) = 2·sqrt(2)
        assert!(close(
            geometric_mean(&[1.0, 4.0, 2.0, 8.0]),
            2.0 * 2f64.sqrt()
        ));
        // (1·10·100)^(1/3) = 10
        assert!(close(geometric_mean(&[1.0, 10.0, 100.0]), 10.0));
        assert!(close(geometric_mean(&[5.0]), 5.0));
        assert_eq!(geometric_mean(&[]), 0.0);
        assert_eq!(geometric_mean(&[3.0, 0.0]), 0.0);
    }

    #[test]
    fn io500_score_by_hand() {
        let score = io500_score(&[1.0, 4.0, 2.0, 8.0], &[1.0, 10.0, 100.0]);
        assert!(close(score.bandwidth_gib_s, 2.828_427_124_746_19));
        assert!(close(score.metadata_kiops, 10.0));
        // sqrt(2.8284271 × 10) = sqrt(28.284271) = 5.3182959
        assert!(close(score.total, 5.318_295_896_944_988));
    }

    #[test]
    fn seed_001_isc22_column() {
        // The ISC22 column of seed 001 (ESS3200): the four ior phases and BW score 62.58.
        // ior-easy-write 109.47, ior-hard-write 32.7, ior-easy-read 148.93, ior-hard-read 28.77:
        // (109.47·32.7·148.93·28.77)^(1/4) = 62.58 (to the 2 decimals printed there).
        let score = io500_score(&[109.47, 32.7, 148.93, 28.77], &[1.0]);
        assert!(
            (score.bandwidth_gib_s - 62.58).abs() < 0.01,
            "{}",
            score.bandwidth_gib_s
        );
    }
}
