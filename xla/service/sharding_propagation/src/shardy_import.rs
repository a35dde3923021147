//! `shardy-import`: turns the Shardy annotations of a default JAX lowering
//! (`xla.sdy.*` frontend attributes and custom calls) into the GSPMD forms
//! the rest of the pipeline reads, the forms JAX emitted before Shardy.
//!
//! What becomes what:
//! - the module's `xla.sdy.meshes` is the mesh table the shardings name;
//! - an instruction's `xla.sdy.sharding` becomes its `sharding={...}`
//!   (tuple-shaped instructions get one leaf per value); a dimension that is
//!   open and names no axis (`{?}`) is left to propagation: on a `Sharding`
//!   custom call it becomes `unspecified_dims` (a constraint made only of
//!   such dimensions is no constraint and is removed), on any other
//!   instruction a sharding made only of such dimensions is dropped;
//! - `xla.sdy.ShardingGroup(x)` (shard_alike) becomes a
//!   `Sharding` custom call `{unknown shard_as N}` on `x` that `x`'s users
//!   read instead;
//! - a manual computation (shard_map): `xla.sdy.GlobalToLocalShape`, a call
//!   to `xla.sdy.manual_computation_body*`, `xla.sdy.LocalToGlobalShape`
//!   becomes, per value, `Sharding` (in sharding) + `SPMDFullToShardShape`
//!   (manual over the manual axes), the body inlined, then `Sharding`
//!   (manual) + `SPMDShardToFullShape` (out sharding);
//! - `xla.sdy.FuncResultSharding(x)` is `x` (the root carries the result
//!   sharding), or a `Sharding` constraint where the root has none.
//!
//! Two modes (`ImportMode`): before GSPMD propagation (what the
//! `shardy-import` pass does, partially open dimensions `{"x", ?}` read as
//! closed), or as the export after Shardy's own propagation
//! (`sdy_propagation`, run by `sdy-propagation` and by default by
//! `sharding-propagation`), where sharding groups are already resolved and
//! instructions of an inlined manual body get its manual sharding.
//!
//! Invariants: a module without `xla.sdy` annotations is left unchanged; on
//! success no `xla.sdy.*` custom call or frontend attribute remains, the
//! instructions keep definition-before-use order and module-wide unique
//! names; every error names the computation, the instruction and the
//! attribute with the offset inside it.

use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::mesh::AxisRef;
use xla_hlo_ir::sdy::{self, FrontendAttributes, MeshRef, SdyMesh, SdySharding};
use xla_hlo_ir::sharding::{HloSharding, ShardGroup, ShardingKind, SingleSharding};
use xla_hlo_ir::{CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode, Shape};
use xla_hlo_utils::{NamedMesh, PartitionSpec};

const MESHES: &str = "xla.sdy.meshes";
const SHARDING: &str = "xla.sdy.sharding";
const IN_SHARDINGS: &str = "xla.sdy.in_shardings";
const OUT_SHARDINGS: &str = "xla.sdy.out_shardings";
const MANUAL_AXES: &str = "xla.sdy.manual_axes";
const GROUP_ID: &str = "xla.sdy.sharding_group_id";
const GLOBAL_TO_LOCAL: &str = "xla.sdy.GlobalToLocalShape";
const LOCAL_TO_GLOBAL: &str = "xla.sdy.LocalToGlobalShape";
const SHARDING_GROUP: &str = "xla.sdy.ShardingGroup";
const FUNC_RESULT: &str = "xla.sdy.FuncResultSharding";
const MANUAL_BODY_PREFIX: &str = "xla.sdy.manual_computation_body";

/// Shardings that Shardy propagation settled, by computation and
/// instruction: each one takes the place of its instruction's
/// `xla.sdy.sharding` attribute, so the export reads them as they are,
/// with no print and re-parse. Indexed by the module's ids as they are
/// when propagation ends (the import's input).
#[derive(Clone, Debug, Default)]
pub struct PropagatedShardings {
    by_comp: Vec<Vec<Option<Vec<SdySharding>>>>,
}

impl PropagatedShardings {
    /// Records `instr`'s shardings, one per value.
    pub fn set(&mut self, comp: CompId, instr: InstrId, shardings: Vec<SdySharding>) {
        let (c, i) = (comp.index(), instr.index());
        if self.by_comp.len() <= c {
            self.by_comp.resize_with(c + 1, Vec::new);
        }
        let instrs = &mut self.by_comp[c];
        if instrs.len() <= i {
            instrs.resize_with(i + 1, || None);
        }
        instrs[i] = Some(shardings);
    }

    /// `instr`'s shardings, where propagation settled them.
    pub fn get(&self, comp: CompId, instr: InstrId) -> Option<&[SdySharding]> {
        self.by_comp
            .get(comp.index())?
            .get(instr.index())?
            .as_deref()
    }
}

/// What the import did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardyImportStats {
    pub shardings: usize,
    pub sharding_groups: usize,
    pub manual_computations: usize,
    pub func_results: usize,
}

