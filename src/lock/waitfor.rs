//! The wait-for graph of deadlock detection: owners are nodes; a parked
//! waiter adds edges from its owner to the owners it waits for. Pure: the
//! caller tells it who waits for whom (`direct_waits`, `grow`).
//!
//! Per key only the direct waits are recorded: the first waiter waits for the
//! holders, every other waiter for the one just ahead of it. A waiter waits
//! for everybody ahead too, but through that chain: every edge recorded is a
//! real wait, and every cycle of the full graph has one through the chains,
//! so cycles are found with O(waiters + holders) edges, not O(waiters²).
//! A waiter whose owner holds the key has no wait there (a multi-key waiter
//! is granted such a key at once) and so breaks the chain: the one behind it
//! waits for it and, past it, for the one ahead of it as well (`direct_waits`).
//!
//! The graph is built lazily: only the part reachable from the owners of the
//! waiters being checked (`grow`), since a cycle through a waiter's wait lies
//! entirely inside what that wait reaches. Nodes reached are expanded once,
//! so growing from many waiters of one long queue costs the queue once.
//!
//! A long queue is thousands of nodes per check, so a node costs as little as
//! possible: each owner is interned once (one hash, the name kept once, no
//! other copy), edges are numbers in one flat array (a per-node linked list,
//! no allocation per node or per wait), and a waiter's edges are found by id.
//!
//! A long queue is mostly owners that wait nowhere else ("sole" waiters):
//! each one's only edge is to the one ahead. Such a stretch is contracted
//! (`queue_run`, `Run`): only its front, the member the reader waits for,
//! and members some other wait reaches (their owner holds another key) are
//! nodes, each with one edge to the next such member ahead, standing for
//! the members in between. A member that is no node has only the edge to the
//! one ahead and only the one behind waits for it, so its wait is on a cycle
//! exactly when the nodes around it are in one component; a cycle's message
//! lists the members its edges stand for, and the victim is unchanged (the
//! members skipped are ahead in the queue, lower ids than the edge's own).
//! A member some wait reaches later becomes a node then (`materialize`),
//! splitting the edge that stood for it.
//!
//! Many waiters come due at once (a long queue parked together): each check
//! must not walk the whole graph. The strongly connected components are
//! computed once (Tarjan, O(V + E)); a wait lies on a cycle only if both its
//! ends are in one component, and only then is a cycle searched, inside it.
//! Components of a graph closed under reachability are the components of the
//! whole server's graph, so the lazily built part answers exactly.

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use super::Owner;

/// The owners a waiter waits for on one key, added to `to`; `ahead` are the
/// owners of the waiters ahead of it, nearest first. None if its owner holds
/// the key (a multi-key waiter is granted such a key at once); else the owner
/// of the waiter just ahead of it, and while that one's owner holds the key
/// (it has no wait there to carry the chain on) the owner of the next one
/// ahead too, and so on; the holders if no waiter ahead is left.
pub fn direct_waits<T: PartialEq + Copy>(
    owner: &T,
    ahead: impl IntoIterator<Item = T>,
    holders: &[T],
    to: &mut Vec<T>,
) {
    if holders.contains(owner) {
        return;
    }
    let start = to.len();
    for a in ahead {
        to.push(a);
        if !holders.contains(&a) {
            return;
        }
    }
    // Only waiters of the holders ahead, or none: it waits for the holders.
    to.truncate(start);
    to.extend_from_slice(holders);
}

/// A node: an owner, numbered as it first appears.
pub type Node = u32;

/// No edge (end of a node's list).
const NONE: u32 = u32::MAX;

/// One wait-for edge, in the list of its owner's edges.
#[derive(Debug, Clone, Copy)]
struct Edge {
    to: Node,
    /// The next edge of the same owner, or `NONE`.
    next: u32,
    /// The waiter whose wait it is.
    waiter: u64,
}

/// Waiter ids are the server's own counter, not client input: hashed by a
/// multiply, not SipHash.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = (id ^ (id >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type ById<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Where a waiter's waits are.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Its owner's node and its edges (`edges[start..end]`).
    Edges(Node, u32, u32),
    /// A member of a run (`runs[run].members[position]`) that is no node.
    InRun(u32, u32),
}

/// A run of waiters in one queue, nearest the waiter that read it first (the
/// highest id) to the front; each one's owner waits nowhere else, for the
/// one ahead of it (ids fall towards the front: a queue is in id order).
/// Only some members are nodes: the front (whose edges are its real waits),
/// the one the reader waits for, and any whose owner another wait reaches
/// (it holds another key). A member that is a node has one edge, to the next
/// member ahead that is a node: it stands for the stretch in between, whose
/// owners are listed only in a cycle's message.
#[derive(Debug)]
struct Run {
    members: Vec<Ahead>,
    /// position -> node, for the members that are nodes (the front always)
    nodes: BTreeMap<u32, Node>,
}

