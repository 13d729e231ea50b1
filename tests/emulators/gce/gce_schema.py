"""Compute Engine's discovery document: request routing and schema checks.

The GCE emulator (server.py) does not describe the API itself: it loads
`compute.v1.json`, the discovery document that google-api-python-client ships
(googleapiclient/discovery_cache/documents/), and uses it

* to route requests: every method's `httpMethod` and `path` template
  (relative to the service path `compute/v1/`) becomes a route, so a request
  is known by its method id, e.g. `compute.instances.bulkInsert`;
* to check requests: path and query parameters against the method's
  `parameters` (and the document's global ones), and the JSON body against
  the method's `request` schema;
* to check responses against the method's `response` schema, so the
  emulator's own answers stay honest.

Only the standard library is used. Problems are reported as (path, message)
pairs, the path being a JSON path into the body (`instanceProperties.
scheduling.provisioningModel`, `disks[0].diskSizeGb`, `labels.env`) or a
parameter name.
"""

import base64
import glob
import importlib.util
import json
import os
import re

# Where the document lives inside the google-api-python-client package.
DOCUMENT_IN_PACKAGE = os.path.join("discovery_cache", "documents", "compute.v1.json")

# Query parameters that Google's front end takes on every method besides the
# document's global `parameters`. The Rust client (google-cloud-compute-v1)
# adds `$alt=json` to every call and, in newer releases, `$apiVersion=...`.
EXTRA_SYSTEM_PARAMETERS = {
    "$apiVersion": {"type": "string"},
}

INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}

# RFC 3339 timestamps as Google writes them (fraction and offset optional in
# what we accept).
DATETIME_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
)
DURATION_RE = re.compile(r"^-?\d+(\.\d{1,9})?s$")
MAX_PROBLEMS = 25


def find_discovery(explicit=None, extra_roots=()):
    """Path of compute.v1.json: `explicit` if given, else the copy inside an
    importable googleapiclient, else one inside a venv under extra_roots.
    None if there is none."""
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    try:
        spec = importlib.util.find_spec("googleapiclient")
    except (ImportError, ValueError):
        spec = None
    candidates = []
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(os.path.join(location, DOCUMENT_IN_PACKAGE))
    for root in extra_roots:
        candidates += sorted(glob.glob(os.path.join(
            root, "lib", "python3*", "site-packages", "googleapiclient", DOCUMENT_IN_PACKAGE)))
    for path in candidates:
        if os.path.isfile(path):
            return path
    return None


