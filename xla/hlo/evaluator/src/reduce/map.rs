//! map: a scalar computation applied elementwise.
//!
//! Invariants: a binary-op computation of two operands runs as the
//! elementwise op itself; otherwise every operand has the result's element
//! count and the computation is called once per element.

use super::combiner::{binary_reducer, scalar_at, scalars_to_array};
use crate::error::{bad, EvalError};
use crate::interp::Evaluator;
use crate::value::{element_count, Array, Value};
use xla_hlo_ir::{CompId, PrimitiveType};

/// map: applies a scalar computation elementwise.
pub fn map(
    ev: &Evaluator,
    comp: CompId,
    ops: &[&Array],
    ty: PrimitiveType,
    dims: &[i64],
) -> Result<Array, EvalError> {
    if ops.len() == 2 {
        if let Some(op) = binary_reducer(ev, comp) {
            return crate::elementwise::binary(op, ops[0], ops[1]);
        }
    }
    let n = element_count(dims);
    for o in ops {
        if o.len() != n {
            return bad("map: operand shapes differ from the result");
        }
    }
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let args: Vec<Value> = ops.iter().map(|o| scalar_at(o, i)).collect();
        items.push(ev.call_array(comp, &args)?);
    }
    scalars_to_array(ty, dims.to_vec(), &items)
}
