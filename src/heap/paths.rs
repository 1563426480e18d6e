//! Why an object is alive, answered on a frozen [`HeapGraph`]: the reference chains from the
//! roots to it, the bytes that would go with it (retained size), and for a group of similar
//! objects the pattern of what holds them.
//!
//! Everything is linear or near-linear in the size of the graph (a breadth-first search, one
//! reverse index, a dominator tree by the iterative Cooper–Harvey–Kennedy algorithm over a
//! reverse post-order), because the graph of a real process has millions of nodes.
//!
//! Which `k` paths are reported, precisely: a path is a shortest chain from the nearest root
//! to one *last referrer* of the target, followed by the target. The candidates are the
//! distinct referrers of the target that the roots reach, ordered by their distance from the
//! roots (so the first path is a shortest path, and the others are shortest or next-shortest
//! ones through other referrers), ties kept in the order the walk met the referrers. One path
//! per last referrer, so the `k` paths always say `k` different things about who holds the
//! object, instead of `k` variations of the same chain.

use std::collections::HashMap;

use super::graph::{HeapGraph, NodeId};
use crate::error::Result;
use crate::platform::fallible;

/// Marks a node no root reaches (distance) or a node without parent.
pub const NONE: u32 = u32::MAX;

/// Everyone that refers to each node: the graph's edges reversed, in compressed rows.
pub struct Referrers {
    offsets: Vec<u32>,
    sources: Vec<NodeId>,
}

impl Referrers {
    /// Builds the reverse index, each node's referrers listed once per edge, in node order.
    pub fn new(g: &HeapGraph) -> Result<Self> {
        let n = g.len();
        let mut offsets = fallible::filled(n + 1, 0u32)?;
        for from in 0..n as NodeId {
            for &to in g.referents(from) {
                offsets[to as usize + 1] += 1;
            }
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = fallible::cloned(&offsets)?;
        let mut sources = fallible::filled(g.edge_count(), 0 as NodeId)?;
        for from in 0..n as NodeId {
            for &to in g.referents(from) {
                let slot = &mut fill[to as usize];
                sources[*slot as usize] = from;
                *slot += 1;
            }
        }
        Ok(Referrers { offsets, sources })
    }

    pub fn of(&self, node: NodeId) -> &[NodeId] {
        let n = node as usize;
        &self.sources[self.offsets[n] as usize..self.offsets[n + 1] as usize]
    }
}

/// The result of a breadth-first search from the roots: per node its distance in edges from
/// the nearest root and the node it was first reached from (a shortest-path tree).
pub struct Reach {
    pub dist: Vec<u32>,
    pub parent: Vec<NodeId>,
    /// The distance each tier of roots started at.
    pub tier_base: Vec<u32>,
}

impl Reach {
    /// Searches from `roots` (distance 0), never entering a node for which `blocked` is true.
    pub fn new(g: &HeapGraph, roots: &[NodeId], blocked: &dyn Fn(NodeId) -> bool) -> Result<Self> {
        Self::tiered(g, &[roots], blocked)
    }

    /// Searches from each tier of roots in turn: a later tier only reaches what the earlier
    /// ones did not, and everything it reaches counts as farther than anything they reached
    /// (its distances start past theirs). Retention paths use two tiers, so that the frames
    /// of the thread asking (which hold the object to ask about it) explain an object only
    /// when nothing else does, and come after the other explanations.
    pub fn tiered(
        g: &HeapGraph,
        tiers: &[&[NodeId]],
        blocked: &dyn Fn(NodeId) -> bool,
    ) -> Result<Self> {
        let n = g.len();
        let mut dist = fallible::filled(n, NONE)?;
        let mut parent = fallible::filled(n, NONE)?;
        // Each node enters the queue at most once.
        let mut queue: Vec<NodeId> = fallible::with_capacity(n)?;
        let mut base = 0;
        let mut tier_base = Vec::with_capacity(tiers.len());
        for roots in tiers {
            tier_base.push(base);
            let mut head = queue.len();
            for &r in roots.iter() {
                if dist[r as usize] == NONE && !blocked(r) {
                    dist[r as usize] = base;
                    queue.push(r);
                }
            }
            while head < queue.len() {
                let node = queue[head];
                head += 1;
                let d = dist[node as usize] + 1;
                base = base.max(d);
                for &next in g.referents(node) {
                    if dist[next as usize] == NONE && !blocked(next) {
                        dist[next as usize] = d;
                        parent[next as usize] = node;
                        queue.push(next);
                    }
                }
            }
        }
        Ok(Reach {
            dist,
            parent,
            tier_base,
        })
    }

