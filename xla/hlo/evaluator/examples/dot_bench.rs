//! Micro-benchmark of the interpreter's dot on the transformer's largest
//! matmul shape: prints GFLOP/s. `cargo run --release --example dot_bench`.
use std::time::Instant;
use xla_hlo_evaluator::dot::dot;
use xla_hlo_evaluator::Array;
use xla_hlo_ir::attrs::DotDimensionNumbers;
use xla_hlo_ir::PrimitiveType;

fn main() {
    let (m, k, n) = (4096usize, 1024usize, 4096usize);
    let a = Array::from_f32(
        vec![m as i64, k as i64],
        (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect(),
    )
    .unwrap();
    let b = Array::from_f32(
        vec![k as i64, n as i64],
        (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect(),
    )
    .unwrap();
    let dn = DotDimensionNumbers {
        lhs_contracting: vec![1],
        rhs_contracting: vec![0],
        ..Default::default()
    };
    for _ in 0..3 {
        let t = Instant::now();
        let r = dot(&a, &b, &dn, PrimitiveType::F32, Default::default()).unwrap();
        let s = t.elapsed().as_secs_f64();
        println!(
            "{} ms, {:.1} GFLOP/s ({})",
            s * 1e3,
            2.0 * (m * n * k) as f64 / s / 1e9,
            r.len()
        );
    }
}