/// Owners are numbered as they first appear (nodes), so that edges, the
/// search and the components work on numbers: a check that builds the graph
/// of a long queue hashes and copies each owner once, not at every step.
#[derive(Default, Debug)]
pub struct WaitFor {
    /// node -> owner name
    names: Vec<Owner>,
    /// owner name -> node
    nodes: HashMap<Owner, Node>,
    /// node -> its first edge (`edges` index), or `NONE`
    first: Vec<u32>,
    /// every edge; a waiter's edges are contiguous
    edges: Vec<Edge>,
    /// node -> whether every parked wait of its owner has been added
    expanded: Vec<bool>,
    /// waiter id -> where its waits are
    waits: ById<Wait>,
    /// Runs of a queue's waiters whose owners wait nowhere else, contracted
    /// (`queue_run`).
    runs: Vec<Run>,
    /// node -> (run, position) if it is a run's member made a node
    run_node: HashMap<Node, (u32, u32), BuildHasherDefault<IdHasher>>,
    /// Nodes reached and not expanded yet (`grow`).
    pending: Vec<Node>,
    /// node -> its strongly connected component, computed on first use.
    components: OnceCell<Vec<u32>>,
}

/// A cycle through a waiter: the waiter to answer (the one on the cycle that
/// started waiting last, the highest id) and the owners around the cycle,
/// starting and ending with that waiter's owner.
#[derive(Debug, PartialEq, Eq)]
pub struct Cycle {
    pub victim: u64,
    pub owners: Vec<Owner>,
}

