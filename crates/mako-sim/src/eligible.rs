//! The set of tasks the scheduler may pick from, as a Fenwick tree (binary indexed
//! tree) of 0/1 weights over task indices: insert, remove and "the k-th member in
//! index order" each cost O(log n). The scheduler draws k uniformly below `len()` and
//! picks the k-th member, which is exactly the task the former linear scan picked
//! (the k-th eligible task in spawn order), so a seed's schedule does not depend on
//! how the set is kept.

#[derive(Default)]
pub(crate) struct EligibleSet {
    /// Membership of each task.
    member: Vec<bool>,
    /// Fenwick tree, 1-based: `tree[i]` counts members in `(i - lowbit(i), i]`.
    tree: Vec<u32>,
    len: usize,
}

impl EligibleSet {
    /// Number of members.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Make room for task indices below `n` (none of them members yet).
    pub(crate) fn grow_to(&mut self, n: usize) {
        if n <= self.member.len() {
            return;
        }
        self.member.resize(n, false);
        if n < self.tree.len() {
            return;
        }
        // Rebuild at double the size: amortized O(1) per task.
        let cap = (n * 2).next_power_of_two();
        self.tree = vec![0; cap + 1];
        for i in 0..self.member.len() {
            if self.member[i] {
                self.add(i, 1);
            }
        }
    }

    fn add(&mut self, i: usize, delta: i32) {
        let mut j = i + 1;
        while j < self.tree.len() {
            self.tree[j] = (self.tree[j] as i64 + delta as i64) as u32;
            j += j & j.wrapping_neg();
        }
    }

    /// Make `i` a member or not.
    pub(crate) fn set(&mut self, i: usize, member: bool) {
        self.grow_to(i + 1);
        if self.member[i] == member {
            return;
        }
        self.member[i] = member;
        if member {
            self.len += 1;
            self.add(i, 1);
        } else {
            self.len -= 1;
            self.add(i, -1);
        }
    }

    /// The `k`-th member (0-based) in index order; `k < len()`.
    pub(crate) fn nth(&self, k: usize) -> usize {
        debug_assert!(k < self.len);
        // Descend: find the largest position whose prefix count is <= k.
        let mut pos = 0;
        let mut rest = k as u32;
        let mut step = (self.tree.len() - 1).next_power_of_two();
        while step > 0 {
            let next = pos + step;
            if next < self.tree.len() && self.tree[next] <= rest {
                pos = next;
                rest -= self.tree[next];
            }
            step >>= 1;
        }
        // `pos` members-or-not precede the answer: it is index `pos` (0-based).
        pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    /// Against a plain sorted list, through random inserts, removes and growth.
    #[test]
    fn nth_is_the_kth_member_in_index_order() {
        let mut rng = SimRng::new(11);
        let mut set = EligibleSet::default();
        let mut plain = vec![false; 0];
        for round in 0..20_000u64 {
            let n = 1 + (round / 40) as usize;
            if plain.len() < n {
                plain.resize(n, false);
                set.grow_to(n);
            }
            let i = rng.below(plain.len() as u64) as usize;
            let m = rng.chance(0.5);
            plain[i] = m;
            set.set(i, m);
            let members: Vec<usize> = (0..plain.len()).filter(|&j| plain[j]).collect();
            assert_eq!(set.len(), members.len());
            for (k, want) in members.iter().enumerate() {
                if k % 7 == (round % 7) as usize {
                    assert_eq!(set.nth(k), *want, "k {k} of {members:?}");
                }
            }
        }
    }
}
