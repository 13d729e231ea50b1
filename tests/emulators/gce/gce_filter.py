"""List filters of the Compute API (`filter=` on list and aggregatedList).

Two syntaxes, as the API documents them (not to be mixed in one filter):

* AIP-160 style: `field OP value` with OP one of `=`, `!=`, `>`, `<`, `>=`,
  `<=`, `:`; terms combined with `AND`, `OR` (which binds tighter, as in
  AIP-160) or juxtaposition (an implicit AND), grouped with parentheses;
  `NOT term` / `-term` negate. Values may be bare or single/double quoted.
  `field:*` tests that a field (or map key) is there; `*` in a value is a
  wildcard for `=`, `!=` and `:`.
* regular expressions: `field eq REGEX` / `field ne REGEX`, alone or as
  parenthesized terms; the regex must match the whole value (RE2 syntax,
  run here with Python's `re`, which is close enough for tests). Quoted
  (`name eq "(a2-highgpu-1g|n1-standard-8)"`, backslashes kept) or bare,
  where groups may nest two deep (`name eq (a2-.*|n1-standard-8)`).

Fields are dotted paths into the resource's JSON (`labels.env`, `status`,
`scheduling.provisioningModel`); an array on the way matches if any element
does. A value without `/` compared with a URL field (zone, machineType) is
compared with the URL's last segment as well, so `zone = us-central1-a`
works. Comparisons are on strings; booleans match `true`/`false`; numbers
compare as numbers when both sides are numbers.
"""

import fnmatch
import re


class FilterError(ValueError):
    pass


TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<lparen>\()|(?P<rparen>\))|
        (?P<keyword>(?:AND|OR|NOT)(?=[\s()]|$))|
        (?P<neg>-(?=[A-Za-z(]))|
        (?P<field>[A-Za-z_][\w.\-]*)\s*
        (?P<op>!=|>=|<=|=|>|<|:|\beq\b|\bne\b)\s*
        (?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|
                  (?:[^\s()]|\((?:[^\s()]|\([^\s()]*\))*\))+)
    )""",
    re.VERBOSE,
)


def _unquote(value, regex=False):
    """A value without its quotes. In a regex only an escaped quote loses its
    backslash: `"n1-standard-\\d+"` keeps its `\\d`."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        if regex:
            return value[1:-1].replace("\\" + value[0], value[0])
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def tokenize(text):
    tokens = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = TOKEN_RE.match(text, pos)
        if not match or match.end() == pos:
            raise FilterError(f"Invalid list filter expression near {text[pos:pos + 30]!r}")
        pos = match.end()
        if match.group("lparen"):
            tokens.append(("(", None))
        elif match.group("rparen"):
            tokens.append((")", None))
        elif match.group("keyword"):
            tokens.append((match.group("keyword"), None))
        elif match.group("neg"):
            tokens.append(("NOT", None))
        else:
            op = match.group("op")
            tokens.append(("cmp", (match.group("field"), op,
                                   _unquote(match.group("value"), regex=op in ("eq", "ne")))))
    return tokens


class _Parser:
    """expr := or_expr (['AND'] or_expr)* ; or_expr := unary ('OR' unary)* ;
    unary := 'NOT' unary | '(' expr ')' | comparison"""

    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def take(self):
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expr(self):
        terms = [self.or_expr()]
        while self.peek() not in (None, ")"):
            if self.peek() == "AND":
                self.take()
            terms.append(self.or_expr())
        return ("and", terms) if len(terms) > 1 else terms[0]

    def or_expr(self):
        terms = [self.unary()]
        while self.peek() == "OR":
            self.take()
            terms.append(self.unary())
        return ("or", terms) if len(terms) > 1 else terms[0]

    def unary(self):
        kind = self.peek()
        if kind == "NOT":
            self.take()
            return ("not", self.unary())
        if kind == "(":
            self.take()
            inner = self.expr()
            if self.peek() != ")":
                raise FilterError("Invalid list filter expression: unbalanced parentheses")
            self.take()
            return inner
        if kind == "cmp":
            return ("cmp", self.take()[1])
        raise FilterError(f"Invalid list filter expression: unexpected {kind or 'end'}")


def compile_filter(text, field_exists=None):
    """A predicate over resource dicts for a filter string (None or blank:
    everything matches). `field_exists(parts)` may refuse unknown fields."""
    if text is None or not text.strip():
        return lambda resource: True
    tokens = tokenize(text)
    parser = _Parser(tokens)
    tree = parser.expr()
    if parser.pos != len(tokens):
        raise FilterError("Invalid list filter expression: unbalanced parentheses")
    ops = {c[1] for kind, c in tokens if kind == "cmp"}
    if ops & {"eq", "ne"} and ops - {"eq", "ne"}:
        raise FilterError("Invalid list filter expression: regular expression (eq, ne) and "
                          "comparison operators cannot be mixed")
    for kind, comparison in tokens:
        if kind == "cmp" and field_exists and not field_exists(comparison[0].split(".")):
            raise FilterError(f"Invalid field name '{comparison[0]}' in list filter expression")
    return lambda resource: _evaluate(tree, resource)


def _evaluate(node, resource):
    kind, payload = node
    if kind == "and":
        return all(_evaluate(n, resource) for n in payload)
    if kind == "or":
        return any(_evaluate(n, resource) for n in payload)
    if kind == "not":
        return not _evaluate(payload, resource)
    return _compare(resource, *payload)


def _leaves(value, parts):
    """Values at a dotted path; arrays fan out."""
    if isinstance(value, list):
        out = []
        for item in value:
            out += _leaves(item, parts)
        return out
    if not parts:
        return [value]
    if isinstance(value, dict) and parts[0] in value:
        return _leaves(value[parts[0]], parts[1:])
    return []


def _as_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _candidates(leaf, wanted):
    """Texts of a leaf to compare with `wanted`: the leaf, and for URLs its
    last segment when `wanted` has no slash."""
    text = _as_text(leaf)
    texts = [text]
    if "/" in text and "/" not in wanted:
        texts.append(text.rstrip("/").rsplit("/", 1)[-1])
    return texts


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def _compare(resource, field, op, wanted):
    parts = field.split(".")
    leaves = _leaves(resource, parts)
    if op == ":" and wanted == "*":
        return any(leaf is not None for leaf in leaves)
    if op == "!=":
        return not _compare(resource, field, "=", wanted)
    if op == "ne":
        return not _compare(resource, field, "eq", wanted)
    for leaf in leaves:
        if leaf is None:
            continue
        if isinstance(leaf, dict):
            # `labels:env` asks whether a map has a key.
            if op == ":" and any(fnmatch.fnmatchcase(k, wanted) for k in leaf):
                return True
            continue
        for text in _candidates(leaf, wanted):
            if op in ("=", ":"):
                if isinstance(leaf, bool):
                    if text == wanted.lower():
                        return True
                elif fnmatch.fnmatchcase(text, wanted) if "*" in wanted else text == wanted:
                    return True
            elif op == "eq":
                try:
                    if re.fullmatch(wanted, text):
                        return True
                except re.error as err:
                    raise FilterError(f"Invalid regular expression {wanted!r}: {err}")
            else:
                a, b = _number(text), _number(wanted)
                left, right = (a, b) if a is not None and b is not None else (text, wanted)
                if ((op == "<" and left < right) or (op == ">" and left > right)
                        or (op == "<=" and left <= right) or (op == ">=" and left >= right)):
                    return True
    return False
