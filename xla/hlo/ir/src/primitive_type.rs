//! XLA primitive (element) types: one closed table giving each type its HLO
//! text name, bit width and class.
//!
//! Invariant: `PrimitiveType::from_name(t.name()) == Some(t)` for every `t`,
//! and the table is the only place a type's name or width is written down.

macro_rules! primitive_types {
    ($( $variant:ident, $name:literal, $bits:expr, $class:ident; )*) => {
        /// An XLA element type, as spelled in HLO text (`f32`, `bf16`, `s4`, ...).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum PrimitiveType { $($variant),* }

        impl PrimitiveType {
            /// Every element type, in table order.
            pub const ALL: &'static [PrimitiveType] = &[$(PrimitiveType::$variant),*];

            /// The HLO text spelling.
            pub fn name(self) -> &'static str {
                match self { $(PrimitiveType::$variant => $name),* }
            }

            /// Parses a type name; `opaque_type` is accepted as an alias of `opaque`.
            pub fn from_name(name: &str) -> Option<PrimitiveType> {
                match name {
                    $($name => Some(PrimitiveType::$variant),)*
                    "opaque_type" => Some(PrimitiveType::Opaque),
                    _ => None,
                }
            }

            /// Storage width of one element in bits (0 for token/opaque).
            pub fn bit_width(self) -> u32 {
                match self { $(PrimitiveType::$variant => $bits),* }
            }

            /// The broad class of the type.
            pub fn class(self) -> TypeClass {
                match self { $(PrimitiveType::$variant => TypeClass::$class),* }
            }
        }
    };
}

/// Broad classes of element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypeClass {
    Pred,
    Signed,
    Unsigned,
    Float,
    Complex,
    Token,
    Opaque,
}

primitive_types! {
    Pred, "pred", 8, Pred;
    S1, "s1", 1, Signed;
    S2, "s2", 2, Signed;
    S4, "s4", 4, Signed;
    S8, "s8", 8, Signed;
    S16, "s16", 16, Signed;
    S32, "s32", 32, Signed;
    S64, "s64", 64, Signed;
    U1, "u1", 1, Unsigned;
    U2, "u2", 2, Unsigned;
    U4, "u4", 4, Unsigned;
    U8, "u8", 8, Unsigned;
    U16, "u16", 16, Unsigned;
    U32, "u32", 32, Unsigned;
    U64, "u64", 64, Unsigned;
    F16, "f16", 16, Float;
    Bf16, "bf16", 16, Float;
    F32, "f32", 32, Float;
    F64, "f64", 64, Float;
    F8E5M2, "f8e5m2", 8, Float;
    F8E4M3, "f8e4m3", 8, Float;
    F8E4M3FN, "f8e4m3fn", 8, Float;
    F8E4M3B11FNUZ, "f8e4m3b11fnuz", 8, Float;
    F8E3M4, "f8e3m4", 8, Float;
    F8E5M2FNUZ, "f8e5m2fnuz", 8, Float;
    F8E4M3FNUZ, "f8e4m3fnuz", 8, Float;
    F8E8M0FNU, "f8e8m0fnu", 8, Float;
    F6E3M2FN, "f6e3m2fn", 6, Float;
    F6E2M3FN, "f6e2m3fn", 6, Float;
    F4E2M1FN, "f4e2m1fn", 4, Float;
    C64, "c64", 64, Complex;
    C128, "c128", 128, Complex;
    Token, "token", 0, Token;
    Opaque, "opaque", 0, Opaque;
}

impl PrimitiveType {
    pub fn is_float(self) -> bool {
        self.class() == TypeClass::Float
    }
    pub fn is_complex(self) -> bool {
        self.class() == TypeClass::Complex
    }
    pub fn is_signed_int(self) -> bool {
        self.class() == TypeClass::Signed
    }
    pub fn is_unsigned_int(self) -> bool {
        self.class() == TypeClass::Unsigned
    }
    pub fn is_integer(self) -> bool {
        matches!(self.class(), TypeClass::Signed | TypeClass::Unsigned)
    }
    /// True for types that hold data (everything but token and opaque).
    pub fn is_array_type(self) -> bool {
        !matches!(self.class(), TypeClass::Token | TypeClass::Opaque)
    }
    /// Bytes one element occupies in a dense, unpacked buffer (sub-byte types take a byte).
    pub fn byte_width(self) -> usize {
        match self.bit_width() {
            0 => 0,
            b => b.div_ceil(8) as usize,
        }
    }
    /// For minifloat types (8 bits or fewer), their encoding parameters.
    pub fn minifloat_format(self) -> Option<crate::float::MiniFloatFormat> {
        crate::float::MiniFloatFormat::of(self)
    }
}

impl std::fmt::Display for PrimitiveType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &t in PrimitiveType::ALL {
            assert_eq!(PrimitiveType::from_name(t.name()), Some(t));
        }
        assert_eq!(PrimitiveType::from_name("tuple"), None);
        assert_eq!(
            PrimitiveType::from_name("opaque_type"),
            Some(PrimitiveType::Opaque)
        );
    }
}
