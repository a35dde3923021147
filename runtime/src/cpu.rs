//! The CPU backend: the reference interpreter. Compiling verifies the module
//! (so structural errors surface before any device starts) and, as XLA's
//! CPU compiler does, promotes bf16 all-reduces and reduce-scatters to f32
//! (`xla_hlo_utils::promote`: the devices' partial sums are added in f32
//! and rounded once); executing converts the device's literals to the
//! interpreter's values, interprets the module with the device's ids and
//! communicator, and converts back.
//!
//! Invariant: a compiled module has passed `xla_hlo_verifier::verify`,
//! before and after the promotion.

use crate::backend::{Backend, DeviceContext, Executable};
use crate::error::RuntimeError;
use crate::literal::Literal;
use xla_hlo_evaluator::collective::{from_buffer, to_buffer};
use xla_hlo_evaluator::{evaluate, EvalContext, EvalError, Value};
use xla_hlo_ir::{HloModule, PrimitiveType};

/// The interpreter as a backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

struct CpuExecutable {
    module: HloModule,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError> {
        let does_not_verify = |e| RuntimeError::Compile {
            backend: "cpu",
            message: format!("the module does not verify:\n{e}"),
        };
        xla_hlo_verifier::verify(module).map_err(does_not_verify)?;
        let mut module = module.clone();
        let promoted = xla_hlo_utils::promote::promote_all_reduces(
            &mut module,
            PrimitiveType::Bf16,
            PrimitiveType::F32,
        );
        if promoted > 0 {
            xla_hlo_verifier::verify(&module).map_err(does_not_verify)?;
        }
        Ok(Box::new(CpuExecutable { module }))
    }
}

impl Executable for CpuExecutable {
    fn module(&self) -> &HloModule {
        &self.module
    }

    fn execute(
        &self,
        device: &DeviceContext<'_>,
        args: &[Literal],
    ) -> Result<Vec<Literal>, RuntimeError> {
        let ctx = eval_context(device);
        let values = args
            .iter()
            .map(value_from_literal)
            .collect::<Result<Vec<_>, _>>()?;
        let results = evaluate(&self.module, &values, &ctx).map_err(execute_error)?;
        results.iter().map(literal_from_value).collect()
    }
}

/// An interpreter failure as a runtime error.
/// The interpreter's context for one device: its ids, counts,
/// communicator and consistent mode.
pub fn eval_context<'a>(device: &DeviceContext<'a>) -> EvalContext<'a> {
    EvalContext {
        partition_id: device.partition_id,
        replica_id: device.replica_id,
        num_partitions: Some(device.num_partitions),
        num_replicas: Some(device.num_replicas),
        collectives: device.communicator,
        memory_limit: None,
        consistent: device.consistent,
    }
}

pub fn execute_error(e: EvalError) -> RuntimeError {
    RuntimeError::Execute {
        backend: "cpu",
        peer_failed: matches!(
            e,
            EvalError::Collective {
                peer_failed: true,
                ..
            }
        ),
        message: e.to_string(),
    }
}

/// The interpreter's value as a literal (one copy of the elements).
pub fn literal_from_value(v: &Value) -> Result<Literal, RuntimeError> {
    Ok(match v {
        Value::Array(a) => Literal::Array(to_buffer(a).map_err(execute_error)?),
        Value::Tuple(e) => {
            Literal::Tuple(e.iter().map(literal_from_value).collect::<Result<_, _>>()?)
        }
        Value::Token => Literal::Token,
    })
}

/// A literal as the interpreter's value (one copy of the elements).
pub fn value_from_literal(l: &Literal) -> Result<Value, RuntimeError> {
    Ok(match l {
        Literal::Array(b) => Value::Array(
            from_buffer(b)
                .map_err(|e| RuntimeError::Arguments(format!("{}: {e}", b.shape_string())))?,
        ),
        Literal::Tuple(e) => {
            Value::Tuple(e.iter().map(value_from_literal).collect::<Result<_, _>>()?)
        }
        Literal::Token => Value::Token,
    })
}

/// [`literal_from_value`] for each value.
pub fn literals_from_values(values: &[Value]) -> Result<Vec<Literal>, RuntimeError> {
    values.iter().map(literal_from_value).collect()
}

/// [`value_from_literal`] for each literal.
pub fn values_from_literals(literals: &[Literal]) -> Result<Vec<Value>, RuntimeError> {
    literals.iter().map(value_from_literal).collect()
}