    pub fn reached(&self, node: NodeId) -> bool {
        self.dist[node as usize] != NONE
    }

    /// Whether the first tier of roots reaches `node`.
    pub fn reached_first(&self, node: NodeId) -> bool {
        let d = self.dist[node as usize];
        d != NONE && self.tier_base.get(1).is_none_or(|&second| d < second)
    }

    /// The shortest chain root → … → `node` (empty if no root reaches it).
    pub fn chain(&self, node: NodeId) -> Vec<NodeId> {
        if !self.reached(node) {
            return Vec::new();
        }
        let mut chain = vec![node];
        let mut at = node;
        while self.parent[at as usize] != NONE {
            at = self.parent[at as usize];
            chain.push(at);
        }
        chain.reverse();
        chain
    }
}

/// Up to `limit` reference chains from the roots to `target`, one per distinct last referrer
/// (see the module docs for which ones). A root target gives the one-node path `[target]`; a
/// target no root reaches gives none.
pub fn paths_to(
    reach: &Reach,
    referrers: &Referrers,
    target: NodeId,
    limit: usize,
) -> Vec<Vec<NodeId>> {
    paths_to_group(reach, referrers, &[target], limit, &|n| n as u64)
}

/// Up to `limit` chains from the roots to members of `group`, each ending in a last referrer
/// of a different `kind` (for one object, each referrer is its own kind; for a group, kinds
/// are the referrers' type and allocation site, so ten thousand members held the same way
/// give one sample chain, not ten thousand alike): members are taken nearest first, and for
/// each its referrers nearest first. Referrers inside the group count like any other (a
/// member held by another member says so), but a chain never passes through the member it
/// ends at twice.
pub fn paths_to_group(
    reach: &Reach,
    referrers: &Referrers,
    group: &[NodeId],
    limit: usize,
    kind: &dyn Fn(NodeId) -> u64,
) -> Vec<Vec<NodeId>> {
    let mut members: Vec<NodeId> = group
        .iter()
        .copied()
        .filter(|&m| reach.reached(m))
        .collect();
    members.sort_by_key(|&m| reach.dist[m as usize]);
    members.dedup();
    let mut out = Vec::new();
    let mut seen_last: HashMap<u64, ()> = HashMap::new();
    for &m in &members {
        if out.len() >= limit {
            break;
        }
        if reach.dist[m as usize] == 0 {
            if seen_last.insert(kind(m), ()).is_none() {
                out.push(vec![m]);
            }
            continue;
        }
        let mut candidates: Vec<NodeId> = referrers
            .of(m)
            .iter()
            .copied()
            .filter(|&r| r != m && reach.reached(r))
            .collect();
        // Stable: ties stay in the order the walk met them.
        candidates.sort_by_key(|&r| reach.dist[r as usize]);
        for r in candidates {
            if out.len() >= limit {
                break;
            }
            let mut chain = reach.chain(r);
            if chain.contains(&m) {
                // The only shortest way to this referrer runs through the target itself.
                continue;
            }
            if seen_last.insert(kind(r), ()).is_some() {
                continue;
            }
            chain.push(m);
            out.push(chain);
        }
    }
    out
}

/// The dominator tree of the graph seen from a virtual root that refers to every root: a
/// node's immediate dominator is the last node every chain from the roots to it must pass.
/// The retained size of a node is then the summed own size of its subtree.
pub struct Dominators {
    /// Immediate dominator per node; `VIRTUAL` for nodes held by several roots or a root,
    /// `NONE` for nodes no root reaches.
    pub idom: Vec<u32>,
    /// Bytes retained per node (0 for unreachable nodes).
    pub retained: Vec<u64>,
}

/// The virtual root's id in [`Dominators::idom`].
pub const VIRTUAL: u32 = u32::MAX - 1;

impl Dominators {
    /// Cooper, Harvey and Kennedy's iterative algorithm ("A Simple, Fast Dominance
    /// Algorithm"): intersect the dominators of the predecessors in reverse post-order until
    /// nothing changes. Near-linear on heap graphs, which are shallow and converge in a few
    /// rounds.
    pub fn new(g: &HeapGraph, referrers: &Referrers, roots: &[NodeId]) -> Result<Self> {
        let n = g.len();
        // Post-order numbering by an explicit-stack DFS from the virtual root (index n).
        let mut post = fallible::filled(n + 1, NONE)?;
        let mut order: Vec<u32> = fallible::with_capacity(n + 1)?; // node by post-order number
        let mut visited = fallible::filled(n + 1, false)?;
        // Each node is pushed at most once.
        let mut stack: Vec<(u32, usize)> = fallible::with_capacity(n + 1)?;
        stack.push((n as u32, 0));
        visited[n] = true;
        let mut is_root = fallible::filled(n, false)?;
        for &r in roots {
            is_root[r as usize] = true;
        }
        while let Some(&mut (node, ref mut i)) = stack.last_mut() {
            let succ: &[NodeId] = if node as usize == n {
                roots
            } else {
                g.referents(node)
            };
            if *i < succ.len() {
                let next = succ[*i];
                *i += 1;
                if !visited[next as usize] {
                    visited[next as usize] = true;
                    stack.push((next, 0));
                }
            } else {
                post[node as usize] = order.len() as u32;
                order.push(node);
                stack.pop();
            }
        }
        let vroot_post = post[n];
        // idom by post-order number.
        let mut idom = fallible::filled(order.len(), NONE)?;
        idom[vroot_post as usize] = vroot_post;
        let intersect = |idom: &[u32], mut a: u32, mut b: u32| {
            while a != b {
                while a < b {
                    a = idom[a as usize];
                }
                while b < a {
                    b = idom[b as usize];
                }
            }
            a
        };
        let mut changed = true;
        while changed {
            changed = false;
            for &node in order.iter().rev() {
                if node as usize == n {
                    continue;
                }
                let mut new_idom = NONE;
                let mut consider = |p: u32| {
                    if idom[p as usize] == NONE {
                        return;
                    }
                    new_idom = if new_idom == NONE {
                        p
                    } else {
                        intersect(&idom, p, new_idom)
                    };
                };
                if is_root[node as usize] {
                    consider(vroot_post);
                }
                for &r in referrers.of(node) {
                    let p = post[r as usize];
                    if p != NONE {
                        consider(p);
                    }
                }
                let me = post[node as usize] as usize;
                if new_idom != NONE && idom[me] != new_idom {
                    idom[me] = new_idom;
                    changed = true;
                }
            }
        }
        let mut by_node = fallible::filled(n, NONE)?;
        let mut retained = fallible::filled(n, 0u64)?;
        for &node in &order {
            if node as usize != n {
                retained[node as usize] = g.size(node);
            }
        }
        // Children precede parents in post-order, so one pass in that order sums subtrees.
        for &node in &order {
            if node as usize == n {
                continue;
            }
            let d = order[idom[post[node as usize] as usize] as usize];
            if d as usize == n {
                by_node[node as usize] = VIRTUAL;
            } else {
                by_node[node as usize] = d;
                retained[d as usize] += retained[node as usize];
            }
        }
        Ok(Dominators {
            idom: by_node,
            retained,
        })
    }
}

/// Bytes that would be freed with every member of `group`: the own sizes of the nodes the
/// roots reach, but reach no more once the members are gone (the members included). For one
/// node this equals its dominator-tree retained size; for a group it also counts what only
/// several members hold together, which no single member dominates.
pub fn retained_by_group(
    g: &HeapGraph,
    roots: &[NodeId],
    all: &Reach,
    group: &[NodeId],
) -> Result<u64> {
    let mut in_group = fallible::filled(g.len(), false)?;
    for &m in group {
        in_group[m as usize] = true;
    }
    let without = Reach::new(g, roots, &|n| in_group[n as usize])?;
    Ok((0..g.len() as NodeId)
        .filter(|&n| all.reached(n) && !without.reached(n))
        .map(|n| g.size(n))
        .sum())
}

/// What a referrer is, for grouping: its type and, where known, its allocation site.
pub type GroupKey = (u32, Option<u32>);

/// One line of a group's referrer pattern: `count` distinct referrers of one kind hold
/// `held` members of the group, and they are in turn held by `up`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternLine {
    pub key: GroupKey,
    /// Distinct referrers with this key.
    pub count: usize,
    /// Distinct group members they refer to.
    pub held: usize,
    /// Their own referrers, grouped the same way (one level, no further `up`).
    pub up: Vec<(GroupKey, usize)>,
}

