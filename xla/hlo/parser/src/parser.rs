//! The HLO module parser: header, stack-frame index, computations,
//! instructions, shapes, layouts, literals, shardings, replica groups and
//! every typed attribute of `xla_hlo_ir::attrs`.
//!
//! Invariants: the parser never panics and always terminates, whatever the
//! input; every error carries the position of the offending text and says
//! what was expected. Names may be used before they are defined (operands,
//! control predecessors, called computations); they are resolved at the end
//! of their computation or module, and unresolved names are errors.
//!
//! One `Parser` type, its methods grouped by syntax in submodules; each
//! submodule uses only the ones listed before it:
//! * `state`: the parser's state, the nesting-depth guard, error helpers;
//! * `values`: booleans and integer lists, shared by everything below;
//! * `shape`, `literal`, `sharding`: shapes and layouts, constant literals,
//!   shardings with meshes and replica groups;
//! * `names`: names used before their definition, resolved later;
//! * `attributes`: one `key=value` attribute of an instruction;
//! * `instruction`, `computation`, `module`: the text's structure, from one
//!   instruction line up to the whole module;
//! * `unique_names`: module-wide unique instruction names, as XLA makes them.

mod attributes;
mod computation;
mod instruction;
mod literal;
mod module;
mod names;
mod shape;
mod sharding;
mod state;
mod unique_names;
mod values;

use crate::error::ParseError;
use state::Parser;
use xla_hlo_ir::module::HloModule;
use xla_hlo_ir::replica_groups::CollectiveDeviceList;
use xla_hlo_ir::shape::Shape;
use xla_hlo_ir::sharding::HloSharding;

/// Parses a whole HLO module.
pub fn parse_module(text: &str) -> Result<HloModule, ParseError> {
    let mut p = Parser::new(text);
    p.module()
}

/// Parses one shape, e.g. `f32[2,3]{1,0}` or `(s32[], f32[4])`.
pub fn parse_shape(text: &str) -> Result<Shape, ParseError> {
    let mut p = Parser::new(text);
    let s = p.shape()?;
    p.expect_end()?;
    Ok(s)
}

/// Parses one sharding, e.g. `{devices=[2,1]<=[2]}`.
pub fn parse_sharding(text: &str) -> Result<HloSharding, ParseError> {
    let mut p = Parser::new(text);
    let s = p.sharding()?;
    p.expect_end()?;
    Ok(s)
}

/// Parses a replica-group list, e.g. `[2,4]<=[8]` or `{{0,1},{2,3}}`.
pub fn parse_replica_groups(text: &str) -> Result<CollectiveDeviceList, ParseError> {
    let mut p = Parser::new(text);
    let g = p.replica_groups()?;
    p.expect_end()?;
    Ok(g)
}
