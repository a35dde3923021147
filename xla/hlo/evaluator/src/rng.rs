//! rng-bit-generator: XLA's Philox4x32-10 and ThreeFry2x32-20 bit
//! generators, bit-exact with XLA's RngBitGeneratorExpander (the CPU
//! backend's default algorithm is Philox).
//!
//! Invariants: state layout, counters, output interleaving, the split of
//! 32-bit ThreeFry outputs over an even dimension and the new state all
//! follow XLA's expansion: state[0] is the key; ThreeFry's counter is
//! state[1]; Philox's 128-bit counter is (state[1], state[2]) when the state
//! has 3 or more words, else (state[1], state[0]) of which only the low word
//! is written back. Narrow types take the low bits of 32-bit outputs.

use crate::error::{bad, EvalError};
use crate::value::{Array, Data};
use xla_hlo_ir::PrimitiveType;

fn threefry2x32(input: [u32; 2], key: [u32; 2]) -> [u32; 2] {
    const ROT: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
    let ks = [key[0], key[1], 0x1BD1_1BDA ^ key[0] ^ key[1]];
    let mut x = [input[0].wrapping_add(ks[0]), input[1].wrapping_add(ks[1])];
    let round = |x: &mut [u32; 2], r: u32| {
        x[0] = x[0].wrapping_add(x[1]);
        x[1] = x[1].rotate_left(r);
        x[1] ^= x[0];
    };
    for block in 0..5u32 {
        let rots = if block % 2 == 0 { &ROT[..4] } else { &ROT[4..] };
        for &r in rots {
            round(&mut x, r);
        }
        let i = block as usize;
        x[0] = x[0].wrapping_add(ks[(i + 1) % 3]);
        x[1] = x[1].wrapping_add(ks[(i + 2) % 3]).wrapping_add(block + 1);
    }
    x
}

