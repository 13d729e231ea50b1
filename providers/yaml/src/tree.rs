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
/// What a node costs in the tree besides its text, for the byte budget
/// (the size of a [`Node`] and its share of a parent's vector, rounded up).
pub const NODE_BYTES: usize = 64;
/// The byte budget of the tree built from `len` bytes of YAML: the tree
/// (nodes and text, aliases counted at full size) may cost at most this
/// much, so a file under the task size cap never costs more than a small
/// multiple of its size however its aliases repeat its strings.
pub fn max_tree_bytes(len: usize) -> usize {
    len.saturating_mul(16).saturating_add(1 << 20)
}

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
    /// Dotted path of the key or item involved, empty when unknown.
    pub field: String,
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

fn nesting_error(pos: Pos) -> YamlError {
    YamlError {
        pos,
        field: String::new(),
        message: format!("nesting deeper than {MAX_DEPTH} levels"),
        hint: Some("task files are shallow; check for runaway brackets".into()),
    }
}

fn scan_error(e: ScanError, text: &str, stack: &[Frame]) -> YamlError {
    let pos = pos_of(*e.marker());
    let info = e.info();
    if info.contains("recursion limit") {
        // The scanner's own (deeper) limit on `[`/`{` can trip before ours.
        return nesting_error(pos);
    }
    let hint = if info.contains("tab") {
        "YAML indentation must use spaces, not tabs".to_string()
    } else if info.contains("escape") {
        "inside double quotes write \\\\ for a backslash, or use single quotes".to_string()
    } else if info.contains("quoted scalar") {
        "check that the quote opened here is closed; a quoted string that goes on \
         to the next line needs that line indented"
            .to_string()
    } else if info.contains("unknown anchor") {
        "define the anchor (&name) before an alias (*name) uses it".to_string()
    } else if let Some((c, at)) = open_flow(text, stack) {
        format!(
            "this is inside the '{c}' opened at line {}, column {}; check that it is closed",
            at.line, at.col
        )
    } else if info.contains("did not find expected key") {
        "this line is indented differently from the lines around it; \
         the keys of one mapping must line up"
            .to_string()
    } else if info.contains("mapping values are not allowed") {
        "quote values that contain ': ', and check the indentation of this line".to_string()
    } else {
        "check the indentation and quoting around this point".to_string()
    };
    YamlError {
        pos,
        field: path_of(stack),
        message: format!("invalid YAML: {info}"),
        hint: Some(hint),
    }
}

/// The innermost `[` or `{` that is still open, and where it is.
fn open_flow(text: &str, stack: &[Frame]) -> Option<(char, Pos)> {
    stack.iter().rev().find_map(|f| {
        let pos = match f {
            Frame::Seq { pos, .. } | Frame::Map { pos, .. } => *pos,
        };
        let c = text
            .lines()
            .nth(pos.line - 1)?
            .chars()
            .nth(pos.col - 1)
            .filter(|c| matches!(c, '[' | '{'))?;
        Some((c, pos))
    })
}

/// The dotted path (`resources.any_of[0].cloud`) to where the parser is.
fn path_of(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Seq { items, .. } => path.push_str(&format!("[{}]", items.len())),
            Frame::Map { key: Some(k), .. } => {
                if let Kind::Scalar { text, .. } = &k.kind {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(text);
                }
            }
            Frame::Map { key: None, .. } => {}
        }
    }
    path
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
        /// Scalar keys so far, to refuse duplicates.
        seen: HashMap<String, Pos>,
    },
}

/// The number of nodes in `n`, and how many levels of mappings and
/// sequences it nests (0 for a scalar).
/// A node's count of nodes, its cost in bytes (see [`NODE_BYTES`]) and
/// its nesting levels.
fn measure(n: &Node) -> (usize, usize, usize) {
    // Iterative to stay safe on deep trees.
    let mut stack = vec![(n, 0)];
    let (mut count, mut bytes, mut height) = (0, 0usize, 0);
    while let Some((n, above)) = stack.pop() {
        count += 1;
        bytes = bytes.saturating_add(cost(n));
        match &n.kind {
            Kind::Seq(items) => {
                height = height.max(above + 1);
                stack.extend(items.iter().map(|i| (i, above + 1)));
            }
            Kind::Map(items) => {
                height = height.max(above + 1);
                for (k, v) in items {
                    stack.push((k, above + 1));
                    stack.push((v, above + 1));
                }
            }
            _ => {}
        }
    }
    (count, bytes, height)
}