/// Whether the module carries Shardy annotations.
pub fn has_shardy_annotations(module: &HloModule) -> bool {
    module
        .config
        .frontend_attributes
        .as_deref()
        .is_some_and(|f| f.contains("xla.sdy."))
        || module.computations.iter().any(|c| {
            c.instructions.iter().any(|i| {
                custom_call_target(i).is_some_and(|t| t.starts_with("xla.sdy."))
                    || raw_frontend_attributes(i).is_some_and(|f| f.contains("xla.sdy."))
            })
        })
}

/// Whether the module has a Shardy manual computation (shard_map).
pub fn has_manual_computation(module: &HloModule) -> bool {
    module.computations.iter().any(|c| {
        c.instructions
            .iter()
            .any(|i| custom_call_target(i) == Some(GLOBAL_TO_LOCAL))
    })
}

pub(crate) fn custom_call_target(instr: &HloInstruction) -> Option<&str> {
    if instr.opcode == Opcode::CustomCall {
        instr.ident_attr(AttrKey::CustomCallTarget)
    } else {
        None
    }
}

fn raw_frontend_attributes(instr: &HloInstruction) -> Option<&str> {
    match instr.attr(AttrKey::FrontendAttributes) {
        Some(AttrValue::Raw(text)) => Some(text),
        _ => None,
    }
}

/// An error about one instruction (or the module, with an empty name).
fn error(comp: &str, instr: &str, message: impl std::fmt::Display) -> String {
    if instr.is_empty() {
        format!("shardy-import: {comp}: {message}")
    } else {
        format!("shardy-import: {comp}/{instr}: {message}")
    }
}

/// The mesh table and the conversion of Shardy shardings to GSPMD ones.
struct Meshes {
    meshes: Vec<(String, SdyMesh)>,
    /// `single`'s results by its arguments, bucketed by their hash (so a
    /// lookup needs no copy of them): a module repeats few distinct
    /// shardings over many instructions.
    converted: RefCell<FxHashMap<u64, Vec<(SingleKey, Converted)>>>,
}

/// `Meshes::single`'s result.
type Converted = Result<Option<SingleSharding>, String>;

/// `Meshes::single`'s arguments.
type SingleKey = (SdySharding, usize, Vec<String>, bool);

impl Meshes {
    fn mesh<'a>(&'a self, r: &'a MeshRef) -> Result<&'a SdyMesh, String> {
        match r {
            MeshRef::Inline(m) => Ok(m),
            MeshRef::Named(n) => self
                .meshes
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, m)| m)
                .ok_or_else(|| {
                    let known: Vec<&str> = self.meshes.iter().map(|(n, _)| n.as_str()).collect();
                    format!(
                        "mesh '@{n}' is not defined (the module's {MESHES} has [{}])",
                        known.join(", ")
                    )
                }),
        }
    }

    /// The GSPMD sharding of one value. `manual` names the axes the value is
    /// manual over (inside a shard_map body, or the local side of one).
    /// `None` when every dimension is open without axes (propagation decides).
    fn single(
        &self,
        s: &SdySharding,
        rank: usize,
        manual: &[String],
        keep_open: bool,
    ) -> Result<Option<SingleSharding>, String> {
        let hash = {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<rustc_hash::FxHasher>::default()
                .hash_one((s, rank, manual, keep_open))
        };
        let same = |(k, _): &&(SingleKey, _)| {
            k.0 == *s && k.1 == rank && k.2.as_slice() == manual && k.3 == keep_open
        };
        if let Some((_, hit)) = self
            .converted
            .borrow()
            .get(&hash)
            .and_then(|bucket| bucket.iter().find(same))
        {
            return hit.clone();
        }
        let result = self.convert(s, rank, manual, keep_open);
        self.converted.borrow_mut().entry(hash).or_default().push((
            (s.clone(), rank, manual.to_vec(), keep_open),
            result.clone(),
        ));
        result
    }

    /// [`Meshes::single`] without the memo.
    fn convert(
        &self,
        s: &SdySharding,
        rank: usize,
        manual: &[String],
        keep_open: bool,
    ) -> Result<Option<SingleSharding>, String> {
        let mesh = self.mesh(&s.mesh)?;
        if s.dims.len() != rank {
            return Err(format!(
                "the sharding has {} dimensions but the value has rank {rank}",
                s.dims.len()
            ));
        }
        check_axes(s, mesh)?;
        if !keep_open
            && manual.is_empty()
            && !s.dims.is_empty()
            && s.dims.iter().all(|d| d.open && d.axes.is_empty())
            && s.replicated.is_empty()
        {
            return Ok(None);
        }
        if mesh.axes.is_empty() {
            return Ok(Some(SingleSharding::new(
                match mesh.device_ids.as_deref() {
                    Some([device]) => ShardingKind::Maximal(*device),
                    _ => ShardingKind::Replicated,
                },
            )));
        }
        let named = match &mesh.device_ids {
            None => NamedMesh::new(mesh.axes.clone()),
            Some(ids) => NamedMesh::with_devices(mesh.axes.clone(), ids.clone()),
        }
        .map_err(|e| e.to_string())?;
        let spec = PartitionSpec {
            dims: s
                .dims
                .iter()
                .map(|d| {
                    d.axes
                        .iter()
                        .filter(|a| !manual.contains(&a.name))
                        .cloned()
                        .collect()
                })
                .collect(),
            manual: manual.iter().map(|m| AxisRef::axis(m.clone())).collect(),
            unreduced: s.unreduced.clone(),
        };
        let sharding = named.sharding(&spec).map_err(|e| e.to_string())?;
        Ok(Some(sharding.to_ir()))
    }

    /// The sharding of an instruction of `shape` from one Shardy sharding per
    /// value (a tuple shape takes one per element).
    fn for_shape(
        &self,
        shardings: &[SdySharding],
        shape: &Shape,
        manual: &[String],
        keep_open: bool,
    ) -> Result<Option<HloSharding>, String> {
        match shape {
            Shape::Tuple(elements) => {
                if shardings.len() != elements.len() {
                    return Err(format!(
                        "{} shardings for a tuple of {} values",
                        shardings.len(),
                        elements.len()
                    ));
                }
                let mut leaves = Vec::new();
                let mut any = false;
                for (s, e) in shardings.iter().zip(elements) {
                    if matches!(e, Shape::Tuple(_)) {
                        return Err("a sharding of a nested tuple value is not supported".into());
                    }
                    match self.single(s, e.rank(), manual, keep_open)? {
                        Some(leaf) => {
                            any = true;
                            leaves.push(leaf);
                        }
                        None => leaves.push(SingleSharding::new(ShardingKind::Replicated)),
                    }
                }
                Ok(any.then_some(HloSharding::Tuple(leaves)))
            }
            _ => {
                if shardings.len() != 1 {
                    return Err(format!("{} shardings for one value", shardings.len()));
                }
                Ok(self
                    .single(&shardings[0], shape.rank(), manual, keep_open)?
                    .map(HloSharding::Single))
            }
        }
    }
}

