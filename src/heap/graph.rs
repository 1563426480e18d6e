//! The object graph of a live heap as plain data: one node per Python object, its type, the
//! bytes it owns, and the objects it refers to.
//!
//! The walk that fills it runs once, with the GIL held and no Python code called, so the graph
//! is a consistent picture even though the heap keeps changing afterwards. Everything that
//! answers questions about it (object kinds per allocation site, retention paths, retained
//! sizes) then works on these arrays alone and is unit-tested without an interpreter.
//!
//! Nodes are numbered in the order they were added; edges are kept in compressed rows (CSR),
//! because a million objects have a few million references and a `Vec` per node would cost
//! more than the data.

use std::collections::HashMap;

/// Index of a node in a [`HeapGraph`].
pub type NodeId = u32;
/// Index into [`HeapGraph::type_names`].
pub type TypeNameId = u32;

/// A frozen object graph. Build one with [`GraphBuilder`].
#[derive(Debug, Default)]
pub struct HeapGraph {
    /// The object's address (`PyObject*`), per node.
    addrs: Vec<usize>,
    /// The object's type, per node.
    types: Vec<TypeNameId>,
    /// Qualified type names (`module.QualName`, builtins bare), surrogatepass UTF-8, each once.
    type_names: Vec<Box<[u8]>>,
    /// Bytes the object owns, per node: its own block plus the buffers attributed to it.
    sizes: Vec<u64>,
    /// Referents of node `n` are `targets[offsets[n]..offsets[n + 1]]`.
    offsets: Vec<u32>,
    targets: Vec<NodeId>,
    by_addr: HashMap<usize, NodeId>,
}

impl HeapGraph {
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The node of the object at `addr`, if the walk saw it.
    pub fn node_of(&self, addr: usize) -> Option<NodeId> {
        self.by_addr.get(&addr).copied()
    }

    pub fn addr(&self, node: NodeId) -> usize {
        self.addrs[node as usize]
    }

    pub fn type_id(&self, node: NodeId) -> TypeNameId {
        self.types[node as usize]
    }

    pub fn type_name(&self, node: NodeId) -> &[u8] {
        &self.type_names[self.types[node as usize] as usize]
    }

    pub fn type_names(&self) -> &[Box<[u8]>] {
        &self.type_names
    }

    pub fn size(&self, node: NodeId) -> u64 {
        self.sizes[node as usize]
    }

    /// The objects `node` refers to, in the order the walk met them (duplicates kept: a list
    /// holding one object twice has two edges).
    pub fn referents(&self, node: NodeId) -> &[NodeId] {
        let n = node as usize;
        &self.targets[self.offsets[n] as usize..self.offsets[n + 1] as usize]
    }

    pub fn edge_count(&self) -> usize {
        self.targets.len()
    }
}

/// Accumulates nodes and edges in any order, then freezes them into a [`HeapGraph`].
#[derive(Debug, Default)]
pub struct GraphBuilder {
    addrs: Vec<usize>,
    types: Vec<TypeNameId>,
    sizes: Vec<u64>,
    type_names: Vec<Box<[u8]>>,
    type_ids: HashMap<Box<[u8]>, TypeNameId>,
    by_addr: HashMap<usize, NodeId>,
    edges: Vec<(NodeId, NodeId)>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the object at `addr`, or returns its node if it was added before (the walk meets
    /// shared objects many times; the first description wins).
    pub fn add_node(&mut self, addr: usize, type_name: &[u8], size: u64) -> NodeId {
        if let Some(&node) = self.by_addr.get(&addr) {
            return node;
        }
        let type_id = match self.type_ids.get(type_name) {
            Some(&id) => id,
            None => {
                let id = self.type_names.len() as TypeNameId;
                self.type_names.push(type_name.into());
                self.type_ids.insert(type_name.into(), id);
                id
            }
        };
        let node = self.addrs.len() as NodeId;
        self.addrs.push(addr);
        self.types.push(type_id);
        self.sizes.push(size);
        self.by_addr.insert(addr, node);
        node
    }

    pub fn node_of(&self, addr: usize) -> Option<NodeId> {
        self.by_addr.get(&addr).copied()
    }

    /// Adds more bytes to a node's own size (a buffer found to belong to it).
    pub fn add_size(&mut self, node: NodeId, bytes: u64) {
        self.sizes[node as usize] += bytes;
    }

    pub fn add_edge(&mut self, from: NodeId, to: NodeId) {
        self.edges.push((from, to));
    }

    pub fn finish(self) -> HeapGraph {
        let n = self.addrs.len();
        let mut offsets = vec![0u32; n + 1];
        for &(from, _) in &self.edges {
            offsets[from as usize + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut targets = vec![0 as NodeId; self.edges.len()];
        // A stable counting sort keeps each node's referents in the order they were added.
        for &(from, to) in &self.edges {
            let slot = &mut fill[from as usize];
            targets[*slot as usize] = to;
            *slot += 1;
        }
        HeapGraph {
            addrs: self.addrs,
            types: self.types,
            type_names: self.type_names,
            sizes: self.sizes,
            offsets,
            targets,
            by_addr: self.by_addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_deduplicated_by_address_and_edges_kept_in_order() {
        let mut b = GraphBuilder::new();
        let d = b.add_node(0x1000, b"dict", 64);
        let l = b.add_node(0x2000, b"list", 56);
        let s = b.add_node(0x3000, b"str", 50);
        assert_eq!(b.add_node(0x2000, b"ignored", 1), l);
        b.add_size(l, 80);
        b.add_edge(l, s);
        b.add_edge(d, l);
        b.add_edge(l, s);
        b.add_edge(d, s);
        let g = b.finish();
        assert_eq!(g.len(), 3);
        assert_eq!(g.edge_count(), 4);
        assert_eq!(g.referents(d), &[l, s]);
        assert_eq!(g.referents(l), &[s, s]);
        assert_eq!(g.referents(s), &[] as &[NodeId]);
        assert_eq!(g.type_name(l), b"list");
        assert_eq!(g.size(l), 136);
        assert_eq!(g.node_of(0x3000), Some(s));
        assert_eq!(g.node_of(0x4000), None);
        assert_eq!(g.type_names().len(), 3);
    }

    #[test]
    fn empty_graph() {
        let g = GraphBuilder::new().finish();
        assert!(g.is_empty());
        assert_eq!(g.edge_count(), 0);
    }
}
