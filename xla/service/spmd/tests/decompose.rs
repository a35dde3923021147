//! Collective decomposition proven by execution: every stored case
//! (testdata/cases and, when present, ../shared/corpus/cases) is propagated
//! and partitioned, then every collective that can be split (with its dot,
//! or alone, and with the chain of work after it) is split into 2 chunks
//! (4 where the dimension allows every other time);
//! the split program must verify, read back, and compute what the unsplit
//! one computes on the same random arguments, bitwise, in consistent mode:
//! there a dot's sum does not depend on its shape, while the default CPU
//! dot is a GEMM library whose kernels (like cuBLAS's) round differently
//! for other shapes, and a training step's optimizer update can magnify
//! that last-bit difference well past any fixed tolerance.

mod common;

use common::{
    assert_bitwise_equal, assert_rewrite_computes_the_same, collective_count,
    propagate_and_partition, random_args, run_partitioned_in_mode,
};
use xla_hlo_evaluator::Value;
use xla_hlo_ir::Opcode;
use xla_spmd_partitioner::decompose::{candidate_ways, candidates, decompose, Candidate, PairKind};

#[test]
fn split_collectives_compute_bitwise_what_whole_ones_compute() {
    let (mut cases, mut pairs) = (0, [0usize; 4]);
    // Ops split with a collective (its chain), and chains reaching a dot.
    let (mut chain_ops, mut chains_with_dots) = (0, 0);
    // Ops split before a pair (its prologue), and prologues holding a dot.
    let (mut prologue_ops, mut prologues_with_dots) = (0, 0);
    for dir in xla_test_paths::all_case_dirs() {
        let Ok(text) = std::fs::read_to_string(dir.join("input.hlo")) else {
            continue;
        };
        let name = dir.display().to_string();
        let (global, module) =
            propagate_and_partition(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let found = candidates(&module);
        let plan: Vec<_> = found
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let k = if i % 2 == 1 && c.size % 4 == 0 { 4 } else { 2 };
                (c.size % k == 0).then_some((c, k))
            })
            .collect();
        if plan.is_empty() {
            continue;
        }
        // Consistent mode is slow unoptimised: debug builds check 30 cases.
        if cfg!(debug_assertions) && cases == 30 {
            break;
        }
        let mut split = module.clone();
        let count = decompose(&mut split, &plan);
        assert!(count >= 1 && count <= plan.len(), "{name}");
        cases += 1;
        for (c, _) in &plan {
            assert!(
                c.size >= 2,
                "{name}: a pair along a dimension of size {}",
                c.size
            );
            pairs[c.kind as usize] += 1;
            chain_ops += c.chain.len();
            let ends_in_dot = c
                .chain
                .iter()
                .any(|(op, _)| module.computations[c.computation].instr(*op).opcode == Opcode::Dot);
            chains_with_dots += usize::from(ends_in_dot);
            prologue_ops += c.prologue.len();
            let comp = &module.computations[c.computation];
            prologues_with_dots += usize::from(
                c.prologue
                    .iter()
                    .any(|p| comp.instr(p.op).opcode == Opcode::Dot),
            );
        }
        if let Err(e) = xla_hlo_verifier::verify(&split) {
            panic!(
                "{name}: the split module does not verify:\n{e}\n{}",
                split.to_text()
            );
        }
        xla_hlo_parser::parse_module(&split.to_text())
            .unwrap_or_else(|e| panic!("{name}: the printed module does not parse: {e}"));
        assert!(
            collective_count(&split) >= collective_count(&module) + count,
            "{name}"
        );
        assert_rewrite_computes_the_same(&global, &module, &split, 0xdec0_3905, &name);
    }
    eprintln!(
        "split {cases} cases: {} all-reduce, {} reduce-scatter, {} all-gather pairs, {} collectives alone; {chain_ops} ops split with them, {chains_with_dots} chains reaching a dot; {prologue_ops} prologue ops, {prologues_with_dots} prologues with a dot",
        pairs[PairKind::AllReduce as usize],
        pairs[PairKind::ReduceScatter as usize],
        pairs[PairKind::AllGather as usize],
        pairs[PairKind::Alone as usize]
    );
    assert!(cases >= 20, "only {cases} cases had pairs to split");
    if !cfg!(debug_assertions) {
        // testdata alone: 132 cases; 110 all-reduce, 16 reduce-scatter and
        // 17 all-gather pairs and 182 collectives alone; 2254 chain ops,
        // 35 chains reaching a dot.
        assert!(cases >= 120 && pairs.iter().all(|&p| p >= 15), "{pairs:?}");
        assert!(pairs[PairKind::Alone as usize] >= 150, "{pairs:?}");
        assert!(
            chain_ops >= 2000 && chains_with_dots >= 30,
            "{chain_ops} chain ops, {chains_with_dots} reaching a dot"
        );
        // With ../shared's corpus: 1554 prologue ops, 49 holding a dot.
        assert!(
            prologue_ops >= 800 && prologues_with_dots >= 25,
            "{prologue_ops} prologue ops, {prologues_with_dots} holding a dot"
        );
    }
}

