//! Vectors reserved fallibly, for the paths whose memory grows with the data.
//!
//! `Vec::with_capacity` and `vec![x; n]` abort the process when memory is out; `tracemalloc`
//! raises `MemoryError` there and the program goes on. The snapshot, load, statistics and
//! export paths reserve their per-trace and per-traceback tables through these helpers, so a
//! failure becomes [`Error::OutOfMemory`] and, at the pyo3 boundary, `MemoryError`.

use crate::error::{Error, Result};
use crate::platform::allocator;

/// An empty vector with room for exactly `n` elements. Refused at once while the
/// allocator's reserve is spent (see [`crate::platform::allocator`]): memory ran out moments ago.
pub fn with_capacity<T>(n: usize) -> Result<Vec<T>> {
    check()?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    Ok(v)
}

/// `vec![value; n]`, fallibly.
pub fn filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = with_capacity(n)?;
    v.resize(n, value);
    Ok(v)
}

/// `items.to_vec()`, the table reserved fallibly (an element's own clone, if it owns memory,
/// is small).
pub fn cloned<T: Clone>(items: &[T]) -> Result<Vec<T>> {
    let mut v = with_capacity(items.len())?;
    v.extend(items.iter().cloned());
    Ok(v)
}

/// The first `n` items of `items` in a vector reserved fallibly for exactly `n`.
pub fn collect_n<T>(items: impl Iterator<Item = T>, n: usize) -> Result<Vec<T>> {
    let mut v = with_capacity(n)?;
    for item in items.take(n) {
        // Making an item may allocate (a formatted line): stop once memory ran out.
        check()?;
        v.push(item);
    }
    Ok(v)
}

/// [`Error::OutOfMemory`] while the allocator's reserve is spent: loops whose steps make
/// small allocations call this per step, to stop while what is left of the reserve lasts.
pub fn check() -> Result<()> {
    match allocator::spent() {
        true => Err(Error::OutOfMemory),
        false => Ok(()),
    }
}

/// Makes room for one more element, growing the vector's table fallibly (doubling, as a
/// push would).
pub fn room_for_one<T>(v: &mut Vec<T>) -> Result<()> {
    if v.len() == v.capacity() {
        check()?;
        v.try_reserve(v.len().max(16))?;
    }
    Ok(())
}

/// Makes room for `n` more elements, growing the vector's table fallibly (at least doubling,
/// as pushes would), so that writing them cannot allocate: for encoders whose output grows
/// item by item, which call it once per item with a bound on what the item writes.
#[inline]
pub fn room_for<T>(v: &mut Vec<T>, n: usize) -> Result<()> {
    if v.capacity() - v.len() < n {
        check()?;
        v.try_reserve(n)?;
    }
    Ok(())
}

/// [`room_for_one`] for a map.
pub fn map_room_for_one<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
) -> Result<()> {
    if map.len() == map.capacity() {
        check()?;
        map.try_reserve(map.len().max(16))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_failures() {
        assert_eq!(filled(3, 7u8).unwrap(), vec![7, 7, 7]);
        assert_eq!(cloned(&[1u32, 2]).unwrap(), vec![1, 2]);
        assert_eq!(cloned(&[String::from("a")]).unwrap(), vec!["a"]);
        assert_eq!(collect_n(1..10, 3).unwrap(), vec![1, 2, 3]);
        let mut v: Vec<u8> = Vec::new();
        room_for_one(&mut v).unwrap();
        assert!(v.capacity() >= 1);
        let mut map = std::collections::HashMap::<u8, u8>::new();
        map_room_for_one(&mut map).unwrap();
        assert!(map.capacity() >= 1);
        assert!(with_capacity::<u8>(0).unwrap().is_empty());
        // More than any address space holds: refused, not an abort.
        assert!(matches!(
            with_capacity::<u64>(usize::MAX / 4),
            Err(Error::OutOfMemory)
        ));
    }
}
