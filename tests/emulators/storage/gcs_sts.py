"""Downscoped GCS tokens in the storage front: Google's Security Token
Service exchange with a Credential Access Boundary, and the boundary's
enforcement on the GCS requests that follow.

Standard library only. The front (front.py) makes one `Sts` when its flavor
is `gcs` and consults it for every request:

* `POST /v1/token` is the STS token exchange (sts.googleapis.com/v1/token):
  a form (`grant_type`, `subject_token_type`, `requested_token_type`,
  `subject_token`, `options` = a JSON `{"accessBoundary": {...}}`) checked as
  Google checks it, answered with a fresh opaque token whose boundary and
  expiry are kept here;
* every other request that carries `Authorization: Bearer <such a token>`
  is classified (which IAM permissions on which bucket or object it needs)
  from its method, path, query and headers alone, never its body (bodies
  stream through the front), and refused with GCS's 403 when no rule of the
  token's boundary allows each permission, or with 401 once the token
  expired. Requests with any other bearer, or none, are not looked at.

The conditions a rule may carry are the subset of CEL that gangway writes:
`resource.name.startsWith('...')` and
`api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('...')`
joined with `||`, with parentheses; anything else is refused at exchange
time (400). README.md beside this file documents all of it.
"""

import hashlib
import http.client
import json
import re
import secrets
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

TOKEN_PATH = "/v1/token"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
# Google's limits (the STS reference, AccessBoundary and Expr).
MAX_RULES = 10
MAX_EXPRESSION = 2048
# The form of a token exchange, read whole: it is small.
MAX_FORM = 64 * 1024
# A refused request's body is read and thrown away up to this much (so the
# connection stays usable), then the connection is closed instead.
DRAIN_LIMIT = 64 << 20
# A body the front must read to classify a request (a resumable upload's
# metadata without `name=` in the query, a compose request's sources).
MAX_PEEK = 1 << 20
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"
RESOURCE = re.compile(r"//storage\.googleapis\.com/projects/_/buckets/([^/\s]+)\Z")
TOKEN_PREFIX = "ya29.downscoped-"

# The predefined roles a rule may name, and their storage permissions
# (bucket and object ones; the project-level ones they also hold do not
# apply to a bucket). Roles outside this table are refused at exchange time.
_MULTIPART = {"storage.multipartUploads.create", "storage.multipartUploads.abort",
              "storage.multipartUploads.listParts", "storage.multipartUploads.list"}
ROLES = {
    "roles/storage.objectViewer": {"storage.objects.get", "storage.objects.list"},
    "roles/storage.objectCreator": {"storage.objects.create"} | (_MULTIPART - {"storage.multipartUploads.list"}),
    "roles/storage.objectAdmin": {
        "storage.objects.create", "storage.objects.delete", "storage.objects.get",
        "storage.objects.list", "storage.objects.update", "storage.objects.getIamPolicy",
        "storage.objects.setIamPolicy"} | _MULTIPART,
    "roles/storage.legacyObjectReader": {"storage.objects.get"},
    "roles/storage.legacyBucketReader": {"storage.buckets.get", "storage.objects.list"},
}

# Paths that belong to the JSON API and fake-gcs-server's helpers; any other
# path (but the token endpoint and the control API) is the XML API's
# /BUCKET/OBJECT, as in ../gcs/xml_api.py.
JSON_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")
# XML API bucket sub-resources read with storage.buckets.get (a GET of the
# bucket with none of these lists its objects).
XML_BUCKET_READS = {"acl", "billing", "cors", "defaultObjectAcl", "encryptionConfig",
                    "lifecycle", "location", "logging", "storageClass", "versioning",
                    "website", "tagging"}


