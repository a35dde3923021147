//! Piecewise window assembly along one tiled dim: every tile's window is
//! cut into pieces, one per source tile it reads (a window may also wrap
//! around the end of the dim, for rotations and wrap pads); the pieces
//! are grouped into collective-permutes in which each tile sends and
//! receives at most once, each permute as wide as its widest piece (every
//! source slices its own rows at its own offset); each received piece is
//! placed at its position in the window and selected there. Pieces a tile
//! reads from itself are placed the same way without communication.
//!
//! It moves only the rows some window needs (a wrap pad moves its two
//! edge rows, not two tiles), at the price of a few selects per group.
//!
//! Invariants: the device at tile `i` ends with a buffer of `len` rows
//! whose rows `[0, valid[i])` are the window's; rows past `valid[i]` hold
//! zeros; a permute never has a source or a target twice.

use crate::error::SpmdError;
use crate::grid::{tile_size, Grid};
use crate::part::Part;
use xla_hlo_ir::{InstrId, Opcode, PrimitiveType};

/// One piece: `width` rows from row `row` of source tile `source`, placed
/// at window position `at` of tile `dest`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Piece {
    source: i64,
    dest: i64,
    row: i64,
    at: i64,
    width: i64,
}

/// A collective-permute (or, `local`, a local slice) of pieces.
#[derive(Clone, Debug, PartialEq)]
struct Group {
    local: bool,
    width: i64,
    pieces: Vec<Piece>,
}

/// The assembly of every tile's window.
#[derive(Clone, Debug, PartialEq)]
pub struct Assembly {
    groups: Vec<Group>,
    /// Rows of a tile and the window length.
    s: i64,
    len: i64,
}

/// Plans the assembly of windows `[starts[i], starts[i] + valid[i])` of a
/// dim of `xa` rows tiled `starts.len()` ways, each padded to `len` rows;
/// with `wrap`, window rows are taken modulo `xa` (else rows outside
/// `[0, xa)` are left as zeros).
pub fn plan(starts: &[i64], valid: &[i64], len: i64, xa: i64, wrap: bool) -> Option<Assembly> {
    let t = starts.len() as i64;
    if t == 0 || xa <= 0 || valid.len() != starts.len() {
        return None;
    }
    let s = tile_size(xa, t);
    let mut pieces = Vec::new();
    for (i, (&st, &v)) in starts.iter().zip(valid).enumerate() {
        let v = v.clamp(0, len);
        let mut pos = 0;
        while pos < v {
            let g = st + pos;
            let row = if wrap { g.rem_euclid(xa) } else { g };
            if !(0..xa).contains(&row) {
                // Outside the dim: skip to where it starts (or ends).
                let skip = if row < 0 { -row } else { v - pos };
                pos += skip.min(v - pos);
                continue;
            }
            let source = row / s;
            let in_tile = row - source * s;
            let width = (s - in_tile).min(v - pos).min(xa - row);
            pieces.push(Piece {
                source,
                dest: i as i64,
                row: in_tile,
                at: pos,
                width,
            });
            pos += width;
        }
    }
    // Widest first, each into the first group where its source and its
    // destination are free.
    pieces.sort_by_key(|p| (-p.width, p.dest, p.at));
    let mut groups: Vec<Group> = Vec::new();
    for piece in pieces {
        let local = piece.source == piece.dest;
        let slot = groups.iter_mut().find(|g| {
            g.local == local
                && !g
                    .pieces
                    .iter()
                    .any(|q| q.source == piece.source || q.dest == piece.dest)
        });
        match slot {
            Some(g) => {
                g.width = g.width.max(piece.width);
                g.pieces.push(piece);
            }
            None => groups.push(Group {
                local,
                width: piece.width,
                pieces: vec![piece],
            }),
        }
    }
    Some(Assembly { groups, s, len })
}

impl Assembly {
    /// Rows the permutes move per device (local groups are free).
    pub fn rows_moved(&self) -> i64 {
        self.groups
            .iter()
            .filter(|g| !g.local)
            .map(|g| g.width)
            .sum()
    }