/// Shardy's invariants on one sharding (`SdySharding::check_axes`).
fn check_axes(s: &SdySharding, mesh: &SdyMesh) -> Result<(), String> {
    s.check_axes(mesh).map_err(|e| e.message)
}

/// One instruction's Shardy attributes, parsed.
struct InstrAnnotations {
    attributes: FrontendAttributes,
}

impl InstrAnnotations {
    fn read(comp: &str, instr: &HloInstruction) -> Result<Option<InstrAnnotations>, String> {
        let Some(raw) = raw_frontend_attributes(instr) else {
            return Ok(None);
        };
        if !raw.contains("xla.sdy.") {
            return Ok(None);
        }
        let attributes = FrontendAttributes::parse(raw)
            .map_err(|e| error(comp, &instr.name, format!("frontend_attributes {e}")))?;
        Ok(Some(InstrAnnotations { attributes }))
    }

    fn value<T>(
        &self,
        comp: &str,
        instr: &str,
        key: &str,
        parse: impl Fn(&str) -> Result<T, sdy::SdyError>,
    ) -> Result<Option<T>, String> {
        let Some(entry) = self.attributes.get(key) else {
            return Ok(None);
        };
        parse(&entry.value).map(Some).map_err(|e| {
            error(
                comp,
                instr,
                format!("attribute {key}: {e} in \"{}\"", entry.value),
            )
        })
    }
}

/// What propagation follows the import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportMode {
    /// GSPMD propagation: sharding groups become `shard_as` constraints and
    /// manual bodies are left to propagation.
    ForGspmdPropagation,
    /// None (Shardy propagation already ran, `sdy_propagation`): sharding
    /// groups are dropped (resolved) and every instruction of a manual body
    /// without a sharding gets the body's manual sharding.
    AfterShardyPropagation,
}

/// Imports every Shardy annotation of `module` for GSPMD propagation.
pub fn import(module: &mut HloModule) -> Result<ShardyImportStats, String> {
    import_with(
        module,
        ImportMode::ForGspmdPropagation,
        &PropagatedShardings::default(),
    )
}

/// Imports every Shardy annotation of `module`, reading an instruction's
/// shardings from `propagated` where it has them (instead of its
/// `xla.sdy.sharding`).
pub fn import_with(
    module: &mut HloModule,
    mode: ImportMode,
    propagated: &PropagatedShardings,
) -> Result<ShardyImportStats, String> {
    let mut stats = ShardyImportStats::default();
    let meshes = read_module_meshes(module)?;
    let manual_bodies = find_manual_bodies(module)?;
    let mut inlined: Vec<CompId> = Vec::new();
    let reducers = manual_body_callees(module, &manual_bodies);
    for ci in 0..module.computations.len() {
        let own_body = manual_bodies.iter().find(|b| b.comp.index() == ci);
        let calling_body = reducers
            .get(&ci)
            .filter(|_| mode == ImportMode::AfterShardyPropagation)
            .map(|&b| &manual_bodies[b]);
        let body = own_body.or(calling_body);
        let manual = body.map(|b| b.axes.clone()).unwrap_or_default();
        let manual_default = match (mode, body) {
            (ImportMode::AfterShardyPropagation, Some(b)) => b.mesh.clone(),
            _ => None,
        };
        let context = RebuildContext {
            meshes: &meshes,
            manual: &manual,
            manual_default_mesh: manual_default.as_ref(),
            parameters_default_manual: own_body.is_some(),
            mode,
            propagated,
        };
        // Taken out, so that its instructions move into the rebuilt one (a
        // computation never calls itself).
        let old = std::mem::replace(
            &mut module.computations[ci],
            HloComputation::new(String::new()),
        );
        let rebuilt = rebuild(
            module,
            old,
            CompId(ci as u32),
            &context,
            &mut stats,
            &mut inlined,
        )?;
        module.computations[ci] = rebuilt;
    }
    xla_hlo_utils::inline::remove_computations(module, &inlined);
    Ok(stats)
}

