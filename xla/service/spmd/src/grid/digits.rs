//! The digit form of a device array (`DigitForm`): XLA's iota tile assignment
//! read as mixed-radix device ids, each grid dim reading some digits. Grid
//! operations on digit forms cost O(rank), not O(devices).
//!
//! Invariant: a `DigitForm` built by `canon` is canonical (no radix-1 digits,
//! adjacent digits of one dim merged, replication digits sorted major
//! first), so two digit forms are equal exactly when their device arrays
//! are.

use xla_hlo_ir::CollectiveDeviceList;
use xla_hlo_utils::TileArray;

/// A device array in digit form: a device id is a mixed-radix number whose
/// digit `k` (minor first) has radix `radix[k]` and weight `base[k]`; each
/// grid dim (data dims, then replication) reads some digits, major first,
/// as its coordinate. This is XLA's iota tile assignment
/// (`iota(reshape_dims).transpose(perm)`) with the transposed dims grouped
/// per grid dim. Canonical (so `==` is equality of device arrays): no
/// radix-1 digits, two digits that sit next to each other (major `k+1`
/// right before minor `k`) in one dim are merged, replication digits are
/// sorted major first (devices of a group ascending).
// `PartialEq` is written out only to compare short lists inline; it is
// field-wise equality, as the derived `Hash` assumes.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Debug, Eq, Hash)]
pub(crate) struct DigitForm {
    pub(super) radix: Vec<i64>,
    pub(super) base: Vec<i64>,
    pub(super) digs: Vec<Vec<usize>>,
}

/// Element-wise equality of short slices, compared inline: digit forms
/// have a handful of digits, where a call to `memcmp` costs more than the
/// comparison.
pub(super) fn same_short<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

impl PartialEq for DigitForm {
    fn eq(&self, other: &DigitForm) -> bool {
        same_short(&self.radix, &other.radix)
            && same_short(&self.base, &other.base)
            && self.digs.len() == other.digs.len()
            && self
                .digs
                .iter()
                .zip(&other.digs)
                .all(|(a, b)| same_short(a, b))
    }
}

impl DigitForm {
    /// Canonical form of a digit assignment (`None` unless every digit is
    /// read by exactly one list). The last list is the replication dim.
    pub(super) fn canon(radix: Vec<i64>, digs: Vec<Vec<usize>>) -> Option<DigitForm> {
        DigitForm::canon_with(radix, digs, true)
    }

