//! Shardings (`{devices=[2,1]<=[2]}`, tuples of them, named shardings on
//! meshes), replica-group lists (explicit, iota, mesh axes) and the mesh and
//! iota syntax they share.
//!
//! Invariants: a `T(...)` transpose must be a permutation of the reshape
//! dimensions; a sharding has exactly one kind, and the tile-dimension
//! options only go with `devices=`.

use super::state::Parser;
use crate::cursor::PResult;
use xla_hlo_ir::mesh::{AxisRef, DeviceIdsPlacement, Mesh, MeshDeviceIds};
use xla_hlo_ir::replica_groups::CollectiveDeviceList;
use xla_hlo_ir::sharding::{
    HloSharding, NamedDim, NamedDims, NamedSharding, ShardGroup, ShardingKind, SingleSharding,
    SubgroupType, TileAssignment,
};

impl<'a> Parser<'a> {
    pub(super) fn replica_groups(&mut self) -> PResult<CollectiveDeviceList> {
        match self.c.peek() {
            Some(b'{') => Ok(CollectiveDeviceList::Explicit(self.int_lists()?)),
            Some(b'[') => {
                let pos = self.c.pos;
                let dims = self.int_list(b'[', b']')?;
                let [num_groups, group_size] = dims[..] else {
                    return Err(self.err(pos, "an iota replica group list has exactly 2 dimensions [num_groups,group_size]"));
                };
                if !self.c.eat_str("<=") {
                    return Err(self.c.expected("'<='"));
                }
                let (reshape_dims, perm) = self.iota_tail()?;
                Ok(CollectiveDeviceList::Iota {
                    num_groups,
                    group_size,
                    reshape_dims,
                    perm,
                })
            }
            _ => {
                let mesh = self.mesh()?;
                let axes = self.axis_set()?;
                Ok(CollectiveDeviceList::MeshAxes { mesh, axes })
            }
        }
    }

    /// `[reshape_dims]` then optional `T(perm)`.
    fn iota_tail(&mut self) -> PResult<(Vec<i64>, Vec<i64>)> {
        let reshape_dims = self.int_list(b'[', b']')?;
        let perm = if self.c.peek_raw() == Some(b'T') {
            self.c.pos += 1;
            let pos = self.c.pos;
            let perm = self.int_list(b'(', b')')?;
            if !is_permutation(&perm, reshape_dims.len()) {
                return Err(self.err(
                    pos,
                    "T(...) must be a permutation of the reshape dimensions",
                ));
            }
            perm
        } else {
            Vec::new()
        };
        Ok((reshape_dims, perm))
    }

    fn axis_name(&mut self) -> PResult<String> {
        self.c.skip_ws();
        match self.c.peek_raw() {
            Some(b'\'') | Some(b'"') => self.c.string(),
            _ => Ok(self.c.ident()?.to_string()),
        }
    }

    fn mesh_device_ids(&mut self) -> PResult<MeshDeviceIds> {
        self.c.expect(b'(')?;
        if self.c.peek() == Some(b'[') {
            let (reshape_dims, perm) = self.iota_tail()?;
            self.c.expect(b')')?;
            Ok(MeshDeviceIds::Iota { reshape_dims, perm })
        } else {
            let mut ids = Vec::new();
            while !self.c.eat(b')') {
                if !ids.is_empty() {
                    self.c.expect(b',')?;
                }
                ids.push(self.c.int()?);
            }
            Ok(MeshDeviceIds::Explicit(ids))
        }
    }

    /// `mesh['a'=2,'b'=4]` with device ids inside or after the brackets.
    fn mesh(&mut self) -> PResult<Mesh> {
        if !self.c.eat_keyword("mesh") {
            return Err(self.c.expected("'mesh[', '{' or '['"));
        }
        self.expect_raw(b'[')?;
        let mut mesh = Mesh::new(Vec::new());
        while !self.c.eat(b']') {
            if !mesh.axes.is_empty() || mesh.device_ids.is_some() {
                self.c.expect(b',')?;
            }
            if self.c.eat_keyword("device_ids") {
                self.c.expect(b'=')?;
                mesh.device_ids = Some(self.mesh_device_ids()?);
                mesh.device_ids_placement = DeviceIdsPlacement::InsideBrackets;
                continue;
            }
            let name = self.axis_name()?;
            self.c.expect(b'=')?;
            let size = self.c.int()?;
            mesh.axes.push((name, size));
        }
        let save = self.c.pos;
        if self.c.eat(b',') && self.c.eat_keyword("device_ids") {
            self.c.expect(b'=')?;
            mesh.device_ids = Some(self.mesh_device_ids()?);
            mesh.device_ids_placement = DeviceIdsPlacement::AfterBrackets;
        } else {
            self.c.pos = save;
        }
        Ok(mesh)
    }

