//! Softmax and log-softmax of a row of logits, computed one careful way for the whole crate: shift
//! by the largest logit, sum in f64, and keep the shift out of the normaliser. The textbook
//! `l − (max + ln Σ exp(l − max))` loses `ln Σ` to the rounding of a huge `max` (1e20 + 10.8 is 1e20
//! in f64), which gave 49152 equal logits of 1e20 probability 1 each; `(l − max) − ln Σ` does not.

/// The largest logit: the shift that keeps `exp` in range.
pub fn row_max(logits: &[f32]) -> f64 {
    logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64
}

/// Log-probabilities of the row: `(l − max) − ln Σ exp(l − max)`, summed in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = row_max(logits);
    let log_z = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits
        .iter()
        .map(|&l| ((l as f64 - max) - log_z) as f32)
        .collect()
}

/// Probabilities of the row at `temperature` (> 0): `exp((l − max) / T) / Σ`, summed in f64.
pub fn softmax(logits: &[f32], temperature: f64) -> Vec<f64> {
    let max = row_max(logits);
    let mut p: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature).exp())
        .collect();
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against exp and ln of the logits themselves, where they are small enough for that.
    #[test]
    fn small_logits_by_hand() {
        let logits = [1.0f32, 3.0, -2.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let lp = log_softmax(&logits);
        let p = softmax(&logits, 1.0);
        for (i, &l) in logits.iter().enumerate() {
            let want = (l as f64).exp() / z;
            assert!((lp[i] as f64 - want.ln()).abs() < 1e-6, "{i}");
            assert!((p[i] - want).abs() < 1e-12, "{i}");
        }
        // Temperature 2 is the softmax of the halved logits.
        let halved: Vec<f32> = logits.iter().map(|l| l / 2.0).collect();
        for (a, b) in softmax(&logits, 2.0).iter().zip(softmax(&halved, 1.0)) {
            assert!((a - b).abs() < 1e-12);
        }
    }

    /// Equal logits give the uniform distribution at any scale f32 can hold.
    #[test]
    fn huge_equal_logits_are_uniform() {
        let n = 49152;
        for big in [1e17f32, 1e20, f32::MAX, -1e20] {
            let want = -(n as f64).ln();
            let lp = log_softmax(&vec![big; n]);
            assert!(
                lp.iter().all(|&l| (l as f64 - want).abs() < 1e-5),
                "{big:e}"
            );
            let p = softmax(&vec![big; n], 1.0);
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{big:e}");
        }
    }
}