/// What one node costs in the tree, its children aside.
fn cost(n: &Node) -> usize {
    match &n.kind {
        Kind::Scalar { text, .. } => NODE_BYTES + text.len(),
        _ => NODE_BYTES,
    }
}

/// Parses all documents in `text`.
pub fn parse(text: &str) -> Result<Documents, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut docs = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // anchor id -> (node, its size, its cost in bytes, its nesting levels)
    let mut anchors: HashMap<usize, (Node, usize, usize, usize)> = HashMap::new();
    let mut total = 0usize;
    let mut bytes = 0usize;
    let budget = max_tree_bytes(text.len());
    let too_costly = |pos, bytes: usize| YamlError {
        pos,
        field: String::new(),
        message: format!(
            "document expands to more than {} MiB ({} MiB so far) from {} KiB of YAML",
            budget >> 20,
            bytes >> 20,
            text.len().div_ceil(1024)
        ),
        hint: Some(
            "aliases (*name) repeat their anchor's text in full; \
             write the value once, or use fewer aliases of large values"
                .into(),
        ),
    };

    // Adds a finished node to its parent, or finishes a document. A key
    // that its mapping already has is an error.
    fn push(stack: &mut [Frame], docs: &mut Vec<Node>, node: Node) -> Result<(), YamlError> {
        let twice = match stack.last_mut() {
            None => {
                docs.push(node);
                None
            }
            Some(Frame::Seq { items, .. }) => {
                items.push(node);
                None
            }
            Some(Frame::Map {
                items, key, seen, ..
            }) => match key.take() {
                Some(k) => {
                    items.push((k, node));
                    None
                }
                None => {
                    let at = node.pos;
                    let first = match &node.kind {
                        Kind::Scalar { text, .. } => seen.insert(text.clone(), at),
                        _ => None,
                    };
                    *key = Some(node);
                    first.map(|first| (first, at))
                }
            },
        };
        match twice {
            None => Ok(()),
            Some((first, pos)) => Err(YamlError {
                pos,
                field: path_of(stack),
                message: format!(
                    "key appears twice; the first is at line {}, column {}",
                    first.line, first.col
                ),
                hint: Some("remove one of them".into()),
            }),
        }
    }

    while let Some(ev) = parser.next_event() {
        let (event, span) = ev.map_err(|e| scan_error(e, text, &stack))?;
        let pos = pos_of(span.start);
        let too_big = |pos| YamlError {
            pos,
            field: String::new(),
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
                let Some((node, size, cost_bytes, height)) = anchors.get(&id) else {
                    return Err(YamlError {
                        pos,
                        field: path_of(&stack),
                        message: "alias refers to an unknown anchor".into(),
                        hint: Some(
                            "define the anchor (&name) before an alias (*name) uses it".into(),
                        ),
                    });
                };
                total = total.saturating_add(*size);
                if total > MAX_NODES {
                    return Err(too_big(pos));
                }
                bytes = bytes.saturating_add(*cost_bytes);
                if bytes > budget {
                    return Err(too_costly(pos, bytes));
                }
                // An alias nests its anchor's levels where it stands:
                // chained anchors, each within the limit, built trees
                // thousands of levels deep (and overflowed the stack).
                if stack.len() + height > MAX_DEPTH {
                    return Err(nesting_error(pos));
                }
                let mut node = node.clone();
                node.pos = pos;
                push(&mut stack, &mut docs, node)?;
            }
            Event::Scalar(text, style, anchor, _tag) => {
                total += 1;
                if total > MAX_NODES {
                    return Err(too_big(pos));
                }
                let quoted = !matches!(style, ScalarStyle::Plain);
                let kind =
                    if !quoted && matches!(text.as_ref(), "" | "~" | "null" | "Null" | "NULL") {
                        Kind::Null
                    } else {
                        Kind::Scalar {
                            text: text.into_owned(),
                            quoted,
                        }
                    };
                let node = Node { kind, pos };
                let c = cost(&node);
                bytes = bytes.saturating_add(c);
                if bytes > budget {
                    return Err(too_costly(pos, bytes));
                }
                if anchor > 0 {
                    anchors.insert(anchor, (node.clone(), 1, c, 0));
                }
                push(&mut stack, &mut docs, node)?;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                total += 1;
                bytes = bytes.saturating_add(NODE_BYTES);
                if stack.len() >= MAX_DEPTH {
                    return Err(nesting_error(pos));
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
                        seen: HashMap::new(),
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
                    let (size, cost_bytes, height) = measure(&node);
                    anchors.insert(anchor, (node.clone(), size, cost_bytes, height));
                }
                push(&mut stack, &mut docs, node)?;
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

    /// The review's case: a 220 KB file whose aliases repeat one 20 KB
    /// string made `gangway optimize` use 790 MB. The tree's cost is now
    /// bounded by bytes, not only by nodes: refused, naming the line of
    /// the alias that went over.
    #[test]
    fn aliases_of_a_large_string_are_refused_by_bytes() {
        let big = "x".repeat(20_000);
        let mut s = format!("big: &big \"{big}\"\nlist:\n");
        while s.len() < 220_000 {
            s.push_str("  - *big\n");
        }
        let e = parse(&s).err().expect("must be refused");
        assert!(e.message.contains("MiB"), "{}", e.message);
        // The budget: 16 x 220 KB + 1 MiB, about 4.4 MiB; the first alias
        // past it is about (4.4 MiB - 20 KB) / 20 KB aliases in.
        let line = e.pos.line;
        assert!((200..260).contains(&line), "refused at line {line}");
        // A few aliases of the same string are fine.
        let ok = format!("big: &big \"{big}\"\nlist: [*big, *big, *big]\n");
        assert!(parse(&ok).is_ok());
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

    /// Found with a hand-made input while fuzzing the task parser: each
    /// anchor nests within the limit, but an alias of one inside the next
    /// adds their levels up. 80 of them (10 KiB) made a 4,800-level tree
    /// whose clone overflowed a test thread's stack in a debug build.
    #[test]
    fn deep_nesting_through_aliases_is_refused() {
        let deep = |anchors: usize, levels: usize| {
            let mut s = format!("x0: &x0 {}{}\n", "[".repeat(levels), "]".repeat(levels));
            for i in 1..anchors {
                let (open, close) = ("[".repeat(levels - 1), "]".repeat(levels - 1));
                s.push_str(&format!("x{i}: &x{i} {open}*x{}{close}\n", i - 1));
            }
            s
        };
        let e = parse(&deep(2, 40)).err().expect("80 levels must fail");
        assert!(
            e.message.contains("nesting deeper than 64"),
            "{}",
            e.message
        );
        assert_eq!(e.pos, Pos { line: 2, col: 48 });
        let e = parse(&deep(80, 60)).err().expect("4,800 levels must fail");
        assert!(
            e.message.contains("nesting deeper than 64"),
            "{}",
            e.message
        );
        // Within the limit, aliases still nest.
        assert!(parse(&deep(2, 30)).is_ok());
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_path() {
        let e = parse("a:\n  - b: 1\n    b: 2\n").err().expect("duplicate");
        assert_eq!(
            (e.pos, e.field.as_str()),
            (Pos { line: 3, col: 5 }, "a[0].b")
        );
        assert!(e.message.contains("line 2, column 5"), "{}", e.message);
        // The same key in different mappings is fine.
        assert!(parse("a: {k: 1}\nb: {k: 2}\nc:\n  - k: 1\n  - k: 2\n").is_ok());
    }

    #[test]
    fn an_unclosed_bracket_is_named_in_the_hint() {
        let e = parse("a: [1, 2\nb: 3\n").err().expect("unclosed");
        let hint = e.hint.unwrap_or_default();
        assert!(hint.contains("'[' opened at line 1, column 4"), "{hint}");
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