/// What `rebuild` needs besides the module.
struct RebuildContext<'a> {
    meshes: &'a Meshes,
    /// The manual axes of the computation (a manual body), else empty.
    manual: &'a [String],
    /// In a manual body after Shardy propagation: the mesh whose manual
    /// sharding instructions without one get.
    manual_default_mesh: Option<&'a MeshRef>,
    /// Whether parameters get that default too (a body's do; those of a
    /// computation the body calls, such as a reducer, do not).
    parameters_default_manual: bool,
    mode: ImportMode,
    propagated: &'a PropagatedShardings,
}

/// A manual-computation body: its manual axes and the mesh of its in
/// shardings.
pub(crate) struct ManualBody {
    pub comp: CompId,
    pub axes: Vec<String>,
    pub mesh: Option<MeshRef>,
}

fn read_module_meshes(module: &mut HloModule) -> Result<Meshes, String> {
    let mut meshes = Vec::new();
    if let Some(raw) = module.config.frontend_attributes.clone() {
        let mut attributes = FrontendAttributes::parse(&raw)
            .map_err(|e| error("<module>", "", format!("frontend_attributes {e}")))?;
        if let Some(entry) = attributes.get(MESHES) {
            meshes = sdy::parse_meshes(&entry.value).map_err(|e| {
                error(
                    "<module>",
                    "",
                    format!("attribute {MESHES}: {e} in \"{}\"", entry.value),
                )
            })?;
        }
        attributes.remove_prefixed("xla.sdy.");
        module.config.frontend_attributes =
            (!attributes.is_empty()).then(|| attributes.to_string());
    }
    Ok(Meshes {
        meshes,
        converted: RefCell::default(),
    })
}

/// Each manual-computation body, its manual axes and mesh (read from the
/// `GlobalToLocalShape` feeding its call).
pub(crate) fn find_manual_bodies(module: &HloModule) -> Result<Vec<ManualBody>, String> {
    let mut bodies: Vec<ManualBody> = Vec::new();
    for comp in &module.computations {
        for instr in &comp.instructions {
            if instr.opcode != Opcode::Call {
                continue;
            }
            let Some(callee) = instr.to_apply() else {
                continue;
            };
            let Some(callee_comp) = module.computations.get(callee.index()) else {
                continue;
            };
            if !callee_comp.name.starts_with(MANUAL_BODY_PREFIX) {
                continue;
            }
            let mut source = instr.operands.first().copied();
            while let Some(op) = source {
                let op_instr = comp.instr(op);
                if op_instr.opcode == Opcode::GetTupleElement {
                    source = op_instr.operands.first().copied();
                } else {
                    break;
                }
            }
            let mut axes = Vec::new();
            let mut mesh = None;
            if let Some(op) = source {
                let op_instr = comp.instr(op);
                if custom_call_target(op_instr) == Some(GLOBAL_TO_LOCAL) {
                    if let Some(a) = InstrAnnotations::read(&comp.name, op_instr)? {
                        axes = a
                            .value(
                                &comp.name,
                                &op_instr.name,
                                MANUAL_AXES,
                                sdy::parse_manual_axes,
                            )?
                            .unwrap_or_default();
                        mesh = a
                            .value(
                                &comp.name,
                                &op_instr.name,
                                IN_SHARDINGS,
                                sdy::parse_sharding_per_value,
                            )?
                            .and_then(|s| s.into_iter().next())
                            .map(|s| s.mesh);
                    }
                }
            }
            if !bodies.iter().any(|b| b.comp == callee) {
                bodies.push(ManualBody {
                    comp: callee,
                    axes,
                    mesh,
                });
            }
        }
    }
    Ok(bodies)
}

/// The computations that only manual bodies call (reducers, comparators,
/// loop bodies inside a shard_map), each with the index of its body in
/// `bodies`: after Shardy propagation their instructions are manual too.
fn manual_body_callees(module: &HloModule, bodies: &[ManualBody]) -> FxHashMap<usize, usize> {
    let mut owner: FxHashMap<usize, usize> = FxHashMap::default();
    let mut stack: Vec<(CompId, usize)> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| (b.comp, i))
        .collect();
    while let Some((comp, body)) = stack.pop() {
        for instr in &module.comp(comp).instructions {
            for callee in instr.called_computations() {
                let is_body = bodies.iter().any(|b| b.comp == callee);
                if !is_body && !owner.contains_key(&callee.index()) {
                    owner.insert(callee.index(), body);
                    stack.push((callee, body));
                }
            }
        }
    }
    for (ci, comp) in module.computations.iter().enumerate() {
        if owner.contains_key(&ci) || bodies.iter().any(|b| b.comp.index() == ci) {
            continue;
        }
        for instr in &comp.instructions {
            for callee in instr.called_computations() {
                if !bodies.iter().any(|b| b.comp == callee) {
                    owner.remove(&callee.index());
                }
            }
        }
    }
    owner
}

