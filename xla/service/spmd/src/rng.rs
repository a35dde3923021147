//! `rng-bit-generator` partitioned without communication: each device
//! computes exactly its tile of the global random stream, so the
//! partitioned program gives the bits of the unpartitioned one, whatever
//! the tiling (veScale's single-device consistency for random numbers).
//!
//! The generator is expanded into elementwise HLO as XLA's
//! `RngBitGeneratorExpander` does, with every element's counter taken from
//! its *global* position (a local iota plus the tile offset of the device):
//! - Philox4x32-10 (`rng_default`, `rng_philox`): element `f` (flat,
//!   row-major) of a 32-bit-or-narrower result is word `f % 4` of the
//!   Philox block at counter `c + f / 4`; a 64-bit element is words
//!   `2 (f % 2)` and `2 (f % 2) + 1` of block `c + f / 2`. The 128-bit
//!   counter `c` is `(state[1], state[2])`, or `(state[1], state[0])` for a
//!   two-word state, and the key is `state[0]`.
//! - ThreeFry2x32-20 (`rng_three_fry`): a 64-bit element `f` is both words
//!   of the block at counter `state[1] + f`; narrower results split a dim
//!   (the first even one, else the largest) in halves, the element at
//!   position `j` of that dim being word `j % 2` of the block at the flat
//!   index of the position with `j / 2` in the halved shape.
//!
//! Narrower types take the low bits of a 32-bit word; the result is the
//! bit pattern in the output type. The new state is the old one with the
//! counter advanced by the blocks of the whole array, computed on the
//! replicated state. The evaluator's `rng` module is the reference
//! (same counters and layout); the tests compare the two bit for bit.
//!
//! Invariants: the state is replicated; the result's tile on each device
//! is the global result's tile (padding positions of uneven tiles hold
//! bits of positions past the end, never read); no collective is emitted.

use crate::grid::{local_dims, tile_size, Grid};
use crate::helpers::HandlerResult;
use crate::part::Part;
use crate::shapes::arr;
use crate::value::{PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, InstrId, Opcode, PrimitiveType, Shape};

const U32: PrimitiveType = PrimitiveType::U32;
const U64: PrimitiveType = PrimitiveType::U64;

/// The generator algorithms XLA expands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Philox,
    ThreeFry,
}

impl Algorithm {
    fn of(instr: &HloInstruction) -> Option<Algorithm> {
        let name = match instr.attr(AttrKey::Algorithm) {
            Some(AttrValue::Ident(name)) | Some(AttrValue::Str(name)) => name.as_str(),
            None => "rng_default",
            _ => return None,
        };
        match name {
            "rng_default" | "rng_philox" => Some(Algorithm::Philox),
            "rng_three_fry" => Some(Algorithm::ThreeFry),
            _ => None,
        }
    }
}

/// Elementwise HLO over one local shape (`dims`), in the builder of `p`.
struct Emit<'a, 'p, 'c> {
    p: &'a mut Part<'p, 'c>,
    dims: Vec<i64>,
}