def short_sha(token):
    """16 hex digits of the SHA-256 of `token`: the front's log's way of
    naming a bearer token without showing it."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


class Refused(ValueError):
    """An exchange Google would answer 400; `error` is the OAuth code."""

    def __init__(self, description, error="invalid_request"):
        super().__init__(description)
        self.error = error


# ---- the CEL subset ------------------------------------------------------

_TOKEN = re.compile(r"""\s*(?:(?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
                    r"""|(?P<op>\|\||[().,])|(?P<id>[A-Za-z_][A-Za-z0-9_]*))""")
_ESCAPES = {"\\": "\\", "'": "'", '"': '"'}


def _tokens(text):
    pos, out = 0, []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise Refused(f"availabilityCondition: {text[pos:pos + 20]!r} at {pos} is outside the "
                          "CEL this emulator evaluates")
        if m.group("str"):
            raw = m.group("str")[1:-1]
            value, i = [], 0
            while i < len(raw):
                if raw[i] == "\\":
                    if raw[i + 1] not in _ESCAPES:
                        raise Refused(f"availabilityCondition: the escape \\{raw[i + 1]} is outside "
                                      "the CEL this emulator evaluates")
                    value.append(_ESCAPES[raw[i + 1]])
                    i += 2
                else:
                    value.append(raw[i])
                    i += 1
            out.append(("str", "".join(value)))
        elif m.group("op"):
            out.append(("op", m.group("op")))
        else:
            out.append(("id", m.group("id")))
        pos = m.end()
    return out


class Condition:
    """A parsed availabilityCondition: a disjunction of `startsWith` terms,
    each ("resource.name", PREFIX) or ("objectListPrefix", PREFIX)."""

    def __init__(self, expression):
        if not isinstance(expression, str) or not expression.strip():
            raise Refused("availabilityCondition.expression must be a non-empty string")
        if len(expression) > MAX_EXPRESSION:
            raise Refused(f"availabilityCondition.expression is longer than {MAX_EXPRESSION} characters")
        self.expression = expression
        self._toks = _tokens(expression)
        self._at = 0
        self.terms = self._disjunction()
        if self._at != len(self._toks):
            raise Refused(f"availabilityCondition: unexpected {self._toks[self._at][1]!r} in "
                          f"{expression!r} (this emulator evaluates startsWith terms joined by ||)")

    def _next(self, kind, value=None):
        if self._at >= len(self._toks):
            raise Refused(f"availabilityCondition: {self.expression!r} ends early")
        tok = self._toks[self._at]
        if tok[0] != kind or (value is not None and tok[1] != value):
            want = value or {"str": "a quoted string", "id": "a name"}.get(kind, kind)
            raise Refused(f"availabilityCondition: expected {want}, found {tok[1]!r} in "
                          f"{self.expression!r} (this emulator evaluates only "
                          "resource.name.startsWith(...) and api.getAttribute("
                          f"'{LIST_PREFIX}', '').startsWith(...) joined by ||)")
        self._at += 1
        return tok[1]

    def _peek(self):
        return self._toks[self._at] if self._at < len(self._toks) else (None, None)

    def _disjunction(self):
        terms = self._term()
        while self._peek() == ("op", "||"):
            self._at += 1
            terms += self._term()
        return terms

    def _term(self):
        if self._peek() == ("op", "("):
            self._at += 1
            terms = self._disjunction()
            self._next("op", ")")
            return terms
        head = self._next("id")
        if head == "resource":
            for part in (".", "name", ".", "startsWith", "("):
                self._next("op" if part in ".(" else "id", part)
            prefix = self._next("str")
            self._next("op", ")")
            return [("resource.name", prefix)]
        if head == "api":
            for part in (".", "getAttribute", "("):
                self._next("op" if part in ".(" else "id", part)
            attribute = self._next("str")
            self._next("op", ",")
            default = self._next("str")
            self._next("op", ")")
            if attribute != LIST_PREFIX or default != "":
                raise Refused(f"availabilityCondition: only api.getAttribute('{LIST_PREFIX}', '') "
                              "is evaluated here")
            for part in (".", "startsWith", "("):
                self._next("op" if part in ".(" else "id", part)
            prefix = self._next("str")
            self._next("op", ")")
            return [("objectListPrefix", prefix)]
        raise Refused(f"availabilityCondition: {head!r} is outside the CEL this emulator evaluates "
                      "(resource.name and api.getAttribute only)")

    def holds(self, resource_name, list_prefix):
        """Whether the expression is true for a request on `resource_name`
        whose objectListPrefix attribute is `list_prefix` (None: absent,
        so the attribute's default '' applies)."""
        attribute = list_prefix if list_prefix is not None else ""
        for kind, prefix in self.terms:
            value = resource_name if kind == "resource.name" else attribute
            if value.startswith(prefix):
                return True
        return False


# ---- the boundary --------------------------------------------------------

class Rule:
    def __init__(self, raw, index):
        where = f"accessBoundaryRules[{index}]"
        if not isinstance(raw, dict):
            raise Refused(f"{where} must be an object")
        unknown = set(raw) - {"availableResource", "availablePermissions", "availabilityCondition"}
        if unknown:
            raise Refused(f"{where}: unknown field(s) {sorted(unknown)}")
        resource = raw.get("availableResource")
        if not isinstance(resource, str) or not resource:
            raise Refused(f"{where}.availableResource is required")
        m = RESOURCE.match(resource)
        if not m:
            raise Refused(f"{where}.availableResource {resource!r} is not a Cloud Storage bucket "
                          "(//storage.googleapis.com/projects/_/buckets/BUCKET)")
        self.bucket = m.group(1)
        permissions = raw.get("availablePermissions")
        if not isinstance(permissions, list) or not permissions:
            raise Refused(f"{where}.availablePermissions must list at least one role")
        self.permissions = set()
        for p in permissions:
            if not isinstance(p, str) or not p.startswith("inRole:"):
                raise Refused(f"{where}.availablePermissions: {p!r} is not of the form inRole:ROLE")
            role = p[len("inRole:"):]
            if role not in ROLES:
                raise Refused(f"{where}.availablePermissions: role {role!r} is not one this "
                              f"emulator knows ({', '.join(sorted(ROLES))})")
            self.permissions |= ROLES[role]
        self.condition = None
        cond = raw.get("availabilityCondition")
        if cond is not None:
            if not isinstance(cond, dict):
                raise Refused(f"{where}.availabilityCondition must be an object")
            unknown = set(cond) - {"expression", "title", "description", "location"}
            if unknown:
                raise Refused(f"{where}.availabilityCondition: unknown field(s) {sorted(unknown)}")
            for key in ("title", "description", "location"):
                if key in cond and not isinstance(cond[key], str):
                    raise Refused(f"{where}.availabilityCondition.{key} must be a string")
            self.condition = Condition(cond.get("expression"))

    def allows(self, check):
        if check.bucket != self.bucket or check.permission not in self.permissions:
            return False
        return self.condition is None or self.condition.holds(check.resource_name, check.list_prefix)


def parse_options(value):
    """The `options` form field: the JSON object, or the same percent-encoded
    once more (google-auth-library-python quotes it before form-encoding;
    the Go library does not). Returns (accessBoundary as sent, rules)."""
    if value is None or value == "":
        raise Refused("options is required: a JSON object with an accessBoundary")
    if not isinstance(value, str):
        raise Refused("options must be a string (the JSON object, serialized)")
    try:
        options = json.loads(value)
    except ValueError:
        try:
            options = json.loads(urllib.parse.unquote(value))
        except ValueError as e:
            raise Refused(f"options is not valid JSON: {e}")
    if not isinstance(options, dict):
        raise Refused("options must be a JSON object")
    unknown = set(options) - {"accessBoundary", "userProject"}
    if unknown:
        raise Refused(f"options: unknown field(s) {sorted(unknown)}")
    boundary = options.get("accessBoundary")
    if not isinstance(boundary, dict):
        raise Refused("options.accessBoundary is required (an object)")
    unknown = set(boundary) - {"accessBoundaryRules"}
    if unknown:
        raise Refused(f"options.accessBoundary: unknown field(s) {sorted(unknown)}")
    rules = boundary.get("accessBoundaryRules")
    if not isinstance(rules, list) or not rules:
        raise Refused("options.accessBoundary.accessBoundaryRules must list at least one rule")
    if len(rules) > MAX_RULES:
        raise Refused(f"options.accessBoundary.accessBoundaryRules has {len(rules)} rules; "
                      f"at most {MAX_RULES} are allowed")
    return boundary, [Rule(r, i) for i, r in enumerate(rules)]


# ---- what a request needs ------------------------------------------------

class Check:
    """One permission a request needs on one bucket or object."""

    def __init__(self, permission, bucket, obj=None, list_prefix=None):
        self.permission = permission
        self.bucket = bucket
        self.object = obj
        self.list_prefix = list_prefix

    @property
    def resource_name(self):
        name = f"projects/_/buckets/{self.bucket}"
        return name if self.object is None else f"{name}/objects/{self.object}"

    def describe(self):
        s = f"{self.permission} on {self.resource_name}"
        if self.list_prefix is not None:
            s += f" (objectListPrefix {self.list_prefix!r})"
        return s


class Needs:
    """What a request needs: `checks` (all must pass); `creates` (objects
    it would write: overwriting one also needs storage.objects.delete);
    `never` (a permission no downscoped token holds, with the resource's
    kind) or `unknown` (a request the front cannot classify: refused);
    `session` (a resumable upload's later piece: allowed, as GCS lets the
    session URI stand for the caller); `peek` (the body must be read to
    know: "resumable-name" or "compose"); `xml` (answer in the XML API's
    form)."""

    def __init__(self, xml=False):
        self.checks, self.creates = [], []
        self.never = self.unknown = self.peek = None
        self.session = False
        self.xml = xml

    def need(self, permission, bucket, obj=None, list_prefix=None):
        self.checks.append(Check(permission, bucket, obj, list_prefix))
        return self

    def create(self, bucket, obj):
        self.need("storage.objects.create", bucket, obj)
        self.creates.append((bucket, obj))
        return self


def _rest_object(rest):
    return urllib.parse.unquote(rest)


def classify(method, path, headers):
    """The permissions a GCS request needs, from its method, path, query and
    headers (never its body)."""
    url = urllib.parse.urlsplit(path)
    query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    p = url.path
    if p.startswith(JSON_PREFIXES):
        return _classify_json(method, p, query)
    return _classify_xml(method, p, query, headers)


def _classify_json(method, p, query):
    n = Needs()
    for prefix in ("/storage/v1/b", "/upload/storage/v1/b", "/download/storage/v1/b"):
        if p == prefix or p.startswith(prefix + "/"):
            api, rest = prefix, p[len(prefix):].lstrip("/")
            break
    else:
        n.unknown = f"{method} {p}"
        return n
    if not rest:
        if api == "/storage/v1/b":
            n.never = ("storage.buckets.create" if method == "POST" else "storage.buckets.list",
                       "project")
        else:
            n.unknown = f"{method} {p}"
        return n
    bucket_enc, _, rest = rest.partition("/")
    bucket = urllib.parse.unquote(bucket_enc)
    if api == "/upload/storage/v1/b":
        if rest != "o":
            n.unknown = f"{method} {p}"
        elif "upload_id" in query:
            n.session = True
        elif method != "POST":
            n.unknown = f"{method} {p}"
        elif query.get("name"):
            n.create(bucket, query["name"])
        elif query.get("uploadType") == "resumable":
            n.peek = ("resumable-name", bucket)
        else:
            n.unknown = "an upload without the object's name in the query (name=)"
        return n
    if api == "/download/storage/v1/b":
        if not rest.startswith("o/") or len(rest) <= 2 or method not in ("GET", "HEAD"):
            n.unknown = f"{method} {p}"
            return n
        return n.need("storage.objects.get", bucket, _rest_object(rest[2:]))
    # The JSON API proper.
    if not rest:
        need = {"GET": "storage.buckets.get", "HEAD": "storage.buckets.get",
                "PATCH": "storage.buckets.update", "PUT": "storage.buckets.update",
                "DELETE": "storage.buckets.delete"}.get(method)
        if need is None:
            n.unknown = f"{method} {p}"
        elif need == "storage.buckets.get":
            n.need(need, bucket)
        else:
            n.never = (need, "bucket")
        return n
    if rest == "o":
        if method == "GET":
            return n.need("storage.objects.list", bucket, None, query.get("prefix", ""))
        if method == "POST" and query.get("name"):
            return n.create(bucket, query["name"])
        n.unknown = f"{method} {p}"
        return n
    if not rest.startswith("o/"):
        n.unknown = f"{method} {p}"
        return n
    rest = rest[2:]
    for verb in ("/copyTo/b/", "/rewriteTo/b/"):
        if verb in rest and method == "POST":
            src, _, dst = rest.partition(verb)
            dst_bucket, _, dst_obj = dst.partition("/o/")
            n.need("storage.objects.get", bucket, _rest_object(src))
            return n.create(urllib.parse.unquote(dst_bucket), _rest_object(dst_obj))
    if rest.endswith("/compose") and method == "POST":
        n.create(bucket, _rest_object(rest[: -len("/compose")]))
        n.peek = ("compose", bucket)
        return n
    obj = _rest_object(rest)
    need = {"GET": "storage.objects.get", "HEAD": "storage.objects.get",
            "PATCH": "storage.objects.update", "PUT": "storage.objects.update",
            "DELETE": "storage.objects.delete"}.get(method)
    if need is None:
        n.unknown = f"{method} {p}"
        return n
    return n.need(need, bucket, obj)


def _classify_xml(method, p, query, headers):
    n = Needs(xml=True)
    bucket_enc, _, obj_enc = p.lstrip("/").partition("/")
    if not bucket_enc:
        if method in ("GET", "HEAD"):
            n.never = ("storage.buckets.list", "project")
        else:
            n.unknown = f"{method} {p}"
        return n
    bucket = urllib.parse.unquote(bucket_enc)
    if not obj_enc:
        if method == "GET":
            if set(query) & XML_BUCKET_READS:
                return n.need("storage.buckets.get", bucket)
            return n.need("storage.objects.list", bucket, None, query.get("prefix", ""))
        if method == "HEAD":
            return n.need("storage.buckets.get", bucket)
        if method in ("PUT", "DELETE"):
            n.never = ("storage.buckets.create" if method == "PUT" else "storage.buckets.delete",
                       "project" if method == "PUT" else "bucket")
            return n
        n.unknown = f"{method} {p}"
        return n
    obj = urllib.parse.unquote(obj_enc)
    if method in ("GET", "HEAD"):
        if "uploadId" in query:
            return n.need("storage.multipartUploads.listParts", bucket, obj)
        return n.need("storage.objects.get", bucket, obj)
    if method == "PUT":
        if "uploadId" in query and "partNumber" in query:
            return n.need("storage.multipartUploads.create", bucket, obj)
        source = headers.get("x-goog-copy-source")
        if source:
            src_bucket, _, src_obj = urllib.parse.unquote(source.lstrip("/")).partition("/")
            n.need("storage.objects.get", src_bucket, src_obj)
        return n.create(bucket, obj)
    if method == "POST":
        if "uploads" in query:
            return n.need("storage.multipartUploads.create", bucket, obj)
        if "uploadId" in query:
            return n.create(bucket, obj)
        n.unknown = f"{method} {p}"
        return n
    if method == "DELETE":
        if "uploadId" in query:
            return n.need("storage.multipartUploads.abort", bucket, obj)
        return n.need("storage.objects.delete", bucket, obj)
    n.unknown = f"{method} {p}"
    return n


# ---- answers -------------------------------------------------------------

def _kind(check_or_kind):
    if isinstance(check_or_kind, str):
        return {"project": "Google Cloud project", "bucket": "Google Cloud Storage bucket"}[check_or_kind]
    return ("Google Cloud Storage object" if check_or_kind.object is not None
            else "Google Cloud Storage bucket")


def denied_message(principal, permission, kind):
    return (f"{principal} does not have {permission} access to the {kind}. "
            f"Permission '{permission}' denied on resource (or it may not exist).")


def forbidden(xml, message):
    """GCS's 403: the JSON API's error object, or the XML API's."""
    if xml:
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                f"<Message>Access denied.</Message><Details>{escape(message)}</Details></Error>")
        return 403, [("Content-Type", "application/xml; charset=UTF-8")], body.encode()
    body = {"error": {"code": 403, "message": message,
                      "errors": [{"message": message, "domain": "global", "reason": "forbidden"}]}}
    return 403, [("Content-Type", "application/json; charset=UTF-8")], json.dumps(body).encode()


