//! Encoding and decoding of XLA's small floating-point types (the f8, f6 and
//! f4 kinds) and the shortest round-trip text form XLA's printer uses.
//!
//! Invariants: `decode(encode(x)) == x` for every value representable in the
//! format; encoding rounds to nearest, ties to even; NaN encodes to the
//! format's NaN where it has one.

use crate::primitive_type::PrimitiveType;

/// How a minifloat format treats the top of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialValues {
    /// IEEE-like: the all-ones exponent holds inf (mantissa 0) and NaN.
    Ieee,
    /// "fn": no infinities; only all-ones exponent and mantissa is NaN.
    FiniteNanAllOnes,
    /// "fnuz": no infinities, no negative zero; the negative-zero bit pattern is NaN.
    FiniteNanNegZero,
    /// "fn" without any NaN (f6, f4): every bit pattern is a finite number.
    FiniteOnly,
    /// e8m0fnu: unsigned, exponent only, 0xFF is NaN, no zero.
    ExponentOnly,
}

/// Encoding parameters of one minifloat type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MiniFloatFormat {
    pub exponent_bits: u32,
    pub mantissa_bits: u32,
    pub bias: i32,
    pub special: SpecialValues,
}

impl MiniFloatFormat {
    /// The format of `ty`, or `None` for types that are not minifloats.
    pub fn of(ty: PrimitiveType) -> Option<MiniFloatFormat> {
        use PrimitiveType::*;
        use SpecialValues::*;
        let (e, m, bias, special) = match ty {
            F8E5M2 => (5, 2, 15, Ieee),
            F8E4M3 => (4, 3, 7, Ieee),
            F8E4M3FN => (4, 3, 7, FiniteNanAllOnes),
            F8E4M3B11FNUZ => (4, 3, 11, FiniteNanNegZero),
            F8E3M4 => (3, 4, 3, Ieee),
            F8E5M2FNUZ => (5, 2, 16, FiniteNanNegZero),
            F8E4M3FNUZ => (4, 3, 8, FiniteNanNegZero),
            F8E8M0FNU => (8, 0, 127, ExponentOnly),
            F6E3M2FN => (3, 2, 3, FiniteOnly),
            F6E2M3FN => (2, 3, 1, FiniteOnly),
            F4E2M1FN => (2, 1, 1, FiniteOnly),
            _ => return None,
        };
        Some(MiniFloatFormat {
            exponent_bits: e,
            mantissa_bits: m,
            bias,
            special,
        })
    }

    fn sign_bit(&self) -> u32 {
        if self.special == SpecialValues::ExponentOnly {
            0
        } else {
            1 << (self.exponent_bits + self.mantissa_bits)
        }
    }

    /// The NaN a conversion produces, as ml_dtypes (and so XLA) encodes it:
    /// the quiet NaN (exponent all ones, top mantissa bit) for IEEE-style
    /// types and all ones for the `fn` types, both keeping `sign`; the
    /// `fnuz` types' one NaN (negative zero's pattern).
    fn nan_bits(&self, sign: u32) -> u32 {
        let all = (1u32 << (self.exponent_bits + self.mantissa_bits)) - 1;
        match self.special {
            SpecialValues::Ieee => {
                let quiet = if self.mantissa_bits == 0 {
                    0
                } else {
                    1u32 << (self.mantissa_bits - 1)
                };
                sign | (((1u32 << self.exponent_bits) - 1) << self.mantissa_bits) | quiet
            }
            SpecialValues::FiniteNanAllOnes => sign | all,
            SpecialValues::FiniteNanNegZero => self.sign_bit(),
            SpecialValues::FiniteOnly => 0,
            SpecialValues::ExponentOnly => 0xFF,
        }
    }

    /// The largest finite value of the format.
    pub fn largest_finite(&self) -> f64 {
        self.decode(self.max_finite_bits())
    }

