//! [`Name`]: a shared, immutable string for the catalog's repeated fields.
//!
//! A catalog of 90,000 offerings names only a few thousand distinct clouds,
//! regions, zones, instance types and accelerators. Each offering holding
//! its own `String`s cost five heap blocks per row (about 30 MB for the
//! published SkyPilot catalogs); a `Name` is a reference-counted pointer to
//! one copy, 16 bytes, cloned without allocating. The count is not atomic
//! (`Rc`): a catalog lives on the thread that loaded it, and with 450,000
//! names to count up and down, atomic counts cost 4 ms of a 27 ms load.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

use serde::{Serialize, Serializer};

/// A shared string (see the module docs). Compares, hashes and orders as
/// its text.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Rc<str>);

impl Name {
    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Address of the shared copy: a key for tables that look each copy
    /// up once (two names at one address have the same text).
    pub(crate) fn addr(&self) -> usize {
        Rc::as_ptr(&self.0) as *const u8 as usize
    }
}

impl Default for Name {
    fn default() -> Name {
        Name::from("")
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name(Rc::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name(Rc::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name(Rc::from(s.as_str()))
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == &*other.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Hands out one shared copy per distinct text, so rows parsed from one
/// file share their names.
#[derive(Default)]
pub(crate) struct Interner {
    names: std::collections::HashSet<Name>,
}

impl Interner {
    /// The shared copy of `s`.
    pub(crate) fn get(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n = Name::from(s);
        self.names.insert(n.clone());
        n
    }
}