impl Emit<'_, '_, '_> {
    fn scalar(&mut self, ty: PrimitiveType, v: u64) -> InstrId {
        self.p.b.scalar(ty, v as i64)
    }
    /// A constant of `ty` over the local shape.
    fn splat_const(&mut self, ty: PrimitiveType, v: u64) -> InstrId {
        let s = self.scalar(ty, v);
        self.p.b.splat(s, &self.dims.clone())
    }
    fn splat(&mut self, s: InstrId) -> InstrId {
        self.p.b.splat(s, &self.dims.clone())
    }
    fn op(&mut self, op: Opcode, a: InstrId, b: InstrId) -> InstrId {
        self.p.b.binary(op, a, b)
    }
    fn convert(&mut self, x: InstrId, ty: PrimitiveType) -> InstrId {
        let dims = self.p.b.dims(x);
        self.p
            .b
            .add("convert", Opcode::Convert, arr(ty, dims), vec![x], vec![])
    }
    fn bitcast(&mut self, x: InstrId, ty: PrimitiveType) -> InstrId {
        let dims = self.p.b.dims(x);
        self.p.b.add(
            "bitcast-convert",
            Opcode::BitcastConvert,
            arr(ty, dims),
            vec![x],
            vec![],
        )
    }
    /// Low and high 32-bit words of a u64 value.
    fn split(&mut self, x: InstrId) -> (InstrId, InstrId) {
        let lo = self.convert(x, U32);
        let dims = self.p.b.dims(x);
        let shift = self.scalar(U64, 32);
        let shift = self.p.b.splat(shift, &dims);
        let hi = self.op(Opcode::ShiftRightLogical, x, shift);
        let hi = self.convert(hi, U32);
        (lo, hi)
    }
    /// `lo | hi << 32` as u64.
    fn join(&mut self, lo: InstrId, hi: InstrId) -> InstrId {
        let lo = self.convert(lo, U64);
        let hi = self.convert(hi, U64);
        let shift = self.splat_const(U64, 32);
        let hi = self.op(Opcode::ShiftLeft, hi, shift);
        self.op(Opcode::Or, lo, hi)
    }
    fn rotate_left(&mut self, x: InstrId, r: u32) -> InstrId {
        let left = self.splat_const(U32, r as u64);
        let right = self.splat_const(U32, 32 - r as u64);
        let l = self.op(Opcode::ShiftLeft, x, left);
        let rr = self.op(Opcode::ShiftRightLogical, x, right);
        self.op(Opcode::Or, l, rr)
    }
    /// `select(lane == k, words[k], ...)` over the words of a block.
    fn pick(&mut self, lane: InstrId, words: &[InstrId]) -> InstrId {
        let ty = self.p.b.ty(lane).unwrap_or(U64);
        let mut out = words[words.len() - 1];
        for k in (0..words.len() - 1).rev() {
            let kk = self.splat_const(ty, k as u64);
            let is_k = self.p.b.compare(lane, kk, "EQ");
            out = self.p.b.select(is_k, words[k], out);
        }
        out
    }

    /// Philox4x32-10 of the counter words with key words (scalars).
    fn philox(&mut self, mut x: [InstrId; 4], key: [InstrId; 2]) -> [InstrId; 4] {
        let mut key = key;
        let m0 = self.splat_const(U64, 0xD251_1F53);
        let m1 = self.splat_const(U64, 0xCD9E_8D57);
        let shift = self.splat_const(U64, 32);
        for round in 0..10 {
            let k0 = self.splat(key[0]);
            let k1 = self.splat(key[1]);
            let x0 = self.convert(x[0], U64);
            let p0 = self.op(Opcode::Multiply, x0, m0);
            let x2 = self.convert(x[2], U64);
            let p1 = self.op(Opcode::Multiply, x2, m1);
            let p0_hi = self.op(Opcode::ShiftRightLogical, p0, shift);
            let p0_hi = self.convert(p0_hi, U32);
            let p0_lo = self.convert(p0, U32);
            let p1_hi = self.op(Opcode::ShiftRightLogical, p1, shift);
            let p1_hi = self.convert(p1_hi, U32);
            let p1_lo = self.convert(p1, U32);
            let a = self.op(Opcode::Xor, p1_hi, x[1]);
            let a = self.op(Opcode::Xor, a, k0);
            let c = self.op(Opcode::Xor, p0_hi, x[3]);
            let c = self.op(Opcode::Xor, c, k1);
            x = [a, p1_lo, c, p0_lo];
            if round < 9 {
                let bump0 = self.scalar(U32, 0x9E37_79B9);
                let bump1 = self.scalar(U32, 0xBB67_AE85);
                key = [
                    self.p.b.binary(Opcode::Add, key[0], bump0),
                    self.p.b.binary(Opcode::Add, key[1], bump1),
                ];
            }
        }
        x
    }

    /// ThreeFry2x32-20 of the counter words with key words (scalars).
    fn threefry(&mut self, input: [InstrId; 2], key: [InstrId; 2]) -> [InstrId; 2] {
        const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
        let parity = self.scalar(U32, 0x1BD1_1BDA);
        let k2 = self.p.b.binary(Opcode::Xor, key[0], key[1]);
        let k2 = self.p.b.binary(Opcode::Xor, k2, parity);
        let ks = [self.splat(key[0]), self.splat(key[1]), self.splat(k2)];
        let mut x = [
            self.op(Opcode::Add, input[0], ks[0]),
            self.op(Opcode::Add, input[1], ks[1]),
        ];
        for block in 0..5usize {
            let rotations = if block % 2 == 0 {
                &ROTATIONS[..4]
            } else {
                &ROTATIONS[4..]
            };
            for &r in rotations {
                x[0] = self.op(Opcode::Add, x[0], x[1]);
                x[1] = self.rotate_left(x[1], r);
                x[1] = self.op(Opcode::Xor, x[1], x[0]);
            }
            x[0] = self.op(Opcode::Add, x[0], ks[(block + 1) % 3]);
            let injected = self.op(Opcode::Add, x[1], ks[(block + 2) % 3]);
            let step = self.splat_const(U32, block as u64 + 1);
            x[1] = self.op(Opcode::Add, injected, step);
        }
        x
    }
}