/// The referrers of all of `group`'s members grouped by `key` (the referrer's type and
/// allocation site), largest first, each with the same grouping one level further up. Ten
/// thousand members held by ten thousand `__dict__`s held by one list read as one line.
pub fn referrer_pattern(
    referrers: &Referrers,
    group: &[NodeId],
    key: &dyn Fn(NodeId) -> GroupKey,
    max_lines: usize,
) -> Vec<PatternLine> {
    // key -> (distinct referrers, distinct members held)
    let mut level1: HashMap<GroupKey, (Vec<NodeId>, usize)> = HashMap::new();
    let mut seen_pair: HashMap<NodeId, u32> = HashMap::new(); // referrer -> last member index
    let mut order: Vec<GroupKey> = Vec::new();
    for (i, &m) in group.iter().enumerate() {
        let mut keys_for_member: Vec<GroupKey> = Vec::new();
        for &r in referrers.of(m) {
            let k = key(r);
            let entry = level1.entry(k).or_insert_with(|| {
                order.push(k);
                (Vec::new(), 0)
            });
            match seen_pair.insert(r, i as u32) {
                None => entry.0.push(r),
                Some(prev) if prev == i as u32 => continue,
                Some(_) => {}
            }
            if !keys_for_member.contains(&k) {
                keys_for_member.push(k);
                entry.1 += 1;
            }
        }
    }
    let mut lines: Vec<PatternLine> = order
        .into_iter()
        .map(|k| {
            let (refs, held) = &level1[&k];
            let mut up: HashMap<GroupKey, (usize, usize)> = HashMap::new(); // key -> (count, first seen)
            let mut seen: HashMap<NodeId, ()> = HashMap::new();
            for &r in refs {
                for &rr in referrers.of(r) {
                    if seen.insert(rr, ()).is_none() {
                        let next = up.len();
                        up.entry(key(rr)).or_insert((0, next)).0 += 1;
                    }
                }
            }
            let mut up: Vec<(GroupKey, usize, usize)> = up
                .into_iter()
                .map(|(k, (c, first))| (k, c, first))
                .collect();
            up.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
            PatternLine {
                key: k,
                count: refs.len(),
                held: *held,
                up: up
                    .into_iter()
                    .take(max_lines)
                    .map(|(k, c, _)| (k, c))
                    .collect(),
            }
        })
        .collect();
    lines.sort_by(|a, b| b.held.cmp(&a.held).then(b.count.cmp(&a.count)));
    lines.truncate(max_lines);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::graph::GraphBuilder;

    /// A graph from `(name, type, size)` nodes and `(from, to)` edges by name.
    fn graph(nodes: &[(&str, &str, u64)], edges: &[(&str, &str)]) -> (HeapGraph, Vec<String>) {
        let mut b = GraphBuilder::new();
        let names: Vec<String> = nodes.iter().map(|n| n.0.to_string()).collect();
        for (i, (_, ty, size)) in nodes.iter().enumerate() {
            b.add_node(0x1000 + i * 16, ty.as_bytes(), *size);
        }
        let id = |s: &str| names.iter().position(|n| n == s).unwrap() as NodeId;
        for (f, t) in edges {
            b.add_edge(id(f), id(t));
        }
        (b.finish(), names)
    }

    fn id(names: &[String], s: &str) -> NodeId {
        names.iter().position(|n| n == s).unwrap() as NodeId
    }

    fn named(names: &[String], path: &[NodeId]) -> String {
        path.iter()
            .map(|&n| names[n as usize].as_str())
            .collect::<Vec<_>>()
            .join(">")
    }

    #[test]
    fn paths_table() {
        // module -> dict -> list -> user; module -> other -> user; a second root -> user2 -> user
        let nodes = [
            ("mod", "module", 10),
            ("dict", "dict", 10),
            ("list", "list", 10),
            ("user", "User", 10),
            ("other", "dict", 10),
            ("frame", "frame", 10),
            ("deep1", "list", 10),
            ("deep2", "list", 10),
            ("lonely", "list", 10),
            ("cyc_a", "list", 10),
            ("cyc_b", "list", 10),
        ];
        let edges = [
            ("mod", "dict"),
            ("dict", "list"),
            ("list", "user"),
            ("mod", "other"),
            ("other", "user"),
            ("frame", "deep1"),
            ("deep1", "deep2"),
            ("deep2", "user"),
            ("dict", "user"),
            ("cyc_a", "cyc_b"),
            ("cyc_b", "cyc_a"),
            ("cyc_b", "user"),
        ];
        let (g, names) = graph(&nodes, &edges);
        let roots = [id(&names, "mod"), id(&names, "frame")];
        let reach = Reach::new(&g, &roots, &|_| false).unwrap();
        let refs = Referrers::new(&g).unwrap();
        let cases: &[(&str, usize, &[&str])] = &[
            // Shortest first, then others by distance, one per last referrer; the cycle
            // nobody reaches is not a way in.
            (
                "user",
                5,
                &[
                    "mod>dict>user",
                    "mod>other>user",
                    "mod>dict>list>user",
                    "frame>deep1>deep2>user",
                ],
            ),
            ("user", 1, &["mod>dict>user"]),
            ("user", 0, &[]),
            ("mod", 3, &["mod"]),
            ("lonely", 3, &[]),
            ("cyc_a", 3, &[]),
            ("deep2", 2, &["frame>deep1>deep2"]),
        ];
        for &(target, limit, want) in cases {
            let got: Vec<String> = paths_to(&reach, &refs, id(&names, target), limit)
                .iter()
                .map(|p| named(&names, p))
                .collect();
            assert_eq!(got, want, "paths to {target} limit {limit}");
        }
    }

    #[test]
    fn a_later_tier_explains_only_what_earlier_ones_do_not() {
        let (g, names) = graph(
            &[
                ("mod", "module", 1),
                ("a", "dict", 1),
                ("b", "list", 1),
                ("own", "frame", 1),
                ("only_own", "list", 1),
            ],
            &[("mod", "a"), ("a", "b"), ("own", "b"), ("own", "only_own")],
        );
        let first = [id(&names, "mod")];
        let second = [id(&names, "own")];
        let reach = Reach::tiered(&g, &[&first, &second], &|_| false).unwrap();
        let refs = Referrers::new(&g).unwrap();
        let to = |t: &str| -> Vec<String> {
            paths_to(&reach, &refs, id(&names, t), 5)
                .iter()
                .map(|p| named(&names, p))
                .collect()
        };
        // The frame is one step from b, the module two, yet the module's path comes first.
        assert_eq!(to("b"), ["mod>a>b", "own>b"]);
        assert_eq!(to("only_own"), ["own>only_own"]);
        assert!(reach.dist[id(&names, "own") as usize] > reach.dist[id(&names, "b") as usize]);
        assert!(reach.reached_first(id(&names, "b")));
        assert!(!reach.reached_first(id(&names, "only_own")));
        assert!(reach.reached(id(&names, "only_own")));
    }

    #[test]
    fn group_paths_end_in_distinct_referrers() {
        let nodes = [
            ("root", "module", 1),
            ("cache", "dict", 1),
            ("a", "S", 1),
            ("b", "S", 1),
            ("c", "S", 1),
            ("l", "list", 1),
        ];
        let edges = [
            ("root", "cache"),
            ("cache", "a"),
            ("cache", "b"),
            ("root", "l"),
            ("l", "c"),
        ];
        let (g, names) = graph(&nodes, &edges);
        let reach = Reach::new(&g, &[0], &|_| false).unwrap();
        let refs = Referrers::new(&g).unwrap();
        let group = [id(&names, "a"), id(&names, "b"), id(&names, "c")];
        let got: Vec<String> = paths_to_group(&reach, &refs, &group, 5, &|n| n as u64)
            .iter()
            .map(|p| named(&names, p))
            .collect();
        assert_eq!(got, ["root>cache>a", "root>l>c"]);
        // By type, the dict and the list are two kinds; all in one kind, one sample.
        let by_type = |n: NodeId| g.type_id(n) as u64;
        assert_eq!(paths_to_group(&reach, &refs, &group, 5, &by_type).len(), 2);
        assert_eq!(paths_to_group(&reach, &refs, &group, 5, &|_| 0).len(), 1);
    }

    /// Retained sizes by brute force: remove the node, see what the roots no longer reach.
    fn brute_retained(g: &HeapGraph, roots: &[NodeId], node: NodeId) -> u64 {
        let all = Reach::new(g, roots, &|_| false).unwrap();
        if !all.reached(node) {
            return 0;
        }
        retained_by_group(g, roots, &all, &[node]).unwrap()
    }

    #[test]
    fn dominators_table() {
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            &'a [&'a str],
            &'a [(&'a str, &'a str, u64)],
        );
        // (edges, roots, expected (node, idom, retained)); every node has size 1 unless named
        // "big" (size 100).
        let cases: &[Case] = &[
            // A chain.
            (
                &[("r", "a"), ("a", "b"), ("b", "c")],
                &["r"],
                &[("r", "*", 4), ("a", "r", 3), ("b", "a", 2), ("c", "b", 1)],
            ),
            // A diamond: d is held by b and c, so only a retains it.
            (
                &[("r", "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                &["r"],
                &[("a", "r", 4), ("b", "a", 1), ("c", "a", 1), ("d", "a", 1)],
            ),
            // A cycle hanging off one node: the entry retains the whole cycle.
            (
                &[("r", "a"), ("a", "b"), ("b", "c"), ("c", "a"), ("c", "big")],
                &["r"],
                &[
                    ("a", "r", 103),
                    ("b", "a", 102),
                    ("c", "b", 101),
                    ("big", "c", 100),
                ],
            ),
            // Two roots share an object: neither retains it.
            (
                &[("r1", "x"), ("r2", "x"), ("x", "big")],
                &["r1", "r2"],
                &[
                    ("r1", "*", 1),
                    ("r2", "*", 1),
                    ("x", "*", 101),
                    ("big", "x", 100),
                ],
            ),
            // A root that is also referred to from another root is still held by the
            // virtual root; an unreachable cycle is retained by nobody.
            (
                &[("r1", "r2"), ("r2", "a"), ("g1", "g2"), ("g2", "g1")],
                &["r1", "r2"],
                &[
                    ("r2", "*", 2),
                    ("a", "r2", 1),
                    ("g1", "-", 0),
                    ("g2", "-", 0),
                ],
            ),
            // Classic irreducible shape: two ways into a loop.
            (
                &[
                    ("r", "a"),
                    ("r", "b"),
                    ("a", "c"),
                    ("b", "d"),
                    ("c", "d"),
                    ("d", "c"),
                ],
                &["r"],
                &[
                    ("a", "r", 1),
                    ("b", "r", 1),
                    ("c", "r", 1),
                    ("d", "r", 1),
                    ("r", "*", 5),
                ],
            ),
        ];
        for (case, &(edges, roots, want)) in cases.iter().enumerate() {
            let mut names: Vec<&str> = Vec::new();
            for &(f, t) in edges.iter() {
                for s in [f, t] {
                    if !names.contains(&s) {
                        names.push(s);
                    }
                }
            }
            let nodes: Vec<(&str, &str, u64)> = names
                .iter()
                .map(|&s| (s, "T", if s == "big" { 100 } else { 1 }))
                .collect();
            let (g, names) = graph(&nodes, edges);
            let roots: Vec<NodeId> = roots.iter().map(|r| id(&names, r)).collect();
            let refs = Referrers::new(&g).unwrap();
            let dom = Dominators::new(&g, &refs, &roots).unwrap();
            for &(node, idom, retained) in want {
                let n = id(&names, node);
                let got_idom = match dom.idom[n as usize] {
                    VIRTUAL => "*".to_string(),
                    NONE => "-".to_string(),
                    d => names[d as usize].clone(),
                };
                assert_eq!(got_idom, idom, "case {case}: idom of {node}");
                assert_eq!(
                    dom.retained[n as usize], retained,
                    "case {case}: retained {node}"
                );
                assert_eq!(
                    brute_retained(&g, &roots, n),
                    retained,
                    "case {case}: brute force agrees for {node}"
                );
            }
        }
    }

    #[test]
    fn dominators_agree_with_brute_force_on_a_pseudo_random_graph() {
        let mut b = GraphBuilder::new();
        let n = 300usize;
        for i in 0..n {
            b.add_node(i * 8 + 8, b"T", (i % 7 + 1) as u64);
        }
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..n {
            for _ in 0..(i % 3 + 1) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let to = (x % n as u64) as NodeId;
                // Mostly forward edges with some back edges: cycles and shared objects.
                if to as usize > i || x % 5 == 0 {
                    b.add_edge(i as NodeId, to);
                }
            }
        }
        let g = b.finish();
        let roots = [0, 1, 2];
        let refs = Referrers::new(&g).unwrap();
        let dom = Dominators::new(&g, &refs, &roots).unwrap();
        for node in 0..n as NodeId {
            assert_eq!(
                dom.retained[node as usize],
                brute_retained(&g, &roots, node),
                "node {node}"
            );
        }
    }

    #[test]
    fn group_retained_counts_what_members_hold_together() {
        let (g, names) = graph(
            &[
                ("r", "module", 1),
                ("a", "S", 10),
                ("b", "S", 10),
                ("shared", "bytes", 100),
                ("out", "list", 1),
            ],
            &[
                ("r", "a"),
                ("r", "b"),
                ("a", "shared"),
                ("b", "shared"),
                ("r", "out"),
                ("out", "b"),
            ],
        );
        let roots = [0];
        let all = Reach::new(&g, &roots, &|_| false).unwrap();
        let a = id(&names, "a");
        let b = id(&names, "b");
        assert_eq!(retained_by_group(&g, &roots, &all, &[a]).unwrap(), 10);
        assert_eq!(retained_by_group(&g, &roots, &all, &[a, b]).unwrap(), 120);
    }

    #[test]
    fn referrer_pattern_folds_similar_holders() {
        let mut b = GraphBuilder::new();
        let cache = b.add_node(1, b"dict", 1);
        let root = b.add_node(2, b"module", 1);
        let other = b.add_node(3, b"tuple", 1);
        b.add_edge(root, cache);
        let mut members = Vec::new();
        for i in 0..100 {
            let holder = b.add_node(1000 + i * 2, b"Session.__dict__", 1);
            let member = b.add_node(1001 + i * 2, b"list", 1);
            b.add_edge(cache, holder);
            b.add_edge(holder, member);
            members.push(member);
        }
        b.add_edge(other, members[0]);
        let g = b.finish();
        let refs = Referrers::new(&g).unwrap();
        // Sessions' dicts have allocation site 7, the cache site 3, the rest unknown.
        let key = |n: NodeId| {
            let site = match g.type_name(n) {
                b"Session.__dict__" => Some(7),
                b"dict" => Some(3),
                _ => None,
            };
            (g.type_id(n), site)
        };
        let lines = referrer_pattern(&refs, &members, &key, 5);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].key, key(2 + 1)); // the first Session.__dict__
        assert_eq!((lines[0].count, lines[0].held), (100, 100));
        assert_eq!(lines[0].up, vec![(key(cache), 1)]);
        assert_eq!(lines[1].key, key(other));
        assert_eq!((lines[1].count, lines[1].held), (1, 1));
        assert!(lines[1].up.is_empty());
        assert_eq!(referrer_pattern(&refs, &members, &key, 1).len(), 1);
        assert!(referrer_pattern(&refs, &[], &key, 5).is_empty());
    }
}
