"""The GCS XML API writes that fake-gcs-server lacks, answered through its JSON API.

object_store's GCS client speaks only the XML API (https://HOST/BUCKET/OBJECT):
fake-gcs-server answers XML GET, HEAD and bucket listings (list-type=2) itself,
but not the writes. This adapter, plugged into the storage front
(`Front.adapter`), turns each of those into fake-gcs-server's JSON API calls:

* PUT /B/O                     -> POST /upload/storage/v1/b/B/o?uploadType=media (streamed)
* PUT /B/O + x-goog-copy-source -> POST /storage/v1/b/SB/o/SO/copyTo/b/B/o/O
* DELETE /B/O                  -> DELETE /storage/v1/b/B/o/O
* x-goog-if-generation-match   -> checked here against the object's generation
  (fake-gcs-server does not enforce it on uploads): 412 PreconditionFailed
* multipart uploads (POST ?uploads, PUT ?partNumber&uploadId, POST ?uploadId,
  DELETE ?uploadId): the parts are kept in this process's data directory
  (never in the store, so no listing shows them) and streamed to the store
  as one media upload when the upload completes.

Answers take the XML API's forms (XML errors, ETag and x-goog-generation
headers). What it does not do: custom metadata (x-goog-meta-*) and other
object attributes but Content-Type, ACL headers, listing or copying parts,
bucket-level XML calls. The request log shows the client's XML requests.
"""

import hashlib
import http.client
import json
import os
import shutil
import threading
import urllib.parse
import uuid
from xml.sax.saxutils import escape

import front as storage_front

# Paths fake-gcs-server answers itself (the JSON API and its helpers).
NATIVE_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")
GENERATION_MATCH = "x-goog-if-generation-match"


def q(name):
    return urllib.parse.quote(name, safe="")


def xml_error(status, code, message):
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>")
    return status, [("Content-Type", "application/xml; charset=UTF-8")], body.encode()


def from_json_error(status, data):
    """A JSON API error answer in the XML API's form."""
    try:
        message = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = data.decode("utf-8", "replace").strip() or "error"
    code = {404: "NoSuchKey", 412: "PreconditionFailed", 403: "AccessDenied",
            409: "Conflict", 400: "InvalidArgument"}.get(status, "InternalError")
    return xml_error(status, code, message)


def object_headers(meta):
    """The XML API's headers for an object the JSON API describes."""
    headers = [("ETag", f'"{meta.get("md5Hash", "")}"'),
               ("x-goog-generation", str(meta.get("generation", ""))),
               ("x-goog-metageneration", str(meta.get("metageneration", "1")))]
    hashes = [f"{k}={meta[j]}" for k, j in (("crc32c", "crc32c"), ("md5", "md5Hash")) if meta.get(j)]
    if hashes:
        headers.append(("x-goog-hash", ",".join(hashes)))
    return headers