/// One word of the replicated state as a u64 scalar.
fn state_word(p: &mut Part<'_, '_>, state: InstrId, k: i64) -> InstrId {
    let one = p.b.slice(state, &[(k, k + 1, 1)]);
    p.b.reshape(one, &[])
}

/// `(lo, hi) + n` on u64 scalars or arrays of one shape, with carry.
fn add_128(p: &mut Part<'_, '_>, lo: InstrId, hi: InstrId, n: InstrId) -> (InstrId, InstrId) {
    let sum = p.b.binary(Opcode::Add, lo, n);
    let wrapped = p.b.compare(sum, lo, "LT");
    let dims = p.b.dims(hi);
    let one = p.b.scalar(U64, 1);
    let one = p.b.splat(one, &dims);
    let bumped = p.b.binary(Opcode::Add, hi, one);
    let hi = p.b.select(wrapped, bumped, hi);
    (sum, hi)
}

/// The global positions of the local elements along every dim (u64 local
/// arrays): a local iota plus the device's tile offset.
fn global_positions(p: &mut Part<'_, '_>, dims: &[i64], out: &Grid) -> Vec<InstrId> {
    let local = local_dims(dims, out);
    (0..dims.len())
        .map(|d| {
            let iota = p.b.iota(U64, &local, d);
            if out.tiles(d) <= 1 {
                return iota;
            }
            let table = p.grids().offsets(out, d, tile_size(dims[d], out.tiles(d)));
            let offset = p.b.table(&table);
            let offset = p.b.add(
                "convert",
                Opcode::Convert,
                Shape::scalar(U64),
                vec![offset],
                vec![],
            );
            let offset = p.b.splat(offset, &local);
            p.b.binary(Opcode::Add, iota, offset)
        })
        .collect()
}

/// Row-major flat index of positions `pos` in an array of `dims` (u64).
fn flat_index(p: &mut Part<'_, '_>, pos: &[InstrId], dims: &[i64], local: &[i64]) -> InstrId {
    let mut flat: Option<InstrId> = None;
    for (d, &x) in pos.iter().enumerate() {
        flat = Some(match flat {
            None => x,
            Some(f) => {
                let size = p.b.scalar(U64, dims[d]);
                let size = p.b.splat(size, local);
                let scaled = p.b.binary(Opcode::Multiply, f, size);
                p.b.binary(Opcode::Add, scaled, x)
            }
        });
    }
    flat.unwrap_or_else(|| p.b.scalar(U64, 0))
}