impl WaitFor {
    /// Waiter `waiter` of `from` waits for each of `to` (self-waits are
    /// ignored). A waiter's waits are added in one call.
    pub fn add<'a>(&mut self, waiter: u64, from: &[u8], to: impl IntoIterator<Item = &'a [u8]>) {
        let from = self.node(from);
        let to: Vec<Node> = to.into_iter().map(|t| self.node(t)).collect();
        let pending = self.pending.len();
        self.wait(from, waiter, &to);
        self.pending.truncate(pending);
    }

    /// The node of `owner`, numbered now if it is new.
    pub fn node(&mut self, owner: &[u8]) -> Node {
        if let Some(&n) = self.nodes.get(owner) {
            return n;
        }
        let n = self.names.len() as Node;
        let owner = Owner::new(owner);
        self.names.push(owner.clone());
        self.nodes.insert(owner, n);
        self.first.push(NONE);
        self.expanded.push(false);
        n
    }

    /// The owner of a node.
    pub fn name(&self, node: Node) -> &Owner {
        &self.names[node as usize]
    }

    /// Starts describing `node`'s waits: false if they were described
    /// already (then they must not be added again). The caller adds every
    /// parked wait of its owner (`wait`) before the graph is used.
    pub fn describe(&mut self, node: Node) -> bool {
        !std::mem::replace(&mut self.expanded[node as usize], true)
    }

    /// Waiter `waiter` of `from` waits for each of `to` (self-waits are
    /// ignored); the nodes it reaches are expanded next by `grow`. A
    /// waiter's waits are added in one call.
    pub fn wait(&mut self, from: Node, waiter: u64, to: &[Node]) {
        self.components = OnceCell::new();
        let start = self.edges.len() as u32;
        for &to in to {
            if to != from {
                let next =
                    std::mem::replace(&mut self.first[from as usize], self.edges.len() as u32);
                self.edges.push(Edge { to, next, waiter });
                if !self.expanded[to as usize] {
                    self.pending.push(to);
                }
            }
        }
        let end = self.edges.len() as u32;
        self.waits
            .entry(waiter)
            .and_modify(|w| {
                if let Wait::InRun(..) = w {
                    *w = Wait::Edges(from, start, end);
                }
            })
            .or_insert(Wait::Edges(from, start, end));
    }

    /// Adds the parked waits of `owner` and of every owner they lead to, as
    /// far as they go. `expand(graph, node)` must `describe` the node and
    /// add every wait of its owner; it may describe other owners too (a long
    /// queue is read in one go: the owners ahead that wait nowhere else).
    /// Owners described are not expanded again.
    pub fn grow(&mut self, owner: &[u8], expand: &mut dyn FnMut(&mut WaitFor, Node)) {
        let start = self.node(owner);
        self.pending.push(start);
        while let Some(n) = self.pending.pop() {
            if !self.expanded[n as usize] {
                expand(self, n);
                self.expanded[n as usize] = true;
            }
        }
    }

    /// Whether `waiter`'s waits are in the graph (its owner was expanded).
    pub fn has(&self, waiter: u64) -> bool {
        self.waits.contains_key(&waiter)
    }

    /// Nodes in the graph.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The strongly connected component `waiter`'s owner is in: a cycle
    /// through any wait lies inside one component. None if the waiter is not
    /// in the graph, or is a run's member that is no node and on no cycle
    /// (its owner is alone in its component).
    pub fn component_of(&self, waiter: u64) -> Option<u32> {
        let comp = self.components();
        match *self.waits.get(&waiter)? {
            Wait::Edges(node, ..) => Some(comp[node as usize]),
            // A member that is no node is in the component of the members
            // around it that are nodes if they are in one (on a cycle).
            Wait::InRun(run, at) => {
                let (above, below) = self.run_neighbours(run, at)?;
                let home = comp[below as usize];
                (comp[above? as usize] == home).then_some(home)
            }
        }
    }

    fn components(&self) -> &[u32] {
        self.components.get_or_init(|| self.strong_components())
    }

    /// The edges of `node`, newest first.
    fn edges_of(&self, node: Node) -> impl Iterator<Item = &Edge> {
        let mut at = self.first[node as usize];
        std::iter::from_fn(move || {
            let e = self.edges.get(at as usize)?;
            at = e.next;
            Some(e)
        })
    }

    /// A cycle that one of `waiter`'s own waits is part of, if any.
    pub fn cycle_through(&self, waiter: u64) -> Option<Cycle> {
        let comp = self.components();
        match *self.waits.get(&waiter)? {
            Wait::Edges(start, from, to) => {
                let home = comp[start as usize];
                let firsts = self.edges[from as usize..to as usize]
                    .iter()
                    .filter(|e| comp[e.to as usize] == home)
                    .map(|e| (e.to, waiter));
                // start -> ... -> start
                let mut walk = vec![(start, waiter)];
                walk.extend(self.path(firsts, start, home)?);
                self.cycle(&walk, None)
            }
            Wait::InRun(run, at) => {
                // Its wait is on a cycle if the member ahead that is a node
                // reaches the one behind it that is a node.
                let (above, below) = self.run_neighbours(run, at)?;
                let above = above?;
                let home = comp[below as usize];
                if comp[above as usize] != home {
                    return None;
                }
                // below -> ... -> above, then above -> (it) -> below.
                let walk = self.path([(below, waiter)].into_iter(), above, home)?;
                self.cycle(&walk, Some((run, at)))
            }
        }
    }

    /// A path from one of `firsts` (node, via) to `target` inside component
    /// `home`: each node with the waiter whose wait led to it.
    fn path(
        &self,
        firsts: impl Iterator<Item = (Node, u64)>,
        target: Node,
        home: u32,
    ) -> Option<Vec<(Node, u64)>> {
        let comp = self.components();
        let mut seen = HashSet::new();
        for first in firsts {
            // Depth-first, iteratively.
            let mut path: Vec<(Node, u64)> = Vec::new();
            let mut stack: Vec<(Node, u64, usize)> = vec![(first.0, first.1, 0)];
            while let Some((node, via, depth)) = stack.pop() {
                path.truncate(depth);
                if node == target {
                    path.push((node, via));
                    return Some(path);
                }
                if !seen.insert(node) {
                    continue;
                }
                path.push((node, via));
                for e in self.edges_of(node) {
                    if comp[e.to as usize] == home {
                        stack.push((e.to, e.waiter, path.len()));
                    }
                }
            }
        }
        None
    }

    /// The cycle of a closed walk of nodes (first == last, each with the
    /// waiter whose wait led to it), with the owners of the runs' members
    /// its edges stand for. `member`: the walk's last node also leads, by
    /// its run, to this member that is no node, which leads to the first.
    fn cycle(&self, walk: &[(Node, u64)], member: Option<(u32, u32)>) -> Option<Cycle> {
        let mut owners: Vec<Owner> = Vec::new();
        let mut victim = 0;
        for pair in walk.windows(2) {
            let ((from, _), (to, via)) = (pair[0], pair[1]);
            owners.push(self.name(from).clone());
            owners.extend(self.stretch(from, to).cloned());
            victim = victim.max(via);
        }
        let &(last, first_via) = walk.last()?;
        if let Some((run, at)) = member {
            // last -> members up to it -> it -> members up to the first.
            owners.push(self.name(last).clone());
            let members = &self.runs[run as usize].members;
            let from = self.run_node.get(&last)?.1 as usize;
            owners.extend(
                members[from + 1..=at as usize]
                    .iter()
                    .map(|m| m.owner.clone()),
            );
            owners.extend(self.stretch_from(run, at, walk[0].0).cloned());
            victim = victim.max(members[from].id).max(first_via);
        } else {
            victim = victim.max(walk[0].1);
        }
        owners.push(self.name(walk[0].0).clone());
        let Wait::Edges(node, ..) = *self.waits.get(&victim)? else {
            return None;
        };
        Some(Cycle {
            victim,
            owners: rotate_to(owners, self.name(node)),
        })
    }

    /// The owners of the members an edge `from -> to` between two members
    /// of a run that are nodes stands for (none for any other edge).
    fn stretch(&self, from: Node, to: Node) -> impl Iterator<Item = &Owner> {
        // A slice, empty for other edges (not an `Option` of a range: its
        // iterator compiled to a compare of the absent range, which valgrind
        // reports as a jump on uninitialised memory).
        let members = match (self.run_node.get(&from), self.run_node.get(&to)) {
            (Some(&(run, a)), Some(&(run_to, b))) if run == run_to && b > a => {
                &self.runs[run as usize].members[a as usize + 1..b as usize]
            }
            _ => &[],
        };
        members.iter().map(|m| &m.owner)
    }

    /// The owners of the members after position `at` of `run`, up to node
    /// `to` (the member that is a node next ahead).
    fn stretch_from(&self, run: u32, at: u32, to: Node) -> impl Iterator<Item = &Owner> {
        let end = self
            .run_node
            .get(&to)
            .map_or(at as usize + 1, |&(_, b)| b as usize);
        self.runs[run as usize].members[at as usize + 1..end]
            .iter()
            .map(|m| &m.owner)
    }

    /// The members of `run` next to position `at` that are nodes: the one
    /// behind it (if any) and the one ahead (the front at the latest).
    /// (The front is always a node, after any member that is not.)
    fn run_neighbours(&self, run: u32, at: u32) -> Option<(Option<Node>, Node)> {
        let nodes = &self.runs.get(run as usize)?.nodes;
        let above = nodes.range(..at).next_back().map(|(_, n)| *n);
        let below = nodes.range(at + 1..).next().map(|(_, n)| *n)?;
        Some((above, below))
    }
}