/// The dimensions a collective is not split along by preference (the
/// other [`candidate_ways`]) are split as exactly: on every stored case,
/// each collective with another way is split along its last one in 2
/// chunks, and the split program computes the unsplit one's bits.
#[test]
fn other_dimensions_compute_bitwise_what_whole_ones_compute() {
    let (mut cases, mut pairs) = (0, 0);
    for dir in xla_test_paths::all_case_dirs() {
        let Ok(text) = std::fs::read_to_string(dir.join("input.hlo")) else {
            continue;
        };
        let name = dir.display().to_string();
        let (global, module) =
            propagate_and_partition(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan: Vec<(Candidate, i64)> = candidate_ways(&module)
            .into_iter()
            .filter(|ways| ways.len() > 1)
            .filter_map(|ways| ways.last().cloned())
            .filter(|c| c.size % 2 == 0)
            .map(|c| (c, 2))
            .collect();
        if plan.is_empty() {
            continue;
        }
        if cfg!(debug_assertions) && cases == 20 {
            break;
        }
        let mut split = module.clone();
        let count = decompose(&mut split, &plan);
        assert!(count >= 1, "{name}");
        cases += 1;
        pairs += count;
        assert_rewrite_computes_the_same(&global, &module, &split, 0x07e5_d135, &name);
    }
    eprintln!("split {pairs} pairs along another dimension in {cases} cases");
    assert!(cases >= 20, "only {cases} cases had other ways to split");
}

/// Splits `module` by `candidate` in 2 chunks: the result verifies and,
/// run on 4 devices, computes `want` (of the global shape `out_shape`) bit
/// for bit.
fn assert_halves_compute(
    module: &xla_hlo_ir::HloModule,
    candidate: Candidate,
    (args, out_shape): (&[Value], &xla_hlo_ir::Shape),
    want: &Value,
    label: &str,
) {
    let mut split = module.clone();
    assert_eq!(decompose(&mut split, &[(candidate, 2)]), 1, "{label}");
    xla_hlo_verifier::verify(&split)
        .unwrap_or_else(|e| panic!("{label}: {e}\n{}", split.to_text()));
    let got = run_partitioned_in_mode(&split, args, out_shape, 4, true).unwrap();
    assert_bitwise_equal(&got, want, label);
}

/// Two tensor-parallel MLP blocks with a residual connection: the first
/// all-reduce's chain runs through the second block, its all-reduce and
/// the residual add to the root, so the whole second block is split with
/// the first collective; the split program computes the same bits.
#[test]
fn a_chain_through_the_next_block_and_its_all_reduce_computes_the_same() {
    let text = r#"HloModule tp2, num_partitions=4

ENTRY %e (x: f32[8,16], w1: f32[16,32], w2: f32[32,16], w3: f32[16,32], w4: f32[32,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0), sharding={replicated}
  %w1 = f32[16,32] parameter(1), sharding={devices=[1,4]<=[4]}
  %w2 = f32[32,16] parameter(2), sharding={devices=[4,1]<=[4]}
  %w3 = f32[16,32] parameter(3), sharding={devices=[1,4]<=[4]}
  %w4 = f32[32,16] parameter(4), sharding={devices=[4,1]<=[4]}
  %h1 = f32[8,32] dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}
  %y1 = f32[8,16] dot(%h1, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  %r1 = f32[8,16] add(%x, %y1), sharding={replicated}
  %t = f32[8,16] tanh(%r1), sharding={replicated}
  %h2 = f32[8,32] dot(%t, %w3), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}
  %y2 = f32[8,16] dot(%h2, %w4), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT %r2 = f32[8,16] add(%r1, %y2), sharding={replicated}
}
"#;
    let (global, module) = propagate_and_partition(text).unwrap();
    let found = candidates(&module);
    let comp = &module.computations[module.entry.index()];
    let first = found
        .iter()
        .filter(|c| c.kind == PairKind::AllReduce)
        .min_by_key(|c| c.collective)
        .expect("the first block's all-reduce")
        .clone();
    // Along the rows, through the second block's dots and all-reduce to
    // the root.
    let chained: Vec<Opcode> = first
        .chain
        .iter()
        .map(|&(op, _)| comp.instr(op).opcode)
        .collect();
    assert_eq!(
        chained.iter().filter(|o| **o == Opcode::Dot).count(),
        2,
        "{chained:?}"
    );
    assert!(chained.contains(&Opcode::AllReduce), "{chained:?}");
    assert!(first.chain.iter().any(|&(op, _)| op == comp.root));
    let args = random_args(&global, 0xc4a1);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let want = run_partitioned_in_mode(&module, &args, &out_shape, 4, true).unwrap();
    for k in [2, 4, 8] {
        let mut split = module.clone();
        assert_eq!(decompose(&mut split, &[(first.clone(), k)]), 1);
        xla_hlo_verifier::verify(&split).unwrap_or_else(|e| panic!("{e}\n{}", split.to_text()));
        let all_reduces = split
            .entry_computation()
            .instructions
            .iter()
            .filter(|i| i.opcode == Opcode::AllReduce)
            .count();
        assert_eq!(
            all_reduces,
            2 * k as usize,
            "both all-reduces in {k} chunks"
        );
        let got = run_partitioned_in_mode(&split, &args, &out_shape, 4, true).unwrap();
        assert_bitwise_equal(&got, &want, &format!("{k} chunks"));
    }
    // Every prefix of the chain is a chain (what `decompose-collectives`
    // tries when the whole chain costs more than it hides): the ops after
    // it read the concatenated values.
    for length in 0..first.chain.len() {
        let shorter = Candidate {
            chain: first.chain[..length].to_vec(),
            ..first.clone()
        };
        assert_halves_compute(
            &module,
            shorter,
            (&args, &out_shape),
            &want,
            &format!("a chain of {length} ops"),
        );
    }
}

