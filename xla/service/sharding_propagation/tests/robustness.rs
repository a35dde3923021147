//! No panics on odd input: every testdata module, with shardings put on
//! random instructions (tiled, partial, manual, maximal, of the right rank
//! or not), goes through the pass without panicking; it either succeeds (and
//! then the result is a fixed point) or reports an error.

use xla_hlo_ir::{HloModule, HloSharding};
use xla_hlo_pass::Pass;
use xla_sharding_propagation::ShardingPropagation;

const SHARDINGS: &[&str] = &[
    "{replicated}",
    "{manual}",
    "{maximal device=3}",
    "{devices=[8]<=[8]}",
    "{devices=[8,1]<=[8]}",
    "{devices=[1,8]<=[8]}",
    "{devices=[2,4]<=[4,2]T(1,0)}",
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
    "{devices=[1,2,4]<=[8] last_tile_dims={manual}}",
    "{devices=[4,1,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}",
    "{devices=[2,2,2]<=[8]}",
    "{unknown}",
];

/// A small deterministic generator (no external RNG needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A random 8-device sharding for a rank-`rank` array.
fn fitting(rank: usize, rng: &mut Lcg) -> String {
    let mut dims = vec![1i64; rank];
    let mut left = 8i64;
    for _ in 0..3 {
        let dim = (rng.next() as usize) % rank;
        if left > 1 && rng.next() % 2 == 0 {
            dims[dim] *= 2;
            left /= 2;
        }
    }
    let list = |values: &[i64]| {
        values
            .iter()
            .map(|value| value.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    match (left, rng.next() % 3) {
        (1, _) => format!("{{devices=[{}]<=[8]}}", list(&dims)),
        (_, 0) => {
            dims.push(left);
            format!(
                "{{devices=[{}]<=[2,4]T(1,0) last_tile_dim_replicate}}",
                list(&dims)
            )
        }
        (_, 1) => {
            dims.push(left);
            format!(
                "{{devices=[{}]<=[8] last_tile_dims={{manual}}}}",
                list(&dims)
            )
        }
        _ => {
            dims[0] *= left;
            format!("{{devices=[{}]<=[8]}}", list(&dims))
        }
    }
}

fn mutate(module: &mut HloModule, rng: &mut Lcg) {
    for comp in &mut module.computations {
        for instr in &mut comp.instructions {
            if rng.next() % 5 != 0 {
                continue;
            }
            let rank = instr.shape.rank();
            let text = if rng.next() % 2 == 0 && rank > 0 && !instr.shape.is_tuple() {
                fitting(rank, rng)
            } else {
                SHARDINGS[(rng.next() as usize) % SHARDINGS.len()].to_string()
            };
            let sharding: HloSharding = xla_hlo_parser::parse_sharding(&text).unwrap();
            instr.sharding = Some(std::sync::Arc::new(sharding));
        }
    }
}

#[test]
fn random_shardings_never_panic() {
    let root = xla_test_paths::testdata_cases();
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    assert!(!dirs.is_empty(), "no testdata under {}", root.display());
    let (mut ok, mut err) = (0, 0);
    for (k, dir) in dirs.iter().enumerate() {
        let Ok(text) = std::fs::read_to_string(dir.join("input.hlo")) else {
            continue;
        };
        let base = xla_hlo_parser::parse_module(&text).unwrap();
        for seed in 0..40u64 {
            let mut module = base.clone();
            let mut rng = Lcg(seed * 7919 + k as u64);
            mutate(&mut module, &mut rng);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut pass = ShardingPropagation::default();
                let first = pass.run(&mut module);
                if first.is_ok() {
                    let before = module.clone();
                    let again = ShardingPropagation::default().run(&mut module);
                    (
                        first.is_ok(),
                        again
                            .map(|changed| !changed && before == module)
                            .unwrap_or(true),
                    )
                } else {
                    (false, true)
                }
            }));
            match result {
                Ok((true, fixed)) => {
                    ok += 1;
                    assert!(
                        fixed,
                        "{} seed {seed}: second run changed the module",
                        dir.display()
                    );
                }
                Ok((false, _)) => err += 1,
                Err(_) => panic!("{} seed {seed}: the pass panicked", dir.display()),
            }
        }
    }
    println!("{ok} runs succeeded, {err} reported errors");
    assert!(ok > 0);
}
