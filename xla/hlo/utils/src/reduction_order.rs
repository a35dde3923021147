//! The consistent reduction order: how the interpreter combines the
//! elements of a reduction in consistent mode (`--consistent`), and which
//! splits of a reduction across devices reproduce it exactly.
//!
//! The order is a pairwise tree: the result over a range of `n > 1`
//! elements combines the result over its first `ceil(n / 2)` elements with
//! the result over the rest (left operand first); one element is itself.
//! A reduction over several dims takes its elements in row-major order over
//! those dims (a reduce: ascending dim order; a dot: the contracting dims as
//! listed; a convolution: input feature, then the kernel's spatial dims).
//!
//! Decomposability: when `n = T * m` with `T` a power of two, the `T`
//! contiguous ranges of `m` elements are exactly the nodes `log2(T)` levels
//! below the root, so devices that each reduce one range by this order and
//! then combine their `T` results by the same tree, in range order, give
//! the single-device result bit for bit. [`tiles_are_subtrees`] says when a
//! sharding splits a reduction that way.
//!
//! Invariant: the tree's shape depends only on the element count.

/// Elements in the left half of a range of `n`.
pub fn left_count(n: usize) -> usize {
    n.div_ceil(2)
}

/// Folds the `rows = buf.len() / width` rows of `buf` (row-major, `width`
/// columns) by the pairwise tree, column by column, with `combine(left,
/// right)`; the result is in row 0. Rows are overwritten.
pub fn fold_rows_in_place<T: Copy>(buf: &mut [T], width: usize, combine: &impl Fn(T, T) -> T) {
    fn fold<T: Copy>(
        buf: &mut [T],
        lo: usize,
        hi: usize,
        width: usize,
        combine: &impl Fn(T, T) -> T,
    ) {
        if hi - lo <= 1 {
            return;
        }
        let mid = lo + left_count(hi - lo);
        fold(buf, lo, mid, width, combine);
        fold(buf, mid, hi, width, combine);
        let (left, right) = buf.split_at_mut(mid * width);
        for (l, &r) in left[lo * width..(lo + 1) * width]
            .iter_mut()
            .zip(&right[..width])
        {
            *l = combine(*l, r);
        }
    }
    if width == 0 {
        return;
    }
    let rows = buf.len() / width;
    fold(buf, 0, rows, width, combine);
}

/// Folds `items` by the pairwise tree with a fallible `combine(left,
/// right)`; `None` for no items.
pub fn fold_values<T, E>(
    items: Vec<T>,
    combine: &mut impl FnMut(T, T) -> Result<T, E>,
) -> Result<Option<T>, E> {
    fn fold<T, E>(
        mut items: Vec<T>,
        combine: &mut impl FnMut(T, T) -> Result<T, E>,
    ) -> Result<T, E> {
        if items.len() == 1 {
            return Ok(items.pop().expect("one item"));
        }
        let right = items.split_off(left_count(items.len()));
        let left = fold(items, combine)?;
        let right = fold(right, combine)?;
        combine(left, right)
    }
    if items.is_empty() {
        return Ok(None);
    }
    fold(items, combine).map(Some)
}

/// True when splitting a reduction over dims of `sizes` (in the order's
/// row-major order, major first) into `tiles[i]` even tiles along dim `i`
/// gives each device a contiguous range of the elements whose tree is a
/// subtree of the whole reduction's tree, the ranges in row-major tile
/// order: the tile count is a power of two, every split dim divides evenly,
/// the dims before the last split one hold one element per tile, and the
/// dims after it are whole.
pub fn tiles_are_subtrees(sizes: &[i64], tiles: &[i64]) -> bool {
    if sizes.len() != tiles.len() {
        return false;
    }
    let Some(last) = tiles.iter().rposition(|&t| t > 1) else {
        return true;
    };
    let total: i64 = tiles.iter().product();
    let even = sizes.iter().zip(tiles).all(|(&s, &t)| t >= 1 && s % t == 0);
    even && (total as u64).is_power_of_two() && (0..last).all(|i| sizes[i] / tiles[i] == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree as text, to compare orders.
    fn shape(lo: usize, hi: usize) -> String {
        if hi - lo == 1 {
            return lo.to_string();
        }
        let mid = lo + left_count(hi - lo);
        format!("({} {})", shape(lo, mid), shape(mid, hi))
    }

    #[test]
    fn the_tree_splits_left_heavy() {
        assert_eq!(shape(0, 5), "(((0 1) 2) (3 4))");
        assert_eq!(shape(0, 4), "((0 1) (2 3))");
    }

    #[test]
    fn folds_follow_the_tree() {
        let items: Vec<String> = (0..5).map(|i| i.to_string()).collect();
        let folded = fold_values::<_, ()>(items, &mut |a, b| Ok(format!("({a} {b})"))).unwrap();
        assert_eq!(folded.as_deref(), Some(shape(0, 5).as_str()));
        // Rows fold column by column in the same tree: floats of very
        // different magnitudes make any other order visible.
        let column = |c: usize| -> Vec<f32> {
            (0..7)
                .map(|r| ((r * 7 + c * 3) % 5) as f32 * 10f32.powi((r % 4) as i32 * 3 - 4))
                .collect()
        };
        let mut buf: Vec<f32> = column(0)
            .into_iter()
            .zip(column(1))
            .flat_map(|(a, b)| [a, b])
            .collect();
        fold_rows_in_place(&mut buf, 2, &|a: f32, b: f32| a + b);
        for (c, got) in buf[..2].iter().enumerate() {
            let want = fold_values::<_, ()>(column(c), &mut |a, b| Ok(a + b))
                .unwrap()
                .unwrap();
            assert_eq!(got.to_bits(), want.to_bits());
        }
    }

    /// Every accepted split gives ranges whose trees are the nodes of the
    /// whole tree at one level, checked by folding with text.
    #[test]
    fn accepted_splits_are_subtrees() {
        let cases: &[(&[i64], &[i64], bool)] = &[
            (&[8], &[2], true),
            (&[8], &[4], true),
            (&[12], &[4], true),
            (&[6], &[3], false),
            (&[10], &[4], false),
            (&[8, 3], &[2, 1], true),
            (&[8, 3], &[1, 3], false),
            (&[2, 8], &[2, 2], true),
            (&[4, 8], &[2, 2], false),
            (&[1, 8], &[1, 4], true),
            (&[3, 8], &[1, 2], false),
        ];
        for &(sizes, tiles, want) in cases {
            assert_eq!(
                tiles_are_subtrees(sizes, tiles),
                want,
                "{sizes:?} {tiles:?}"
            );
            if !want {
                continue;
            }
            let n: i64 = sizes.iter().product();
            let t: i64 = tiles.iter().product();
            let m = (n / t) as usize;
            let whole = shape(0, n as usize);
            let parts: Vec<String> = (0..t as usize).map(|k| shape(k * m, (k + 1) * m)).collect();
            let combined =
                fold_values::<_, ()>(parts, &mut |a, b| Ok(format!("({a} {b})"))).unwrap();
            assert_eq!(
                combined.as_deref(),
                Some(whole.as_str()),
                "{sizes:?} {tiles:?}"
            );
        }
    }
}