/// Tensor-parallel attention (a head per device) and its row-parallel
/// output projection: the all-reduce's prologue reaches back through the
/// attention-weighted values, the softmax and the scores to the query
/// projection (the keys and values are needed whole), so every query
/// chunk's attention and all-reduce are computed on their own; the split
/// program computes the same bits.
#[test]
fn a_prologue_through_attention_computes_the_same() {
    let text = r#"HloModule attention, num_partitions=4

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[8,16], wq: f32[16,4,8], wk: f32[16,4,8], wv: f32[16,4,8], wo: f32[4,8,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0), sharding={replicated}
  %wq = f32[16,4,8] parameter(1), sharding={devices=[1,4,1]<=[4]}
  %wk = f32[16,4,8] parameter(2), sharding={devices=[1,4,1]<=[4]}
  %wv = f32[16,4,8] parameter(3), sharding={devices=[1,4,1]<=[4]}
  %wo = f32[4,8,16] parameter(4), sharding={devices=[4,1,1]<=[4]}
  %q = f32[8,4,8] dot(%x, %wq), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4,1]<=[4]}
  %k = f32[8,4,8] dot(%x, %wk), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4,1]<=[4]}
  %v = f32[8,4,8] dot(%x, %wv), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4,1]<=[4]}
  %scores = f32[4,8,8] dot(%q, %k), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={1}, rhs_contracting_dims={2}, sharding={devices=[4,1,1]<=[4]}
  %ninf = f32[] constant(-inf)
  %row_max = f32[4,8] reduce(%scores, %ninf), dimensions={2}, to_apply=%max, sharding={devices=[4,1]<=[4]}
  %max_b = f32[4,8,8] broadcast(%row_max), dimensions={0,1}, sharding={devices=[4,1,1]<=[4]}
  %shifted = f32[4,8,8] subtract(%scores, %max_b), sharding={devices=[4,1,1]<=[4]}
  %exp = f32[4,8,8] exponential(%shifted), sharding={devices=[4,1,1]<=[4]}
  %zero = f32[] constant(0)
  %row_sum = f32[4,8] reduce(%exp, %zero), dimensions={2}, to_apply=%sum, sharding={devices=[4,1]<=[4]}
  %sum_b = f32[4,8,8] broadcast(%row_sum), dimensions={0,1}, sharding={devices=[4,1,1]<=[4]}
  %p = f32[4,8,8] divide(%exp, %sum_b), sharding={devices=[4,1,1]<=[4]}
  %o = f32[4,8,8] dot(%p, %v), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1,1]<=[4]}
  ROOT %out = f32[8,16] dot(%o, %wo), lhs_contracting_dims={0,2}, rhs_contracting_dims={0,1}, sharding={replicated}
}
"#;
    let (global, module) = propagate_and_partition(text).unwrap();
    let found = candidates(&module);
    let comp = &module.computations[module.entry.index()];
    let pair = found
        .iter()
        .find(|c| c.kind == PairKind::AllReduce)
        .expect("the output projection's all-reduce")
        .clone();
    let opcodes: Vec<Opcode> = pair
        .prologue
        .iter()
        .map(|p| comp.instr(p.op).opcode)
        .collect();
    // The query projection, the scores and the weighted values.
    assert_eq!(
        opcodes.iter().filter(|o| **o == Opcode::Dot).count(),
        3,
        "{opcodes:?}"
    );
    assert!(opcodes.contains(&Opcode::Exp), "{opcodes:?}");
    assert_eq!(
        opcodes.iter().filter(|o| **o == Opcode::Reduce).count(),
        2,
        "{opcodes:?}"
    );
    let args = random_args(&global, 0xa77e);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let want = run_partitioned_in_mode(&module, &args, &out_shape, 4, true).unwrap();
    for k in [2, 4, 8] {
        let mut split = module.clone();
        assert_eq!(decompose(&mut split, &[(pair.clone(), k)]), 1);
        xla_hlo_verifier::verify(&split).unwrap_or_else(|e| panic!("{e}\n{}", split.to_text()));
        let entry = split.entry_computation();
        let count = |opcode: Opcode| {
            entry
                .instructions
                .iter()
                .filter(|i| i.opcode == opcode)
                .count()
        };
        // The key and value projections stay whole.
        assert_eq!(count(Opcode::Dot), 2 + 4 * k as usize, "{k} chunks");
        assert_eq!(count(Opcode::Exp), k as usize, "{k} chunks");
        // Chunk-major order: the first chunk's all-reduce comes before the
        // last chunk's attention.
        let position = |opcode: Opcode| {
            entry
                .instructions
                .iter()
                .enumerate()
                .filter(move |(_, i)| i.opcode == opcode)
                .map(|(p, _)| p)
        };
        let first_all_reduce = position(Opcode::AllReduce).next().unwrap();
        let last_exp = position(Opcode::Exp).next_back().unwrap();
        assert!(first_all_reduce < last_exp, "{k} chunks");
        let got = run_partitioned_in_mode(&split, &args, &out_shape, 4, true).unwrap();
        assert_bitwise_equal(&got, &want, &format!("{k} chunks"));
    }
    // Every suffix of the prologue is a prologue (what
    // `decompose-collectives` tries when the whole one costs more than it
    // hides): its first ops slice their operands from whole values.
    for length in 0..pair.prologue.len() {
        let shorter = Candidate {
            prologue: pair.prologue[pair.prologue.len() - length..].to_vec(),
            ..pair.clone()
        };
        assert_halves_compute(
            &module,
            shorter,
            (&args, &out_shape),
            &want,
            &format!("a prologue of {length} ops"),
        );
    }
}

