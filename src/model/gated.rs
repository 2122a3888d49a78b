//! The feed-forward's gate, `act(gate) · up` element by element: SiLU for llama, GELU's tanh form
//! for Gemma.
//!
//! On x86 with AVX2 and FMA the elements go eight at a time through one exponential
//! (`exp_lanes`), where candle took a scalar `expf` (SiLU) or `tanhf` (GELU) per element and a
//! second pass to multiply: in an 8-row verification pass of SmolLM2 that was 1.4 ms of 24
//! (`perf`, one thread), now 0.24. A tail shorter than eight is padded and goes through the same
//! lanes, so every element is computed the same way whatever the length of its tensor: a row's
//! gate does not depend on the other rows of its pass.

use candle_core::Tensor;

use super::config::Activation;
#[cfg(target_arch = "x86_64")]
use super::exp_lanes::exp;

/// `act(gate) · up` for two tensors of one shape.
pub fn gated(activation: Activation, gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if gate.device().is_cpu()
        && [gate.dtype(), up.dtype()] == [candle_core::DType::F32; 2]
        && gate.dims() == up.dims()
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        let (g, u) = (flat(gate)?, flat(up)?);
        let mut out = vec![0f32; g.len()];
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { gated_lanes(activation, &g, &u, &mut out) };
        return Tensor::from_vec(out, gate.dims(), gate.device());
    }
    let act = match activation {
        Activation::Silu => candle_nn::ops::silu(gate)?,
        Activation::GeluTanh => gate.gelu()?,
    };
    act * up
}

#[cfg(target_arch = "x86_64")]
fn flat(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// √(2/π), of GELU's tanh form.
#[cfg(target_arch = "x86_64")]
const GELU_SCALE: f32 = 0.797_884_6;
/// The cubic's coefficient of GELU's tanh form.
#[cfg(target_arch = "x86_64")]
const GELU_CUBIC: f32 = 0.044_715;

/// `out = act(gate) · up`, eight lanes at a time, the tail padded with zeros.
///
/// # Safety
/// The CPU supports AVX2 and FMA (checked by [`gated`] before the call). Nothing else: each load
/// and store covers an eight-float chunk cut with bounds checks, so a short `up` or `out` panics.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_lanes(activation: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    // Both are x · σ(z) = x / (1 + e^−z): SiLU's z is x; GELU's is 2u, u = √(2/π)(x + 0.044715x³),
    // since (1 + tanh u)/2 = σ(2u) (which also keeps 1 + tanh u from cancelling where u ≪ 0).
    let act = |x: __m256| {
        let z = match activation {
            Activation::Silu => x,
            Activation::GeluTanh => {
                let cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), cube, x);
                _mm256_mul_ps(_mm256_set1_ps(2.0 * GELU_SCALE), inner)
            }
        };
        let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), z));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    };
    let eight = |g: &[f32], u: &[f32], o: &mut [f32]| {
        let v = _mm256_mul_ps(
            act(_mm256_loadu_ps(g.as_ptr())),
            _mm256_loadu_ps(u.as_ptr()),
        );
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    };
    let whole = gate.len() / 8 * 8;
    for ((g, u), o) in gate[..whole]
        .chunks_exact(8)
        .zip(up[..whole].chunks_exact(8))
        .zip(out[..whole].chunks_exact_mut(8))
    {
        eight(g, u, o);
    }
    let rest = gate.len() - whole;
    if rest > 0 {
        let (mut g, mut u, mut o) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        g[..rest].copy_from_slice(&gate[whole..]);
        u[..rest].copy_from_slice(&up[whole..]);
        eight(&g, &u, &mut o);
        out[whole..].copy_from_slice(&o[..rest]);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Both activations against their f64 definitions over the range a gate takes (and beyond,
    /// where the exponential saturates), on a tensor whose length leaves a tail of three; three
    /// elements alone (a tail) equal, bit for bit, the same three inside a group of eight.
    #[test]
    fn gates_match_their_definitions_and_do_not_depend_on_length() {
        if !crate::model::exp_lanes::tests::avx2() {
            return;
        }
        let n = 1003;
        let gate: Vec<f32> = (0..n)
            .map(|i| -100.0 + 130.0 * i as f32 / n as f32)
            .collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for activation in [Activation::Silu, Activation::GeluTanh] {
            let got = gated(activation, &t(&gate), &t(&up))
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for ((&x, &u), &y) in gate.iter().zip(&up).zip(&got) {
                let (x, u) = (x as f64, u as f64);
                let act = match activation {
                    Activation::Silu => x / (1.0 + (-x).exp()),
                    Activation::GeluTanh => {
                        let inner =
                            (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
                        0.5 * x * (1.0 + inner.tanh())
                    }
                };
                let want = act * u;
                assert!(
                    (y as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{activation:?}({x}) · {u}: {y} against {want}"
                );
            }
            let alone = gated(activation, &t(&gate[8..11]), &t(&up[8..11]))
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(
                bits(&alone),
                bits(&got[8..11]),
                "{activation:?}: a tail differs"
            );
        }
    }
}
