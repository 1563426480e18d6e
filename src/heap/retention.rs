//! Retention reports from a live heap: walk it once, then answer "why is this alive" for one
//! object or for every object of an allocation site, as node addresses and numbers. Naming
//! the edges (which needs the interpreter and may run code) happens afterwards, only for the
//! paths reported, in `alloctrace._retention`.
//!
//! Roots are chosen by the caller (module objects and the frames of every thread) and passed
//! in as objects; the walk adds them as extra roots so that frames, which the collector does
//! not track, are in the graph.

use std::collections::HashMap;

use pyo3::ffi;
use pyo3::prelude::*;

use super::graph::{HeapGraph, NodeId};
use super::paths::{
    paths_to, paths_to_group, referrer_pattern, retained_by_group, Dominators, PatternLine, Reach,
    Referrers,
};
use super::walk::walk;
use crate::error::Result;

/// A walked heap with the indexes every question needs.
pub struct Analysis {
    pub graph: HeapGraph,
    pub referrers: Referrers,
    pub roots: Vec<NodeId>,
    pub reach: Reach,
}

impl Analysis {
    /// Walks the heap from the collector's objects plus `roots` and `extra` (objects that must
    /// be in the graph without being roots), and searches it from `roots`, the first `primary`
    /// of them before the others (see [`Reach::tiered`]). Runs no Python code.
    pub fn new(
        py: Python<'_>,
        roots: &[*mut ffi::PyObject],
        primary: usize,
        extra: &[*mut ffi::PyObject],
    ) -> Result<Self> {
        let all: Vec<*mut ffi::PyObject> = roots.iter().chain(extra).copied().collect();
        let graph = walk(py, &all, crate::hooks::tracer::traced_size)?;
        let nodes = |ptrs: &[*mut ffi::PyObject]| -> Vec<NodeId> {
            ptrs.iter()
                .filter_map(|&p| graph.node_of(p as usize))
                .collect()
        };
        let primary = primary.min(roots.len());
        let first = nodes(&roots[..primary]);
        let second = nodes(&roots[primary..]);
        let referrers = Referrers::new(&graph)?;
        let reach = Reach::tiered(&graph, &[&first, &second], &|_| false)?;
        let mut root_nodes: Vec<NodeId> = first.into_iter().chain(second).collect();
        root_nodes.sort_unstable();
        root_nodes.dedup();
        Ok(Analysis {
            graph,
            referrers,
            roots: root_nodes,
            reach,
        })
    }

    fn addrs(&self, path: &[NodeId]) -> Vec<usize> {
        path.iter().map(|&n| self.graph.addr(n)).collect()
    }
}

/// Why one object is alive.
pub struct ObjectReport {
    /// Reference chains from a root to the object, as object addresses, root first.
    pub paths: Vec<Vec<usize>>,
    /// Bytes the object owns itself.
    pub own: u64,
    /// Bytes freed with it (itself included), counting every root, the asking thread's
    /// frames too; 0 when no root reaches it.
    pub retained: u64,
    /// Whether a first-tier root reaches it (false: garbage kept alive by a cycle, held only
    /// by something that is not a root, or only by the asking thread's frames).
    pub reachable: bool,
}

/// The report for the object at `target`, which the walk must have seen.
pub fn object_report(a: &Analysis, target: usize, limit: usize) -> Result<Option<ObjectReport>> {
    let Some(node) = a.graph.node_of(target) else {
        return Ok(None);
    };
    let reachable = a.reach.reached_first(node);
    let retained = if a.reach.reached(node) {
        Dominators::new(&a.graph, &a.referrers, &a.roots)?.retained[node as usize]
    } else {
        0
    };
    Ok(Some(ObjectReport {
        paths: paths_to(&a.reach, &a.referrers, node, limit)
            .iter()
            .map(|p| a.addrs(p))
            .collect(),
        own: a.graph.size(node),
        retained,
        reachable,
    }))
}

/// Why the objects allocated at one site are alive.
pub struct SiteReport {
    /// Objects found whose block was allocated at the site.
    pub count: usize,
    /// Those of them no first-tier root reaches.
    pub unreachable: usize,
    /// Their own bytes, summed.
    pub own: u64,
    /// Bytes freed if all of them went (see [`retained_by_group`]).
    pub retained: u64,
    /// Sample chains, one per distinct last referrer, as addresses.
    pub paths: Vec<Vec<usize>>,
    /// What holds them, grouped by (type id, site id).
    pub pattern: Vec<PatternLine>,
}

/// Reports for each of `wanted` (site ids as in `node_sites`), in that order.
pub fn site_reports(
    a: &Analysis,
    node_sites: &[Option<u32>],
    wanted: &[u32],
    limit: usize,
    max_lines: usize,
) -> Result<Vec<SiteReport>> {
    let index: HashMap<u32, usize> = wanted.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); wanted.len()];
    for (node, site) in node_sites.iter().enumerate() {
        if let Some(&i) = site.and_then(|s| index.get(&s)) {
            members[i].push(node as NodeId);
        }
    }
    let key = |n: NodeId| (a.graph.type_id(n), node_sites[n as usize]);
    let kind = |n: NodeId| {
        let (ty, site) = key(n);
        (u64::from(ty) << 32) | u64::from(site.map_or(u32::MAX, |s| s))
    };
    let mut reports = Vec::with_capacity(members.len());
    for group in &members {
        reports.push(SiteReport {
            count: group.len(),
            unreachable: group.iter().filter(|&&n| !a.reach.reached_first(n)).count(),
            own: group.iter().map(|&n| a.graph.size(n)).sum(),
            retained: if group.is_empty() {
                0
            } else {
                retained_by_group(&a.graph, &a.roots, &a.reach, group)?
            },
            paths: paths_to_group(&a.reach, &a.referrers, group, limit, &kind)
                .iter()
                .map(|p| a.addrs(p))
                .collect(),
            pattern: referrer_pattern(&a.referrers, group, &key, max_lines),
        });
    }
    Ok(reports)
}
