"""The Azure Retail Prices API (`GET /api/retail/prices`), as the fake serves it.

What the real service answers (learn.microsoft.com, "Azure Retail Prices
overview"): no credentials; an OData `$filter` of `field eq 'value'`
clauses joined by `and` (values case-sensitive since 2023-01-01-preview);
pages of `Items` with a `NextPageLink` (null on the last page) that carries
the filter and a `$skip`; each item a meter with `armSkuName`,
`armRegionName`, `retailPrice`, `unitOfMeasure`, `type` (`Consumption`,
`DevTestConsumption`, `Reservation`), `productName` (Windows meters say
`Windows` there), `skuName` and `meterName` (Spot meters end in `Spot`, the
older Low Priority ones in `Low Priority`).

The fake's sheet: the VM prices a test or bench posts (`POST /_fake/retail`,
`{"prices": [{"sku", "region", "linux", "spot"?, "windows"?}],
"filler_per_region": N}`), each made into the meters the real service
lists for a size (Linux and Windows, pay-as-you-go, Spot, Low Priority,
Dev/Test, a one-year reservation; the wrong ones priced so that a reader
that takes them gets a visibly wrong price), plus N meters of other sizes
per region so that a region takes as many pages as a real one. A filter it
does not understand is answered 400 and counted as a violation.
"""

import re
import threading
import urllib.parse
import uuid

SERVICE = "Virtual Machines"
SERVICE_ID = "DZH313Z7MMC8"
FIELDS = {"armRegionName", "location", "meterId", "meterName", "productId", "skuId",
          "productName", "skuName", "serviceName", "serviceId", "serviceFamily",
          "priceType", "armSkuName", "currencyCode"}
CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$")
NS = uuid.UUID("6f1f0b1e-6d1b-4c2e-9a55-2d0c3f7e9a10")


class BadFilter(Exception):
    pass


def parse_filter(text):
    """`a eq 'x' and b eq 'y'` -> [(a, x), (b, y)]."""
    if not text or not text.strip():
        return []
    out = []
    for clause in re.split(r"\s+and\s+", text.strip()):
        m = CLAUSE.match(clause)
        if not m:
            raise BadFilter(f"cannot read the clause {clause!r}: the fake reads "
                            "`field eq 'value'` clauses joined by `and`")
        field, value = m.groups()
        if field not in FIELDS:
            raise BadFilter(f"unknown field {field!r} in $filter; known: {sorted(FIELDS)}")
        out.append((field, value))
    return out


def series_of(sku):
    """`Standard_ND96amsr_A100_v4` -> (`ND96amsr A100 v4`, `NDamsrA100v4`)."""
    short = sku[len("Standard_"):] if sku.startswith("Standard_") else sku
    words = short.split("_")
    family = re.sub(r"\d+", "", words[0], count=1)
    return " ".join(words), family + "".join(words[1:])


def meter(sku, region, price, kind, windows=False, tag="", term=None):
    name, series = series_of(sku)
    sku_name = f"{name} {tag}".strip()
    product = f"Virtual Machines {series} Series" + (" Windows" if windows else "")
    key = f"{sku}|{region}|{kind}|{windows}|{tag}|{term}"
    item = {
        "currencyCode": "USD", "tierMinimumUnits": 0.0,
        "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region,
        "effectiveStartDate": "2026-04-01T00:00:00Z",
        "meterId": str(uuid.uuid5(NS, key)), "meterName": sku_name,
        "productId": "DZH318Z0" + str(uuid.uuid5(NS, product))[:4].upper(),
        "skuId": "DZH318Z0/" + str(uuid.uuid5(NS, sku_name))[:4].upper(),
        "productName": product, "skuName": sku_name,
        "serviceName": SERVICE, "serviceId": SERVICE_ID, "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True,
        "armSkuName": sku,
    }
    if term:
        item["reservationTerm"] = term
    return item


