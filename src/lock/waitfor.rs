//! The wait-for graph of deadlock detection: owners are nodes; a parked
//! waiter adds edges from its owner to the owners it waits for. Pure: the
//! caller tells it who waits for whom (`direct_waits`, `grow`).
//!
//! Per key only the direct waits are recorded: the first waiter waits for the
//! holders, every other waiter for the one just ahead of it. A waiter waits
//! for everybody ahead too, but through that chain: every edge recorded is a
//! real wait, and every cycle of the full graph has one through the chains,
//! so cycles are found with O(waiters + holders) edges, not O(waiters²).
//!
//! The graph is built lazily: only the part reachable from the owners of the
//! waiters being checked (`grow`), since a cycle through a waiter's wait lies
//! entirely inside what that wait reaches. Nodes reached are expanded once,
//! so growing from many waiters of one long queue costs the queue once.
//!
//! Many waiters come due at once (a long queue parked together): each check
//! must not walk the whole graph. The strongly connected components are
//! computed once (Tarjan, O(V + E)); a wait lies on a cycle only if both its
//! ends are in one component, and only then is a cycle searched, inside it.
//! Components of a graph closed under reachability are the components of the
//! whole server's graph, so the lazily built part answers exactly.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// The owners a waiter waits for on one key: none if its owner holds the key
/// (a multi-key waiter is granted such a key at once), else the holders if it
/// is first in the queue, else the owner of the waiter just ahead of it.
pub fn direct_waits<'a>(
    owner: &[u8],
    ahead: Option<&'a [u8]>,
    holders: &'a [Vec<u8>],
) -> Vec<&'a [u8]> {
    if holders.iter().any(|h| h.as_slice() == owner) {
        return Vec::new();
    }
    match ahead {
        None => holders.iter().map(Vec::as_slice).collect(),
        Some(ahead) => vec![ahead],
    }
}

/// One parked waiter of an owner and the owners it waits for.
pub type Waits = (u64, Vec<Vec<u8>>);