/// `rng-bit-generator` with a tiled result: see the module doc. Falls back
/// (whole generation) for a replicated or manual result and for
/// algorithms or types this expansion does not cover.
pub fn rng_bit_generator(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let ValueSharding::Tuple(parts) = target else {
        return Ok(None);
    };
    let (Some(out), Shape::Tuple(shapes)) = (parts.get(1).and_then(|v| v.grid()), &instr.shape)
    else {
        return Ok(None);
    };
    let out = out.clone();
    let (Some(algorithm), Some(Shape::Array(bits_shape)), Some(Shape::Array(state_shape))) =
        (Algorithm::of(instr), shapes.get(1), shapes.first())
    else {
        return Ok(None);
    };
    let ty = bits_shape.element_type;
    let width = ty.bit_width();
    let dims = bits_shape.dims.clone();
    let state_len = state_shape.dims.first().copied().unwrap_or(0);
    if out.rank() != dims.len()
        || (0..dims.len()).all(|d| out.tiles(d) <= 1)
        || state_shape.element_type != U64
        || state_shape.dims.len() != 1
        || state_len < 2
        || !matches!(width, 8 | 16 | 32 | 64)
        || !(ty.is_integer() || ty.is_float())
        || dims.iter().any(|&d| d <= 0)
    {
        return Ok(None);
    }
    let count: u64 = dims.iter().map(|&d| d as u64).product();
    let state = p.operand(instr, 0)?;
    let state = p.replicate(&state)?;
    let local = local_dims(&dims, &out);
    let pos = global_positions(p, &dims, &out);

    let key = state_word(p, state.id, 0);
    let mut e = Emit {
        p,
        dims: local.clone(),
    };
    let (key_lo, key_hi) = e.split(key);
    let key = [key_lo, key_hi];
    let (bits, new_counter): (InstrId, Vec<(i64, InstrId)>) = match algorithm {
        Algorithm::Philox => {
            let lo = state_word(e.p, state.id, 1);
            let hi = state_word(e.p, state.id, if state_len >= 3 { 2 } else { 0 });
            let flat = flat_index(e.p, &pos, &dims, &local);
            let per_block = if width == 64 { 2 } else { 4 };
            let per_block_array = e.splat_const(U64, per_block);
            let block = e.op(Opcode::Divide, flat, per_block_array);
            let lane = e.op(Opcode::Remainder, flat, per_block_array);
            let lo_array = e.splat(lo);
            let hi_array = e.splat(hi);
            let (counter_lo, counter_hi) = add_128(e.p, lo_array, hi_array, block);
            let (c0, c1) = e.split(counter_lo);
            let (c2, c3) = e.split(counter_hi);
            let words = e.philox([c0, c1, c2, c3], key);
            let bits = if width == 64 {
                let low = e.join(words[0], words[1]);
                let high = e.join(words[2], words[3]);
                e.pick(lane, &[low, high])
            } else {
                e.pick(lane, &words)
            };
            let words_total = if width == 64 { 2 * count } else { count };
            let blocks = e.scalar(U64, words_total.div_ceil(4));
            let (new_lo, new_hi) = add_128(e.p, lo, hi, blocks);
            let mut written = vec![(1, new_lo)];
            if state_len >= 3 {
                written.push((2, new_hi));
            }
            (bits, written)
        }
        Algorithm::ThreeFry => {
            let counter = state_word(e.p, state.id, 1);
            let (index, lane, blocks) = if width == 64 {
                (flat_index(e.p, &pos, &dims, &local), None, count)
            } else {
                // The first even dim, else the first of the largest.
                let split = dims.iter().position(|&d| d % 2 == 0).unwrap_or_else(|| {
                    (0..dims.len())
                        .max_by_key(|&d| (dims[d], std::cmp::Reverse(d)))
                        .unwrap_or(0)
                });
                let mut halved = dims.clone();
                halved[split] = (dims[split] + 1) / 2;
                let two = e.splat_const(U64, 2);
                let mut halved_pos = pos.clone();
                halved_pos[split] = e.op(Opcode::Divide, pos[split], two);
                let lane = e.op(Opcode::Remainder, pos[split], two);
                let index = flat_index(e.p, &halved_pos, &halved, &local);
                let blocks: u64 = halved.iter().map(|&d| d as u64).product();
                (index, Some(lane), blocks)
            };
            let counter_array = e.splat(counter);
            let counter_array = e.op(Opcode::Add, counter_array, index);
            let (c0, c1) = e.split(counter_array);
            let words = e.threefry([c0, c1], key);
            let bits = match lane {
                None => e.join(words[0], words[1]),
                Some(lane) => e.pick(lane, &words),
            };
            let blocks = e.scalar(U64, blocks);
            let new_counter = e.p.b.binary(Opcode::Add, counter, blocks);
            (bits, vec![(1, new_counter)])
        }
    };
    let bits = match width {
        64 if ty == U64 => bits,
        64 => e.bitcast(bits, ty),
        32 if ty == U32 => bits,
        32 => e.bitcast(bits, ty),
        _ => {
            let unsigned = if width == 16 {
                PrimitiveType::U16
            } else {
                PrimitiveType::U8
            };
            let narrow = e.convert(bits, unsigned);
            if ty == unsigned {
                narrow
            } else {
                e.bitcast(narrow, ty)
            }
        }
    };

    // The new state: the old words with the counter words replaced.
    let mut pieces = Vec::new();
    for k in 0..state_len {
        let word = match new_counter.iter().find(|(at, _)| *at == k) {
            Some(&(_, w)) => p.b.reshape(w, &[1]),
            None => p.b.slice(state.id, &[(k, k + 1, 1)]),
        };
        pieces.push(word);
    }
    let new_state = p.b.concatenate(pieces, 0);
    let local_shape = Shape::Tuple(vec![p.b.shape(new_state).clone(), p.b.shape(bits).clone()]);
    let id = p.b.add(
        "tuple",
        Opcode::Tuple,
        local_shape,
        vec![new_state, bits],
        vec![],
    );
    p.note(instr, "global-stream-tile");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Tuple(vec![state.vs, ValueSharding::Grid(out)]),
    }))
}