class XmlApi:
    """`Front.adapter` for the GCS XML API writes; see the module docs."""

    def __init__(self, parts_dir):
        self.parts_dir = parts_dir
        self.lock = threading.Lock()
        # upload id -> {"bucket", "object", "content_type"}
        self.uploads = {}

    def __call__(self, h, rule, entry):
        if h.command == "GET":
            return self.missing_bucket_listing(h, entry)
        if h.command not in ("PUT", "POST", "DELETE"):
            return False
        url = urllib.parse.urlsplit(h.path)
        if url.path.startswith(NATIVE_PREFIXES) or url.path.startswith("/_gangway/"):
            return False
        bucket, _, obj = url.path.lstrip("/").partition("/")
        if not bucket or not obj:
            return False
        bucket, obj = urllib.parse.unquote(bucket), urllib.parse.unquote(obj)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        if h.command == "POST" and "uploads" in query:
            self.initiate(h, entry, bucket, obj)
        elif h.command == "PUT" and "uploadId" in query and "partNumber" in query:
            self.put_part(h, rule, entry, bucket, obj, query["uploadId"], query["partNumber"])
        elif h.command == "POST" and "uploadId" in query:
            self.complete(h, rule, entry, bucket, obj, query["uploadId"])
        elif h.command == "DELETE" and "uploadId" in query:
            self.abort(h, entry, bucket, obj, query["uploadId"])
        elif h.command == "PUT" and h.headers.get("x-goog-copy-source"):
            self.copy(h, rule, entry, bucket, obj)
        elif h.command == "PUT":
            self.put(h, rule, entry, bucket, obj)
        elif h.command == "DELETE":
            self.delete(h, rule, entry, bucket, obj)
        else:
            return False
        return True

    def missing_bucket_listing(self, h, entry):
        """GCS answers a listing of a bucket that does not exist with 404
        NoSuchBucket; fake-gcs-server with 500 (a failed lstat). Only that
        case is answered here; every other GET goes to fake-gcs-server."""
        url = urllib.parse.urlsplit(h.path)
        if url.path.startswith(NATIVE_PREFIXES) or url.path.startswith("/_gangway/"):
            return False
        bucket, _, obj = url.path.lstrip("/").partition("/")
        if not bucket or obj or "list-type" not in url.query:
            return False
        status, _ = self.json_get(h, "/storage/v1/b/" + q(urllib.parse.unquote(bucket)))
        if status != 404:
            return False
        self.answer(h, entry, xml_error(404, "NoSuchBucket",
                                        "The specified bucket does not exist."))
        return True

    # ---- helpers ---------------------------------------------------------

    def answer(self, h, entry, reply):
        status, headers, body = reply
        entry["status"] = status
        entry["bytes_out"] = len(body)
        h.write_full(status, headers, body)

    def drain(self, h, entry, limit=1 << 20):
        """The client's (small) body."""
        data = bytearray()
        for piece in h.body_pieces():
            entry["bytes_in"] += len(piece)
            if len(data) < limit:
                data += piece
        return bytes(data)

    def json_get(self, h, path):
        host, port = h.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, (json.loads(data) if resp.status == 200 else None)
        finally:
            conn.close()

    def precondition(self, h, bucket, obj):
        """None, or the 412 answer when x-goog-if-generation-match fails."""
        want = h.headers.get(GENERATION_MATCH)
        if want is None:
            return None
        status, meta = self.json_get(h, f"/storage/v1/b/{q(bucket)}/o/{q(obj)}")
        if status == 200:
            current = str(meta.get("generation"))
        elif status == 404:
            current = "0"
        else:
            return xml_error(503, "ServiceUnavailable", f"generation check answered {status}")
        if current != want.strip():
            return xml_error(412, "PreconditionFailed",
                             f"At least one of the pre-conditions you specified did not hold "
                             f"({GENERATION_MATCH}: {want}, generation {current})")
        return None

    def media_upload_path(self, bucket, obj):
        return f"/upload/storage/v1/b/{q(bucket)}/o?uploadType=media&name={q(obj)}"

    # ---- simple objects --------------------------------------------------

    def put(self, h, rule, entry, bucket, obj):
        failed = self.precondition(h, bucket, obj)
        if failed:
            self.drain(h, entry)
            return self.answer(h, entry, failed)

        def transform(status, _msg, data):
            if status != 200:
                return from_json_error(status, data)
            return 200, object_headers(json.loads(data)), b""

        h.forward(rule, entry, method="POST", path=self.media_upload_path(bucket, obj),
                  transform=transform)

    def copy(self, h, rule, entry, bucket, obj):
        self.drain(h, entry)
        source = urllib.parse.unquote(h.headers["x-goog-copy-source"].lstrip("/"))
        src_bucket, _, src_obj = source.partition("/")
        failed = self.precondition(h, bucket, obj)
        if failed:
            return self.answer(h, entry, failed)

        def transform(status, _msg, data):
            if status != 200:
                return from_json_error(status, data)
            meta = json.loads(data)
            meta = meta.get("resource", meta)
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n<CopyObjectResult>'
                    f'<LastModified>{escape(meta.get("updated", ""))}</LastModified>'
                    f'<ETag>"{escape(meta.get("md5Hash", ""))}"</ETag></CopyObjectResult>')
            return 200, object_headers(meta) + [("Content-Type", "application/xml")], body.encode()

        path = (f"/storage/v1/b/{q(src_bucket)}/o/{q(src_obj)}"
                f"/copyTo/b/{q(bucket)}/o/{q(obj)}")
        h.forward(rule, entry, method="POST", path=path,
                  headers=[("Content-Length", "0")], body=[], transform=transform)

    def delete(self, h, rule, entry, bucket, obj):
        self.drain(h, entry)

        def transform(status, _msg, data):
            if status >= 300:
                return from_json_error(status, data)
            return 204, [], b""

        h.forward(rule, entry, method="DELETE", path=f"/storage/v1/b/{q(bucket)}/o/{q(obj)}",
                  headers=[("Content-Length", "0")], body=[], transform=transform)

    # ---- multipart uploads -----------------------------------------------

    def upload(self, upload_id, bucket, obj):
        with self.lock:
            info = self.uploads.get(upload_id)
        if info is None or info["bucket"] != bucket or info["object"] != obj:
            return None
        return info

    def initiate(self, h, entry, bucket, obj):
        self.drain(h, entry)
        upload_id = uuid.uuid4().hex
        os.makedirs(os.path.join(self.parts_dir, upload_id))
        with self.lock:
            self.uploads[upload_id] = {
                "bucket": bucket, "object": obj,
                "content_type": h.headers.get("Content-Type") or "application/octet-stream",
            }
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<InitiateMultipartUploadResult>'
                f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(obj)}</Key>"
                f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")
        self.answer(h, entry, (200, [("Content-Type", "application/xml")], body.encode()))

    def no_upload(self, upload_id):
        return xml_error(404, "NoSuchUpload", f"no multipart upload {upload_id}")

    def put_part(self, h, rule, entry, bucket, obj, upload_id, number):
        if self.upload(upload_id, bucket, obj) is None or not number.isdigit():
            self.drain(h, entry)
            return self.answer(h, entry, self.no_upload(upload_id))
        drop_at = None
        if rule and rule["action"] == "drop" and rule["direction"] == "request":
            drop_at = rule["after_bytes"] or 0
        final = os.path.join(self.parts_dir, upload_id, f"{int(number):05d}")
        tmp = f"{final}.{threading.get_ident()}.tmp"
        md5 = hashlib.md5()
        try:
            with open(tmp, "wb") as f:
                if drop_at == 0:
                    raise storage_front.Dropped()
                for piece in h.body_pieces():
                    if drop_at is not None and entry["bytes_in"] + len(piece) >= drop_at:
                        entry["bytes_in"] = drop_at
                        raise storage_front.Dropped()
                    f.write(piece)
                    md5.update(piece)
                    entry["bytes_in"] += len(piece)
                if drop_at is not None:
                    raise storage_front.Dropped()
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.answer(h, entry, (200, [("ETag", f'"{md5.hexdigest()}"')], b""))

    def complete(self, h, rule, entry, bucket, obj, upload_id):
        import xml.etree.ElementTree as ET

        data = self.drain(h, entry)
        info = self.upload(upload_id, bucket, obj)
        if info is None:
            return self.answer(h, entry, self.no_upload(upload_id))
        try:
            root = ET.fromstring(data)
        except ET.ParseError as e:
            return self.answer(h, entry, xml_error(400, "MalformedXML", str(e)))
        parts = []
        for part in root.iter():
            if part.tag.rsplit("}", 1)[-1] != "Part":
                continue
            fields = {c.tag.rsplit("}", 1)[-1]: (c.text or "") for c in part}
            parts.append((int(fields.get("PartNumber", "0")), fields.get("ETag", "").strip('"')))
        paths = []
        for number, etag in parts:
            path = os.path.join(self.parts_dir, upload_id, f"{number:05d}")
            if not os.path.isfile(path):
                return self.answer(h, entry, xml_error(400, "InvalidPart", f"part {number} was not uploaded"))
            md5 = hashlib.md5()
            with open(path, "rb") as f:
                for piece in iter(lambda: f.read(storage_front.PIECE), b""):
                    md5.update(piece)
            if etag and md5.hexdigest() != etag:
                return self.answer(h, entry, xml_error(400, "InvalidPart", f"part {number}'s ETag is not {etag}"))
            paths.append(path)
        if not paths:
            return self.answer(h, entry, xml_error(400, "InvalidRequest", "no parts"))
        total = sum(os.path.getsize(p) for p in paths)

        def pieces():
            for path in paths:
                with open(path, "rb") as f:
                    yield from iter(lambda: f.read(storage_front.PIECE), b"")

        def transform(status, _msg, data):
            if status != 200:
                return from_json_error(status, data)
            meta = json.loads(data)
            with self.lock:
                self.uploads.pop(upload_id, None)
            shutil.rmtree(os.path.join(self.parts_dir, upload_id), ignore_errors=True)
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n<CompleteMultipartUploadResult>'
                    f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(obj)}</Key>"
                    f'<ETag>"{escape(meta.get("md5Hash", ""))}"</ETag></CompleteMultipartUploadResult>')
            return 200, object_headers(meta) + [("Content-Type", "application/xml")], body.encode()

        headers = [("Content-Type", info["content_type"]), ("Content-Length", str(total))]
        h.forward(rule, entry, method="POST", path=self.media_upload_path(bucket, obj),
                  headers=headers, body=pieces(), transform=transform)

    def abort(self, h, entry, bucket, obj, upload_id):
        self.drain(h, entry)
        if self.upload(upload_id, bucket, obj) is None:
            return self.answer(h, entry, self.no_upload(upload_id))
        with self.lock:
            self.uploads.pop(upload_id, None)
        shutil.rmtree(os.path.join(self.parts_dir, upload_id), ignore_errors=True)
        self.answer(h, entry, (204, [], b""))
