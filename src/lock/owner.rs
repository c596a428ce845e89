//! An owner name in one allocation with its length in front, so a holder
//! spends one pointer on it (8 bytes) rather than a pointer and a length (16):
//! with the holder inline in the lock value, that keeps a one-holder lock in a
//! smaller allocation class.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::ptr::NonNull;

const HEADER: usize = 4;

pub struct Owner(NonNull<u8>);

impl Owner {
    pub fn new(bytes: &[u8]) -> Owner {
        let len = u32::try_from(bytes.len()).expect("owner shorter than 4 GiB (Redis strings are)");
        let mut block = Vec::with_capacity(HEADER + bytes.len());
        block.extend(len.to_le_bytes());
        block.extend_from_slice(bytes);
        let raw = Box::into_raw(block.into_boxed_slice());
        Owner(NonNull::new(raw.cast::<u8>()).expect("Box is never null"))
    }

    fn len_bytes(&self) -> usize {
        // SAFETY: the block starts with the 4-byte length written by `new`.
        let header = unsafe { std::slice::from_raw_parts(self.0.as_ptr(), HEADER) };
        u32::from_le_bytes(header.try_into().expect("4 bytes")) as usize
    }
}

impl Deref for Owner {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `new` wrote `len` bytes after the header; the block lives until drop.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(HEADER), self.len_bytes()) }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let total = HEADER + self.len_bytes();
        // SAFETY: rebuilds exactly the boxed slice `new` leaked.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.0.as_ptr(),
                total,
            )))
        };
    }
}

impl From<&[u8]> for Owner {
    fn from(bytes: &[u8]) -> Owner {
        Owner::new(bytes)
    }
}

impl Clone for Owner {
    fn clone(&self) -> Owner {
        Owner::new(self)
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
        for bytes in [&b""[..], b"a", b"\0\r\n", &[7u8; 100_000]] {
            let o = Owner::new(bytes);
            assert_eq!(&*o, bytes);
            assert_eq!(o.clone(), o);
        }
        let mut m = HashMap::new();
        m.insert(Owner::new(b"worker-1"), 1);
        assert_eq!(m.get(&b"worker-1"[..]), Some(&1));
        assert_eq!(m.get(&b"worker-2"[..]), None);
        assert_eq!(std::mem::size_of::<Owner>(), 8);
        assert_eq!(std::mem::size_of::<Option<Owner>>(), 8);
    }
}