    pub(super) fn canon_with(
        mut radix: Vec<i64>,
        mut digs: Vec<Vec<usize>>,
        sort_last: bool,
    ) -> Option<DigitForm> {
        let m = radix.len();
        let mut seen = vec![false; m];
        for l in &digs {
            for &k in l {
                if k >= m || seen[k] {
                    return None;
                }
                seen[k] = true;
            }
        }
        if seen.iter().any(|s| !s) || radix.iter().any(|&r| r < 1) || digs.is_empty() {
            return None;
        }
        if sort_last {
            if let Some(l) = digs.last_mut() {
                l.sort_unstable_by(|a, b| b.cmp(a));
            }
        }
        fn drop_digit(radix: &mut Vec<i64>, digs: &mut [Vec<usize>], k: usize) {
            radix.remove(k);
            for l in digs.iter_mut() {
                l.retain(|&x| x != k);
                for x in l.iter_mut() {
                    if *x > k {
                        *x -= 1;
                    }
                }
            }
        }
        loop {
            if let Some(k) = (0..radix.len()).find(|&k| radix[k] == 1) {
                drop_digit(&mut radix, &mut digs, k);
                continue;
            }
            let mut hit = None;
            'outer: for l in digs.iter() {
                for w in l.windows(2) {
                    if w[0] == w[1] + 1 {
                        hit = Some(w[1]);
                        break 'outer;
                    }
                }
            }
            let Some(k) = hit else { break };
            radix[k] *= radix[k + 1];
            radix[k + 1] = 1;
            drop_digit(&mut radix, &mut digs, k + 1);
        }
        Some(DigitForm::with(radix, digs))
    }

    pub(super) fn with(radix: Vec<i64>, digs: Vec<Vec<usize>>) -> DigitForm {
        let mut base = Vec::with_capacity(radix.len());
        let mut b = 1i64;
        for &r in &radix {
            base.push(b);
            b = b.saturating_mul(r);
        }
        DigitForm { radix, base, digs }
    }

    /// Everything on `n` devices (one replication digit).
    pub(super) fn replicated(rank: usize, n: i64) -> DigitForm {
        let mut digs = vec![Vec::new(); rank + 1];
        if n > 1 {
            digs[rank].push(0);
            DigitForm::with(vec![n], digs)
        } else {
            DigitForm::with(vec![], digs)
        }
    }

    pub(super) fn dims(&self) -> Vec<i64> {
        self.digs
            .iter()
            .map(|l| l.iter().map(|&k| self.radix[k]).product())
            .collect()
    }

    /// Splits digit `k` into a minor digit `k` of radix `inner` and a major
    /// digit `k + 1` (it must divide).
    pub(super) fn split(&mut self, k: usize, inner: i64) -> bool {
        let r = self.radix[k];
        if inner < 1 || r % inner != 0 {
            return false;
        }
        if inner == 1 || inner == r {
            return true;
        }
        for l in self.digs.iter_mut() {
            let mut out = Vec::with_capacity(l.len() + 1);
            for &x in l.iter() {
                if x == k {
                    out.push(k + 1);
                    out.push(k);
                } else if x > k {
                    out.push(x + 1);
                } else {
                    out.push(x);
                }
            }
            *l = out;
        }
        self.radix[k] = inner;
        self.radix.insert(k + 1, r / inner);
        let (radix, digs) = (
            std::mem::take(&mut self.radix),
            std::mem::take(&mut self.digs),
        );
        *self = DigitForm::with(radix, digs);
        true
    }

    /// Makes `p` a digit boundary (a weight), splitting a digit if needed.
    pub(super) fn refine(&mut self, p: i64) -> bool {
        for k in 0..self.radix.len() {
            let (b, r) = (self.base[k], self.radix[k]);
            if p == b {
                return true;
            }
            if p > b && p < b * r {
                return p % b == 0 && self.split(k, p / b);
            }
        }
        true
    }

    /// Moves the minor factor `f` of list `a` (splitting a digit if needed)
    /// to the front of list `into`.
    pub(super) fn take_minor(&mut self, a: usize, f: i64, into: usize) -> bool {
        let mut need = f;
        while need > 1 {
            let Some(&k) = self.digs[a].last() else {
                return false;
            };
            let r = self.radix[k];
            if need % r == 0 {
                self.digs[a].pop();
                self.digs[into].insert(0, k);
                need /= r;
            } else if r % need == 0 {
                if !self.split(k, need) {
                    return false;
                }
                // Now list `a` ends with [k+1, k]; digit k has radix `need`.
                self.digs[a].pop();
                self.digs[into].insert(0, k);
                need = 1;
            } else {
                return false;
            }
        }
        true
    }

    /// The place value of every digit in the coordinate of dim `a` (0 for
    /// digits it does not read).
    pub(super) fn places(&self, a: usize) -> Vec<i64> {
        let mut pv = vec![0i64; self.radix.len()];
        let mut w = 1i64;
        for &k in self.digs[a].iter().rev() {
            pv[k] = w;
            w *= self.radix[k];
        }
        pv
    }

    pub(super) fn coord(&self, d: i64, a: usize) -> i64 {
        let mut c = 0;
        for &k in &self.digs[a] {
            c = c * self.radix[k] + (d / self.base[k]) % self.radix[k];
        }
        c
    }

    pub(super) fn device(&self, coords: &[i64]) -> i64 {
        let mut d = 0;
        for (l, &c) in self.digs.iter().zip(coords) {
            let mut c = c;
            for &k in l.iter().rev() {
                d += (c % self.radix[k]) * self.base[k];
                c /= self.radix[k];
            }
        }
        d
    }

    /// The devices in row-major order over the grid dims.
    pub(super) fn devices(&self) -> Vec<i64> {
        let m = self.radix.len();
        let order: Vec<usize> = self.digs.iter().flatten().copied().collect();
        let n: i64 = self.radix.iter().product();
        if m == 0 {
            return vec![0];
        }
        let sizes: Vec<i64> = order.iter().map(|&k| self.radix[k]).collect();
        let weights: Vec<i64> = order.iter().map(|&k| self.base[k]).collect();
        let mut out = Vec::with_capacity(n as usize);
        let mut idx = vec![0i64; m];
        let mut v = 0i64;
        for _ in 0..n {
            out.push(v);
            for t in (0..m).rev() {
                idx[t] += 1;
                v += weights[t];
                if idx[t] < sizes[t] {
                    break;
                }
                v -= weights[t] * sizes[t];
                idx[t] = 0;
            }
        }
        out
    }

    /// The digit form of `devs` over `dims`, when it has one.
    pub(super) fn detect(dims: &[i64], devs: &[i64]) -> Option<DigitForm> {
        let n = devs.len() as i64;
        if n == 1 {
            return Some(DigitForm::replicated(dims.len() - 1, 1));
        }
        let t = TileArray::new(vec![n], devs.to_vec()).ok()?;
        let (rd, perm) = t.to_iota()?;
        let s = DigitForm::from_iota(dims, &rd, &perm)?;
        (s.devices() == devs).then_some(s)
    }

    /// Deals the digits `seq` (major first) out to dims of sizes `dims`, in
    /// order: each dim takes whole digits, or the major part of a digit it
    /// needs only part of (the digit is split). The digits left over form
    /// one more list at the end. `None` when a size does not line up.
    pub(super) fn deal(radix: Vec<i64>, seq: Vec<usize>, dims: &[i64]) -> Option<DigitForm> {
        let mut digs = vec![Vec::new(); dims.len()];
        digs.push(seq);
        let mut s = DigitForm::with(radix, digs);
        let rest = dims.len();
        for (a, &want) in dims.iter().enumerate() {
            let mut need = want;
            while need > 1 {
                let &k = s.digs[rest].first()?;
                let r = s.radix[k];
                if need % r == 0 {
                    s.digs[rest].remove(0);
                    s.digs[a].push(k);
                    need /= r;
                } else if r % need == 0 {
                    // Split: the major part (radix `need`) goes to dim a.
                    if !s.split(k, r / need) {
                        return None;
                    }
                    let major = s.digs[rest].remove(0); // k + 1
                    s.digs[a].push(major);
                    need = 1;
                } else {
                    return None;
                }
            }
        }
        Some(s)
    }

    /// The digit form of `iota(rd).transpose(perm)` laid out over `dims`
    /// (data dims then replication), when its dims line up with `dims`.
    pub(super) fn from_iota(dims: &[i64], rd: &[i64], perm: &[i64]) -> Option<DigitForm> {
        let m = rd.len();
        let perm: Vec<usize> = if perm.is_empty() {
            (0..m).collect()
        } else {
            perm.iter().map(|&p| p as usize).collect()
        };
        if perm.len() != m || rd.iter().any(|&r| r < 1) {
            return None;
        }
        let mut seen = vec![false; m];
        for &p in &perm {
            if p >= m || std::mem::replace(&mut seen[p], true) {
                return None;
            }
        }
        if dims.is_empty() || dims.iter().product::<i64>() != rd.iter().product::<i64>() {
            return None;
        }
        // Digits minor first: reshape dim j is digit m-1-j.
        let radix: Vec<i64> = (0..m).map(|k| rd[m - 1 - k]).collect();
        let seq: Vec<usize> = perm.iter().map(|&p| m - 1 - p).collect();
        let mut s = DigitForm::deal(radix, seq, dims)?;
        let tmp = dims.len();
        while let Some(&k) = s.digs[tmp].first() {
            if s.radix[k] != 1 {
                return None;
            }
            s.digs[tmp].remove(0);
            s.digs[dims.len() - 1].push(k);
        }
        s.digs.pop();
        DigitForm::canon(s.radix, s.digs)
    }

    /// Both forms over one digit basis (`None` when their weights do not
    /// form one chain).
    pub(super) fn common(x: &DigitForm, y: &DigitForm) -> Option<(DigitForm, DigitForm)> {
        let (mut x, mut y) = (x.clone(), y.clone());
        for _ in 0..4 {
            if x.radix == y.radix {
                return Some((x, y));
            }
            for p in y.base.clone() {
                if !x.refine(p) {
                    return None;
                }
            }
            for p in x.base.clone() {
                if !y.refine(p) {
                    return None;
                }
            }
        }
        (x.radix == y.radix).then_some((x, y))
    }

    /// Replica groups over the digits of the other coordinates (major
    /// first) then `minor` (the group members), in XLA's shortest iota form.
    pub(super) fn iota_groups(&self, rest: &[usize], minor: &[usize]) -> CollectiveDeviceList {
        let m = self.radix.len();
        let g: i64 = minor.iter().map(|&k| self.radix[k]).product();
        let n: i64 = self.radix.iter().product();
        // Merge digits adjacent in the sequence (major k+1 before minor k).
        let seq: Vec<usize> = rest.iter().chain(minor).copied().collect();
        let s = DigitForm::canon_with(self.radix.clone(), vec![seq], false)
            .unwrap_or_else(|| DigitForm::replicated(0, n));
        let seq = &s.digs[0];
        let m2 = s.radix.len();
        let _ = m;
        let reshape_dims: Vec<i64> = (0..m2).map(|j| s.radix[m2 - 1 - j]).collect();
        let perm: Vec<i64> = seq.iter().map(|&k| (m2 - 1 - k) as i64).collect();
        let identity = perm.iter().enumerate().all(|(i, &p)| i as i64 == p);
        CollectiveDeviceList::Iota {
            num_groups: n / g.max(1),
            group_size: g,
            reshape_dims: if m2 == 0 { vec![1] } else { reshape_dims },
            perm: if identity { vec![] } else { perm },
        }
    }
}
