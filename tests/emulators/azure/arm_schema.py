"""The ARM fake's request checks against the official Azure SDK models.

server.py does not describe Azure's resources itself: it reads
`arm-schema.json`, which extract_schema.py writes (at setup time, with the
venv's python) from the generated models of azure-mgmt-compute,
azure-mgmt-network and azure-mgmt-resource, one API version per resource
provider. Each model there is the OpenAPI definition of that version
(property names and nesting under `properties`, JSON types, required and
read-only flags, enumerations, patterns and ranges).

`Schema.check(set, model, body)` walks a request body against a model and
returns problems as (kind, path, message), kind one of

* `unknown`  a property the model does not have;
* `type`     a value of the wrong JSON type;
* `required` a required property that is missing;
* `enum`     a string that is none of the enumeration's values (compared
             without regard to case, as ARM's providers do);
* `constraint` a pattern, length, range or item count the model sets;
* `readonly` a read-only property sent by the client. ARM ignores those, so
             the fake does too, but still counts them as violations.

Standard library only.
"""

import copy
import glob
import json
import os
import re

MAX_PROBLEMS = 25

# Enumerations the specification marks extensible and ARM does not hold
# clients to (`x-ms-enum: modelAsString: true` with a list that is known to be
# incomplete): any string is taken. Others are checked (without regard to
# case), which is stricter than ARM for most extensible enumerations: it
# catches typos, and gangway only sends documented values.
OPEN_ENUMS = {
    "VirtualMachineSizeTypes",  # every VM size since 2020 is missing from it
}

# The .NET type names ARM's deserializer uses in its messages.
NET_TYPES = {
    "str": "System.String", "int": "System.Int32", "float": "System.Double",
    "bool": "System.Boolean", "datetime": "System.DateTime", "duration": "System.TimeSpan",
    "date": "System.DateTime", "bytes": "System.Byte[]", "list": "List", "map": "Dictionary",
}


def find_schema(explicit=None, roots=()):
    """Path of arm-schema.json: `explicit` if given, else the first
    `<root>/arm-schema.json` of the venvs in `roots`. None if none exists."""
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "arm-schema.json"))):
            if os.path.isfile(path):
                return path
    return None


def describe(value):
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Schema:
    def __init__(self, path):
        with open(path) as f:
            doc = json.load(f)
        self.sets = doc["sets"]
        self.path = path

    def api_version(self, set_name):
        return self.sets[set_name]["api_version"]

    def package(self, set_name):
        return self.sets[set_name]["package"]

    def has_model(self, set_name, model):
        return model in self.sets[set_name]["models"]

    def check(self, set_name, model, body, request=True):
        """Problems of `body` as a `model` of the set. `request=False`
        checks an answer instead: read-only properties are expected there
        and required ones are not looked for."""
        problems = []
        models = self.sets[set_name]["models"]
        walker = copy.copy(self)  # one per call: servers check from several threads
        walker.request = request
        walker._model(models, model, body, "", problems)
        return problems[:MAX_PROBLEMS]

    # ----- the walk ------------------------------------------------------

    def _model(self, models, name, value, path, problems):
        spec = models.get(name)
        if spec is None:
            return
        if not isinstance(value, dict):
            problems.append(("type", path or "$", f"Error converting value {describe(value)} "
                             f"to type '{name}'. Path '{path}'."))
            return
        disc = spec.get("disc")
        if disc and isinstance(value.get(disc["key"]), str):
            sub = disc["map"].get(value[disc["key"]])
            if sub and sub in models and sub != name:
                spec = models[sub]
                name = sub
        self._props(models, name, spec["props"], value, path, problems)

    def _props(self, models, type_name, props, value, path, problems):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            node = props.get(key)
            if node is None:
                problems.append(("unknown", where, f"Could not find member '{key}' on object of "
                                 f"type '{type_name}'. Path '{where}'."))
                continue
            if item is None:
                continue
            if node.get("ro") and self.request:
                problems.append(("readonly", where, f"'{where}' is read-only; the client sent "
                                 f"{describe(item)}, which ARM ignores."))
                continue
            self._node(models, node, item, where, problems)
        for key, node in props.items():
            if not self.request:
                break
            if node.get("req") and not node.get("ro") and value.get(key) is None:
                where = f"{path}.{key}" if path else key
                problems.append(("required", where, f"Required property '{key}' not found in "
                                 f"JSON. Path '{path or '$'}'."))

    def _node(self, models, node, value, path, problems):
        t = node["t"]
        bad = False
        if t == "str":
            bad = not isinstance(value, str)
        elif t == "int":
            bad = not isinstance(value, int) or isinstance(value, bool)
        elif t == "float":
            bad = not isinstance(value, (int, float)) or isinstance(value, bool)
        elif t == "bool":
            bad = not isinstance(value, bool)
        elif t in ("datetime", "duration", "date", "bytes"):
            bad = not isinstance(value, str)
        elif t == "list":
            bad = not isinstance(value, list)
        elif t in ("map", "obj"):
            bad = not isinstance(value, dict)
        if bad:
            problems.append(("type", path, f"Error converting value {describe(value)} to type "
                             f"'{NET_TYPES.get(t, t)}'. Path '{path}'."))
            return
        if t == "str" and "enum" in node and node.get("en") not in OPEN_ENUMS:
            if value.lower() not in {e.lower() for e in node["enum"]}:
                allowed = ", ".join(node["enum"])
                problems.append(("enum", path, f"The value '{value}' of '{path}' is not allowed. "
                                 f"Allowed values are: {allowed}."))
        self._constraints(node.get("v"), value, path, problems)
        if t == "list":
            for i, item in enumerate(value):
                if item is not None:
                    self._node(models, node["of"], item, f"{path}[{i}]", problems)
        elif t == "map":
            for key, item in value.items():
                if item is not None:
                    self._node(models, node["of"], item, f"{path}.{key}", problems)
        elif t == "obj":
            self._props(models, "properties", node["props"], value, path, problems)
        elif t == "model":
            self._model(models, node["m"], value, path, problems)

    @staticmethod
    def _constraints(rules, value, path, problems):
        if not rules:
            return
        why = None
        if isinstance(value, str):
            if "pattern" in rules and not re.search(rules["pattern"], value):
                why = f"does not match the pattern {rules['pattern']}"
            elif "max_length" in rules and len(value) > rules["max_length"]:
                why = f"is longer than {rules['max_length']} characters"
            elif "min_length" in rules and len(value) < rules["min_length"]:
                why = f"is shorter than {rules['min_length']} characters"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if "maximum" in rules and value > rules["maximum"]:
                why = f"is more than {rules['maximum']}"
            elif "minimum" in rules and value < rules["minimum"]:
                why = f"is less than {rules['minimum']}"
        elif isinstance(value, list):
            if "max_items" in rules and len(value) > rules["max_items"]:
                why = f"has more than {rules['max_items']} items"
            elif "min_items" in rules and len(value) < rules["min_items"]:
                why = f"has fewer than {rules['min_items']} items"
        if why:
            problems.append(("constraint", path, f"The value {describe(value)} of '{path}' {why}."))