fn philox4x32(mut x: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for _ in 0..10 {
        let p0 = (x[0] as u64) * 0xD251_1F53u64;
        let p1 = (x[2] as u64) * 0xCD9E_8D57u64;
        x = [
            ((p1 >> 32) as u32) ^ x[1] ^ key[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ x[3] ^ key[1],
            p0 as u32,
        ];
        key = [
            key[0].wrapping_add(0x9E37_79B9),
            key[1].wrapping_add(0xBB67_AE85),
        ];
    }
    x
}

fn split_u64(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

/// (low, high) + n with carry.
fn u128_add(lo: u64, hi: u64, n: u64) -> (u64, u64) {
    let nl = lo.wrapping_add(n);
    (nl, if nl < lo { hi.wrapping_add(1) } else { hi })
}

/// ThreeFry 32-bit outputs for `dims` (XLA splits the shape in halves).
fn threefry_bits32(key: u64, state: u64, dims: &[i64]) -> (Vec<u32>, u64) {
    let k = split_u64(key);
    let n: usize = dims.iter().map(|&d| d.max(0) as usize).product();
    if dims.is_empty() {
        let x = threefry2x32(split_u64(state), k);
        return (vec![x[0]], state.wrapping_add(1));
    }
    // split dim: first even dim, else the largest
    let split = dims.iter().position(|&d| d % 2 == 0).unwrap_or_else(|| {
        let mut best = 0;
        for (i, &d) in dims.iter().enumerate() {
            if d > dims[best] {
                best = i;
            }
        }
        best
    });
    let mut half = dims.to_vec();
    half[split] = (dims[split] + 1) / 2;
    let half_n: usize = half.iter().map(|&d| d.max(0) as usize).product();
    let outer: usize = dims[..split].iter().map(|&d| d as usize).product();
    let inner: usize = dims[split + 1..].iter().map(|&d| d as usize).product();
    let h = half[split] as usize;
    let full = dims[split] as usize;
    let mut out = vec![0u32; n];
    for o in 0..outer {
        for j in 0..h {
            for i in 0..inner {
                let hflat = (o * h + j) * inner + i;
                let x = threefry2x32(split_u64(state.wrapping_add(hflat as u64)), k);
                for (c, &v) in x.iter().enumerate() {
                    let jj = 2 * j + c;
                    if jj < full {
                        out[(o * full + jj) * inner + i] = v;
                    }
                }
            }
        }
    }
    (out, state.wrapping_add(half_n as u64))
}

/// Returns (new state, random bits of `ty` and `dims`).
pub fn rng_bit_generator(
    algorithm: &str,
    state: &Array,
    ty: PrimitiveType,
    dims: &[i64],
) -> Result<(Array, Array), EvalError> {
    let Data::U64(sv) = &*state.data else {
        return bad("rng-bit-generator state must be u64");
    };
    if sv.len() < 2 || state.rank() != 1 {
        return bad("rng-bit-generator state must be u64[n] with n >= 2");
    }
    let n: usize = dims.iter().map(|&d| d.max(0) as usize).product();
    let width = ty.bit_width();
    if !(ty.is_integer() || ty.is_float())
        || !(width == 8 || width == 16 || width == 32 || width == 64)
    {
        return bad(format!("rng-bit-generator cannot produce {ty}"));
    }
    let key = sv[0];
    let mut new_state = sv.clone();
    let (bits32, bits64): (Vec<u32>, Vec<u64>) = match algorithm {
        "rng_three_fry" => {
            if width == 64 {
                let k = split_u64(key);
                let out = (0..n)
                    .map(|i| {
                        let x = threefry2x32(split_u64(sv[1].wrapping_add(i as u64)), k);
                        x[0] as u64 | (x[1] as u64) << 32
                    })
                    .collect();
                new_state[1] = sv[1].wrapping_add(n as u64);
                (Vec::new(), out)
            } else {
                let (out, s) = threefry_bits32(key, sv[1], dims);
                new_state[1] = s;
                (out, Vec::new())
            }
        }
        "rng_philox" | "rng_default" => {
            let (lo, hi) = if sv.len() >= 3 {
                (sv[1], sv[2])
            } else {
                (sv[1], sv[0])
            };
            let k = split_u64(key);
            let words = if width == 64 { 2 * n } else { n };
            let vecs = words.div_ceil(4);
            let mut raw = Vec::with_capacity(vecs);
            for i in 0..vecs {
                let (l, h) = u128_add(lo, hi, i as u64);
                let l2 = split_u64(l);
                let h2 = split_u64(h);
                raw.push(philox4x32([l2[0], l2[1], h2[0], h2[1]], k));
            }
            let (nl, nh) = u128_add(lo, hi, vecs as u64);
            new_state[1] = nl;
            if sv.len() >= 3 {
                new_state[2] = nh;
            }
            if width == 64 {
                let mut out = Vec::with_capacity(2 * vecs);
                for r in &raw {
                    out.push(r[0] as u64 | (r[1] as u64) << 32);
                    out.push(r[2] as u64 | (r[3] as u64) << 32);
                }
                out.truncate(n);
                (Vec::new(), out)
            } else {
                let mut out: Vec<u32> = raw.iter().flat_map(|r| r.iter().copied()).collect();
                out.truncate(n);
                (out, Vec::new())
            }
        }
        other => return bad(format!("unknown rng-bit-generator algorithm {other}")),
    };
    let bytes: Vec<u8> = match width {
        64 => bits64.iter().flat_map(|v| v.to_le_bytes()).collect(),
        32 => bits32.iter().flat_map(|v| v.to_le_bytes()).collect(),
        16 => bits32
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        _ => bits32.iter().map(|&v| v as u8).collect(),
    };
    let data = crate::elementwise::from_bytes(ty, &bytes)?;
    let st = Array::new(PrimitiveType::U64, state.dims.clone(), Data::U64(new_state))?;
    Ok((st, Array::new(ty, dims.to_vec(), data)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threefry_known_answer() {
        // Random123 known-answer test for threefry2x32_20: key=0, ctr=0.
        assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(
            threefry2x32([0xffff_ffff, 0xffff_ffff], [0xffff_ffff, 0xffff_ffff]),
            [0x1cb9_96fc, 0xbb00_2be7]
        );
    }

    #[test]
    fn philox_known_answer() {
        // Random123 known-answer test for philox4x32_10.
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([0xffff_ffff; 4], [0xffff_ffff; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }
}