def unauthorized(xml):
    """GCS's 401 for a token that is no longer valid."""
    if xml:
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AuthenticationRequired</Code>'
                "<Message>Authentication required.</Message></Error>")
        return 401, [("Content-Type", "application/xml; charset=UTF-8")], body.encode()
    body = {"error": {"code": 401, "message": "Invalid Credentials",
                      "errors": [{"message": "Invalid Credentials", "domain": "global",
                                  "reason": "authError", "locationType": "header",
                                  "location": "Authorization"}]}}
    return (401, [("Content-Type", "application/json; charset=UTF-8"),
                  ("WWW-Authenticate", 'Bearer realm="https://accounts.google.com/", error="invalid_token"')],
            json.dumps(body).encode())


def oauth_error(error, description):
    body = {"error": error, "error_description": description}
    return 400, [("Content-Type", "application/json; charset=utf-8")], json.dumps(body).encode()


# ---- the service ---------------------------------------------------------

class Sts:
    """The token exchange, the tokens it issued, and their enforcement."""

    def __init__(self):
        self._lock = threading.Lock()
        # token -> {"rules", "expires_at", "sha"}
        self._tokens = {}
        self._exchanges = []
        self._next_id = 1
        # How long an issued token lives, and whether the answer says so
        # (Google omits expires_in for tokens derived from a user's token).
        self.lifetime_s = 3600
        self.send_expires_in = True

    # -- the exchange --

    @staticmethod
    def is_token_request(h):
        return urllib.parse.urlsplit(h.path).path == TOKEN_PATH

    def exchange(self, h, entry):
        """Answers POST /v1/token."""
        if h.command != "POST":
            h.drain_body(entry)
            return self.answer(h, entry, (405, [("Content-Type", "application/json"), ("Allow", "POST")],
                                          b'{"error": "invalid_request", "error_description": "POST only"}'))
        raw = h.read_small_body(entry, MAX_FORM)
        if raw is None:
            return self.answer(h, entry, oauth_error("invalid_request", "the request body is too large"))
        ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            form = self._form(raw, ctype)
            subject = form.get("subject_token")
            if isinstance(subject, str) and subject:
                entry["key_id"] = "bearer-sha256:" + short_sha(subject)
            reply = self._issue(form)
        except Refused as e:
            return self.answer(h, entry, oauth_error(e.error, str(e)))
        self.answer(h, entry, reply)

    @staticmethod
    def _form(raw, ctype):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused("the request body is not UTF-8")
        if ctype == "application/json":
            try:
                data = json.loads(text)
            except ValueError as e:
                raise Refused(f"the JSON body does not parse: {e}")
            if not isinstance(data, dict):
                raise Refused("the JSON body must be an object")
            camel = {"grantType": "grant_type", "subjectToken": "subject_token",
                     "subjectTokenType": "subject_token_type",
                     "requestedTokenType": "requested_token_type"}
            return {camel.get(k, k): v for k, v in data.items()}
        form = {}
        for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
            if key in form:
                raise Refused(f"{key} is given more than once")
            form[key] = value
        return form

    def _issue(self, form):
        grant = form.get("grant_type")
        if not grant:
            raise Refused("grant_type is required")
        if grant != GRANT_TYPE:
            raise Refused(f"grant_type {grant!r} is not supported; expected {GRANT_TYPE}")
        for key in ("subject_token_type", "requested_token_type"):
            value = form.get(key)
            if not value:
                raise Refused(f"{key} is required")
            if value != ACCESS_TOKEN_TYPE:
                raise Refused(f"{key} {value!r} is not supported here; a Credential Access "
                              f"Boundary needs {ACCESS_TOKEN_TYPE}")
        subject = form.get("subject_token")
        if not isinstance(subject, str) or not subject:
            raise Refused("subject_token is required")
        boundary, rules = parse_options(form.get("options"))
        now = time.time()
        with self._lock:
            if subject in self._tokens:
                raise Refused("the subject token already carries a Credential Access Boundary; "
                              "another one cannot be applied", "invalid_grant")
            token = TOKEN_PREFIX + secrets.token_urlsafe(32)
            sha = short_sha(token)
            expires_at = now + self.lifetime_s
            self._tokens[token] = {"rules": rules, "expires_at": expires_at, "sha": sha}
            record = {"id": self._next_id, "time": now, "subject_sha256": short_sha(subject),
                      "boundary": boundary, "token_sha256": sha, "expires_at": expires_at}
            self._next_id += 1
            self._exchanges.append(record)
            send_expires_in = self.send_expires_in
        answer = {"access_token": token, "issued_token_type": ACCESS_TOKEN_TYPE,
                  "token_type": "Bearer"}
        if send_expires_in:
            answer["expires_in"] = int(self.lifetime_s)
        return (200, [("Content-Type", "application/json; charset=utf-8")],
                json.dumps(answer).encode())

    # -- enforcement --

    def _token_of(self, h):
        auth = h.headers.get("Authorization") or ""
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None, None
        value = value.strip()
        with self._lock:
            return value, self._tokens.get(value)

    def refuse(self, h, entry):
        """For a request with a downscoped token that its boundary does not
        allow, or whose token expired: answers it (401 or 403) and returns
        True. Otherwise False (the request goes on); the body may then have
        been read into `h.prefetched` (see Handler.forward)."""
        token, info = self._token_of(h)
        if info is None:
            return False
        needs = classify(h.command, h.path, h.headers)
        if needs.session:
            # A resumable upload's session URI stands for its caller (GCS
            # checks the token when the session starts, not after).
            return False
        if time.time() >= info["expires_at"]:
            entry["denied"] = "expired downscoped token"
            self.refuse_with(h, entry, unauthorized(needs.xml))
            return True
        principal = f"downscoped-token-{info['sha']}"
        if needs.unknown:
            message = (f"{principal} may not make this request ({needs.unknown}): the gangway front "
                       "cannot tell from its path and headers which permissions it needs, and "
                       "refuses it to a downscoped token")
            entry["denied"] = f"unclassified: {needs.unknown}"
            self.refuse_with(h, entry, forbidden(needs.xml, message))
            return True
        if needs.never:
            permission, kind = needs.never
            entry["denied"] = f"{permission} (never held by a downscoped token)"
            self.refuse_with(h, entry, forbidden(needs.xml, denied_message(principal, permission, _kind(kind))))
            return True
        if needs.peek:
            failed = self._peek(h, entry, needs)
            if failed:
                entry["denied"] = failed
                self.refuse_with(h, entry, forbidden(needs.xml, f"{principal}: {failed}"))
                return True
        rules = info["rules"]
        for check in needs.checks:
            if not any(rule.allows(check) for rule in rules):
                entry["denied"] = check.describe()
                self.refuse_with(h, entry, forbidden(
                    needs.xml, denied_message(principal, check.permission, _kind(check))))
                return True
        for bucket, obj in needs.creates:
            delete = Check("storage.objects.delete", bucket, obj)
            if any(rule.allows(delete) for rule in rules):
                continue
            if self._exists(h, bucket, obj):
                entry["denied"] = delete.describe() + " (overwriting an existing object)"
                self.refuse_with(h, entry, forbidden(
                    needs.xml, denied_message(principal, delete.permission, _kind(delete))))
                return True
        return False

    def _peek(self, h, entry, needs):
        """Reads a small body the decision depends on; adds its checks.
        Returns a reason to refuse, or None."""
        kind, bucket = needs.peek
        raw = h.read_small_body(entry, MAX_PEEK)
        if raw is None:
            return f"a {kind} request body over {MAX_PEEK} bytes: not read to classify it"
        h.prefetched = raw
        try:
            meta = json.loads(raw or b"{}")
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            return f"the {kind} request's body is not a JSON object"
        if kind == "resumable-name":
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                return "a resumable upload without an object name"
            needs.create(bucket, name)
        else:
            sources = meta.get("sourceObjects")
            if not isinstance(sources, list):
                return "a compose request without sourceObjects"
            for src in sources:
                name = src.get("name") if isinstance(src, dict) else None
                if not isinstance(name, str):
                    return "a compose source without a name"
                needs.need("storage.objects.get", bucket, name)
        return None

    @staticmethod
    def _exists(h, bucket, obj):
        host, port = h.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            q = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
            conn.request("GET", f"/storage/v1/b/{q(bucket)}/o/{q(obj)}")
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        finally:
            conn.close()

    def refuse_with(self, h, entry, reply):
        """Answers `reply` first, then reads what is left of the body and
        throws it away (up to DRAIN_LIMIT; past it the connection closes),
        so a client that sends its whole body before reading sees it too."""
        kind, length = h.body_framing()
        if h.prefetched is None and kind == "length" and length > DRAIN_LIMIT:
            h.close_connection = True
        self.answer(h, entry, reply)
        if h.prefetched is None and not h.close_connection and not h.drain_body(entry, DRAIN_LIMIT):
            h.close_connection = True

    @staticmethod
    def answer(h, entry, reply):
        status, headers, body = reply
        if h.command == "HEAD":
            body = b""
        h.write_full(status, headers + [("Server", "gangway-front")], body)
        entry["status"] = status
        entry["bytes_out"] = len(body)

    # -- the control API --

    def control(self, method, path, raw):
        """(status, JSON object) for /_gangway/sts..., or None: no such route."""
        if (method, path) == ("GET", "/_gangway/sts"):
            now = time.time()
            with self._lock:
                exchanges = [dict(e, expired=now >= e["expires_at"]) for e in self._exchanges]
            return 200, {"exchanges": exchanges, "lifetime_s": self.lifetime_s,
                         "send_expires_in": self.send_expires_in}
        if (method, path) == ("POST", "/_gangway/sts/expire"):
            spec = json.loads(raw or b"{}")
            if not isinstance(spec, dict):
                raise ValueError("a JSON object: {} or {\"token_sha256\": HEX}")
            only = spec.get("token_sha256")
            now = time.time()
            n = 0
            with self._lock:
                for info in self._tokens.values():
                    if (only is None or info["sha"] == only) and info["expires_at"] > now:
                        info["expires_at"] = now
                        n += 1
                for e in self._exchanges:
                    if only is None or e["token_sha256"] == only:
                        e["expires_at"] = min(e["expires_at"], now)
            return 200, {"expired": n}
        if (method, path) == ("POST", "/_gangway/sts/settings"):
            spec = json.loads(raw or b"{}")
            if not isinstance(spec, dict) or set(spec) - {"lifetime_s", "send_expires_in"}:
                raise ValueError('settings: {"lifetime_s": N, "send_expires_in": true|false}')
            if "lifetime_s" in spec:
                if not isinstance(spec["lifetime_s"], int) or spec["lifetime_s"] <= 0:
                    raise ValueError("lifetime_s is a positive integer")
                self.lifetime_s = spec["lifetime_s"]
            if "send_expires_in" in spec:
                if not isinstance(spec["send_expires_in"], bool):
                    raise ValueError("send_expires_in is true or false")
                self.send_expires_in = spec["send_expires_in"]
            return 200, {"lifetime_s": self.lifetime_s, "send_expires_in": self.send_expires_in}
        return None
