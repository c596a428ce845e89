//! An owner name, kept inline when it is short (as Redisson's `uuid:threadId`
//! owners are): the one-holder lock, by far the most common value, is then a
//! single allocation. Freeing it touches one block, and acquiring allocates
//! once (`FLUSHALL` of a million locks, loads and acquires all pay per
//! allocation). Longer owners go to the heap.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Owners up to this long live inline (the whole `Owner` is 48 bytes).
const INLINE: usize = 46;

#[derive(Clone)]
pub struct Owner(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Owner {
    pub fn new(bytes: &[u8]) -> Owner {
        if bytes.len() <= INLINE {
            let mut inline = [0u8; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Owner(Repr::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            })
        } else {
            Owner(Repr::Heap(bytes.into()))
        }
    }

    /// Bytes allocated beside the `Owner` itself (0 when inline).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Inline { .. } => 0,
            Repr::Heap(bytes) => bytes.len(),
        }
    }
}

impl Deref for Owner {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Heap(bytes) => bytes,
        }
    }
}

impl From<&[u8]> for Owner {
    fn from(bytes: &[u8]) -> Owner {
        Owner::new(bytes)
    }
}

impl PartialEq for Owner {
    fn eq(&self, other: &Owner) -> bool {
        **self == **other
    }
}

impl Eq for Owner {}

impl Hash for Owner {
    // Must hash as the `[u8]` it borrows as, for map lookups by `&[u8]`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl Borrow<[u8]> for Owner {
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn owners_round_trip_compare_and_look_up_by_bytes() {
        let edge = [9u8; INLINE + 1];
        for bytes in [
            &b""[..],
            b"a",
            b"\0\r\n",
            &edge[..INLINE],
            &edge,
            &[7u8; 100_000],
        ] {
            let o = Owner::new(bytes);
            assert_eq!(&*o, bytes);
            assert_eq!(o.clone(), o);
        }
        let mut m = HashMap::new();
        m.insert(Owner::new(b"worker-1"), 1);
        assert_eq!(m.get(&b"worker-1"[..]), Some(&1));
        assert_eq!(m.get(&b"worker-2"[..]), None);
        assert_eq!(std::mem::size_of::<Owner>(), 48);
        assert_eq!(std::mem::size_of::<Option<Owner>>(), 48);
    }
}