def describe(value):
    """A short rendering of a JSON value for error messages."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def join(path, key):
    return key if not path else f"{path}.{key}"


def compile_template(template):
    """A discovery path template as (regex, parameter names, literal count).

    `{name}` matches one path segment, `{+name}` any rest of the path."""
    names = []
    pattern = ""
    pos = 0
    for match in re.finditer(r"\{(\+?)([^}]+)\}", template):
        pattern += re.escape(template[pos:match.start()])
        names.append(match.group(2))
        pattern += "(.+)" if match.group(1) else "([^/]+)"
        pos = match.end()
    pattern += re.escape(template[pos:])
    literals = sum(1 for seg in template.split("/") if "{" not in seg)
    return re.compile("^" + pattern + "$"), names, literals


class Discovery:
    """The loaded document, its routes and its checks."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.doc = json.load(f)
        self.path = path
        self.revision = self.doc.get("revision", "?")
        self.schemas = self.doc["schemas"]
        self.global_parameters = self.doc.get("parameters", {})
        self.methods = {}
        self._routes = {}
        self._collect(self.doc.get("resources", {}))
        # Most literal segments first, so `instances/bulkInsert` wins over
        # `instances/{instance}`.
        for routes in self._routes.values():
            routes.sort(key=lambda r: -r[2])

    def _collect(self, resources):
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                self.methods[method["id"]] = method
                regex, names, literals = compile_template(method["path"])
                self._routes.setdefault(method["httpMethod"], []).append(
                    (regex, names, literals, method))
            self._collect(resource.get("resources", {}))

    # ----- routing ----------------------------------------------------------

    def route(self, http_method, relative_path):
        """(method, path parameters) for a path relative to `compute/v1/`,
        or (None, None)."""
        from urllib.parse import unquote

        for regex, names, _, method in self._routes.get(http_method, ()):
            match = regex.match(relative_path)
            if match:
                values = [unquote(v) for v in match.groups()]
                return method, dict(zip(names, values))
        return None, None

    def response_ref(self, method):
        return (method.get("response") or {}).get("$ref")

    def request_ref(self, method):
        return (method.get("request") or {}).get("$ref")

    # ----- parameters -------------------------------------------------------

    def check_parameters(self, method, path_params, query_pairs):
        """Problems with the path and query parameters of a call.

        Unknown query parameters are refused, as Google's front end does
        (`Cannot bind query parameter`)."""
        problems = []
        declared = method.get("parameters", {})
        for name, value in path_params.items():
            spec = declared.get(name, {"type": "string"})
            problems += self._check_parameter(name, value, spec)
        seen = set()
        for name, value in query_pairs:
            spec = declared.get(name)
            if spec is not None and spec.get("location") != "query":
                spec = None
            if spec is None:
                spec = self.global_parameters.get(name)
            if spec is None and name.startswith("$"):
                spec = self.global_parameters.get(name[1:]) or EXTRA_SYSTEM_PARAMETERS.get(name)
            if spec is None:
                problems.append((name, f'Invalid JSON payload received. Unknown name "{name}": '
                                       f"Cannot bind query parameter. Field '{name}' could not be "
                                       "found in request message."))
                continue
            if name in seen and not spec.get("repeated"):
                problems.append((name, f"parameter '{name}' given more than once"))
            seen.add(name)
            problems += self._check_parameter(name, value, spec)
        for name, spec in declared.items():
            if spec.get("required") and spec.get("location") == "query" and name not in seen:
                problems.append((name, f"Required parameter '{name}' not specified"))
        return problems

    def _check_parameter(self, name, value, spec):
        kind = spec.get("type", "string")
        fmt = spec.get("format")
        bad = f"Invalid value for field '{name}': '{value}'."
        if kind == "boolean":
            if value not in ("true", "false"):
                return [(name, f"{bad} Expected 'true' or 'false'.")]
        elif kind == "integer" or fmt in INT_RANGES:
            try:
                number = int(value, 10)
            except ValueError:
                return [(name, f"{bad} Expected an integer.")]
            low, high = INT_RANGES.get(fmt, INT_RANGES["int64"])
            if "minimum" in spec:
                low = max(low, int(spec["minimum"]))
            if "maximum" in spec:
                high = min(high, int(spec["maximum"]))
            if not low <= number <= high:
                return [(name, f"{bad} Must be between {low} and {high}.")]
        if "enum" in spec and value not in spec["enum"]:
            return [(name, f"{bad} Must be one of {', '.join(spec['enum'])}.")]
        if "pattern" in spec and not re.fullmatch(spec["pattern"], value):
            return [(name, f"{bad} Must be a match of regex '{spec['pattern']}'")]
        return []

    # ----- bodies -----------------------------------------------------------

    def check_request_body(self, method, body):
        """Problems with a request body (already parsed JSON) for `method`."""
        ref = self.request_ref(method)
        if ref is None:
            # Methods without a body: nothing, `{}` or null only.
            if body in (None, {}):
                return []
            return [("", "this method takes no request body")]
        return self.check(ref, body, mode="request", method_id=method["id"])

    def check_response_body(self, method, body):
        ref = self.response_ref(method)
        if ref is None:
            return []
        return self.check(ref, body, mode="response", method_id=method["id"])

    def check(self, ref, value, mode="request", method_id=None):
        """Problems with `value` as an instance of schema `ref`.

        mode "request": fields annotated as required for `method_id` must be
        there; mode "response": no such check. Output-only (readOnly) fields
        are accepted in both (GCE ignores them in requests)."""
        problems = []
        self._check({"$ref": ref}, value, "", mode, method_id, problems)
        return problems[:MAX_PROBLEMS]

    def _resolve(self, schema):
        while "$ref" in schema:
            schema = self.schemas[schema["$ref"]]
        return schema

    def _check(self, schema, value, path, mode, method_id, problems):
        if len(problems) >= MAX_PROBLEMS:
            return
        schema = self._resolve(schema)
        if value is None:
            # proto3 JSON: null stands for the field's default.
            return
        kind = schema.get("type")
        fmt = schema.get("format")
        if kind == "any" or fmt == "google.protobuf.Any":
            return
        if kind == "object":
            self._check_object(schema, value, path, mode, method_id, problems)
        elif kind == "array":
            if not isinstance(value, list):
                problems.append((path, f"expected an array, got {json_type(value)} {describe(value)}"))
                return
            for i, item in enumerate(value):
                self._check(schema.get("items", {}), item, f"{path}[{i}]", mode, method_id, problems)
        elif kind == "string":
            self._check_string(schema, value, path, problems)
        elif kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    problems.append((path, f"expected an integer ({fmt or 'int32'}), "
                                           f"got {json_type(value)} {describe(value)}"))
                    return
            low, high = INT_RANGES.get(fmt, INT_RANGES["int32"])
            if not low <= value <= high:
                problems.append((path, f"{value} is out of range for {fmt or 'int32'}"))
        elif kind == "number":
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in (
                "NaN", "Infinity", "-Infinity")
            if not ok:
                problems.append((path, f"expected a number, got {json_type(value)} {describe(value)}"))
        elif kind == "boolean":
            if not isinstance(value, bool):
                problems.append((path, f"expected a boolean, got {json_type(value)} {describe(value)}"))
        else:
            problems.append((path, f"schema type {kind!r} is not understood by the emulator"))

    def _check_object(self, schema, value, path, mode, method_id, problems):
        if not isinstance(value, dict):
            problems.append((path, f"expected an object, got {json_type(value)} {describe(value)}"))
            return
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is None and additional is None:
            return  # a free-form object
        for key, item in value.items():
            if properties and key in properties:
                self._check(properties[key], item, join(path, key), mode, method_id, problems)
            elif additional is not None:
                self._check(additional, item, join(path, key), mode, method_id, problems)
            else:
                where = f" at '{path}'" if path else ""
                problems.append((join(path, key), f'Invalid JSON payload received. Unknown name '
                                                  f'"{key}"{where}: Cannot find field.'))
        if mode == "request" and properties and method_id:
            for key, spec in properties.items():
                required_for = spec.get("annotations", {}).get("required", ())
                if method_id in required_for and value.get(key) in (None, ""):
                    problems.append((join(path, key),
                                     f"Required field '{join(path, key)}' not specified"))

    def _check_string(self, schema, value, path, problems):
        fmt = schema.get("format")
        if not isinstance(value, str):
            if fmt in ("int64", "uint64") and isinstance(value, int) and not isinstance(value, bool):
                problems.append((path, f"{value} is a JSON number, but {fmt} fields are JSON "
                                       f'strings in this API (send "{value}")'))
            else:
                problems.append((path, f"expected a string, got {json_type(value)} {describe(value)}"))
            return
        if fmt in ("int64", "uint64"):
            try:
                number = int(value, 10)
            except ValueError:
                problems.append((path, f"{describe(value)} is not a decimal {fmt}"))
                return
            low, high = INT_RANGES[fmt]
            if not low <= number <= high:
                problems.append((path, f"{value} is out of range for {fmt}"))
        elif fmt == "byte":
            candidate = value.replace("-", "+").replace("_", "/")
            candidate += "=" * (-len(candidate) % 4)
            try:
                base64.b64decode(candidate, validate=True)
            except ValueError:
                problems.append((path, f"{describe(value)} is not base64 (format byte)"))
        elif fmt == "google-datetime":
            if not DATETIME_RE.match(value):
                problems.append((path, f"{describe(value)} is not an RFC 3339 timestamp"))
        elif fmt == "google-duration":
            if not DURATION_RE.match(value):
                problems.append((path, f'{describe(value)} is not a duration like "3.5s"'))
        if "enum" in schema and value not in schema["enum"]:
            problems.append((path, f"{describe(value)} is not one of {', '.join(schema['enum'])}"))
        if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
            problems.append((path, f"{describe(value)} does not match the pattern "
                                   f"{schema['pattern']}"))

    # ----- field paths (for list filters) -----------------------------------

    def field_exists(self, ref, parts):
        """Whether a dotted field path (split) names a field of schema `ref`:
        maps take any key, arrays are looked through."""
        schema = self._resolve({"$ref": ref})
        for part in parts:
            while schema.get("type") == "array":
                schema = self._resolve(schema.get("items", {}))
            properties = schema.get("properties")
            if properties and part in properties:
                schema = self._resolve(properties[part])
            elif schema.get("additionalProperties") is not None:
                schema = self._resolve(schema["additionalProperties"])
            elif schema.get("type") in ("any",) or (
                    schema.get("type") == "object" and not properties):
                return True
            else:
                return False
        return True
