//! Object kinds: what each traced block is, from a heap walk.
//!
//! A block is matched by its address: an object's block starts before the object (GC header,
//! 3.11+ pre-header; the walk records where, see [`HeapGraph::block`]), and the buffers the
//! walk attributed to an object are named after its type and their role (`list (items)`,
//! `dict (keys)`, `bytearray (buffer)`, `set (table)`). Anything else is [`RAW_KIND`]: memory
//! that is not an object the walk reached (C-level buffers of extension types, dict values
//! from 3.11, interpreter internals) or an object nothing tracked refers to.

use std::collections::HashMap;

use super::graph::HeapGraph;
use crate::analysis::snapshot::{Kinds, RAW_KIND};
use crate::error::Result;
use crate::hooks::table::BuildAddressHasher;
use crate::platform::fallible;

/// The kind of each block in `addresses` (in order), by what `graph` found at that address.
pub fn kinds_of(graph: &HeapGraph, addresses: &[usize]) -> Result<Kinds> {
    // Kind names: the graph's type names first (same ids), then buffer kinds and raw.
    let mut names: Vec<Box<[u8]>> = graph.type_names().to_vec();
    // Every name once, even if a type happens to be called like a buffer kind or `raw`.
    let mut extra: HashMap<Vec<u8>, u32> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_vec(), i as u32))
        .collect();
    let mut intern = |names: &mut Vec<Box<[u8]>>, name: Vec<u8>| -> u32 {
        *extra.entry(name).or_insert_with_key(|name| {
            names.push(name.as_slice().into());
            (names.len() - 1) as u32
        })
    };
    let mut by_block: HashMap<usize, u32, BuildAddressHasher> =
        HashMap::with_hasher(BuildAddressHasher);
    by_block.try_reserve(graph.len() + graph.buffers().len())?;
    for node in 0..graph.len() as u32 {
        by_block.insert(graph.block(node), graph.type_id(node));
    }
    let mut buffer_kinds: HashMap<(u32, &'static str), u32> = HashMap::new();
    for buffer in graph.buffers() {
        let owner_type = graph.type_id(buffer.owner);
        let kind = *buffer_kinds
            .entry((owner_type, buffer.label))
            .or_insert_with(|| {
                let mut name = graph.type_name(buffer.owner).to_vec();
                name.extend_from_slice(b" (");
                name.extend_from_slice(buffer.label.as_bytes());
                name.push(b')');
                intern(&mut names, name)
            });
        by_block.entry(buffer.addr).or_insert(kind);
    }
    let mut raw = None;
    let mut of_trace = fallible::with_capacity(addresses.len())?;
    of_trace.extend(addresses.iter().map(|addr| match by_block.get(addr) {
        Some(&kind) => kind,
        None => *raw.get_or_insert_with(|| intern(&mut names, RAW_KIND.to_vec())),
    }));
    Ok(Kinds { names, of_trace })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::graph::{Buffer, GraphBuilder};

    #[test]
    fn blocks_are_matched_to_objects_buffers_or_raw() {
        let mut b = GraphBuilder::new();
        let (list, _) = b.add_node_unnamed(0x1010, 0, 56);
        let (dict, _) = b.add_node_unnamed(0x2010, 1, 64);
        let (user, _) = b.add_node_unnamed(0x3020, 2, 48);
        let (other_list, _) = b.add_node_unnamed(0x4010, 0, 56);
        b.set_block(list, 0x1000);
        b.set_block(dict, 0x2000);
        b.set_block(user, 0x3000);
        b.set_block(other_list, 0x4000);
        let items = |addr, owner| Buffer {
            addr,
            owner,
            label: "items",
            size: 80,
        };
        b.add_buffer(items(0x9000, list));
        b.add_buffer(items(0x9100, other_list));
        b.add_buffer(Buffer {
            addr: 0xa000,
            owner: dict,
            label: "keys",
            size: 200,
        });
        b.name_types(&[
            b"list".to_vec().into(),
            b"dict".to_vec().into(),
            b"app.User".to_vec().into(),
        ]);
        let g = b.finish();
        // (block address, expected kind): object blocks, not object addresses, match.
        let table: &[(usize, &str)] = &[
            (0x1000, "list"),
            (0x9000, "list (items)"),
            (0x2000, "dict"),
            (0xa000, "dict (keys)"),
            (0x3000, "app.User"),
            (0x3020, "raw"),
            (0x9100, "list (items)"),
            (0x5000, "raw"),
        ];
        let addresses: Vec<usize> = table.iter().map(|&(a, _)| a).collect();
        let kinds = kinds_of(&g, &addresses).unwrap();
        let got: Vec<&str> = kinds
            .of_trace
            .iter()
            .map(|&k| std::str::from_utf8(&kinds.names[k as usize]).unwrap())
            .collect();
        let want: Vec<&str> = table.iter().map(|&(_, k)| k).collect();
        assert_eq!(got, want);
        // Each name once.
        let mut names = kinds.names.clone();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), kinds.names.len());
    }

    #[test]
    fn no_traces_no_raw_kind() {
        let g = GraphBuilder::new().finish();
        let kinds = kinds_of(&g, &[]).unwrap();
        assert!(kinds.names.is_empty() && kinds.of_trace.is_empty());
    }
}
