//! The wait-for graph of deadlock detection: owners are nodes; a parked
//! waiter adds edges from its owner to the owners it waits for. Pure: the
//! caller feeds it the queues and holders.
//!
//! Per key only the direct waits are recorded: the first waiter waits for the
//! holders, every other waiter for the one just ahead of it. A waiter waits
//! for everybody ahead too, but through that chain: every edge recorded is a
//! real wait, and every cycle of the full graph has one through the chains,
//! so cycles are found with O(waiters + holders) edges, not O(waiters²).
//!
//! Many waiters come due at once (a long queue parked together): each check
//! must not walk the whole graph. The strongly connected components are
//! computed once (Tarjan, O(V + E)); a wait lies on a cycle only if both its
//! ends are in one component, and only then is a cycle searched, inside it.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};

/// Owners are numbered as they first appear (nodes), so that edges, the
/// search and the components work on numbers: a check that builds the graph
/// of a long queue hashes and copies each owner once, not at every step.
#[derive(Default, Debug)]
pub struct WaitFor {
    /// node -> owner name
    names: Vec<Vec<u8>>,
    /// owner name -> node
    nodes: HashMap<Vec<u8>, usize>,
    /// node -> (node it waits for, the waiter whose wait it is)
    edges: Vec<Vec<(usize, u64)>>,
    /// waiter id -> its owner's node
    owners: HashMap<u64, usize>,
    /// node -> its strongly connected component, computed on first use.
    components: OnceCell<Vec<usize>>,
}

/// A cycle through a waiter: the waiter to answer (the one on the cycle that
/// started waiting last, the highest id) and the owners around the cycle,
/// starting and ending with that waiter's owner.
#[derive(Debug, PartialEq, Eq)]
pub struct Cycle {
    pub victim: u64,
    pub owners: Vec<Vec<u8>>,
}

impl WaitFor {
    /// Waiter `waiter` of `from` waits for `to` (self-waits are ignored).
    pub fn add(&mut self, waiter: u64, from: &[u8], to: &[u8]) {
        self.components = OnceCell::new();
        let from_node = self.node(from);
        self.owners.entry(waiter).or_insert(from_node);
        if from != to {
            let to_node = self.node(to);
            self.edges[from_node].push((to_node, waiter));
        }
    }

    fn node(&mut self, owner: &[u8]) -> usize {
        if let Some(&n) = self.nodes.get(owner) {
            return n;
        }
        let n = self.names.len();
        self.names.push(owner.to_vec());
        self.nodes.insert(owner.to_vec(), n);
        self.edges.push(Vec::new());
        n
    }

    /// Forgets a waiter's edges (it was answered).
    pub fn remove_waiter(&mut self, waiter: u64) {
        self.components = OnceCell::new();
        if let Some(node) = self.owners.remove(&waiter) {
            self.edges[node].retain(|(_, w)| *w != waiter);
        }
    }

    /// A cycle that one of `waiter`'s own waits is part of, if any.
    pub fn cycle_through(&self, waiter: u64) -> Option<Cycle> {
        let start = *self.owners.get(&waiter)?;
        let comp = self.components.get_or_init(|| self.strong_components());
        let home = comp[start];
        let mut firsts = self.edges[start]
            .iter()
            .filter(|(to, w)| *w == waiter && comp[*to] == home)
            .peekable();
        firsts.peek()?;
        let mut seen = HashSet::new();
        for &(next, _) in firsts {
            // Depth-first search from `next` back to `start`, iteratively.
            let mut path: Vec<(usize, u64)> = vec![(start, waiter)];
            let mut stack: Vec<(usize, u64, usize)> = vec![(next, waiter, path.len())];
            while let Some((node, via, depth)) = stack.pop() {
                path.truncate(depth);
                if node == start {
                    let victim = path.iter().map(|(_, w)| *w).chain([via]).max()?;
                    let mut owners: Vec<Vec<u8>> =
                        path.iter().map(|(n, _)| self.names[*n].clone()).collect();
                    owners.push(self.names[start].clone());
                    let first = &self.names[*self.owners.get(&victim)?];
                    return Some(Cycle {
                        victim,
                        owners: rotate_to(owners, first),
                    });
                }
                if !seen.insert(node) {
                    continue;
                }
                path.push((node, via));
                for &(to, w) in &self.edges[node] {
                    if comp[to] == home {
                        stack.push((to, w, path.len()));
                    }
                }
            }
        }
        None
    }
}

