//! Windowed dimensions (XLA's `InferWindowOutputShape`), shared by
//! `reduce-window`, `select-and-scatter` and `convolution`.
//!
//! Invariant: sizes, strides and dilations must be positive and the padded
//! base non-negative; the arithmetic is done in `i128`, so no input
//! overflows.

use super::R;
use crate::attrs::Window;

/// The size of a windowed dimension (XLA's `InferWindowOutputShape`).
pub fn window_output_size(base: i64, d: &crate::attrs::WindowDim) -> Result<i64, String> {
    if d.size <= 0 {
        return Err(format!("window size {} must be positive", d.size));
    }
    if d.stride <= 0 {
        return Err(format!("window stride {} must be positive", d.stride));
    }
    if d.lhs_dilation <= 0 || d.rhs_dilation <= 0 {
        return Err("window dilations must be positive".into());
    }
    if base < 0 {
        return Err(format!("negative dimension {base}"));
    }
    let dilated = |bound: i64, dil: i64| -> i128 {
        if bound == 0 {
            0
        } else {
            (bound as i128 - 1) * dil as i128 + 1
        }
    };
    let padded = d.padding_low as i128 + dilated(base, d.lhs_dilation) + d.padding_high as i128;
    let window = dilated(d.size, d.rhs_dilation);
    if padded < 0 {
        return Err(format!(
            "padded dimension {padded} is negative (base {base}, padding {}_{})",
            d.padding_low, d.padding_high
        ));
    }
    let out = if window > padded {
        0
    } else {
        (padded - window) / d.stride as i128 + 1
    };
    i64::try_from(out).map_err(|_| "window output size overflows".to_string())
}

pub(super) fn window_shape(dims: &[i64], window: &Window) -> R<Vec<i64>> {
    if window.dims.len() != dims.len() {
        invalid!(
            "window has {} dimensions but the operand has rank {}",
            window.dims.len(),
            dims.len()
        );
    }
    let mut out = Vec::with_capacity(dims.len());
    for (i, (&b, w)) in dims.iter().zip(&window.dims).enumerate() {
        match window_output_size(b, w) {
            Ok(s) => out.push(s),
            Err(e) => invalid!("window dimension {i}: {e}"),
        }
    }
    Ok(out)
}
