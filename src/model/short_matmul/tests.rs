#[cfg(target_arch = "x86_64")]
use super::activations::{quantize_block, quantize_block_avx2};
use super::*;
use candle_core::quantized::GgmlDType;
use candle_core::Device;
use half::f16;

fn flat(t: Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn pseudo(len: usize, step: usize, modulus: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * step) % modulus) as f32 / modulus as f32 - 0.5) * scale)
        .collect()
}

/// The oracle: candle's dequantized weights against our dequantized activations, in f64, with
/// Q4_1's offsets taken as ggml's `vec_dot_q4_1_q8_1` takes them: `m` times the activations'
/// f16-rounded `d·Σq` (Q8_1's `s`), not their exact sum.
fn reference(q: &QTensor, xs: &[f32], n: usize, k: usize) -> Vec<f64> {
    let w = flat(q.dequantize(&Device::Cpu).unwrap());
    let raw = q.data().unwrap();
    let acts = quantize_rows(xs, KernelFlavour::Portable);
    let a: Vec<f64> = acts
        .iter()
        .flat_map(|b| b.qs.map(|q| q as f64 * b.d as f64))
        .collect();
    let m = xs.len() / k;
    let kb = k / QK;
    // Per (column, block): what Q8_1's rounded `s` adds over the exact sum, for Q4_1.
    let offset_error = |c: usize, r: usize, b: usize| match q.dtype() {
        GgmlDType::Q4_1 => {
            let at = (c * kb + b) * (4 + QK / 2);
            let min = f16::from_le_bytes([raw[at + 2], raw[at + 3]]).to_f32() as f64;
            let act = &acts[r * kb + b];
            let sum = act.sum();
            let s16 = f16::from_f32(f16::from_f32(sum as f32).to_f32() * act.d).to_f32();
            min * (s16 as f64 - act.d as f64 * sum as f64)
        }
        _ => 0.0,
    };
    (0..m)
        .flat_map(|r| {
            let (a, w) = (&a, &w);
            (0..n).map(move |c| {
                let exact: f64 = (0..k).map(|i| a[r * k + i] * w[c * k + i] as f64).sum();
                exact + (0..kb).map(|b| offset_error(c, r, b)).sum::<f64>()
            })
        })
        .collect()
}

const FORMATS: [GgmlDType; 5] = [
    GgmlDType::Q4_1,
    GgmlDType::Q4K,
    GgmlDType::Q5_0,
    GgmlDType::Q6K,
    GgmlDType::Q8_0,
];

/// The stored-quant offset of each format (what `q` exceeds the signed quant by).
fn offset(format: Format) -> f32 {
    match format {
        Format::Q4_1 | Format::Q4K => 0.0,
        Format::Q5_0 => 16.0,
        Format::Q6K => 32.0,
        Format::Q8_0 => 128.0,
    }
}

/// Our decoding of every format's blocks gives candle's dequantized weights (an independent
/// implementation of ggml's formats): `scale·(q − offset) + min` at every input.
#[test]
fn decoded_blocks_are_candles_weights() {
    let dev = Device::Cpu;
    let (n, k) = (16, 512);
    let w = Tensor::from_vec(pseudo(n * k, 7919, 997, 0.2), (n, k), &dev).unwrap();
    for dtype in FORMATS {
        let q = QTensor::quantize(&w, dtype).unwrap();
        let expected = flat(q.dequantize(&dev).unwrap());
        let format = Format::of(dtype).unwrap();
        let (block_inputs, block_bytes) = format.block();
        let data = q.data().unwrap();
        for (e, &want) in expected.iter().enumerate() {
            let (c, i) = (e / k, e % k);
            let at = (c * k / block_inputs + i / block_inputs) * block_bytes;
            let sub = format.sub_block(&data[at..at + block_bytes], i % block_inputs / QK);
            let x = i % QK;
            let got = sub.scale[x / 16] * (sub.q[x] as f32 - offset(format)) + sub.min;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{dtype:?} at ({c}, {i}): {got} vs candle {want}"
            );
        }
    }
}