/// A tensor-parallel MLP on a batch of one, after a normalisation with a
/// scale and bias of shape [1, features] broadcast along the rows (as JAX
/// lowers them, with ops of their own): along the batch dimension (size 1)
/// the prologue would be longest (it takes in the scale's and bias's ops),
/// but no chunk count divides it, so the pair is split along the rows
/// instead (a held-out LayerNorm MLP once got no split at all this way).
#[test]
fn a_batch_of_one_is_split_along_its_rows() {
    let text = r#"HloModule batch_of_one, num_partitions=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[1,16,8], scale: f32[1,8], bias: f32[1,8], w1: f32[8,32], w2: f32[32,8]) -> f32[1,16,8] {
  %x = f32[1,16,8] parameter(0), sharding={replicated}
  %scale = f32[1,8] parameter(1), sharding={replicated}
  %bias = f32[1,8] parameter(2), sharding={replicated}
  %w1 = f32[8,32] parameter(3), sharding={devices=[1,4]<=[4]}
  %w2 = f32[32,8] parameter(4), sharding={devices=[4,1]<=[4]}
  %zero = f32[] constant(0)
  %row_sum = f32[1,16] reduce(%x, %zero), dimensions={2}, to_apply=%sum, sharding={replicated}
  %row_sum_b = f32[1,16,8] broadcast(%row_sum), dimensions={0,1}, sharding={replicated}
  %centred = f32[1,16,8] subtract(%x, %row_sum_b), sharding={replicated}
  %scale_exp = f32[1,8] exponential(%scale), sharding={replicated}
  %scale_b = f32[1,16,8] broadcast(%scale_exp), dimensions={0,2}, sharding={replicated}
  %scaled = f32[1,16,8] multiply(%centred, %scale_b), sharding={replicated}
  %bias_tanh = f32[1,8] tanh(%bias), sharding={replicated}
  %bias_b = f32[1,16,8] broadcast(%bias_tanh), dimensions={0,2}, sharding={replicated}
  %normed = f32[1,16,8] add(%scaled, %bias_b), sharding={replicated}
  %h = f32[1,16,32] dot(%normed, %w1), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,1,4]<=[4]}
  %a = f32[1,16,32] tanh(%h), sharding={devices=[1,1,4]<=[4]}
  ROOT %y = f32[1,16,8] dot(%a, %w2), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={replicated}
}
"#;
    let (global, module) = propagate_and_partition(text).unwrap();
    let pair = candidates(&module)
        .into_iter()
        .find(|c| c.kind == PairKind::AllReduce)
        .expect("the MLP's all-reduce");
    assert_eq!((pair.output_dim, pair.size), (1, 16), "{pair:?}");
    assert!(!pair.prologue.is_empty(), "{pair:?}");
    let args = random_args(&global, 0xba7c);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let want = run_partitioned_in_mode(&module, &args, &out_shape, 4, true).unwrap();
    assert_halves_compute(
        &module,
        pair.clone(),
        (&args, &out_shape),
        &want,
        "2 chunks",
    );
    // The other way: the projection's output features (the weight's
    // columns, each read once), after the rows.
    let ways = candidate_ways(&module)
        .into_iter()
        .find(|ways| ways[0] == pair)
        .expect("the all-reduce's ways");
    let features = ways
        .iter()
        .find(|c| (c.side, c.output_dim, c.size) == (1, 2, 8))
        .expect("a way along the output features")
        .clone();
    assert!(features.prologue.is_empty(), "{features:?}");
    assert_halves_compute(
        &module,
        features,
        (&args, &out_shape),
        &want,
        "2 chunks of features",
    );
}