impl WaitFor {
    /// Tarjan's algorithm, iterative: node -> component number.
    fn strong_components(&self) -> Vec<usize> {
        let n = self.names.len();
        let (mut index, mut low, mut comp) = (vec![usize::MAX; n], vec![0; n], vec![usize::MAX; n]);
        let (mut on_stack, mut stack, mut next, mut comps) = (vec![false; n], Vec::new(), 0, 0);
        for root in 0..n {
            if index[root] != usize::MAX {
                continue;
            }
            // (node, next successor to look at)
            let mut work = vec![(root, 0usize)];
            while let Some(&mut (v, ref mut i)) = work.last_mut() {
                if *i == 0 {
                    index[v] = next;
                    low[v] = next;
                    next += 1;
                    stack.push(v);
                    on_stack[v] = true;
                }
                if let Some(&(w, _)) = self.edges[v].get(*i) {
                    *i += 1;
                    if index[w] == usize::MAX {
                        work.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp[w] = comps;
                        if w == v {
                            break;
                        }
                    }
                    comps += 1;
                }
            }
        }
        comp
    }
}

/// `owners` is a closed walk (first == last); starts it at `first`.
fn rotate_to(mut owners: Vec<Vec<u8>>, first: &[u8]) -> Vec<Vec<u8>> {
    owners.pop();
    if let Some(i) = owners.iter().position(|o| o == first) {
        owners.rotate_left(i);
    }
    owners.push(owners[0].clone());
    owners
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &Cycle) -> Vec<String> {
        c.owners
            .iter()
            .map(|o| String::from_utf8_lossy(o).into_owned())
            .collect()
    }

    #[test]
    fn two_owners_waiting_for_each_other() {
        let mut g = WaitFor::default();
        // a holds k1 and waits for k2 (waiter 1); b holds k2 and waits for k1 (waiter 2).
        g.add(1, b"a", b"b");
        g.add(2, b"b", b"a");
        let c = g.cycle_through(1).unwrap();
        assert_eq!(c.victim, 2, "the one that started waiting last");
        assert_eq!(names(&c), ["b", "a", "b"]);
        assert_eq!(g.cycle_through(2).unwrap().victim, 2);
        g.remove_waiter(2);
        assert_eq!(g.cycle_through(1), None);
    }

    #[test]
    fn chains_and_bystanders() {
        let mut g = WaitFor::default();
        // c waits behind d on some key, d waits for a, a waits for c: a cycle of three.
        g.add(5, b"c", b"d");
        g.add(3, b"d", b"a");
        g.add(4, b"a", b"c");
        // e waits for a: on no cycle.
        g.add(9, b"e", b"a");
        assert_eq!(g.cycle_through(9), None);
        let c = g.cycle_through(3).unwrap();
        assert_eq!(c.victim, 5);
        assert_eq!(names(&c), ["c", "d", "a", "c"]);
        // A waiter that only waits for itself is no cycle.
        let mut g = WaitFor::default();
        g.add(1, b"a", b"a");
        assert_eq!(g.cycle_through(1), None);
        // One owner with two waiters: only the wait that closes the cycle counts.
        let mut g = WaitFor::default();
        g.add(1, b"a", b"b");
        g.add(2, b"a", b"z");
        g.add(3, b"b", b"a");
        assert_eq!(g.cycle_through(2), None);
        assert_eq!(g.cycle_through(1).unwrap().victim, 3);
    }

    #[test]
    fn a_long_queue_all_due_at_once_is_checked_in_linear_time() {
        // 50,000 waiters in one queue behind a holder, checked in one tick:
        // walking the chain once per waiter would be 2.5e9 steps.
        let mut g = WaitFor::default();
        let n = 50_000u64;
        g.add(1, b"w1", b"holder");
        for id in 2..=n {
            g.add(
                id,
                format!("w{id}").as_bytes(),
                format!("w{}", id - 1).as_bytes(),
            );
        }
        assert!((1..=n).all(|id| g.cycle_through(id).is_none()));
        // The holder waits for the last of them elsewhere: one big cycle.
        g.add(n + 1, b"holder", format!("w{n}").as_bytes());
        let c = g.cycle_through(n + 1).unwrap();
        assert_eq!(c.victim, n + 1);
        assert_eq!(c.owners.len() as u64, n + 2);
    }
}