    /// Largest finite magnitude encoding (without sign).
    fn max_finite_bits(&self) -> u32 {
        let m = self.mantissa_bits;
        let exp_all = (1u32 << self.exponent_bits) - 1;
        match self.special {
            SpecialValues::Ieee => ((exp_all - 1) << m) | ((1 << m) - 1),
            SpecialValues::FiniteNanAllOnes => (exp_all << m) | ((1 << m) - 2),
            SpecialValues::FiniteNanNegZero | SpecialValues::FiniteOnly => {
                (exp_all << m) | ((1 << m) - 1)
            }
            SpecialValues::ExponentOnly => 0xFE,
        }
    }

    /// Encodes `x` with round-to-nearest-even. Overflow gives inf where the
    /// format has it, NaN where it has NaN, and the largest finite value otherwise.
    pub fn encode(&self, x: f64) -> u32 {
        let m = self.mantissa_bits as i32;
        if self.special == SpecialValues::ExponentOnly {
            if x.is_nan() || x <= 0.0 {
                return 0xFF;
            }
            let e = x.log2().round_ties_even() as i64 + self.bias as i64;
            return e.clamp(0, 0xFE) as u32;
        }
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if x.is_nan() {
            return self.nan_bits(sign);
        }
        let a = x.abs();
        let overflow = |sign: u32| -> u32 {
            match self.special {
                SpecialValues::Ieee => sign | (((1u32 << self.exponent_bits) - 1) << m),
                SpecialValues::FiniteNanAllOnes | SpecialValues::FiniteNanNegZero => {
                    self.nan_bits(sign)
                }
                _ => sign | self.max_finite_bits(),
            }
        };
        if a.is_infinite() {
            return overflow(sign);
        }
        let min_normal_exp = 1 - self.bias;
        let magnitude: u32 = if a == 0.0 {
            0
        } else {
            let e = a.log2().floor() as i32;
            // log2 may be off by one near powers of two; fix it exactly.
            let e = if 2f64.powi(e) > a {
                e - 1
            } else if 2f64.powi(e + 1) <= a {
                e + 1
            } else {
                e
            };
            if e < min_normal_exp {
                let q = (a / 2f64.powi(min_normal_exp - m)).round_ties_even();
                q as u32
            } else {
                let q = (a / 2f64.powi(e - m)).round_ties_even() as u64;
                let (e, q) = if q == 1u64 << (m + 1) {
                    (e + 1, q >> 1)
                } else {
                    (e, q)
                };
                let biased = (e + self.bias) as i64;
                if biased >= (1i64 << self.exponent_bits) {
                    return overflow(sign);
                }
                ((biased as u32) << m) | (q as u32 - (1u32 << m))
            }
        };
        if magnitude > self.max_finite_bits() {
            return overflow(sign);
        }
        if magnitude == 0 && self.special == SpecialValues::FiniteNanNegZero {
            return 0;
        }
        sign | magnitude
    }

    /// Decodes a bit pattern (only the low bits of the format are read).
    pub fn decode(&self, bits: u32) -> f64 {
        let m = self.mantissa_bits;
        if self.special == SpecialValues::ExponentOnly {
            let b = bits & 0xFF;
            return if b == 0xFF {
                f64::NAN
            } else {
                2f64.powi(b as i32 - self.bias)
            };
        }
        let total = self.exponent_bits + m + 1;
        let bits = bits & ((1u32 << total) - 1);
        let negative = bits & self.sign_bit() != 0;
        let magnitude = bits & (self.sign_bit() - 1);
        let exp_all = (1u32 << self.exponent_bits) - 1;
        let e = magnitude >> m;
        let frac = magnitude & ((1 << m) - 1);
        let value = match self.special {
            SpecialValues::Ieee if e == exp_all => {
                if frac == 0 {
                    f64::INFINITY
                } else {
                    f64::NAN
                }
            }
            SpecialValues::FiniteNanAllOnes if e == exp_all && frac == (1 << m) - 1 => f64::NAN,
            SpecialValues::FiniteNanNegZero if negative && magnitude == 0 => return f64::NAN,
            _ => {
                if e == 0 {
                    frac as f64 * 2f64.powi(1 - self.bias - m as i32)
                } else {
                    (1.0 + frac as f64 / (1u32 << m) as f64) * 2f64.powi(e as i32 - self.bias)
                }
            }
        };
        if negative {
            -value
        } else {
            value
        }
    }
}

