//! Randomized handler tests: dots (batch, contracting, free dims, uneven
//! sizes), reductions and transposes with random shardings of operands and
//! results on random 1-3 axis meshes, checked by execution against the
//! global module (the interpreter is the oracle).

mod common;

use common::{check, Rng};
use xla_spmd_partitioner::grid::Grid;

/// A random grid of rank `rank` on a mesh of `axes` (devices in iota order
/// over a random axis permutation), as IR sharding text.
fn random_sharding(rng: &mut Rng, axes: &[i64], perm: &[usize], rank: usize) -> String {
    let n: i64 = axes.iter().product();
    // Devices laid out over the permuted mesh.
    let pd: Vec<i64> = perm.iter().map(|&p| axes[p]).collect();
    let mut devs_mesh = vec![0i64; n as usize];
    // devs_mesh[mesh index] = device; device = row-major index over pd.
    let mut idx = vec![0i64; axes.len()];
    for flat in 0..n {
        let mut rem = flat;
        for k in (0..axes.len()).rev() {
            idx[k] = rem % axes[k];
            rem /= axes[k];
        }
        let mut d = 0;
        for &p in perm {
            d = d * axes[p] + idx[p];
        }
        devs_mesh[flat as usize] = d;
    }
    let _ = pd;
    let owner: Vec<usize> = axes
        .iter()
        .map(|_| (rng.next() % (rank as u64 + 1)) as usize)
        .collect();
    let mut order = Vec::new();
    for d in 0..=rank {
        for (i, &o) in owner.iter().enumerate() {
            if o == d {
                order.push(i);
            }
        }
    }
    // Transpose the mesh device array to `order`.
    let mut strides = vec![1i64; axes.len()];
    for k in (0..axes.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * axes[k + 1];
    }
    let nd: Vec<i64> = order.iter().map(|&o| axes[o]).collect();
    let mut devs = Vec::with_capacity(n as usize);
    for flat in 0..n {
        let mut rem = flat;
        let mut src = 0;
        let mut c = vec![0i64; nd.len()];
        for k in (0..nd.len()).rev() {
            c[k] = rem % nd[k];
            rem /= nd[k];
        }
        for (k, &o) in order.iter().enumerate() {
            src += c[k] * strides[o];
        }
        devs.push(devs_mesh[src as usize]);
    }
    let mut dims = vec![1i64; rank + 1];
    for (i, &o) in owner.iter().enumerate() {
        dims[o] *= axes[i];
    }
    let g = Grid::new(dims, devs).expect("grid");
    xla_hlo_utils::InstrSharding::Single(g.to_sharding())
        .to_ir()
        .to_string()
}