/// A row-parallel MLP whose all-reduce feeds tensor-parallel attention
/// over a batch of two: split along the batch, the chain runs through the
/// scores and the attention-weighted values (dots with the batch as a
/// batch dimension, both sides chunked), the output projection and its
/// all-reduce to the root; the split program computes the same bits.
#[test]
fn a_chain_through_batched_attention_computes_the_same() {
    let text = r#"HloModule batched_attention, num_partitions=4

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[2,8,16], w1: f32[16,32], w2: f32[32,16], wq: f32[16,4,8], wk: f32[16,4,8], wv: f32[16,4,8], wo: f32[4,8,16]) -> f32[2,8,16] {
  %x = f32[2,8,16] parameter(0), sharding={replicated}
  %w1 = f32[16,32] parameter(1), sharding={devices=[1,4]<=[4]}
  %w2 = f32[32,16] parameter(2), sharding={devices=[4,1]<=[4]}
  %wq = f32[16,4,8] parameter(3), sharding={devices=[1,4,1]<=[4]}
  %wk = f32[16,4,8] parameter(4), sharding={devices=[1,4,1]<=[4]}
  %wv = f32[16,4,8] parameter(5), sharding={devices=[1,4,1]<=[4]}
  %wo = f32[4,8,16] parameter(6), sharding={devices=[4,1,1]<=[4]}
  %h = f32[2,8,32] dot(%x, %w1), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,1,4]<=[4]}
  %y = f32[2,8,16] dot(%h, %w2), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={replicated}
  %r = f32[2,8,16] add(%x, %y), sharding={replicated}
  %q = f32[2,8,4,8] dot(%r, %wq), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,1,4,1]<=[4]}
  %k = f32[2,8,4,8] dot(%r, %wk), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,1,4,1]<=[4]}
  %v = f32[2,8,4,8] dot(%r, %wv), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,1,4,1]<=[4]}
  %scores = f32[2,4,8,8] dot(%q, %k), lhs_batch_dims={0,2}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={3}, sharding={devices=[1,4,1,1]<=[4]}
  %ninf = f32[] constant(-inf)
  %row_max = f32[2,4,8] reduce(%scores, %ninf), dimensions={3}, to_apply=%max, sharding={devices=[1,4,1]<=[4]}
  %max_b = f32[2,4,8,8] broadcast(%row_max), dimensions={0,1,2}, sharding={devices=[1,4,1,1]<=[4]}
  %shifted = f32[2,4,8,8] subtract(%scores, %max_b), sharding={devices=[1,4,1,1]<=[4]}
  %exp = f32[2,4,8,8] exponential(%shifted), sharding={devices=[1,4,1,1]<=[4]}
  %zero = f32[] constant(0)
  %row_sum = f32[2,4,8] reduce(%exp, %zero), dimensions={3}, to_apply=%sum, sharding={devices=[1,4,1]<=[4]}
  %sum_b = f32[2,4,8,8] broadcast(%row_sum), dimensions={0,1,2}, sharding={devices=[1,4,1,1]<=[4]}
  %p = f32[2,4,8,8] divide(%exp, %sum_b), sharding={devices=[1,4,1,1]<=[4]}
  %o = f32[2,4,8,8] dot(%p, %v), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={1}, sharding={devices=[1,4,1,1]<=[4]}
  %out = f32[2,8,16] dot(%o, %wo), lhs_contracting_dims={1,3}, rhs_contracting_dims={0,1}, sharding={replicated}
  ROOT %r2 = f32[2,8,16] add(%r, %out), sharding={replicated}
}
"#;
    let (global, module) = propagate_and_partition(text).unwrap();
    let comp = &module.computations[module.entry.index()];
    let pair = candidates(&module)
        .into_iter()
        .filter(|c| c.kind == PairKind::AllReduce)
        .min_by_key(|c| c.collective)
        .expect("the MLP's all-reduce");
    assert_eq!((pair.output_dim, pair.size), (0, 2), "{pair:?}");
    let chain: Vec<&xla_hlo_ir::HloInstruction> =
        pair.chain.iter().map(|&(op, _)| comp.instr(op)).collect();
    let batch_dots = chain
        .iter()
        .filter(|i| i.opcode == Opcode::Dot && i.attr(xla_hlo_ir::AttrKey::LhsBatchDims).is_some())
        .count();
    assert_eq!(
        batch_dots, 2,
        "the scores and the weighted values: {chain:?}"
    );
    assert!(
        chain.iter().any(|i| i.opcode == Opcode::AllReduce),
        "the output projection's all-reduce"
    );
    let args = random_args(&global, 0x0ba7_c4ed);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let want = run_partitioned_in_mode(&module, &args, &out_shape, 4, true).unwrap();
    assert_halves_compute(&module, pair, (&args, &out_shape), &want, "2 batch chunks");
}