/// A waiter ahead in a queue, as deadlock detection reads it.
#[derive(Debug, Clone)]
pub struct Ahead {
    pub id: u64,
    pub owner: Owner,
    /// Its owner's only parked wait is this one, on this key alone: the
    /// waiter ahead of it is all it waits for there.
    pub sole: bool,
}

impl WaitFor {
    /// The waits of a waiter's owner `from` (waiter `id`) on one key, whose
    /// holders are `holders` and where `ahead` are the waiters ahead of it,
    /// nearest first: added to `to` (see `direct_waits`). Returns whether
    /// its owner holds the key (it has no wait there).
    pub fn waits_on_key(
        &mut self,
        from: Node,
        ahead: &[Ahead],
        holders: &[Node],
        to: &mut Vec<Node>,
    ) -> bool {
        let ahead = ahead.iter().map(|a| self.node(&a.owner));
        direct_waits(&from, ahead, holders, to);
        holders.contains(&from)
    }

    /// Describes the owners of the sole waiters at the front of `ahead`
    /// (the waiters ahead of one waiter in a queue, nearest first, as far as
    /// the first that is not sole, and past it if its owner holds the key):
    /// each waits for the next one, the last as `direct_waits` says. They
    /// become one `Run`: only its front is made
    /// a node now, with its real waits; the nearest is the reader's own
    /// target and is made a node when expanded (`materialize`). The run
    /// stops before a waiter already in the graph and before one whose owner
    /// holds the key (those are expanded on their own).
    pub fn queue_run(&mut self, mut ahead: Vec<Ahead>, holders: &[Node]) {
        let holds = |g: &WaitFor, a: &Ahead| holders.iter().any(|h| g.name(*h)[..] == a.owner[..]);
        let mut len = 0;
        while let Some(a) = ahead.get(len) {
            if !a.sole || self.waits.contains_key(&a.id) || holds(self, a) {
                break;
            }
            len += 1;
        }
        if len == 0 {
            return;
        }
        let front = len - 1;
        let front_node = self.node(&ahead[front].owner);
        let mut to = Vec::new();
        let beyond = ahead[len..].iter().map(|b| self.node(&b.owner));
        direct_waits(&front_node, beyond, holders, &mut to);
        ahead.truncate(len);
        let run = self.runs.len() as u32;
        self.waits.reserve(len);
        for (at, a) in ahead[..front].iter().enumerate() {
            self.waits.insert(a.id, Wait::InRun(run, at as u32));
        }
        let front_id = ahead[front].id;
        self.runs.push(Run {
            members: ahead,
            nodes: BTreeMap::from([(front as u32, front_node)]),
        });
        self.run_node.insert(front_node, (run, front as u32));
        self.describe(front_node);
        self.wait(front_node, front_id, &to);
    }

    /// Makes the member waiter `id` of a run a node, `node` (expanded now:
    /// its owner's only wait is that one): its edge goes to the member
    /// ahead that is a node, and the one behind that is a node now leads to
    /// it. False if `id` is no such member (then expand as usual).
    pub fn materialize(&mut self, node: Node, id: u64) -> bool {
        let Some(&Wait::InRun(run, at)) = self.waits.get(&id) else {
            return false;
        };
        let Some((above, below)) = self.run_neighbours(run, at) else {
            return false;
        };
        if let Some(above) = above {
            let above_id = self.runs[run as usize].members[self.run_node[&above].1 as usize].id;
            if let Some(&Wait::Edges(_, first, _)) = self.waits.get(&above_id) {
                self.edges[first as usize].to = node;
            }
        }
        self.runs[run as usize].nodes.insert(at, node);
        self.run_node.insert(node, (run, at));
        self.wait(node, id, &[below]);
        true
    }
}

