//! Vectorisable f32 `exp` and `tanh` in the forms XLA's CPU backend uses:
//! tanh is the clamped rational approximation XLA emits for f32 (odd
//! degree-13 numerator over even degree-6 denominator, tanh(x) = x for
//! |x| < 0.0004); exp uses Cody-Waite range reduction by ln 2 and a
//! degree-7 polynomial, scaling by 2^n in two steps so that results that
//! underflow to subnormals and overflow to infinity come out right.
//!
//! Invariants: branch-free on the hot path (the loops auto-vectorise on
//! baseline SSE2); NaN in gives NaN out; max error of exp about 2 ulp, of
//! tanh about 5 ulp (XLA's own error); both are monotone and odd/positive
//! as the functions are.

/// tanh as XLA computes it for f32.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    const C: f32 = 7.905_311;
    let tiny = x.abs() < 0.0004;
    let xc = x.clamp(-C, C);
    let x2 = xc * xc;
    let mut p = x2 * -2.760_768_5e-16 + 2.000_188e-13;
    p = x2 * p + -8.604_672e-11;
    p = x2 * p + 5.122_297e-8;
    p = x2 * p + 1.485_722_4e-5;
    p = x2 * p + 6.372_619_3e-4;
    p = x2 * p + 4.893_524_6e-3;
    p *= xc;
    let mut q = x2 * 1.198_258_4e-6 + 1.185_347_1e-4;
    q = x2 * q + 2.268_434_6e-3;
    q = x2 * q + 4.893_525e-3;
    if tiny {
        x
    } else {
        p / q
    }
}

/// exp for f32 with correct overflow, underflow and NaN behaviour.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // few mantissa bits: n * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let xc = x.clamp(-104.0, 89.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = r * (1.0 / 5040.0) + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r * r + r + 1.0;
    let ni = n as i32;
    let e1 = ni >> 1;
    let e2 = ni - e1;
    let s1 = f32::from_bits(((e1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((e2 + 127) as u32) << 23);
    let res = p * s1 * s2;
    if x.is_nan() {
        x
    } else {
        res
    }
}

pub fn exp_slice(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = exp(*x);
    }
}

pub fn tanh_slice(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = tanh(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -103.0f32;
        while x < 88.7 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            if want > 1e-37 {
                worst = worst.max(((got - want) / want).abs());
            }
            x += 0.0137;
        }
        assert!(worst < 3e-7, "max rel error {worst}");
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-100.0) > 0.0 && exp(-100.0) < 1e-43);
    }

    #[test]
    fn tanh_is_accurate() {
        let mut x = -10.0f32;
        while x < 10.0 {
            let d = (tanh(x) as f64 - (x as f64).tanh()).abs();
            assert!(d < 2e-6, "tanh({x}) off by {d}");
            x += 0.00731;
        }
        assert_eq!(tanh(1e-5), 1e-5);
        assert!(tanh(f32::NAN).is_nan());
    }
}
