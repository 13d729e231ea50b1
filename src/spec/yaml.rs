//! A small YAML tree that remembers where every node came from.
//!
//! Built from `saphyr-parser` events without recursion, with hard limits on
//! nesting depth and on the number of nodes (aliases included), so that
//! hostile input ("billion laughs", 10,000 nested brackets) fails fast with a
//! located error instead of exhausting memory or the stack.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError};

/// Deepest nesting of mappings and sequences we accept.
pub const MAX_DEPTH: usize = 64;
/// Most nodes one document may expand to, aliases counted at full size.
pub const MAX_NODES: usize = 200_000;

/// 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub col: usize,
}

/// One node of the tree.
#[derive(Clone, Debug)]
pub struct Node {
    /// What it is.
    pub kind: Kind,
    /// Where it starts.
    pub pos: Pos,
}

/// The shapes a node can have.
#[derive(Clone, Debug)]
pub enum Kind {
    /// `~`, `null`, or nothing.
    Null,
    /// Any scalar; `quoted` is true for quoted and block scalars, which are
    /// always strings.
    Scalar {
        /// The text.
        text: String,
        /// Whether its style forces it to be a string.
        quoted: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A short name of the node's shape, for "expected X, found Y" messages.
    pub fn describe(&self) -> &'static str {
        match &self.kind {
            Kind::Null => "nothing (null)",
            Kind::Scalar { text, quoted } => {
                if *quoted {
                    "a string"
                } else if text.parse::<f64>().is_ok() {
                    "a number"
                } else if matches!(text.as_str(), "true" | "false" | "True" | "False") {
                    "a boolean"
                } else {
                    "a string"
                }
            }
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// Why the text is not a YAML document we can use.
#[derive(Debug)]
pub struct YamlError {
    /// Where.
    pub pos: Pos,
    /// What.
    pub message: String,
    /// What to do.
    pub hint: Option<String>,
}

/// Parsed documents (at least one when the input is not empty).
pub struct Documents {
    /// The documents in order, each with the position of its start.
    pub docs: Vec<Node>,
}

fn pos_of(m: saphyr_parser::Marker) -> Pos {
    Pos {
        line: m.line().max(1),
        col: m.col() + 1,
    }
}

fn scan_error(e: ScanError) -> YamlError {
    let info = e.info().to_string();
    let hint = if info.contains("recursion limit") {
        Some(format!("nesting is limited to {MAX_DEPTH} levels"))
    } else if info.contains("tab") {
        Some("YAML indentation must use spaces, not tabs".to_string())
    } else {
        Some("check the indentation and quoting around this point".to_string())
    };
    YamlError {
        pos: pos_of(*e.marker()),
        message: format!("invalid YAML: {info}"),
        hint,
    }
}

enum Frame {
    Seq {
        pos: Pos,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        pos: Pos,
        anchor: usize,
        items: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

fn count_nodes(n: &Node) -> usize {
    // Iterative to stay safe on deep trees.
    let mut stack = vec![n];
    let mut count = 0;
    while let Some(n) = stack.pop() {
        count += 1;
        match &n.kind {
            Kind::Seq(items) => stack.extend(items.iter()),
            Kind::Map(items) => {
                for (k, v) in items {
                    stack.push(k);
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    count
}

/// Parses all documents in `text`.
pub fn parse(text: &str) -> Result<Documents, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut docs = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // anchor id -> (node, its size)
    let mut anchors: HashMap<usize, (Node, usize)> = HashMap::new();
    let mut total = 0usize;

    // Adds a finished node to its parent, or finishes a document.
    fn push(stack: &mut [Frame], docs: &mut Vec<Node>, node: Node) {
        match stack.last_mut() {
            None => docs.push(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { items, key, .. }) => match key.take() {
                None => *key = Some(node),
                Some(k) => items.push((k, node)),
            },
        }
    }

    while let Some(ev) = parser.next_event() {
        let (event, span) = ev.map_err(scan_error)?;
        let pos = pos_of(span.start);
        let too_big = |pos| YamlError {
            pos,
            message: format!("document expands to more than {MAX_NODES} nodes"),
            hint: Some(
                "task files are small; this looks like an alias bomb (anchors expanding anchors)"
                    .into(),
            ),
        };
        match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentStart(_) | Event::Nothing => {}
            Event::DocumentEnd => anchors.clear(),
            Event::Alias(id) => {
                let Some((node, size)) = anchors.get(&id) else {
                    return Err(YamlError {
                        pos,
                        message: "alias refers to an unknown anchor".into(),
                        hint: None,
                    });
                };
                total = total.saturating_add(*size);
                if total > MAX_NODES {
                    return Err(too_big(pos));
                }
                let mut node = node.clone();
                node.pos = pos;
                push(&mut stack, &mut docs, node);
            }
            Event::Scalar(text, style, anchor, _tag) => {
                total += 1;
                if total > MAX_NODES {
                    return Err(too_big(pos));
                }
                let quoted = !matches!(style, ScalarStyle::Plain);
                let kind = if !quoted && matches!(text.as_ref(), "" | "~" | "null" | "Null" | "NULL")
                {
                    Kind::Null
                } else {
                    Kind::Scalar {
                        text: text.into_owned(),
                        quoted,
                    }
                };
                let node = Node { kind, pos };
                if anchor > 0 {
                    anchors.insert(anchor, (node.clone(), 1));
                }
                push(&mut stack, &mut docs, node);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                total += 1;
                if stack.len() >= MAX_DEPTH {
                    return Err(YamlError {
                        pos,
                        message: format!("nesting deeper than {MAX_DEPTH} levels"),
                        hint: Some("task files are shallow; check for runaway brackets".into()),
                    });
                }
                if matches!(event, Event::SequenceStart(..)) {
                    stack.push(Frame::Seq {
                        pos,
                        anchor,
                        items: Vec::new(),
                    });
                } else {
                    stack.push(Frame::Map {
                        pos,
                        anchor,
                        items: Vec::new(),
                        key: None,
                    });
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match stack.pop() {
                    Some(Frame::Seq { pos, anchor, items }) => (
                        Node {
                            kind: Kind::Seq(items),
                            pos,
                        },
                        anchor,
                    ),
                    Some(Frame::Map {
                        pos, anchor, items, ..
                    }) => (
                        Node {
                            kind: Kind::Map(items),
                            pos,
                        },
                        anchor,
                    ),
                    None => continue,
                };
                if anchor > 0 {
                    let size = count_nodes(&node);
                    anchors.insert(anchor, (node.clone(), size));
                }
                push(&mut stack, &mut docs, node);
            }
        }
    }
    Ok(Documents { docs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let d = parse("a: 1\nb:\n  c: x\n").unwrap();
        let Kind::Map(items) = &d.docs[0].kind else {
            panic!("not a map")
        };
        assert_eq!(items[1].0.pos, Pos { line: 2, col: 1 });
        let Kind::Map(inner) = &items[1].1.kind else {
            panic!("not a map")
        };
        assert_eq!(inner[0].1.pos, Pos { line: 3, col: 6 });
    }

    #[test]
    fn nulls_and_quoted_strings_differ() {
        let d = parse("a: ~\nb: 'null'\nc:\n").unwrap();
        let Kind::Map(items) = &d.docs[0].kind else {
            panic!()
        };
        assert!(matches!(items[0].1.kind, Kind::Null));
        assert!(matches!(items[1].1.kind, Kind::Scalar { quoted: true, .. }));
        assert!(matches!(items[2].1.kind, Kind::Null));
    }

    #[test]
    fn alias_bomb_is_refused() {
        let mut s = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='k' {
            s.push_str(&format!(
                "{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = c;
        }
        let e = parse(&s).err().expect("bomb must fail");
        assert!(e.message.contains("more than"), "{}", e.message);
    }

    #[test]
    fn deep_nesting_is_refused() {
        let s = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = parse(&s).err().expect("deep must fail");
        assert!(e.message.contains("nesting") || e.message.contains("recursion"));
        let s = (0..200)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect::<String>();
        let e = parse(&s).err().expect("deep block must fail");
        assert!(e.message.contains("nesting"), "{}", e.message);
    }

    #[test]
    fn small_aliases_work() {
        let d = parse("a: &x {k: v}\nb: *x\n").unwrap();
        let Kind::Map(items) = &d.docs[0].kind else {
            panic!()
        };
        assert!(matches!(items[1].1.kind, Kind::Map(_)));
        assert_eq!(items[1].1.pos.line, 2);
    }
}