fn mesh(rng: &mut Rng) -> (Vec<i64>, Vec<usize>) {
    let naxes = 1 + (rng.next() % 3) as usize;
    let mut axes = Vec::new();
    let mut total = 1;
    for _ in 0..naxes {
        let a = [2i64, 2, 4][(rng.next() % 3) as usize];
        if total * a <= 16 {
            total *= a;
            axes.push(a);
        }
    }
    let mut perm: Vec<usize> = (0..axes.len()).collect();
    for i in (1..perm.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    (axes, perm)
}

const ADD: &str = "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n";

fn dim(rng: &mut Rng) -> i64 {
    [4i64, 8, 6, 5, 12][(rng.next() % 5) as usize]
}

#[test]
fn random_dots() {
    for seed in 1..41u64 {
        let mut rng = Rng(seed * 7919);
        let (axes, perm) = mesh(&mut rng);
        let n: i64 = axes.iter().product();
        let (b, m, k, nn) = (dim(&mut rng), dim(&mut rng), dim(&mut rng), dim(&mut rng));
        let sl = random_sharding(&mut rng, &axes, &perm, 3);
        let sr = random_sharding(&mut rng, &axes, &perm, 3);
        let so = random_sharding(&mut rng, &axes, &perm, 3);
        let text = format!(
            "HloModule d, num_partitions={n}\n\nENTRY %e (a: f32[{b},{m},{k}], w: f32[{b},{k},{nn}]) -> f32[{b},{m},{nn}] {{\n  %a = f32[{b},{m},{k}] parameter(0), sharding={sl}\n  %w = f32[{b},{k},{nn}] parameter(1), sharding={sr}\n  ROOT %d = f32[{b},{m},{nn}] dot(%a, %w), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{1}}, sharding={so}\n}}\n"
        );
        check(&text, n, false, 1e-4, seed);
    }
}

#[test]
fn random_reductions_and_transposes() {
    for seed in 1..41u64 {
        let mut rng = Rng(seed * 104729);
        let (axes, perm) = mesh(&mut rng);
        let n: i64 = axes.iter().product();
        let (x, y, z) = (dim(&mut rng), dim(&mut rng), dim(&mut rng));
        let si = random_sharding(&mut rng, &axes, &perm, 3);
        let sr = random_sharding(&mut rng, &axes, &perm, 2);
        let st = random_sharding(&mut rng, &axes, &perm, 3);
        let text = format!(
            "HloModule r, num_partitions={n}\n\n{ADD}ENTRY %e (a: f32[{x},{y},{z}]) -> (f32[{x},{z}], f32[{z},{x},{y}]) {{\n  %a = f32[{x},{y},{z}] parameter(0), sharding={si}\n  %c = f32[] constant(0)\n  %r = f32[{x},{z}] reduce(%a, %c), dimensions={{1}}, to_apply=%add, sharding={sr}\n  %t = f32[{z},{x},{y}] transpose(%a), dimensions={{2,0,1}}, sharding={st}\n  ROOT %o = (f32[{x},{z}], f32[{z},{x},{y}]) tuple(%r, %t), sharding={{{sr}, {st}}}\n}}\n"
        );
        check(&text, n, false, 1e-4, seed);
    }
}

#[test]
fn random_windows() {
    let mut ran = 0;
    for seed in 1..61u64 {
        let mut rng = Rng(seed * 15485863);
        let n = [2i64, 4, 8][(rng.next() % 3) as usize];
        let x = 3 + (rng.next() % 30) as i64;
        let tin = [1i64, 2, 4, 8][(rng.next() % 4) as usize].min(n);
        let sin = if tin == 1 {
            "{replicated}".to_string()
        } else {
            format!(
                "{{devices=[{tin},1,{}]<=[{n}] last_tile_dim_replicate}}",
                n / tin
            )
        };
        let tout = [2i64, 4, 8][(rng.next() % 3) as usize].min(n);
        let sout = format!(
            "{{devices=[{tout},1,{}]<=[{n}] last_tile_dim_replicate}}",
            n / tout
        );
        // slice
        let start = (rng.next() % x as u64) as i64;
        let limit = start + 1 + (rng.next() % (x - start) as u64) as i64;
        let stride = 1 + (rng.next() % 3) as i64;
        let sl = (limit - start + stride - 1) / stride;
        // pad
        let (lo, hi, it) = (
            (rng.next() % 9) as i64 - 3,
            (rng.next() % 9) as i64 - 3,
            (rng.next() % 3) as i64,
        );
        let px = (x + lo + hi + (x - 1) * it).max(0);
        let (lo, hi) = if px <= 0 { (0, 0) } else { (lo, hi) };
        let px = x + lo + hi + (x - 1) * it;
        // reduce-window
        let w = 1 + (rng.next() % 6) as i64;
        let ws = 1 + (rng.next() % 3) as i64;
        let (wl, wh) = ((rng.next() % 4) as i64, (rng.next() % 4) as i64);
        let rx = (x + wl + wh - w).max(-1) / ws + 1;
        if rx <= 0 {
            continue;
        }
        let text = format!(
            "HloModule w, num_partitions={n}\n\n{ADD}ENTRY %e (a: f32[{x},4]) -> (f32[{sl},4], f32[{px},4], f32[{rx},4]) {{\n  %a = f32[{x},4] parameter(0), sharding={sin}\n  %sl = f32[{sl},4] slice(%a), slice={{[{start}:{limit}:{stride}], [0:4]}}, sharding={sout}\n  %c = f32[] constant(-2)\n  %pd = f32[{px},4] pad(%a, %c), padding={lo}_{hi}_{it}x0_0, sharding={sout}\n  %z = f32[] constant(0)\n  %rw = f32[{rx},4] reduce-window(%a, %z), window={{size={w}x1 stride={ws}x1 pad={wl}_{wh}x0_0}}, to_apply=%add, sharding={sout}\n  ROOT %o = (f32[{sl},4], f32[{px},4], f32[{rx},4]) tuple(%sl, %pd, %rw), sharding={{{sout}, {sout}, {sout}}}\n}}\n"
        );
        check(&text, n, false, 1e-4, seed);
        ran += 1;
    }
    assert!(ran >= 40, "only {ran} cases ran");
}