    fn axis_ref(&mut self) -> PResult<AxisRef> {
        let name = self.axis_name()?;
        let sub_axis = if self.c.eat(b':') {
            self.c.expect(b'(')?;
            let pre = self.c.int()?;
            self.c.expect(b')')?;
            let size = self.c.int()?;
            Some((pre, size))
        } else {
            None
        };
        Ok(AxisRef { name, sub_axis })
    }

    /// `{'a', 'b':(2)2}`
    fn axis_set(&mut self) -> PResult<Vec<AxisRef>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.axis_ref()?);
        }
        Ok(out)
    }

    pub(super) fn sharding(&mut self) -> PResult<HloSharding> {
        let save = self.c.pos;
        self.c.expect(b'{')?;
        match self.c.peek() {
            Some(b'{') => {
                let mut elements = Vec::new();
                while !self.c.eat(b'}') {
                    if !elements.is_empty() {
                        self.c.expect(b',')?;
                    }
                    elements.push(self.single_sharding()?);
                }
                Ok(HloSharding::Tuple(elements))
            }
            Some(b'}') => {
                self.c.expect(b'}')?;
                Ok(HloSharding::Tuple(Vec::new()))
            }
            _ => {
                self.c.pos = save;
                Ok(HloSharding::Single(self.single_sharding()?))
            }
        }
    }

    fn single_sharding(&mut self) -> PResult<SingleSharding> {
        let open = self.c.pos;
        self.c.expect(b'{')?;
        let mut kind: Option<ShardingKind> = None;
        let mut replicate_last = false;
        let mut last_tile_dims = Vec::new();
        let mut shard_group = None;
        let mut metadata = None;
        let mut maximal = false;
        while !self.c.eat(b'}') {
            self.c.skip_ws();
            let pos = self.c.pos;
            if self.c.at_end() {
                return Err(self.err(open, "unterminated sharding"));
            }
            let word = self.c.ident()?;
            let set = |p: &Self, kind: &mut Option<ShardingKind>, k: ShardingKind| {
                if kind.is_some() {
                    return Err(p.err(pos, format!("conflicting sharding kinds at '{word}'")));
                }
                *kind = Some(k);
                Ok(())
            };
            match word {
                "replicated" => set(self, &mut kind, ShardingKind::Replicated)?,
                "manual" => set(self, &mut kind, ShardingKind::Manual)?,
                "unknown" => set(self, &mut kind, ShardingKind::Unknown)?,
                "unreduced" => set(self, &mut kind, ShardingKind::Unreduced)?,
                "maximal" => maximal = true,
                "device" => {
                    self.c.expect(b'=')?;
                    let d = self.c.int()?;
                    set(self, &mut kind, ShardingKind::Maximal(d))?;
                }
                "devices" => {
                    self.c.expect(b'=')?;
                    let dims = self.int_list(b'[', b']')?;
                    let ta = if self.c.eat_str("<=") {
                        let (reshape_dims, perm) = self.iota_tail()?;
                        TileAssignment::Iota {
                            dims,
                            reshape_dims,
                            perm,
                        }
                    } else {
                        let mut devices = vec![self.c.int()?];
                        loop {
                            let save = self.c.pos;
                            if !self.c.eat(b',') {
                                break;
                            }
                            self.c.skip_ws();
                            if !self.c.peek_raw().is_some_and(|b| b.is_ascii_digit()) {
                                self.c.pos = save;
                                break;
                            }
                            devices.push(self.c.int()?);
                        }
                        TileAssignment::Explicit { dims, devices }
                    };
                    set(
                        self,
                        &mut kind,
                        ShardingKind::Tiled {
                            tile_assignment: ta,
                            replicate_on_last_tile_dim: false,
                            last_tile_dims: Vec::new(),
                        },
                    )?;
                }
                "last_tile_dim_replicate" => replicate_last = true,
                "last_tile_dims" => {
                    self.c.expect(b'=')?;
                    self.c.expect(b'{')?;
                    while !self.c.eat(b'}') {
                        if !last_tile_dims.is_empty() {
                            self.c.expect(b',')?;
                        }
                        let tpos = self.c.pos;
                        let t = self.c.ident()?;
                        last_tile_dims.push(SubgroupType::from_name(t).ok_or_else(|| {
                            self.err(tpos, format!("unknown subgroup type '{t}'"))
                        })?);
                    }
                }
                "shard_as" => shard_group = Some(ShardGroup::As(self.c.int()?)),
                "shard_like" => shard_group = Some(ShardGroup::Like(self.c.int()?)),
                "metadata" => {
                    self.c.expect(b'=')?;
                    metadata = Some(self.c.balanced()?.to_string());
                }
                "mesh" => {
                    self.c.pos = pos;
                    let named = self.named_sharding()?;
                    set(self, &mut kind, ShardingKind::Named(named))?;
                }
                "maximal_mesh" => {
                    self.expect_raw(b'[')?;
                    if !self.c.eat_keyword("device_id") {
                        return Err(self.c.expected("'device_id'"));
                    }
                    self.c.expect(b'=')?;
                    let d = self.c.int()?;
                    self.c.expect(b']')?;
                    set(self, &mut kind, ShardingKind::MaximalMesh(d))?;
                }
                other => return Err(self.err(pos, format!("unexpected '{other}' in sharding"))),
            }
            self.c.eat(b',');
        }
        let mut kind = match kind {
            Some(k) => k,
            None if maximal => return Err(self.err(open, "maximal sharding needs device=N")),
            None => return Err(self.err(open, "empty sharding")),
        };
        if let ShardingKind::Tiled {
            replicate_on_last_tile_dim,
            last_tile_dims: ltd,
            ..
        } = &mut kind
        {
            *replicate_on_last_tile_dim = replicate_last;
            *ltd = last_tile_dims;
        } else if replicate_last || !last_tile_dims.is_empty() {
            return Err(self.err(
                open,
                "last_tile_dim_replicate/last_tile_dims need devices=[...]",
            ));
        }
        if maximal && !matches!(kind, ShardingKind::Maximal(_)) {
            return Err(self.err(open, "maximal sharding needs device=N"));
        }
        Ok(SingleSharding {
            kind,
            shard_group,
            metadata,
        })
    }

    fn named_sharding(&mut self) -> PResult<NamedSharding> {
        let mesh = self.mesh()?;
        self.c.expect(b',')?;
        let dims = if self.c.eat_keyword("replicated") {
            NamedDims::Replicated
        } else if self.c.eat_keyword("manual") {
            NamedDims::Manual
        } else {
            self.c.expect(b'[')?;
            let mut dims = Vec::new();
            while !self.c.eat(b']') {
                if !dims.is_empty() {
                    self.c.expect(b',')?;
                }
                let axes = self.axis_set()?;
                let open = self.c.eat(b'?');
                dims.push(NamedDim { axes, open });
            }
            NamedDims::Dims(dims)
        };
        let mut named = NamedSharding {
            mesh,
            dims,
            replicated_axes: None,
            unreduced: None,
            manual_axes: None,
        };
        loop {
            let save = self.c.pos;
            if !self.c.eat(b',') {
                break;
            }
            if self.c.eat_keyword("replicated") {
                self.c.expect(b'=')?;
                named.replicated_axes = Some(self.axis_set()?);
            } else if self.c.eat_keyword("manual") {
                self.c.expect(b'=')?;
                named.manual_axes = Some(self.axis_set()?);
            } else if self.c.eat_keyword("unreduced") {
                let op = if self.c.eat(b'=') {
                    Some(self.c.ident()?.to_string())
                } else {
                    None
                };
                named.unreduced = Some((op, self.axis_set()?));
            } else {
                self.c.pos = save;
                break;
            }
        }
        Ok(named)
    }
}

fn is_permutation(perm: &[i64], n: usize) -> bool {
    let mut seen = vec![false; n];
    perm.len() == n
        && perm.iter().all(|&p| {
            usize::try_from(p)
                .ok()
                .and_then(|p| seen.get_mut(p))
                .is_some_and(|s| !std::mem::replace(s, true))
        })
}
