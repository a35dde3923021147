//! Dense linear algebra on the minor two dims of batched float arrays:
//! `cholesky` and `triangular-solve`, with the semantics of XLA's expanders
//! (the ones its CPU and GPU backends lower these opcodes to).
//!
//! Invariants:
//! - Only the triangle named by `lower` is read; the result of `cholesky`
//!   is zero in the other triangle, and a matrix whose factorisation meets
//!   a negative or NaN pivot is NaN everywhere (XLA's `seen_error` rule).
//! - `triangular-solve` reads only `a`'s named triangle and, with
//!   `unit_diagonal`, never reads its diagonal.
//! - Arithmetic is in f64 and rounded once to the element type, so a result
//!   is at least as accurate as XLA's f32 blocked algorithms.
//! - Shapes are validated before any element is touched; nothing panics.

use crate::error::{bad, EvalError};
use crate::value::Array;
use xla_hlo_ir::TypeClass;

/// How `a` enters `op(a) x = b` (or `x op(a) = b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransposeA {
    NoTranspose,
    /// `TRANSPOSE`, and `ADJOINT`, which is the same for real types.
    Transpose,
}

impl TransposeA {
    /// Parses the HLO spelling (`NO_TRANSPOSE`, `TRANSPOSE`, `ADJOINT`).
    pub fn from_name(name: &str) -> Result<TransposeA, EvalError> {
        match name {
            "NO_TRANSPOSE" => Ok(TransposeA::NoTranspose),
            "TRANSPOSE" | "ADJOINT" => Ok(TransposeA::Transpose),
            other => bad(format!(
                "triangular-solve: transpose_a={other}; expected NO_TRANSPOSE, TRANSPOSE or ADJOINT"
            )),
        }
    }
}

/// `(batch, rows, cols)` of an array of rank >= 2.
fn matrix_dims(a: &Array, what: &str) -> Result<(usize, usize, usize), EvalError> {
    if a.rank() < 2 {
        return bad(format!(
            "{what} has rank {} (at least 2 expected)",
            a.rank()
        ));
    }
    if a.ty.class() != TypeClass::Float {
        return bad(format!(
            "{what} has element type {} (a float type expected)",
            a.ty.name()
        ));
    }
    let rows = a.dims[a.rank() - 2] as usize;
    let cols = a.dims[a.rank() - 1] as usize;
    let batch = a.dims[..a.rank() - 2].iter().product::<i64>() as usize;
    Ok((batch, rows, cols))
}

/// Cholesky factor of each matrix in the minor two dims: `L` with
/// `L L^T = a` from `a`'s lower triangle when `lower`, else `U` with
/// `U^T U = a` from its upper triangle.
pub fn cholesky(a: &Array, lower: bool) -> Result<Array, EvalError> {
    let (batch, n, cols) = matrix_dims(a, "cholesky operand")?;
    if n != cols {
        return bad(format!("cholesky operand is not square: {n}x{cols}"));
    }
    let input = a.to_f64_vec();
    let mut out = vec![0.0f64; input.len()];
    // `at(m, r, c)` reads the factor's (r, c) with r >= c in lower terms.
    let index = |r: usize, c: usize| if lower { r * n + c } else { c * n + r };
    for m in 0..batch {
        let base = m * n * n;
        let mut failed = false;
        'columns: for j in 0..n {
            let mut pivot = input[base + index(j, j)];
            for k in 0..j {
                let l = out[base + index(j, k)];
                pivot -= l * l;
            }
            let diagonal = pivot.sqrt();
            if diagonal.is_nan() {
                failed = true;
                break 'columns;
            }
            out[base + index(j, j)] = diagonal;
            for i in j + 1..n {
                let mut v = input[base + index(i, j)];
                for k in 0..j {
                    v -= out[base + index(i, k)] * out[base + index(j, k)];
                }
                out[base + index(i, j)] = v / diagonal;
            }
        }
        if failed {
            out[base..base + n * n].fill(f64::NAN);
        }
    }
    Array::from_f64s(a.ty, a.dims.clone(), &out)
}

/// Options of `triangular-solve`.
#[derive(Clone, Copy, Debug)]
pub struct TriangularSolveOptions {
    pub left_side: bool,
    pub lower: bool,
    pub unit_diagonal: bool,
    pub transpose_a: TransposeA,
}

/// Solves `op(a) x = b` (left side) or `x op(a) = b` for each batch element,
/// `a` triangular in its minor two dims.
pub fn triangular_solve(
    a: &Array,
    b: &Array,
    options: TriangularSolveOptions,
) -> Result<Array, EvalError> {
    let (batch, n, a_cols) = matrix_dims(a, "triangular-solve a")?;
    let (b_batch, rows, cols) = matrix_dims(b, "triangular-solve b")?;
    if n != a_cols {
        return bad(format!("triangular-solve a is not square: {n}x{a_cols}"));
    }
    if a.rank() != b.rank() || a.dims[..a.rank() - 2] != b.dims[..b.rank() - 2] || batch != b_batch
    {
        return bad("triangular-solve: a and b have different batch dims");
    }
    let solved = if options.left_side { rows } else { cols };
    if solved != n {
        return bad(format!(
            "triangular-solve: b's {} dim is {solved}, a is {n}x{n}",
            if options.left_side { "row" } else { "column" }
        ));
    }
    let a_values = a.to_f64_vec();
    let mut x = b.to_f64_vec();
    // With `op(a)` written as a matrix `t`, `t` is lower triangular exactly
    // when `lower` differs from `transpose`.
    let transposed = options.transpose_a == TransposeA::Transpose;
    let op_lower = options.lower != transposed;
    let op_a = |base: usize, r: usize, c: usize| -> f64 {
        let (r, c) = if transposed { (c, r) } else { (r, c) };
        a_values[base + r * n + c]
    };
    for m in 0..batch {
        let a_base = m * n * n;
        let x_base = m * rows * cols;
        if options.left_side {
            // t x = b, column by column of b; rows in substitution order.
            for col in 0..cols {
                for step in 0..n {
                    let i = if op_lower { step } else { n - 1 - step };
                    let mut v = x[x_base + i * cols + col];
                    let range = if op_lower { 0..i } else { i + 1..n };
                    for k in range {
                        v -= op_a(a_base, i, k) * x[x_base + k * cols + col];
                    }
                    if !options.unit_diagonal {
                        v /= op_a(a_base, i, i);
                    }
                    x[x_base + i * cols + col] = v;
                }
            }
        } else {
            // x t = b, i.e. t^T x^T = b^T: row by row of b; t^T is upper
            // exactly when t is lower, so a lower t solves from the last column.
            for row in 0..rows {
                for step in 0..n {
                    let j = if op_lower { n - 1 - step } else { step };
                    let mut v = x[x_base + row * cols + j];
                    let range = if op_lower { j + 1..n } else { 0..j };
                    for k in range {
                        v -= x[x_base + row * cols + k] * op_a(a_base, k, j);
                    }
                    if !options.unit_diagonal {
                        v /= op_a(a_base, j, j);
                    }
                    x[x_base + row * cols + j] = v;
                }
            }
        }
    }
    Array::from_f64s(b.ty, b.dims.clone(), &x)
}
