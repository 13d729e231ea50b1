//! The located YAML tree, shared with the providers' configuration files
//! (`gangway-yaml`).

pub use gangway_yaml::{parse, Documents, Kind, Node, Pos, YamlError, MAX_DEPTH, MAX_NODES};