    /// Emits the assembly for local tiles `x` (laid out by `g`, dim `a`).
    pub fn emit(
        &self,
        p: &mut Part<'_, '_>,
        x: InstrId,
        g: &Grid,
        a: usize,
    ) -> Result<InstrId, SpmdError> {
        let t = g.tiles(a);
        let ld = p.b.dims(x);
        if ld.get(a) != Some(&self.s) {
            return Err(SpmdError::Invalid(
                "assembly of a buffer that is not a tile".into(),
            ));
        }
        let widest = self.groups.iter().map(|g| g.width).max().unwrap_or(0);
        let mut lo_hi = vec![(0, 0); ld.len()];
        lo_hi[a] = (0, widest);
        let padded = if widest > 0 {
            p.b.pad_zero(x, &lo_hi)?
        } else {
            x
        };
        let mut wd = ld.clone();
        wd[a] = self.len;
        let zero = p.b.zero_of(x)?;
        let mut acc = p.b.splat(zero, &wd);
        let zero_s32 = p.b.scalar(PrimitiveType::S32, 0);
        for grp in &self.groups {
            let per_tile = |f: &dyn Fn(&Piece) -> i64, by_source: bool, default: i64| -> Vec<i64> {
                (0..t)
                    .map(|k| {
                        grp.pieces
                            .iter()
                            .find(|q| {
                                if by_source {
                                    q.source == k
                                } else {
                                    q.dest == k
                                }
                            })
                            .map_or(default, f)
                    })
                    .collect()
            };
            // Each source slices its piece's rows (receivers of a local
            // group are their own sources).
            let rows = per_tile(&|q| q.row, !grp.local, 0);
            let rows = p.grids().per_coord(g, a, &rows);
            let mut starts = vec![zero_s32; ld.len()];
            starts[a] = p.b.table(&rows);
            let mut sizes = ld.clone();
            sizes[a] = grp.width;
            let piece = p.b.dynamic_slice(padded, starts, &sizes);
            let piece = if grp.local {
                piece
            } else {
                let mut source = vec![None; t as usize];
                for q in &grp.pieces {
                    source[q.dest as usize] = Some(q.source);
                }
                let pairs = tile_pairs(g, a, &source);
                p.b.collective_permute(piece, &pairs)
            };
            // Placed at its window position: the piece padded by `len` on
            // both sides, the window taken at `len - at`.
            let mut pad = vec![(0, 0); ld.len()];
            pad[a] = (self.len, self.len);
            let wide = p.b.pad_zero(piece, &pad)?;
            let at = per_tile(&|q| q.at, false, self.len);
            let shift: Vec<i64> = at.iter().map(|&v| self.len - v).collect();
            let shift = p.grids().per_coord(g, a, &shift);
            let mut starts = vec![zero_s32; ld.len()];
            starts[a] = p.b.table(&shift);
            let placed = p.b.dynamic_slice(wide, starts, &wd);
            let end: Vec<i64> = (0..t)
                .map(|k| {
                    grp.pieces
                        .iter()
                        .find(|q| q.dest == k)
                        .map_or(self.len, |q| q.at + q.width)
                })
                .collect();
            let at = p.grids().per_coord(g, a, &at);
            let end = p.grids().per_coord(g, a, &end);
            let (at, end) = (p.b.table(&at), p.b.table(&end));
            let iota = p.b.iota(PrimitiveType::S32, &wd, a);
            let atb = p.b.splat(at, &wd);
            let endb = p.b.splat(end, &wd);
            let ge = p.b.compare(iota, atb, "GE");
            let lt = p.b.compare(iota, endb, "LT");
            let mask = p.b.binary(Opcode::And, ge, lt);
            acc = p.b.select(mask, placed, acc);
        }
        Ok(acc)
    }
}

/// Pairs sending, for every device at tile `i` of dim `a` with
/// `source[i] = Some(j)`, from the device at tile `j` with the same other
/// coordinates.
pub fn tile_pairs(g: &Grid, a: usize, source: &[Option<i64>]) -> Vec<(i64, i64)> {
    let mut pairs = Vec::new();
    for d in 0..g.num_devices() {
        let mut c = g.coords(d);
        let Some(Some(j)) = source.get(c[a] as usize) else {
            continue;
        };
        c[a] = *j;
        pairs.push((g.device_at(&c), d));
    }
    pairs.sort_unstable_by_key(|p| p.1);
    pairs
}