/// Formats a float the way XLA's `RoundTripFpToString` does: `%.{d}g` with the
/// type's `digits10`, falling back to `max_digits10` when that does not round-trip.
/// `nan`, `inf` and `-inf` are spelled as HLO text spells them.
pub fn format_float(
    value: f64,
    short_digits: usize,
    long_digits: usize,
    round_trips: impl Fn(f64) -> bool,
) -> String {
    if value.is_nan() {
        return if value.is_sign_negative() {
            "-nan".into()
        } else {
            "nan".into()
        };
    }
    if value.is_infinite() {
        return if value < 0.0 {
            "-inf".into()
        } else {
            "inf".into()
        };
    }
    let short = format_g(value, short_digits);
    let parsed: f64 = short.parse().unwrap_or(f64::NAN);
    if round_trips(parsed) {
        short
    } else {
        format_g(value, long_digits)
    }
}

/// C's `%.{precision}g` for finite values.
pub fn format_g(value: f64, precision: usize) -> String {
    let precision = precision.max(1);
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{:.*e}", precision - 1, value);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    if exp < -4 || exp >= precision as i32 {
        let mantissa = trim_fraction_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (precision as i32 - 1 - exp).max(0) as usize;
        trim_fraction_zeros(&format!("{:.*}", decimals, value)).to_string()
    }
}

fn trim_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minifloats_round_trip_every_pattern() {
        for &ty in PrimitiveType::ALL {
            let Some(fmt) = MiniFloatFormat::of(ty) else {
                continue;
            };
            let width = ty.bit_width();
            for bits in 0..(1u32 << width) {
                let v = fmt.decode(bits);
                if v.is_nan() {
                    assert!(fmt.decode(fmt.encode(v)).is_nan(), "{ty} {bits:#x}");
                    continue;
                }
                let back = fmt.encode(v);
                assert_eq!(fmt.decode(back), v, "{ty} {bits:#x} -> {v}");
            }
        }
    }

    #[test]
    fn known_values() {
        let e4m3fn = MiniFloatFormat::of(PrimitiveType::F8E4M3FN).unwrap();
        assert_eq!(e4m3fn.decode(0x7E), 448.0);
        assert!(e4m3fn.decode(e4m3fn.encode(1000.0)).is_nan());
        let e5m2 = MiniFloatFormat::of(PrimitiveType::F8E5M2).unwrap();
        assert_eq!(e5m2.decode(e5m2.encode(1e9)), f64::INFINITY);
        assert_eq!(e5m2.decode(e5m2.encode(1.25)), 1.25);
        // ties to even: 1.125 lies between 1.0 and 1.25 in e5m2
        assert_eq!(e5m2.decode(e5m2.encode(1.125)), 1.0);
        let f4 = MiniFloatFormat::of(PrimitiveType::F4E2M1FN).unwrap();
        assert_eq!(f4.decode(f4.encode(100.0)), 6.0);
    }

    #[test]
    fn format_g_matches_c() {
        assert_eq!(format_g(1e-05, 6), "1e-05");
        assert_eq!(format_g(64.0, 6), "64");
        assert_eq!(format_g(0.797884583, 9), "0.797884583");
        assert_eq!(format_g(-2.38197633e+38, 9), "-2.38197633e+38");
        assert_eq!(format_g(0.000244140625, 6), "0.000244141");
        assert_eq!(format_g(123456789.0, 6), "1.23457e+08");
    }
}