impl WaitFor {
    /// Tarjan's algorithm, iterative: node -> component number.
    fn strong_components(&self) -> Vec<u32> {
        let n = self.names.len();
        const UNSEEN: u32 = u32::MAX;
        let (mut index, mut low, mut comp) = (vec![UNSEEN; n], vec![0u32; n], vec![UNSEEN; n]);
        let (mut on_stack, mut stack, mut next, mut comps) =
            (vec![false; n], Vec::new(), 0u32, 0u32);
        // (node, next edge to look at)
        let mut work: Vec<(Node, u32)> = Vec::new();
        macro_rules! visit {
            ($v:expr) => {{
                let v: Node = $v;
                index[v as usize] = next;
                low[v as usize] = next;
                next += 1;
                stack.push(v);
                on_stack[v as usize] = true;
                work.push((v, self.first[v as usize]));
            }};
        }
        for root in 0..n as Node {
            if index[root as usize] != UNSEEN {
                continue;
            }
            visit!(root);
            while let Some(&mut (v, ref mut at)) = work.last_mut() {
                let vi = v as usize;
                if let Some(e) = self.edges.get(*at as usize) {
                    *at = e.next;
                    let w = e.to as usize;
                    if index[w] == UNSEEN {
                        visit!(e.to);
                    } else if on_stack[w] {
                        low[vi] = low[vi].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    low[parent as usize] = low[parent as usize].min(low[vi]);
                }
                if low[vi] == index[vi] {
                    while let Some(w) = stack.pop() {
                        on_stack[w as usize] = false;
                        comp[w as usize] = comps;
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
fn rotate_to(mut owners: Vec<Owner>, first: &Owner) -> Vec<Owner> {
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

    /// One parked waiter and the owners it waits for.
    type Waits = (u64, Vec<Vec<u8>>);

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

        fn expand(&mut self) -> impl FnMut(&mut WaitFor, Node) + '_ {
            |g, node| {
                self.asked += 1;
                assert!(g.describe(node));
                let owner = g.name(node).to_vec();
                for (id, to) in self.waits.get(&owner).into_iter().flatten() {
                    let to: Vec<Node> = to.iter().map(|t| g.node(t)).collect();
                    g.wait(node, *id, &to);
                }
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
        let holders = ["h1", "h2"];
        let waits = |owner, ahead: &[&'static str], holders: &[&'static str]| {
            let mut to = vec!["other key"];
            direct_waits(&owner, ahead.iter().copied(), holders, &mut to);
            to.split_off(1)
        };
        // First in the queue: every holder; behind someone: that one only.
        assert_eq!(waits("w", &[], &holders), ["h1", "h2"]);
        assert_eq!(waits("w", &["x", "y"], &holders), ["x"]);
        // Its owner holds the key (a multi-key waiter): no wait there.
        assert!(waits("h2", &["x"], &holders).is_empty());
        assert!(waits("h1", &[], &holders).is_empty());
        // A free key's first waiter waits for nobody.
        assert!(waits("w", &[], &[]).is_empty());
        // Behind a waiter whose owner holds the key (it has no wait there):
        // that owner and the next one ahead, or the holders at the front.
        assert_eq!(waits("w", &["h1", "x", "y"], &holders), ["h1", "x"]);
        assert_eq!(waits("w", &["h1", "h1", "x"], &holders), ["h1", "h1", "x"]);
        assert_eq!(waits("w", &["h2", "h1"], &holders), ["h1", "h2"]);
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
        g.grow(b"d", &mut server.expand());
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
        g.grow(b"b", &mut server.expand());
        assert_eq!(server.asked, 5);
        g.grow(b"x", &mut server.expand());
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
        g.grow(format!("w{n}").as_bytes(), &mut server.expand());
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
        g.grow(b"w3", &mut |g, node| {
            asked.push(g.name(node).to_vec());
            assert!(g.describe(node));
            if g.name(node)[..] == b"w3"[..] {
                let [w1, w2, holder] = ["w1", "w2", "holder"].map(|o| g.node(o.as_bytes()));
                g.wait(node, 3, &[w2]);
                for (from, id, to) in [(w2, 2, w1), (w1, 1, holder)] {
                    assert!(g.describe(from));
                    g.wait(from, id, &[to]);
                }
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

    /// A key's holders and its waiters in order.
    type Queue = (Vec<&'static str>, Vec<(u64, &'static str)>);

    /// Lock queues as deadlock detection reads them: key -> (holders,
    /// waiters in order), and each owner's parked waits (id, keys).
    #[derive(Default)]
    struct Queues {
        keys: HashMap<&'static str, Queue>,
        waits: HashMap<&'static str, Vec<(u64, Vec<&'static str>)>>,
        asked: Vec<String>,
        /// Run members made nodes when expanded.
        made_nodes: Vec<String>,
    }

    impl Queues {
        fn hold(&mut self, key: &'static str, owner: &'static str) {
            self.keys.entry(key).or_default().0.push(owner);
        }

        fn park(&mut self, id: u64, owner: &'static str, keys: &[&'static str]) {
            for key in keys {
                self.keys.entry(key).or_default().1.push((id, owner));
            }
            self.waits
                .entry(owner)
                .or_default()
                .push((id, keys.to_vec()));
        }

        fn sole(&self, id: u64, owner: &str) -> bool {
            matches!(self.waits.get(owner).map(Vec::as_slice), Some([(only, keys)]) if *only == id && keys.len() == 1)
        }

        /// What `deadlock::expand` does, on these queues.
        fn expand(&mut self) -> impl FnMut(&mut WaitFor, Node) + '_ {
            |g, node| {
                assert!(g.describe(node));
                let owner = String::from_utf8(g.name(node).to_vec()).unwrap();
                if let Some([(id, _)]) = self.waits.get(owner.as_str()).map(Vec::as_slice) {
                    if self.sole(*id, &owner) && g.materialize(node, *id) {
                        self.made_nodes.push(owner);
                        return;
                    }
                }
                self.asked.push(owner.clone());
                for (id, keys) in self.waits.get(owner.as_str()).cloned().unwrap_or_default() {
                    let mut to = Vec::new();
                    let mut runs = Vec::new();
                    for key in keys {
                        let (holders, queue) = &self.keys[key];
                        let holders: Vec<Node> =
                            holders.iter().map(|h| g.node(h.as_bytes())).collect();
                        let at = queue.iter().position(|(w, _)| *w == id).unwrap();
                        let mut ahead = Vec::new();
                        for &(id, owner) in queue[..at].iter().rev() {
                            let sole = self.sole(id, owner);
                            ahead.push(Ahead {
                                id,
                                owner: Owner::new(owner.as_bytes()),
                                sole,
                            });
                            // As `deadlock::expand` reads on past a waiter
                            // whose owner holds the key.
                            if !sole && !self.keys[key].0.contains(&owner) {
                                break;
                            }
                        }
                        g.waits_on_key(node, &ahead, &holders, &mut to);
                        runs.push((ahead, holders));
                    }
                    g.wait(node, id, &to);
                    for (ahead, holders) in runs {
                        g.queue_run(ahead, &holders);
                    }
                }
            }
        }
    }

    fn strings(owners: &[&str]) -> Vec<String> {
        owners.iter().map(|o| o.to_string()).collect()
    }

    #[test]
    fn a_queue_of_owners_waiting_nowhere_else_is_read_in_one_go() {
        let mut q = Queues::default();
        q.hold("k", "h");
        for (id, owner) in [(1, "w1"), (2, "w2"), (3, "w3"), (4, "w4"), (5, "w5")] {
            q.park(id, owner, &["k"]);
        }
        let mut g = WaitFor::default();
        g.grow(b"w5", &mut q.expand());
        // w5 is asked, then the holder; w4..w1 come with w5's queue.
        assert_eq!(q.asked, ["w5", "h"]);
        // Nodes: w5, the holder, and of the run w4 (w5's target) and w1
        // (its front); w4 stands for w3 and w2.
        assert_eq!(q.made_nodes, ["w4"]);
        assert_eq!(g.len(), 4);
        assert!((1..=5).all(|id| g.has(id) && g.cycle_through(id).is_none()));
        // Each waits for the one just ahead, the first for the holder.
        let first = g.node(b"w1");
        let h = g.node(b"h");
        assert_eq!(
            g.edges_of(first)
                .map(|e| (e.to, e.waiter))
                .collect::<Vec<_>>(),
            [(h, 1)]
        );
    }

    #[test]
    fn a_cycle_through_an_owner_read_along_with_a_queue() {
        // w3, read with w5's queue, also holds "l", which the holder of "k"
        // waits for: h -> w3 -> w2 -> w1 -> h. w4 and w5 wait on it, on
        // no cycle.
        let mut q = Queues::default();
        q.hold("k", "h");
        q.hold("l", "w3");
        for (id, owner) in [(1, "w1"), (2, "w2"), (3, "w3"), (4, "w4"), (5, "w5")] {
            q.park(id, owner, &["k"]);
        }
        q.park(10, "h", &["l"]);
        let mut g = WaitFor::default();
        g.grow(b"w5", &mut q.expand());
        assert_eq!(q.asked, ["w5", "h"], "w3 is not read again");
        assert_eq!(q.made_nodes, ["w3", "w4"]);
        assert_eq!(g.cycle_through(5), None);
        assert_eq!(g.cycle_through(4), None);
        let cycle = ["h", "w3", "w2", "w1", "h"];
        for id in [3, 2, 1, 10] {
            let c = g.cycle_through(id).unwrap();
            assert_eq!((c.victim, names(&c)), (10, strings(&cycle)), "waiter {id}");
        }
        assert_ne!(g.component_of(4), g.component_of(3));
        // The same, growing from the holder first: w3's queue is then read
        // from w3 (the first owner met), and w5's later from w5.
        let mut q2 = Queues::default();
        std::mem::swap(&mut q2.keys, &mut q.keys);
        std::mem::swap(&mut q2.waits, &mut q.waits);
        let mut g = WaitFor::default();
        g.grow(b"h", &mut q2.expand());
        assert_eq!(q2.asked, ["h", "w3"]);
        assert!(!g.has(4) && !g.has(5));
        g.grow(b"w5", &mut q2.expand());
        assert!(g.has(4) && g.has(5));
        assert_eq!(g.cycle_through(5), None);
        let c = g.cycle_through(2).unwrap();
        assert_eq!((c.victim, names(&c)), (10, strings(&cycle)));
    }

    #[test]
    fn a_multi_key_waiter_ends_a_queue_read_and_has_no_wait_on_a_key_it_holds() {
        // m waits for "k" (behind w1) and "l", which it holds: its only wait
        // is for w1. w2 and w3 are read with w3's queue up to m, which is
        // asked on its own; m -> w1 -> h and h waits for w3: a cycle.
        let mut q = Queues::default();
        q.hold("k", "h");
        q.hold("l", "m");
        q.park(1, "w1", &["k"]);
        q.park(2, "m", &["k", "l"]);
        q.park(3, "w2", &["k"]);
        q.park(4, "w3", &["k"]);
        q.park(5, "h", &["x"]);
        q.hold("x", "w3");
        let mut g = WaitFor::default();
        g.grow(b"w3", &mut q.expand());
        assert_eq!(q.asked, ["w3", "m", "h"], "w1 comes with m's queue");
        let c = g.cycle_through(4).unwrap();
        assert_eq!(
            (c.victim, names(&c)),
            (5, strings(&["h", "w3", "w2", "m", "w1", "h"]))
        );
    }

    /// The graph of every direct wait of `q`, built whole (the reference the
    /// randomized checks compare with), and which waiters each owner-to-owner
    /// edge stands for.
    fn whole_graph(q: &Queues) -> (WaitFor, HashMap<(String, String), Vec<u64>>) {
        let mut whole = WaitFor::default();
        let mut edges: HashMap<(String, String), Vec<u64>> = HashMap::new();
        for (owner, waits) in &q.waits {
            for (id, keys) in waits {
                let mut to = Vec::new();
                for key in keys {
                    let (holders, queue) = &q.keys[key];
                    let at = queue.iter().position(|(w, _)| w == id).unwrap();
                    let ahead = queue[..at].iter().rev().map(|(_, o)| *o);
                    direct_waits(owner, ahead, holders, &mut to);
                }
                for t in &to {
                    edges
                        .entry((owner.to_string(), t.to_string()))
                        .or_default()
                        .push(*id);
                }
                whole.add(*id, owner.as_bytes(), to.iter().map(|t| t.as_bytes()));
            }
        }
        (whole, edges)
    }

    /// Every parked waiter of `q` with its owner, oldest first.
    fn waiter_ids(q: &Queues) -> Vec<(u64, &'static str)> {
        let mut ids: Vec<(u64, &str)> = q
            .waits
            .iter()
            .flat_map(|(o, ws)| ws.iter().map(move |(id, _)| (*id, *o)))
            .collect();
        ids.sort();
        ids
    }

    /// A tiny deterministic generator for the randomized check.
    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn contracted_runs_answer_as_the_whole_graph_does() {
        // Random servers: a few keys with holders and queues, owners parked
        // on one or two keys. Every waiter's answer from the graph grown
        // with runs contracted matches the graph of every direct wait, and
        // every cycle reported is one of its real waits around.
        let owners: Vec<&'static str> = (0..30)
            .map(|i| &*Box::leak(format!("o{i}").into_boxed_str()))
            .collect();
        const KEYS: [&str; 4] = ["k1", "k2", "k3", "k4"];
        for seed in 0..1500u64 {
            let mut rnd = seed;
            let mut q = Queues::default();
            for key in KEYS {
                for _ in 0..lcg(&mut rnd) % 3 {
                    let h = owners[(lcg(&mut rnd) % 30) as usize];
                    if !q.keys.get(key).is_some_and(|k| k.0.contains(&h)) {
                        q.hold(key, h);
                    }
                }
            }
            for id in 1..=(4 + lcg(&mut rnd) % 36) {
                let owner = owners[(lcg(&mut rnd) % 30) as usize];
                let k1 = KEYS[(lcg(&mut rnd) % 4) as usize];
                let k2 = KEYS[(lcg(&mut rnd) % 4) as usize];
                let keys: Vec<&str> = if lcg(&mut rnd).is_multiple_of(6) && k1 != k2 {
                    vec![k1, k2]
                } else {
                    vec![k1]
                };
                // One owner's waiters are on distinct keys.
                let busy = q.waits.get(owner).into_iter().flatten();
                if busy.flat_map(|(_, ks)| ks).any(|k| keys.contains(k)) {
                    continue;
                }
                q.park(id, owner, &keys);
            }
            let (whole, edges) = whole_graph(&q);
            // Grown lazily, newest first, as a slice does.
            let ids = waiter_ids(&q);
            let mut g = WaitFor::default();
            for &(id, owner) in ids.iter().rev() {
                if !g.has(id) {
                    g.grow(owner.as_bytes(), &mut q.expand());
                }
            }
            for &(id, owner) in &ids {
                assert!(g.has(id));
                let want = whole.cycle_through(id);
                let got = g.cycle_through(id);
                assert_eq!(got.is_some(), want.is_some(), "seed {seed} waiter {id}");
                let Some(c) = got else { continue };
                let names = names(&c);
                assert_eq!(names.first(), names.last());
                assert!(names.iter().any(|n| n == owner), "seed {seed}: {names:?}");
                let distinct: HashSet<&String> = names[1..].iter().collect();
                assert_eq!(distinct.len(), names.len() - 1, "seed {seed}: {names:?}");
                let mut on_cycle = Vec::new();
                for pair in names.windows(2) {
                    let by = edges.get(&(pair[0].clone(), pair[1].clone()));
                    assert!(by.is_some(), "seed {seed}: {names:?} has no wait {pair:?}");
                    on_cycle.extend(by.unwrap().iter().copied());
                }
                assert!(on_cycle.contains(&c.victim), "seed {seed}");
                let first = edges[&(names[0].clone(), names[1].clone())].contains(&c.victim);
                assert!(first, "seed {seed}: the victim's owner comes first");
            }
        }
    }

    #[test]
    fn a_member_behind_one_another_wait_reaches_is_on_no_cycle() {
        // w1..w7 in one queue behind h; w3 also holds "l", which h waits
        // for. The waits of w1..w3 are on the cycle h -> w3 -> w2 -> w1 -> h,
        // those of w4..w7 wait on it from behind.
        let mut q = Queues::default();
        q.hold("k", "h");
        q.hold("l", "w3");
        let owners = ["w1", "w2", "w3", "w4", "w5", "w6", "w7"];
        for (i, owner) in owners.iter().enumerate() {
            q.park(i as u64 + 1, owner, &["k"]);
        }
        q.park(10, "h", &["l"]);
        let mut g = WaitFor::default();
        g.grow(b"w7", &mut q.expand());
        assert_eq!(q.made_nodes, ["w3", "w6"]);
        for id in 4..=7 {
            assert_eq!(g.cycle_through(id), None, "waiter {id}");
        }
        for id in [1, 2, 3, 10] {
            let c = g.cycle_through(id).unwrap();
            assert_eq!(c.victim, 10);
            assert_eq!(names(&c), strings(&["h", "w3", "w2", "w1", "h"]));
        }
        assert_eq!(g.component_of(2), g.component_of(10));
        assert_ne!(g.component_of(5), g.component_of(10));
    }

    #[test]
    fn a_run_read_past_a_waiter_whose_owner_holds_the_key() {
        // On k: y, then m's multi-key waiter (m holds k), then w1, w2, x.
        // m has no wait on k, so w1 (the front of the run x reads) waits
        // for m and, past it, for y; y also waits for l, which x holds.
        let mut q = Queues::default();
        q.hold("k", "m");
        q.hold("k2", "n");
        q.hold("l", "x");
        q.park(1, "y", &["k"]);
        q.park(2, "m", &["k", "k2"]);
        q.park(3, "w1", &["k"]);
        q.park(4, "w2", &["k"]);
        q.park(5, "x", &["k"]);
        q.park(6, "y", &["l"]);
        let mut g = WaitFor::default();
        g.grow(b"x", &mut q.expand());
        let cycle = ["y", "x", "w2", "w1", "y"];
        for id in [3, 4, 5, 6] {
            let c = g.cycle_through(id).unwrap();
            assert_eq!((c.victim, names(&c)), (6, strings(&cycle)), "waiter {id}");
        }
        assert_eq!(g.cycle_through(2), None, "m waits for n only");
    }

    #[test]
    fn lazily_grown_slices_answer_as_the_whole_graph_does() {
        // Random servers, as above, but an owner may wait twice on one key
        // and only some waiters are due (grown from, newest first): every
        // waiter in the graph is answered as by the graph of every direct
        // wait, its cycle is made of real waits, and the components that
        // hold cycles are the whole graph's.
        let pool: Vec<&'static str> = (0..60)
            .map(|i| &*Box::leak(format!("o{i}").into_boxed_str()))
            .collect();
        const KEYS: [&str; 6] = ["k1", "k2", "k3", "k4", "k5", "k6"];
        for seed in 0..2000u64 {
            let mut rnd = seed.wrapping_mul(7919) + 1;
            let nown = 2 + (lcg(&mut rnd) % 40) as usize;
            let nkeys = 1 + (lcg(&mut rnd) % 6) as usize;
            let owners = &pool[..nown];
            let keys = &KEYS[..nkeys];
            let mut q = Queues::default();
            for key in keys {
                for _ in 0..lcg(&mut rnd) % 3 {
                    let h = owners[(lcg(&mut rnd) % nown as u64) as usize];
                    if !q.keys.get(key).is_some_and(|k| k.0.contains(&h)) {
                        q.hold(key, h);
                    }
                }
            }
            let m = 2 + lcg(&mut rnd) % 50;
            for id in 1..=m {
                let owner = owners[(lcg(&mut rnd) % nown as u64) as usize];
                let k1 = keys[(lcg(&mut rnd) % nkeys as u64) as usize];
                let k2 = keys[(lcg(&mut rnd) % nkeys as u64) as usize];
                let ks: Vec<&str> = if lcg(&mut rnd).is_multiple_of(5) && k1 != k2 {
                    vec![k1, k2]
                } else {
                    vec![k1]
                };
                q.park(id, owner, &ks);
            }
            let (whole, edges) = whole_graph(&q);
            let ids = waiter_ids(&q);
            // A random subset is due; grown newest first.
            let due: Vec<(u64, &str)> = ids
                .iter()
                .copied()
                .filter(|_| !lcg(&mut rnd).is_multiple_of(3))
                .collect();
            let mut g = WaitFor::default();
            for &(id, owner) in due.iter().rev() {
                if !g.has(id) {
                    g.grow(owner.as_bytes(), &mut q.expand());
                }
            }
            for &(id, _) in &ids {
                if !g.has(id) {
                    continue;
                }
                let want = whole.cycle_through(id);
                let got = g.cycle_through(id);
                assert_eq!(got.is_some(), want.is_some(), "seed {seed} waiter {id}");
                let same = |a: u64, b: u64| {
                    whole.component_of(a).is_some()
                        && whole.component_of(a) == whole.component_of(b)
                };
                if let Some(c) = got {
                    let names = names(&c);
                    assert_eq!(names.first(), names.last());
                    let distinct: HashSet<&String> = names[1..].iter().collect();
                    assert_eq!(distinct.len(), names.len() - 1, "seed {seed}: {names:?}");
                    let mut on_cycle = Vec::new();
                    for pair in names.windows(2) {
                        let by = edges.get(&(pair[0].clone(), pair[1].clone()));
                        assert!(by.is_some(), "seed {seed}: {names:?} has no wait {pair:?}");
                        on_cycle.extend(by.unwrap().iter().copied());
                    }
                    assert!(on_cycle.contains(&c.victim), "seed {seed}");
                    assert!(edges[&(names[0].clone(), names[1].clone())].contains(&c.victim));
                    let own = ids.iter().find(|(i, _)| *i == id).unwrap().1;
                    assert!(names.iter().any(|n| n == own), "seed {seed}");
                    assert!(g.has(c.victim), "seed {seed}");
                    assert_eq!(
                        g.component_of(c.victim),
                        g.component_of(id),
                        "seed {seed} {id}"
                    );
                    assert!(same(c.victim, id), "seed {seed} {id}");
                }
                // Components agree with the whole graph's among waiters on cycles.
                for &(other, _) in &ids {
                    if g.has(other) && want.is_some() && whole.cycle_through(other).is_some() {
                        assert_eq!(
                            g.component_of(id) == g.component_of(other),
                            same(id, other),
                            "seed {seed} {id} {other}"
                        );
                    }
                }
            }
        }
    }
}