/// Rebuilds one computation with every annotation imported.
fn rebuild(
    module: &HloModule,
    mut old: HloComputation,
    comp_id: CompId,
    context: &RebuildContext<'_>,
    stats: &mut ShardyImportStats,
    inlined: &mut Vec<CompId>,
) -> Result<HloComputation, String> {
    let (meshes, manual) = (context.meshes, context.manual);
    let old_name = old.name.clone();
    let name = old_name.as_str();
    let mut out = HloComputation::new(old.name.clone());
    out.instructions.reserve(old.instructions.len());
    out.execution_thread = old.execution_thread.clone();
    // Old id -> new id, and for tuple-valued instructions replaced by one
    // value per element, the elements.
    let mut map: Vec<InstrId> = vec![InstrId(u32::MAX); old.instructions.len()];
    let mut elements: FxHashMap<usize, Vec<InstrId>> = FxHashMap::default();
    // Sharding-group members: old id -> group.
    let mut groups: FxHashMap<usize, i64> = FxHashMap::default();
    for instr in &old.instructions {
        if custom_call_target(instr) == Some(SHARDING_GROUP) {
            let a = InstrAnnotations::read(name, instr)?;
            let id = match &a {
                Some(a) => a.value(name, &instr.name, GROUP_ID, sdy::parse_group_id)?,
                None => None,
            }
            .ok_or_else(|| error(name, &instr.name, format!("needs a {GROUP_ID} attribute")))?;
            let &[operand] = instr.operands.as_slice() else {
                return Err(error(
                    name,
                    &instr.name,
                    "a ShardingGroup takes one operand",
                ));
            };
            groups.insert(operand.index(), id);
        }
    }
    // Only a ShardingGroup's users are asked for.
    let users = if groups.is_empty() {
        Vec::new()
    } else {
        old.users()
    };
    let root_is_sharded = old.root_instr().sharding.is_some();
    for old_index in 0..old.instructions.len() {
        let instr = &old.instructions[old_index];
        let shard_as_name = groups
            .contains_key(&old_index)
            .then(|| format!("{}.shard_as", instr.name));
        let operands: Vec<InstrId> = instr.operands.iter().map(|o| map[o.index()]).collect();
        let annotations = InstrAnnotations::read(name, instr)?;
        let propagated = context.propagated.get(comp_id, InstrId(old_index as u32));
        // The instruction's shardings: propagation's, else its attribute's.
        let shardings_of = |annotations: Option<&InstrAnnotations>| match propagated {
            Some(p) => Ok(Some(Cow::Borrowed(p))),
            None => annotations
                .map(|a| a.value(name, &instr.name, SHARDING, sdy::parse_shardings))
                .transpose()
                .map(|s| s.flatten().map(Cow::Owned)),
        };
        let target = custom_call_target(instr);
        let new_id = match target {
            Some(SHARDING_GROUP) => {
                if !users[old_index].is_empty() || old.root.index() == old_index {
                    return Err(error(
                        name,
                        &instr.name,
                        "a ShardingGroup result must be unused",
                    ));
                }
                stats.sharding_groups += 1;
                continue;
            }
            Some(FUNC_RESULT) => {
                stats.func_results += 1;
                let &[operand] = operands.as_slice() else {
                    return Err(error(
                        name,
                        &instr.name,
                        "FuncResultSharding takes one operand",
                    ));
                };
                if root_is_sharded {
                    operand
                } else {
                    let shardings = shardings_of(annotations.as_ref())?
                        .ok_or_else(|| error(name, &instr.name, format!("needs {SHARDING}")))?;
                    let sharding = meshes
                        .for_shape(&shardings, &instr.shape, manual, true)
                        .map_err(|e| error(name, &instr.name, e))?;
                    let mut cc = sharding_custom_call(&instr.name, &instr.shape, operand, sharding);
                    copy_other_frontend_attributes(instr, &mut cc);
                    out.add(cc)
                }
            }
            Some(GLOBAL_TO_LOCAL) | Some(LOCAL_TO_GLOBAL) => {
                let to_local = target == Some(GLOBAL_TO_LOCAL);
                let key = if to_local {
                    IN_SHARDINGS
                } else {
                    OUT_SHARDINGS
                };
                let a = annotations.as_ref().ok_or_else(|| {
                    error(name, &instr.name, format!("needs {key} and {MANUAL_AXES}"))
                })?;
                let shardings = a
                    .value(name, &instr.name, key, sdy::parse_sharding_per_value)?
                    .ok_or_else(|| error(name, &instr.name, format!("needs {key}")))?;
                let manual_axes = a
                    .value(name, &instr.name, MANUAL_AXES, sdy::parse_manual_axes)?
                    .unwrap_or_default();
                if to_local {
                    stats.manual_computations += 1;
                }
                let result_shapes: Vec<Shape> = match &instr.shape {
                    Shape::Tuple(e) => e.clone(),
                    s => vec![s.clone()],
                };
                if shardings.len() != operands.len() || result_shapes.len() != operands.len() {
                    return Err(error(
                        name,
                        &instr.name,
                        format!(
                            "{} operands, {} results and {} {key}",
                            operands.len(),
                            result_shapes.len(),
                            shardings.len()
                        ),
                    ));
                }
                let mut values = Vec::new();
                for (i, (&operand, result_shape)) in operands.iter().zip(&result_shapes).enumerate()
                {
                    let global_shape = if to_local {
                        out.instr(operand).shape.clone()
                    } else {
                        result_shape.clone()
                    };
                    let rank = global_shape.rank();
                    let global = meshes
                        .single(&shardings[i], rank, &[], true)
                        .map_err(|e| error(name, &instr.name, e))?
                        .map(HloSharding::Single);
                    let local = meshes
                        .single(&shardings[i], rank, &manual_axes, true)
                        .map_err(|e| error(name, &instr.name, e))?
                        .map(HloSharding::Single);
                    let suffix = if operands.len() > 1 {
                        format!(".{i}")
                    } else {
                        String::new()
                    };
                    let (first_sharding, second_target, second_sharding) = if to_local {
                        (global, "SPMDFullToShardShape", local)
                    } else {
                        (local, "SPMDShardToFullShape", global)
                    };
                    let operand_shape = out.instr(operand).shape.clone();
                    let constraint = out.add(sharding_custom_call(
                        &format!("{}{suffix}.sharding", instr.name),
                        &operand_shape,
                        operand,
                        first_sharding,
                    ));
                    let mut reshape = HloInstruction::new(
                        format!("{}{suffix}", instr.name),
                        Opcode::CustomCall,
                        result_shape.clone(),
                        vec![constraint],
                    );
                    reshape.set_attr(
                        AttrKey::CustomCallTarget,
                        AttrValue::Str(second_target.into()),
                    );
                    reshape.sharding = second_sharding.map(Arc::new);
                    values.push(out.add(reshape));
                }
                if matches!(instr.shape, Shape::Tuple(_)) {
                    elements.insert(old_index, values);
                    // Users are get-tuple-elements, mapped below; a tuple for
                    // any other user.
                    let mut tuple = HloInstruction::new(
                        format!("{}.tuple", instr.name),
                        Opcode::Tuple,
                        instr.shape.clone(),
                        elements[&old_index].clone(),
                    );
                    let leaves: Option<Vec<SingleSharding>> = elements[&old_index]
                        .iter()
                        .map(|&v| match out.instr(v).sharding.as_deref() {
                            Some(HloSharding::Single(s)) => Some(s.clone()),
                            _ => None,
                        })
                        .collect();
                    tuple.sharding = leaves.map(|l| Arc::new(HloSharding::Tuple(l)));
                    out.add(tuple)
                } else {
                    values[0]
                }
            }
            Some(t) if t.starts_with("xla.sdy.") => {
                return Err(error(
                    name,
                    &instr.name,
                    format!("unsupported Shardy custom call \"{t}\""),
                ));
            }
            _ if instr.opcode == Opcode::GetTupleElement
                && elements.contains_key(&instr.operands[0].index()) =>
            {
                let index = instr.int_attr(AttrKey::Index).unwrap_or(0) as usize;
                let parts = &elements[&instr.operands[0].index()];
                *parts
                    .get(index)
                    .ok_or_else(|| error(name, &instr.name, "tuple index out of range"))?
            }
            _ if instr.opcode == Opcode::Call
                && instr
                    .to_apply()
                    .is_some_and(|c| module.comp(c).name.starts_with(MANUAL_BODY_PREFIX)) =>
            {
                let callee = instr.to_apply().expect("checked above");
                if !inlined.contains(&callee) {
                    inlined.push(callee);
                }
                inline_call(module.comp(callee), &operands, &mut out)
            }
            Some("Sharding")
                if is_vacuous_constraint(shardings_of(annotations.as_ref())?.as_deref()) =>
            {
                // Every dimension open without axes: no constraint at all.
                stats.shardings += 1;
                operands[0]
            }
            _ => {
                let mut sharding = None;
                let mut unspecified_dims = None;
                if let Some(shardings) = shardings_of(annotations.as_ref())? {
                    let is_constraint = target == Some("Sharding");
                    sharding = Some(
                        meshes
                            .for_shape(&shardings, &instr.shape, manual, is_constraint)
                            .map_err(|e| {
                                error(name, &instr.name, format!("attribute {SHARDING}: {e}"))
                            })?,
                    );
                    stats.shardings += 1;
                    if is_constraint {
                        let open: Vec<String> = match &*shardings {
                            [s] => s
                                .dims
                                .iter()
                                .enumerate()
                                .filter(|(_, d)| d.open && d.axes.is_empty())
                                .map(|(i, _)| i.to_string())
                                .collect(),
                            _ => Vec::new(),
                        };
                        if !open.is_empty() {
                            unspecified_dims = Some(open.join(","));
                        }
                    }
                }
                drop(annotations);
                let placeholder = HloInstruction::new(
                    String::new(),
                    instr.opcode,
                    Shape::Tuple(Vec::new()),
                    Vec::new(),
                );
                let mut copy = std::mem::replace(&mut old.instructions[old_index], placeholder);
                copy.operands = operands;
                for p in &mut copy.control_predecessors {
                    *p = map[p.index()];
                }
                if let Some(dims) = unspecified_dims {
                    copy.set_attr(
                        AttrKey::BackendConfig,
                        AttrValue::Raw(format!("\"unspecified_dims=[{dims}]\"").into()),
                    );
                }
                if let Some(sharding) = sharding {
                    copy.sharding = sharding.map(Arc::new);
                }
                strip_shardy_attributes(&mut copy);
                out.add(copy)
            }
        };
        map[old_index] = new_id;
        if let Some(mesh) = context.manual_default_mesh {
            let new = out.instr(new_id);
            if new.sharding.is_none()
                && (context.parameters_default_manual || new.opcode != Opcode::Parameter)
            {
                let shape = new.shape.clone();
                let open: Vec<SdySharding> = leaf_ranks(&shape)
                    .into_iter()
                    .map(|rank| SdySharding::all_open(mesh.clone(), rank))
                    .collect();
                let sharding = meshes
                    .for_shape(&open, &shape, manual, true)
                    .map_err(|e| error(name, &out.instr(new_id).name, e))?;
                out.instr_mut(new_id).sharding = sharding.map(Arc::new);
            }
        }
        if context.mode == ImportMode::AfterShardyPropagation {
            // An element taken from a sharded tuple (an inlined manual
            // body's root) has that element's sharding.
            let new = out.instr(new_id);
            if new.sharding.is_none() && new.opcode == Opcode::GetTupleElement {
                let index = new.int_attr(AttrKey::Index).unwrap_or(0) as usize;
                if let Some(HloSharding::Tuple(leaves)) =
                    out.instr(new.operands[0]).sharding.as_deref()
                {
                    if let Some(leaf) = leaves.get(index) {
                        let leaf = leaf.clone();
                        out.instr_mut(new_id).sharding = Some(Arc::new(HloSharding::Single(leaf)));
                    }
                }
            }
            continue;
        }
        if let (Some(&group), Some(member_name)) = (groups.get(&old_index), shard_as_name) {
            let shape = out.instr(new_id).shape.clone();
            let mut leaf = SingleSharding::new(ShardingKind::Unknown);
            leaf.shard_group = Some(ShardGroup::As(group));
            let member = sharding_custom_call(
                &member_name,
                &shape,
                new_id,
                Some(HloSharding::Single(leaf)),
            );
            map[old_index] = out.add(member);
        }
    }
    out.root = map[old.root.index()];
    Ok(out)
}

