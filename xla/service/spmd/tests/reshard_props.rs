//! Resharding property tests: random meshes (1 to 3 axes, up to 64
//! devices, device orders transposed), random source and target shardings
//! (tiled, partially replicated, several mesh axes on one dim, uneven
//! dims), random shapes and every dtype class: partition `copy(p)` from the
//! source to the target sharding, run it on the loopback devices (input
//! split by the source sharding), assemble by the target sharding (replicas
//! must agree) and require the input back bit for bit.

mod common;

use common::{random_value, Rng};
use proptest::prelude::*;
use xla_hlo_ir::{PrimitiveType, Shape};
use xla_spmd_partitioner::grid::Grid;
use xla_spmd_partitioner::{partition_module, SpmdOptions};

const TYPES: &[PrimitiveType] = &[
    PrimitiveType::F32,
    PrimitiveType::Bf16,
    PrimitiveType::F16,
    PrimitiveType::F64,
    PrimitiveType::S8,
    PrimitiveType::S32,
    PrimitiveType::S64,
    PrimitiveType::U8,
    PrimitiveType::U32,
    PrimitiveType::Pred,
];

/// A random mesh: axis sizes (product <= 64) and a device order.
fn mesh(rng: &mut Rng) -> (Vec<i64>, Vec<i64>) {
    let naxes = 1 + (rng.next() % 3) as usize;
    let choices = [1i64, 2, 2, 3, 4, 4, 8];
    let mut axes = Vec::new();
    let mut total = 1;
    for _ in 0..naxes {
        let mut a = choices[(rng.next() % choices.len() as u64) as usize];
        while total * a > 64 {
            a /= 2;
        }
        let a = a.max(1);
        total *= a;
        axes.push(a);
    }
    // Devices: iota over a random permutation of the axes.
    let mut perm: Vec<usize> = (0..axes.len()).collect();
    for i in (1..perm.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    let pdims: Vec<i64> = perm.iter().map(|&p| axes[p]).collect();
    let iota: Vec<i64> = (0..total).collect();
    // Transpose iota laid out over pdims back to mesh order.
    let mut inv = vec![0usize; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let devs = transpose(&pdims, &iota, &inv);
    (axes, devs)
}

fn strides(d: &[i64]) -> Vec<i64> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

/// Row-major transpose of `v` over `dims`: result axis i is axis perm[i].
fn transpose(dims: &[i64], v: &[i64], perm: &[usize]) -> Vec<i64> {
    let s = strides(dims);
    let nd: Vec<i64> = perm.iter().map(|&p| dims[p]).collect();
    let n = v.len();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n as i64 {
        let mut rem = flat;
        let mut src = 0;
        let ns = strides(&nd);
        for (i, &p) in perm.iter().enumerate() {
            let c = rem / ns[i];
            rem %= ns[i];
            src += c * s[p];
        }
        out.push(v[src as usize]);
    }
    out
}

/// A random sharding of a rank-`rank` array over the mesh: each axis goes
/// to a random dim or to replication.
fn sharding(rng: &mut Rng, axes: &[i64], devs: &[i64], rank: usize) -> Grid {
    let n: i64 = axes.iter().product();
    let mut owner: Vec<usize> = Vec::new(); // rank = replication
    for _ in axes {
        owner.push((rng.next() % (rank as u64 + 1)) as usize);
    }
    // Order: axes of dim 0, dim 1, ..., then replicated axes.
    let mut order: Vec<usize> = Vec::new();
    for d in 0..=rank {
        for (i, &o) in owner.iter().enumerate() {
            if o == d {
                order.push(i);
            }
        }
    }
    let t = transpose(axes, devs, &order);
    let mut dims = vec![1i64; rank + 1];
    for (i, &o) in owner.iter().enumerate() {
        dims[o] *= axes[i];
    }
    let _ = n;
    Grid::new(dims, t).expect("valid grid")
}

fn run_case(seed: u64) {
    let mut rng = Rng(seed | 1);
    let (axes, devs) = mesh(&mut rng);
    let n: i64 = axes.iter().product();
    let rank = 1 + (rng.next() % 3) as usize;
    let dims: Vec<i64> = (0..rank).map(|_| 1 + (rng.next() % 12) as i64).collect();
    let ty = TYPES[(rng.next() % TYPES.len() as u64) as usize];
    let src = sharding(&mut rng, &axes, &devs, rank);
    let tgt = sharding(&mut rng, &axes, &devs, rank);
    let shape = Shape::array(ty, dims.clone());
    let s_ir = xla_hlo_utils::InstrSharding::Single(src.to_sharding()).to_ir();
    let t_ir = xla_hlo_utils::InstrSharding::Single(tgt.to_sharding()).to_ir();
    let text = format!(
        "HloModule r, num_partitions={n}\n\nENTRY %e (p: {shape}) -> {shape} {{\n  %p = {shape} parameter(0), sharding={s_ir}\n  ROOT %c = {shape} copy(%p), sharding={t_ir}\n}}\n"
    );
    let mut m = common::parse(&text);
    let summary = partition_module(
        &mut m,
        &SpmdOptions {
            num_partitions: Some(n),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    if std::env::var("RESHARD_VERBOSE").is_ok() {
        eprintln!(
            "n={n} {shape} {s_ir} -> {t_ir}: {:?} {} bytes",
            summary.collectives, summary.collective_bytes
        );
    }
    xla_hlo_verifier::verify(&m).unwrap_or_else(|e| panic!("{e}\n{}", m.to_text()));
    let x = random_value(&shape, &mut rng);
    let got = common::run_partitioned(&m, std::slice::from_ref(&x), &shape, n)
        .unwrap_or_else(|e| panic!("{e}\n{text}\n{}", m.to_text()));
    assert!(
        got == x,
        "reshard changed the data\n{text}\n{}",
        m.to_text()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn reshard_round_trips(seed in any::<u64>()) {
        run_case(seed);
    }
}

#[test]
fn reshard_fixed_seeds() {
    for seed in 0..48u64 {
        run_case(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
}