def meters_of(p):
    """The meters the real service lists for one size in one region."""
    sku, region, linux = p["sku"], p["region"], float(p["linux"])
    spot = p.get("spot")
    windows = float(p.get("windows") or round(linux * 1.45, 4))
    out = [meter(sku, region, linux, "Consumption"),
           meter(sku, region, windows, "Consumption", windows=True),
           # Dev/Test and reservations are cheaper: taking them is wrong.
           meter(sku, region, round(linux * 0.5, 4), "DevTestConsumption"),
           meter(sku, region, round(linux * 0.6, 4), "Reservation", term="1 Year")]
    if spot is not None:
        spot = float(spot)
        out += [meter(sku, region, spot, "Consumption", tag="Spot"),
                meter(sku, region, round(spot * 1.3, 4), "Consumption", windows=True, tag="Spot"),
                # Low Priority (Batch's older discount) is cheaper than Spot.
                meter(sku, region, round(spot * 0.7, 4), "Consumption", tag="Low Priority")]
    return out


def filler(region, i):
    """Meter i of the other sizes of `region`."""
    sku = f"Standard_F{2 * (i // 6 + 1)}s_v9"
    kind, windows, tag = [("Consumption", False, ""), ("Consumption", True, ""),
                          ("Consumption", False, "Spot"), ("Consumption", True, "Spot"),
                          ("DevTestConsumption", False, ""),
                          ("Reservation", False, "")][i % 6]
    price = round(0.05 * (i // 6 + 1), 4)
    return meter(sku, region, price, kind, windows=windows, tag=tag,
                 term="1 Year" if kind == "Reservation" else None)


class Retail:
    def __init__(self, fake):
        self.fake = fake
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.prices = []
            self.filler = 0
            self.requests = 0
            self.cache = (None, [])

    def configure(self, spec):
        if not isinstance(spec, dict) or set(spec) - {"prices", "filler_per_region"}:
            raise ValueError('a retail sheet is {"prices": [...], "filler_per_region": N}')
        prices = spec.get("prices", [])
        for p in prices:
            if not isinstance(p, dict) or not {"sku", "region", "linux"} <= set(p) \
                    or set(p) - {"sku", "region", "linux", "spot", "windows"}:
                raise ValueError('each price is {"sku", "region", "linux", "spot"?, "windows"?}')
        with self.lock:
            self.prices = list(prices)
            self.filler = int(spec.get("filler_per_region", 0))
            self.cache = (None, [])
        return self.view()

    def view(self):
        return {"prices": len(self.prices), "filler_per_region": self.filler,
                "requests": self.requests}

    def matching(self, clauses):
        """Every item the filter selects (the last filter's, cached: a
        client pages through one filter at a time)."""
        key = tuple(clauses)
        with self.lock:
            if self.cache[0] == key:
                return self.cache[1]
            prices, n = list(self.prices), self.filler
        regions = sorted({p["region"] for p in prices})
        want = dict(clauses)
        if "armRegionName" in want:
            regions = [want["armRegionName"]] if want["armRegionName"] in regions or n else []

        def keep(item):
            for field, value in clauses:
                have = item["type"] if field == "priceType" else item.get(field)
                if have != value:
                    return False
            return True

        out = []
        for region in regions:
            for p in prices:
                if p["region"] == region:
                    out.extend(m for m in meters_of(p) if keep(m))
            out.extend(m for m in (filler(region, i) for i in range(n)) if keep(m))
        with self.lock:
            self.cache = (key, out)
        return out

    def answer(self, url, base):
        """(status, body, headers) for `GET /api/retail/prices`."""
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        with self.lock:
            self.requests += 1
        rule = self.fake.take_rule({"method": "GET", "path": url.path, "type": "retail"}, False)
        if rule is not None:
            err = self.fake.fault_error(rule, {"method": "GET", "path": url.path})
            return err.status, err.body(), err.headers
        try:
            clauses = parse_filter(query.get("$filter", ""))
            skip = int(query.get("$skip", "0") or 0)
            if skip < 0:
                raise BadFilter("$skip must not be negative")
        except (BadFilter, ValueError) as err:
            self.fake.violation("retail-filter", "GET", url.path + "?" + url.query, str(err))
            return 400, {"Error": {"Code": "BadRequest", "Message": f"Invalid OData parameters "
                                   f"supplied: {err}"}}, {}
        items = self.matching(clauses)
        size = max(1, int(self.fake.settings.get("retail_page_size", 1000)))
        page = items[skip:skip + size]
        nxt = None
        if skip + size < len(items):
            q = dict(query)
            q["$skip"] = str(skip + size)
            nxt = f"{base}{url.path}?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)
        return 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default",
                     "CustomerEntityType": "Retail", "Items": page, "NextPageLink": nxt,
                     "Count": len(page)}, {}
