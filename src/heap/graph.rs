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

use crate::hooks::table::BuildAddressHasher;
use crate::platform::fallible;

/// Addresses are keys of the hottest maps here; the trace table's hasher suits them.
type AddrMap = HashMap<usize, NodeId, BuildAddressHasher>;

/// Index of a node in a [`HeapGraph`].
pub type NodeId = u32;

/// What [`GraphBuilder`] hands out instead of a node once memory ran out: every method
/// ignores it, and [`GraphBuilder::try_finish`] reports the failure.
pub const NO_NODE: NodeId = NodeId::MAX;
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
    by_addr: AddrMap,
    /// Start of the memory block holding the object, per node (before the GC header and the
    /// 3.11+ pre-header); the address allocation traces are keyed by. Equal to the address
    /// when the builder was not told otherwise.
    blocks: Vec<usize>,
    /// Separately allocated blocks that belong to an object (a list's item array, ...).
    buffers: Vec<Buffer>,
    /// Objects held by threads' running frames: `(thread id, node)`.
    stack_refs: Vec<(u64, NodeId)>,
}

/// A memory block that is not an object but belongs to one: what it is named after
/// (`list (items)`) and how big it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// The block's address, as allocation traces key it.
    pub addr: usize,
    pub owner: NodeId,
    /// What the block is to its owner: `items`, `keys`, `values`, `buffer`, `table`.
    pub label: &'static str,
    /// Its traced size, or an estimate from the owner's fields, or 0 if neither is known.
    pub size: u64,
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

    /// The start of the memory block that holds the object (see [`crate::capture::Interpreter::object_block`]).
    pub fn block(&self, node: NodeId) -> usize {
        self.blocks[node as usize]
    }

    /// The non-object blocks attributed to objects, in the order the walk found them.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// The objects each thread's running frames hold directly, as `(thread id, node)` (the
    /// thread id is `threading.get_ident()`'s), innermost frame first. Up to 3.10 the frames
    /// are objects and the nodes are the frames; from 3.11 a running frame is not an object
    /// and the nodes are its locals, function and `f_locals`. Objects held only by a running
    /// function are found through these.
    pub fn stack_refs(&self) -> &[(u64, NodeId)] {
        &self.stack_refs
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
    by_addr: AddrMap,
    edges: Vec<(NodeId, NodeId)>,
    blocks: Vec<usize>,
    buffers: Vec<Buffer>,
    stack_refs: Vec<(u64, NodeId)>,
    /// Set when a table could not grow: the walk runs in the middle of the interpreter's
    /// state (it cannot unwind), so it stops adding, and `try_finish` says why.
    out_of_memory: bool,
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
        let type_id = self.intern_type(type_name);
        self.push(addr, type_id, size)
    }

    fn push(&mut self, addr: usize, type_id: TypeNameId, size: u64) -> NodeId {
        if self.out_of_memory || self.room_for_a_node().is_err() {
            self.out_of_memory = true;
            return NO_NODE;
        }
        let node = self.addrs.len() as NodeId;
        self.addrs.push(addr);
        self.types.push(type_id);
        self.sizes.push(size);
        self.blocks.push(addr);
        self.by_addr.insert(addr, node);
        node
    }

    fn room_for_a_node(&mut self) -> crate::error::Result<()> {
        fallible::room_for_one(&mut self.addrs)?;
        fallible::room_for_one(&mut self.types)?;
        fallible::room_for_one(&mut self.sizes)?;
        fallible::room_for_one(&mut self.blocks)?;
        fallible::map_room_for_one(&mut self.by_addr)
    }

    /// True once a table could not grow; from then on nothing more is added.
    pub fn out_of_memory(&self) -> bool {
        self.out_of_memory
    }

    /// Records that memory the walk needed could not be had (see [`NO_NODE`]).
    pub fn note_out_of_memory(&mut self) {
        self.out_of_memory = true;
    }

    /// Pushes unless memory ran out (now or before).
    fn push_fallibly<T>(&mut self, items: impl FnOnce(&mut Self) -> &mut Vec<T>, item: T) {
        if self.out_of_memory {
            return;
        }
        let items = items(self);
        if fallible::room_for_one(items).is_err() {
            self.out_of_memory = true;
            return;
        }
        items.push(item);
    }

    /// Adds the object at `addr` with a provisional type number, to be named later by
    /// [`GraphBuilder::name_types`]; returns its node and whether it is new. The walk cannot
    /// read type names while walking (that may allocate), so it numbers the distinct type
    /// objects and names them afterwards.
    pub fn add_node_unnamed(
        &mut self,
        addr: usize,
        provisional_type: u32,
        size: u64,
    ) -> (NodeId, bool) {
        if let Some(&node) = self.by_addr.get(&addr) {
            return (node, false);
        }
        (self.push(addr, provisional_type, size), true)
    }

    /// Names the provisional type numbers of [`GraphBuilder::add_node_unnamed`]:
    /// `names[provisional]`. Distinct type objects with one name share a type id.
    pub fn name_types(&mut self, names: &[Box<[u8]>]) {
        let ids: Vec<TypeNameId> = names.iter().map(|name| self.intern_type(name)).collect();
        for t in &mut self.types {
            *t = ids[*t as usize];
        }
    }

    fn intern_type(&mut self, type_name: &[u8]) -> TypeNameId {
        match self.type_ids.get(type_name) {
            Some(&id) => id,
            None => {
                let id = self.type_names.len() as TypeNameId;
                self.type_names.push(type_name.into());
                self.type_ids.insert(type_name.into(), id);
                id
            }
        }
    }

    /// Records where the object's memory block starts, when it is not at the object's address.
    pub fn set_block(&mut self, node: NodeId, block: usize) {
        if let Some(slot) = self.blocks.get_mut(node as usize) {
            *slot = block;
        }
    }

    /// Records that a running frame of `thread` holds `node`.
    pub fn add_stack_ref(&mut self, thread: u64, node: NodeId) {
        if node != NO_NODE {
            self.push_fallibly(|b| &mut b.stack_refs, (thread, node));
        }
    }

    /// Records a non-object block owned by `owner` and adds its size to the owner's.
    pub fn add_buffer(&mut self, buffer: Buffer) {
        if buffer.owner == NO_NODE {
            return;
        }
        self.sizes[buffer.owner as usize] += buffer.size;
        self.push_fallibly(|b| &mut b.buffers, buffer);
    }

    pub fn node_of(&self, addr: usize) -> Option<NodeId> {
        self.by_addr.get(&addr).copied()
    }

    /// Adds more bytes to a node's own size (a buffer found to belong to it).
    pub fn add_size(&mut self, node: NodeId, bytes: u64) {
        if let Some(size) = self.sizes.get_mut(node as usize) {
            *size += bytes;
        }
    }

    pub fn add_edge(&mut self, from: NodeId, to: NodeId) {
        if from != NO_NODE && to != NO_NODE {
            self.push_fallibly(|b| &mut b.edges, (from, to));
        }
    }

    /// [`GraphBuilder::try_finish`] for graphs built by hand (tests).
    #[cfg(test)]
    pub fn finish(self) -> HeapGraph {
        self.try_finish()
            .expect("a small test graph fits in memory")
    }

    /// The graph, or [`Error::OutOfMemory`](crate::error::Error::OutOfMemory) if a table
    /// could not grow while it was built.
    pub fn try_finish(self) -> crate::error::Result<HeapGraph> {
        if self.out_of_memory {
            return Err(crate::error::Error::OutOfMemory);
        }
        let n = self.addrs.len();
        let mut offsets = fallible::filled(n + 1, 0u32)?;
        for &(from, _) in &self.edges {
            offsets[from as usize + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = fallible::cloned(&offsets)?;
        let mut targets = fallible::filled(self.edges.len(), 0 as NodeId)?;
        // A stable counting sort keeps each node's referents in the order they were added.
        for &(from, to) in &self.edges {
            let slot = &mut fill[from as usize];
            targets[*slot as usize] = to;
            *slot += 1;
        }
        Ok(HeapGraph {
            addrs: self.addrs,
            types: self.types,
            type_names: self.type_names,
            sizes: self.sizes,
            offsets,
            targets,
            by_addr: self.by_addr,
            blocks: self.blocks,
            buffers: self.buffers,
            stack_refs: self.stack_refs,
        })
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
    fn provisional_types_are_named_after_the_walk_and_merged_by_name() {
        let mut b = GraphBuilder::new();
        let (a, new_a) = b.add_node_unnamed(0x1000, 0, 32);
        let (c, _) = b.add_node_unnamed(0x2000, 1, 48);
        let (d, _) = b.add_node_unnamed(0x3000, 2, 16);
        assert_eq!(b.add_node_unnamed(0x1000, 2, 1), (a, false));
        assert!(new_a);
        b.set_block(c, 0x1ff0);
        b.add_buffer(Buffer {
            addr: 0x9000,
            owner: c,
            label: "items",
            size: 64,
        });
        b.add_stack_ref(7, d);
        b.name_types(&[
            b"app.User".to_vec().into(),
            b"list".to_vec().into(),
            b"app.User".to_vec().into(),
        ]);
        let g = b.finish();
        assert_eq!(g.type_name(a), b"app.User");
        assert_eq!(g.type_name(c), b"list");
        assert_eq!(g.type_id(a), g.type_id(d));
        assert_eq!(g.type_names().len(), 2);
        assert_eq!(g.block(a), 0x1000);
        assert_eq!(g.block(c), 0x1ff0);
        assert_eq!(g.size(c), 112);
        assert_eq!(g.stack_refs(), &[(7, d)]);
        assert_eq!(
            g.buffers(),
            &[Buffer {
                addr: 0x9000,
                owner: c,
                label: "items",
                size: 64
            }]
        );
    }

    #[test]
    fn empty_graph() {
        let g = GraphBuilder::new().finish();
        assert!(g.is_empty());
        assert_eq!(g.edge_count(), 0);
    }
}