/// For each format and each flavour this CPU runs: every row's output is the same bit for bit
/// whether the row runs alone or with up to `MAX_EXACT_ROWS − 1` others (what exact verification
/// rests on), the products
/// match the dequantized oracle, all flavours agree bit for bit, products sharing one input equal
/// separate ones. (candle's own products are no oracle: they quantize activations more coarsely,
/// per 256 inputs for K-quants, and differ from the exact sums by up to 2% here.)
#[test]
fn rows_are_independent_and_match_the_oracle() {
    let dev = Device::Cpu;
    let flavours = KernelFlavour::supported_here();
    let (n, k) = (96, 512);
    let w = Tensor::from_vec(pseudo(n * k, 7919, 997, 0.2), (n, k), &dev).unwrap();
    let m = crate::model::MAX_EXACT_ROWS;
    let xs = pseudo(m * k, 104729, 1009, 3.0);
    let x = |rows: usize| Tensor::from_vec(xs[..rows * k].to_vec(), (1, rows, k), &dev);
    for dtype in FORMATS {
        let q = QTensor::quantize(&w, dtype).unwrap();
        let oracle = reference(&q, &xs, n, k);
        let mut first_flavour: Option<Vec<f32>> = None;
        for &flavour in &flavours {
            let ours = ShortMatmul::from_qtensor(&q, flavour).unwrap().unwrap();
            let all = flat(ours.forward(&x(m).unwrap()).unwrap());
            for rows in [1usize, 2, 3, 4, 5, 15, 16, m - 1] {
                let alone = flat(ours.forward(&x(rows).unwrap()).unwrap());
                assert!(
                    alone == all[..rows * n],
                    "{dtype:?} {flavour}: {rows} rows differ"
                );
            }
            for (i, (&a, &o)) in all.iter().zip(&oracle).enumerate() {
                assert!(
                    (a as f64 - o).abs() <= 1e-4 * o.abs().max(1.0),
                    "{dtype:?} {flavour} at {i}: {a} vs oracle {o}"
                );
            }
            match &first_flavour {
                Some(f) => assert!(*f == all, "{dtype:?}: {flavour} differs from the others"),
                None => first_flavour = Some(all.clone()),
            }
            let shared = ShortMatmul::forward_shared(&[&ours, &ours], &x(m).unwrap()).unwrap();
            for part in shared {
                assert!(flat(part) == all, "{dtype:?}: a shared product differs");
            }
        }
    }
}

/// Products sharing one input come out as separate ones, bit for bit, for matrices of different
/// widths (12 column groups: three whole tasks; 5: a whole task and one of a single group) and
/// for no rows at all.
#[test]
fn shared_products_of_different_widths_equal_separate_ones() {
    let dev = Device::Cpu;
    let k = 256;
    let matrix = |n: usize, dtype| {
        let w = Tensor::from_vec(pseudo(n * k, 7919, 997, 0.2), (n, k), &dev).unwrap();
        QTensor::quantize(&w, dtype).unwrap()
    };
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let (wide, narrow) = (matrix(96, dtype), matrix(40, dtype));
        for flavour in KernelFlavour::supported_here() {
            let parts =
                [&wide, &narrow].map(|q| ShortMatmul::from_qtensor(q, flavour).unwrap().unwrap());
            for rows in [0usize, 1, 5] {
                let x = Tensor::from_vec(pseudo(rows * k, 104729, 1009, 3.0), (1, rows, k), &dev)
                    .unwrap();
                let shared = ShortMatmul::forward_shared(&[&parts[0], &parts[1]], &x).unwrap();
                for (part, together) in parts.iter().zip(shared) {
                    assert_eq!(together.dims(), [1, rows, part.n]);
                    assert!(
                        flat(together) == flat(part.forward(&x).unwrap()),
                        "{dtype:?} {flavour}, {rows} rows, {} wide",
                        part.n
                    );
                }
            }
        }
    }
}

/// The vector quantizer gives the scalar one's blocks bit for bit, halves and zeros included.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_quantization_matches_scalar() {
    if !KernelFlavour::Avx2.supported() {
        return;
    }
    let mut xs = pseudo(64 * QK, 7919, 1013, 9.0);
    // A block whose maximum makes the scale 1 (exact halves), and a block of zeros.
    xs.extend((0..QK).map(|i| if i == 0 { 127.0 } else { i as f32 - 15.5 }));
    xs.extend([0.0; QK]);
    for x in xs.chunks_exact(QK) {
        // SAFETY: AVX2, FMA and F16C checked above.
        let vector = unsafe { quantize_block_avx2(x) };
        let scalar = quantize_block(x);
        assert_eq!(vector.qs, scalar.qs, "{x:?}");
        assert_eq!(
            (vector.half_sums, vector.d, vector.s, vector.ds),
            (scalar.half_sums, scalar.d, scalar.s, scalar.ds)
        );
        let halves: Vec<i32> = scalar
            .qs
            .chunks(16)
            .map(|h| h.iter().map(|&q| q as i32).sum())
            .collect();
        assert_eq!(halves, scalar.half_sums);
    }
}

/// Shapes and types the kernels cannot take are left to candle.
#[test]
fn unsupported_shapes_are_declined() {
    let dev = Device::Cpu;
    let flavour = KernelFlavour::Portable;
    for (n, k, dtype) in [
        (12, 64, GgmlDType::Q8_0),
        (16, 64, GgmlDType::F16),
        (16, 64, GgmlDType::Q4K),
    ] {
        let q = match QTensor::quantize(
            &Tensor::zeros((n, k), candle_core::DType::F32, &dev).unwrap(),
            dtype,
        ) {
            Ok(q) => q,
            Err(_) => continue,
        };
        assert!(ShortMatmul::from_qtensor(&q, flavour).unwrap().is_none());
    }
    let w = Tensor::zeros((16, 64), candle_core::DType::F32, &dev).unwrap();
    let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
    assert!(ShortMatmul::from_qtensor(&q, flavour).unwrap().is_some());
}