/// The rank of each value of `shape` (one per tuple element).
fn leaf_ranks(shape: &Shape) -> Vec<usize> {
    match shape {
        Shape::Tuple(elements) => elements.iter().map(|e| e.rank()).collect(),
        s => vec![s.rank()],
    }
}

/// Whether a constraint's Shardy sharding leaves every dimension open with
/// no axes (and names no replicated or unreduced axes).
fn is_vacuous_constraint(shardings: Option<&[SdySharding]>) -> bool {
    match shardings {
        Some([s]) => {
            s.dims.iter().all(|d| d.open && d.axes.is_empty())
                && s.replicated.is_empty()
                && s.unreduced.is_empty()
        }
        _ => false,
    }
}

fn sharding_custom_call(
    name: &str,
    shape: &Shape,
    operand: InstrId,
    sharding: Option<HloSharding>,
) -> HloInstruction {
    let mut cc = HloInstruction::new(name, Opcode::CustomCall, shape.clone(), vec![operand]);
    cc.set_attr(AttrKey::CustomCallTarget, AttrValue::Str("Sharding".into()));
    cc.sharding = Some(Arc::new(sharding.unwrap_or_else(HloSharding::replicated)));
    cc
}

/// Copies the callee's instructions into `out`, its parameters replaced by
/// `arguments`; returns the new id of the callee's root.
fn inline_call(
    callee: &HloComputation,
    arguments: &[InstrId],
    out: &mut HloComputation,
) -> InstrId {
    let mut map: Vec<InstrId> = vec![InstrId(u32::MAX); callee.instructions.len()];
    for (i, instr) in callee.instructions.iter().enumerate() {
        if instr.opcode == Opcode::Parameter {
            let n = instr.parameter_number.unwrap_or(0) as usize;
            map[i] = arguments[n.min(arguments.len().saturating_sub(1))];
            continue;
        }
        let mut copy = instr.clone();
        copy.operands = instr.operands.iter().map(|o| map[o.index()]).collect();
        copy.control_predecessors = instr
            .control_predecessors
            .iter()
            .map(|p| map[p.index()])
            .collect();
        map[i] = out.add(copy);
    }
    map[callee.root.index()]
}