/// An owner and every one of its parked waits.
pub type OwnerWaits = (Vec<u8>, Vec<Waits>);

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
    /// node -> whether every parked wait of its owner has been added
    expanded: Vec<bool>,
    /// waiter id -> its owner's node and its edges there (`edges[node][range]`)
    waits: HashMap<u64, (usize, Range<usize>)>,
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
    /// Waiter `waiter` of `from` waits for each of `to` (self-waits are
    /// ignored). A waiter's waits are added in one call.
    pub fn add<'a>(&mut self, waiter: u64, from: &[u8], to: impl IntoIterator<Item = &'a [u8]>) {
        let from_node = self.node(from);
        self.add_at(from_node, waiter, from, to);
    }

    fn add_at<'a>(
        &mut self,
        from_node: usize,
        waiter: u64,
        from: &[u8],
        to: impl IntoIterator<Item = &'a [u8]>,
    ) {
        self.components = OnceCell::new();
        let first = self.edges[from_node].len();
        for to in to {
            if to != from {
                let to_node = self.node(to);
                self.edges[from_node].push((to_node, waiter));
            }
        }
        let range = first..self.edges[from_node].len();
        self.waits.entry(waiter).or_insert((from_node, range));
    }

    fn node(&mut self, owner: &[u8]) -> usize {
        if let Some(&n) = self.nodes.get(owner) {
            return n;
        }
        let n = self.names.len();
        self.names.push(owner.to_vec());
        self.nodes.insert(owner.to_vec(), n);
        self.edges.push(Vec::new());
        self.expanded.push(false);
        n
    }

    /// Adds the parked waits of `owner` and of every owner they lead to, as
    /// far as they go. `waits_of(o)` gives every wait of `o`, and may give
    /// those of other owners too (a long queue is read in one go: the owners
    /// ahead that wait nowhere else). Owners described are not asked again.
    pub fn grow(&mut self, owner: &[u8], waits_of: &mut dyn FnMut(&[u8]) -> Vec<OwnerWaits>) {
        let mut todo = vec![self.node(owner)];
        while let Some(n) = todo.pop() {
            if self.expanded[n] {
                continue;
            }
            let name = self.names[n].clone();
            for (described, waits) in waits_of(&name) {
                let from = self.node(&described);
                if std::mem::replace(&mut self.expanded[from], true) {
                    continue;
                }
                for (waiter, to) in waits {
                    let first = self.edges[from].len();
                    self.add_at(from, waiter, &described, to.iter().map(Vec::as_slice));
                    let reached = self.edges[from][first..].iter().map(|(to, _)| *to);
                    todo.extend(reached.filter(|to| !self.expanded[*to]));
                }
            }
            self.expanded[n] = true;
        }
    }

    /// Whether `waiter`'s waits are in the graph (its owner was expanded).
    pub fn has(&self, waiter: u64) -> bool {
        self.waits.contains_key(&waiter)
    }

    /// The strongly connected component `waiter`'s owner is in: a cycle
    /// through any wait lies inside one component.
    pub fn component_of(&self, waiter: u64) -> Option<usize> {
        let (node, _) = self.waits.get(&waiter)?;
        Some(self.components()[*node])
    }

    fn components(&self) -> &[usize] {
        self.components.get_or_init(|| self.strong_components())
    }

    /// A cycle that one of `waiter`'s own waits is part of, if any.
    pub fn cycle_through(&self, waiter: u64) -> Option<Cycle> {
        let (start, range) = self.waits.get(&waiter)?.clone();
        let comp = self.components();
        let home = comp[start];
        let mut firsts = self.edges[start][range]
            .iter()
            .filter(|(to, _)| comp[*to] == home)
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
                    let first = &self.names[self.waits.get(&victim)?.0];
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

    /// Waiter `id` of `from` waits for `to` alone.
    fn wait(g: &mut WaitFor, id: u64, from: &str, to: &str) {
        g.add(id, from.as_bytes(), [to.as_bytes()]);
    }

    /// A server's parked waits by owner, for `grow`; counts the owners asked.
    #[derive(Default)]
    struct Server {
        waits: HashMap<Vec<u8>, Vec<Waits>>,
        asked: usize,
    }

    impl Server {
        fn wait(&mut self, id: u64, from: &str, to: &[&str]) {
            let to = to.iter().map(|t| t.as_bytes().to_vec()).collect();
            self.waits
                .entry(from.as_bytes().to_vec())
                .or_default()
                .push((id, to));
        }

        fn waits_of(&mut self) -> impl FnMut(&[u8]) -> Vec<OwnerWaits> + '_ {
            |owner| {
                self.asked += 1;
                vec![(
                    owner.to_vec(),
                    self.waits.get(owner).cloned().unwrap_or_default(),
                )]
            }
        }
    }

    #[test]
    fn two_owners_waiting_for_each_other() {
        let mut g = WaitFor::default();
        // a holds k1 and waits for k2 (waiter 1); b holds k2 and waits for k1 (waiter 2).
        wait(&mut g, 1, "a", "b");
        wait(&mut g, 2, "b", "a");
        let c = g.cycle_through(1).unwrap();
        assert_eq!(c.victim, 2, "the one that started waiting last");
        assert_eq!(names(&c), ["b", "a", "b"]);
        assert_eq!(g.cycle_through(2).unwrap().victim, 2);
        assert_eq!(g.component_of(1), g.component_of(2));
        assert_eq!(g.component_of(3), None);
    }

    #[test]
    fn chains_and_bystanders() {
        let mut g = WaitFor::default();
        // c waits behind d on some key, d waits for a, a waits for c: a cycle of three.
        wait(&mut g, 5, "c", "d");
        wait(&mut g, 3, "d", "a");
        wait(&mut g, 4, "a", "c");
        // e waits for a: on no cycle.
        wait(&mut g, 9, "e", "a");
        assert_eq!(g.cycle_through(9), None);
        assert_ne!(g.component_of(9), g.component_of(3));
        let c = g.cycle_through(3).unwrap();
        assert_eq!(c.victim, 5);
        assert_eq!(names(&c), ["c", "d", "a", "c"]);
        // A waiter that only waits for itself is no cycle.
        let mut g = WaitFor::default();
        wait(&mut g, 1, "a", "a");
        assert!(g.has(1));
        assert_eq!(g.cycle_through(1), None);
        // One owner with two waiters: only the wait that closes the cycle counts.
        let mut g = WaitFor::default();
        wait(&mut g, 1, "a", "b");
        wait(&mut g, 2, "a", "z");
        wait(&mut g, 3, "b", "a");
        assert_eq!(g.cycle_through(2), None);
        assert_eq!(g.cycle_through(1).unwrap().victim, 3);
    }

    #[test]
    fn direct_waits_follow_the_queue_and_skip_keys_the_owner_holds() {
        let holders = vec![b"h1".to_vec(), b"h2".to_vec()];
        // First in the queue: every holder; behind someone: that one only.
        assert_eq!(direct_waits(b"w", None, &holders), [b"h1", b"h2"]);
        assert_eq!(direct_waits(b"w", Some(b"x"), &holders), [b"x"]);
        // Its owner holds the key (a multi-key waiter): no wait there.
        assert!(direct_waits(b"h2", Some(b"x"), &holders).is_empty());
        assert!(direct_waits(b"h1", None, &holders).is_empty());
        // A free key's first waiter waits for nobody.
        assert!(direct_waits(b"w", None, &[]).is_empty());
    }

    #[test]
    fn grow_builds_only_what_the_waiters_reach() {
        let mut server = Server::default();
        // a -> b -> c -> a through three waiters; x -> y and y -> x elsewhere.
        server.wait(1, "a", &["b"]);
        server.wait(2, "b", &["c", "h"]);
        server.wait(3, "c", &["a"]);
        server.wait(4, "x", &["y"]);
        server.wait(5, "y", &["x"]);
        // d waits for a: growing from d reaches the first cycle, not the other.
        server.wait(6, "d", &["a"]);
        let mut g = WaitFor::default();
        g.grow(b"d", &mut server.waits_of());
        assert!([1, 2, 3, 6].iter().all(|w| g.has(*w)));
        assert!(!g.has(4) && !g.has(5), "x and y are not reached");
        assert_eq!(server.asked, 5, "d, a, b, c and h, once each");
        assert_eq!(g.cycle_through(6), None);
        let c = g.cycle_through(1).unwrap();
        assert_eq!(
            (c.victim, names(&c)),
            (
                3,
                vec!["c", "a", "b", "c"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
        // Growing again from an owner already in the graph asks nobody.
        g.grow(b"b", &mut server.waits_of());
        assert_eq!(server.asked, 5);
        g.grow(b"x", &mut server.waits_of());
        assert_eq!(g.cycle_through(4).unwrap().victim, 5);
        assert_ne!(g.component_of(4), g.component_of(1));
    }

    #[test]
    fn growing_from_the_newest_of_a_long_queue_covers_the_queue_once() {
        // w1 is first behind the holder, every other waiter behind the one
        // before it: the newest one's waits reach all of them.
        let mut server = Server::default();
        let n = 50_000u64;
        server.wait(1, "w1", &["holder"]);
        for id in 2..=n {
            server.wait(id, &format!("w{id}"), &[&format!("w{}", id - 1)]);
        }
        let mut g = WaitFor::default();
        g.grow(format!("w{n}").as_bytes(), &mut server.waits_of());
        assert!((1..=n).all(|id| g.has(id)));
        assert_eq!(server.asked as u64, n + 1);
        assert!((1..=n).all(|id| g.cycle_through(id).is_none()));
    }

    #[test]
    fn owners_described_along_with_another_are_not_asked_again() {
        // Asked for w3, the source also describes w2 and w1 (a queue read in
        // one go): only w3 and the holder are asked.
        let mut asked = Vec::new();
        let mut g = WaitFor::default();
        g.grow(b"w3", &mut |owner| {
            asked.push(owner.to_vec());
            let waits = |id: u64, to: &str| vec![(id, vec![to.as_bytes().to_vec()])];
            match owner {
                b"w3" => vec![
                    (b"w3".to_vec(), waits(3, "w2")),
                    (b"w2".to_vec(), waits(2, "w1")),
                    (b"w1".to_vec(), waits(1, "holder")),
                ],
                _ => vec![(owner.to_vec(), Vec::new())],
            }
        });
        assert_eq!(asked, [b"w3".to_vec(), b"holder".to_vec()]);
        assert!((1..=3).all(|id| g.has(id)));
        assert_eq!(g.cycle_through(1), None);
    }

    #[test]
    fn a_long_queue_all_due_at_once_is_checked_in_linear_time() {
        // 50,000 waiters in one queue behind a holder, checked in one tick:
        // walking the chain once per waiter would be 2.5e9 steps.
        let mut g = WaitFor::default();
        let n = 50_000u64;
        wait(&mut g, 1, "w1", "holder");
        for id in 2..=n {
            wait(&mut g, id, &format!("w{id}"), &format!("w{}", id - 1));
        }
        assert!((1..=n).all(|id| g.cycle_through(id).is_none()));
        // The holder waits for the last of them elsewhere: one big cycle.
        wait(&mut g, n + 1, "holder", &format!("w{n}"));
        let c = g.cycle_through(n + 1).unwrap();
        assert_eq!(c.victim, n + 1);
        assert_eq!(c.owners.len() as u64, n + 2);
    }

    #[test]
    fn many_waits_of_one_owner_are_each_checked_on_their_own_edges() {
        // One owner parked on 20,000 keys held by others: each check looks
        // at its own waiter's edges, not at all of the owner's.
        let mut g = WaitFor::default();
        let n = 20_000u64;
        for id in 1..=n {
            wait(&mut g, id, "many", &format!("h{id}"));
        }
        wait(&mut g, n + 1, "h7", "many");
        assert!((1..=n)
            .filter(|id| *id != 7)
            .all(|id| g.cycle_through(id).is_none()));
        assert_eq!(g.cycle_through(7).unwrap().victim, n + 1);
    }
}
