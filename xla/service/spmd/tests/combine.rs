//! Collective combining proven by execution: every stored case
//! (testdata/cases and, when present, ../shared/corpus/cases) is propagated
//! and partitioned, every group `combinable_groups` finds is combined, and
//! the combined program must verify, read back, and compute what the
//! uncombined one computes on the same random arguments, bitwise, in
//! consistent mode. Small modules check what may and may not be grouped.

mod common;

use common::{
    assert_bitwise_equal, assert_rewrite_computes_the_same, collective_count,
    propagate_and_partition, random_args, run_partitioned_in_mode,
};
use xla_hlo_ir::Opcode;
use xla_spmd_partitioner::combine::{combinable_groups, combine, CombineOptions};

#[test]
fn combined_collectives_compute_bitwise_what_separate_ones_compute() {
    let (mut cases, mut groups_total, mut members_total) = (0, 0, 0);
    for dir in xla_test_paths::all_case_dirs() {
        let Ok(text) = std::fs::read_to_string(dir.join("input.hlo")) else {
            continue;
        };
        let name = dir.display().to_string();
        let (global, module) =
            propagate_and_partition(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let groups = combinable_groups(&module, &CombineOptions::default());
        if groups.is_empty() {
            continue;
        }
        if cfg!(debug_assertions) && cases == 20 {
            break;
        }
        let members: usize = groups.iter().map(|g| g.members.len()).sum();
        let mut combined = module.clone();
        assert_eq!(combine(&mut combined, &groups), groups.len(), "{name}");
        cases += 1;
        groups_total += groups.len();
        members_total += members;
        assert_eq!(
            collective_count(&combined),
            collective_count(&module) - members + groups.len(),
            "{name}"
        );
        xla_hlo_parser::parse_module(&combined.to_text())
            .unwrap_or_else(|e| panic!("{name}: the printed module does not parse: {e}"));
        assert_rewrite_computes_the_same(&global, &module, &combined, 0xc0b1_9e55, &name);
    }
    eprintln!("combined {groups_total} groups of {members_total} collectives in {cases} cases");
    assert!(cases >= 10, "only {cases} cases had collectives to combine");
}

/// A data-parallel step's gradients over 4 devices, already partitioned
/// (each device's values offset by its partition id):
/// `%ga` and `%gb` are independent (one group), `%gc` needs `%ga`'s sum,
/// `%gd` reduces over other devices and `%ge` is a maximum, so none of
/// those three joins; thresholds split a group.
const GRADIENTS: &str = r#"HloModule gradients, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %t = f32[] add(%y, %x)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

ENTRY %e (a: f32[16,8], b: f32[8], c: f32[8], d: f32[4]) -> (f32[16,8], f32[8], f32[8], f32[4], f32[8]) {
  %a = f32[16,8] parameter(0)
  %b = f32[8] parameter(1)
  %c = f32[8] parameter(2)
  %d = f32[4] parameter(3)
  %pid = u32[] partition-id()
  %pid_f = f32[] convert(%pid)
  %pid_a = f32[16,8] broadcast(%pid_f), dimensions={}
  %pid_b = f32[8] broadcast(%pid_f), dimensions={}
  %a1 = f32[16,8] add(%a, %pid_a)
  %b1 = f32[8] multiply(%b, %pid_b)
  %ga = f32[16,8] all-reduce(%a1), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %gb = f32[8] all-reduce(%b1), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%sum
  %row = f32[1,8] slice(%ga), slice={[0:1], [0:8]}
  %row1 = f32[8] reshape(%row)
  %c1 = f32[8] add(%c, %row1)
  %gc = f32[8] all-reduce(%c1), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %gd = f32[4] all-reduce(%d), channel_id=4, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  %ge = f32[8] all-reduce(%b1), channel_id=5, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%max
  ROOT %out = (f32[16,8], f32[8], f32[8], f32[4], f32[8]) tuple(%ga, %gb, %gc, %gd, %ge)
}
"#;

#[test]
fn only_independent_collectives_of_one_kind_are_grouped() {
    let module = xla_hlo_parser::parse_module(GRADIENTS).unwrap();
    let comp = module.entry_computation();
    let names = |options: &CombineOptions| -> Vec<Vec<String>> {
        combinable_groups(&module, options)
            .iter()
            .map(|g| {
                g.members
                    .iter()
                    .map(|m| comp.instr(*m).name.clone())
                    .collect()
            })
            .collect()
    };
    // `%sum` adds its parameters the other way round: still an addition.
    assert_eq!(names(&CombineOptions::default()), [["ga", "gb"]]);
    // `%ga` (512 bytes) and `%gb` (32) overflow a 500-byte group: `%gb`
    // opens the next one, which `%gc` joins (it needs `%ga`, not `%gb`).
    let small = CombineOptions {
        threshold_bytes: 500,
        ..Default::default()
    };
    assert_eq!(names(&small), [["gb", "gc"]]);
    let single = CombineOptions {
        threshold_count: 1,
        ..Default::default()
    };
    assert!(names(&single).is_empty());

    let mut combined = module.clone();
    let groups = combinable_groups(&module, &CombineOptions::default());
    assert_eq!(combine(&mut combined, &groups), 1);
    xla_hlo_verifier::verify(&combined).unwrap_or_else(|e| panic!("{e}"));
    let entry = combined.entry_computation();
    let tuple = entry
        .instructions
        .iter()
        .find(|i| i.opcode == Opcode::AllReduce && i.operands.len() == 2)
        .expect("the combined all-reduce");
    assert!(tuple.shape.is_tuple());
    for name in ["ga", "gb"] {
        let element = entry.instructions.iter().find(|i| i.name == name).unwrap();
        assert_eq!(element.opcode, Opcode::GetTupleElement, "{name}");
    }
    // Arguments are the same on every device, each device adds (or
    // multiplies by) its partition id before the sums; results agree
    // across devices.
    let args = random_args(&module, 7);
    let out_shape = comp.root_instr().shape.clone();
    let want = run_partitioned_in_mode(&module, &args, &out_shape, 4, true).unwrap();
    let got = run_partitioned_in_mode(&combined, &args, &out_shape, 4, true).unwrap();
    assert_bitwise_equal(&got, &want, "gradients");
}