fn copy_other_frontend_attributes(from: &HloInstruction, to: &mut HloInstruction) {
    if let Some(raw) = raw_frontend_attributes(from) {
        to.set_attr(AttrKey::FrontendAttributes, AttrValue::Raw(raw.into()));
        strip_shardy_attributes(to);
    }
}

/// Removes `xla.sdy.*` keys (and the whole attribute when nothing is left).
fn strip_shardy_attributes(instr: &mut HloInstruction) {
    let Some(raw) = raw_frontend_attributes(instr) else {
        return;
    };
    if !raw.contains("xla.sdy.") {
        return;
    }
    match FrontendAttributes::parse(raw) {
        Ok(mut a) => {
            a.remove_prefixed("xla.sdy.");
            if a.is_empty() {
                instr.remove_attr(AttrKey::FrontendAttributes);
            } else {
                instr.set_attr(
                    AttrKey::FrontendAttributes,
                    AttrValue::Raw(a.to_string().into()),
                );
            }
        }
        Err(_) => {
            instr.remove_attr(AttrKey::FrontendAttributes);
        }
    }
}

/// Turns every `Sharding` custom call into a `copy` with its sharding (as
/// XLA's export leaves constraints); returns how many.
pub fn constraints_to_copies(module: &mut HloModule) -> usize {
    let mut count = 0;
    for comp in &mut module.computations {
        for instr in &mut comp.instructions {
            if custom_call_target(instr) == Some("Sharding") && instr.operands.len() == 1 {
                instr.opcode = Opcode::Copy;
                instr.remove_attr(AttrKey::CustomCallTarget);
                instr.remove_attr(AttrKey::BackendConfig);
                instr.remove_attr(AttrKey::CustomCallHasSideEffect);
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import_text(text: &str) -> Result<String, String> {
        let mut m = xla_hlo_parser::parse_module(text).unwrap();
        import(&mut m)?;
        xla_hlo_verifier::verify(&m).map_err(|e| e.to_string())?;
        Ok(m.to_string())
    }

    #[test]
    fn errors_name_instruction_attribute_and_offset() {
        let base = |sharding: &str| {
            format!(
                "HloModule m, num_partitions=8, frontend_attributes={{xla.sdy.meshes={{mesh = #sdy.mesh<[\"x\"=2, \"y\"=4]>}}}}\n\
                 ENTRY e {{\n  ROOT p = f32[8,8] parameter(0), frontend_attributes={{xla.sdy.sharding=\"{sharding}\"}}\n}}\n"
            )
        };
        let e = import_text(&base(r##"#sdy.sharding<@other, [{\"x\"}, {}]>"##)).unwrap_err();
        assert!(
            e.contains("e/p") && e.contains("'@other' is not defined"),
            "{e}"
        );
        let e = import_text(&base(r##"#sdy.sharding<@mesh, [{\"x\"}, {\"x\"}]>"##)).unwrap_err();
        assert!(e.contains("used more than once"), "{e}");
        let e = import_text(&base(r##"#sdy.sharding<@mesh, [{\"y\":(2)4}, {}]>"##)).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
        let e = import_text(&base(r##"#sdy.sharding<@mesh, [{\"x\"}, {}>"##)).unwrap_err();
        assert!(e.contains("attribute xla.sdy.sharding: at offset"), "{e}");
    }

    #[test]
    fn shardings_groups_and_manual_computations_become_gspmd_forms() {
        let text = r##"HloModule m, num_partitions=8, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}
add {
  l = f32[] parameter(0)
  r = f32[] parameter(1)
  ROOT s = f32[] add(l, r)
}
xla.sdy.manual_computation_body.1 {
  bp = f32[8,16] parameter(0)
  ROOT ar = f32[8,16] all-reduce(bp), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=add
}
ENTRY e {
  a = f32[16,64] parameter(0), sharding={devices=[2,4]<=[8]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"x\"}, {\"y\"}]>"}
  r = f32[16,64] parameter(1)
  g0 = () custom-call(a), custom_call_target="xla.sdy.ShardingGroup", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding_group_id="0 : i64"}
  g1 = () custom-call(r), custom_call_target="xla.sdy.ShardingGroup", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding_group_id="0 : i64"}
  sum = f32[16,64] add(a, r)
  c = f32[16,64] custom-call(sum), custom_call_target="Sharding", sharding={replicated}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{?}, {\"y\"}]>]>"}
  local = f32[8,16] custom-call(c), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\"}, {\"y\"}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"x\", \"y\"}>"}
  body = f32[8,16] call(local), to_apply=xla.sdy.manual_computation_body.1, frontend_attributes={inlineable="false"}
  ROOT global = f32[16,16] custom-call(body), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"x\", \"y\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\"}, {}]>]>"}
}
"##;
        let out = import_text(text).unwrap();
        assert!(!out.contains("xla.sdy"), "{out}");
        for expected in [
            "sharding={unknown shard_as 0}",
            "custom_call_target=\"SPMDFullToShardShape\", sharding={manual}",
            "custom_call_target=\"SPMDShardToFullShape\", sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}",
            "backend_config=\"unspecified_dims=[0]\"",
            "all-reduce(",
        ] {
            assert!(out.contains(expected), "missing {expected}:\n{out}");
        }
        assert!(!out.contains("manual_computation_body"), "{out}");
    }
}
