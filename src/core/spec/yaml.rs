//! The located YAML tree, shared with the providers' configuration files
//! (`gangway-yaml`).

pub(crate) use gangway_yaml::{parse, Kind, Node};
