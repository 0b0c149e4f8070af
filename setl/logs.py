"""setl's own log: the level and format of `log:` in setl.yaml, and Spark's and the drivers' noise kept out.

Every setl log message names what it is about as ``key=value`` words (``pipeline=p1 stage=load
batch=12 table=shop.orders position=mysql-bin.000003:4711``). With ``log.format: json`` each
record is one JSON object per line, those words lifted into fields, so that a log shipper
needs no parsing rules.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

#: The ``key=value`` words of a message that become fields of a JSON record.
FIELDS = ("pipeline", "stage", "batch", "table", "position", "node")
_FIELD = re.compile(r"\b(" + "|".join(FIELDS) + r")=(\S+)")

#: Libraries whose INFO lines are theirs, not the operator's: kept to warnings and above.
NOISY = ("py4j", "py4j.clientserver", "pyspark", "kazoo", "pymysqlreplication", "urllib3")

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, the message's
    ``key=value`` fields (`FIELDS`), anything passed with ``extra={"setl": {...}}``, and the
    traceback as `exception` when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        for key, value in _FIELD.findall(message):
            data.setdefault(key, value.rstrip(":,;"))
        if "batch" in data and data["batch"].isdigit():
            data["batch"] = int(data["batch"])
        extra = getattr(record, "setl", None)
        if isinstance(extra, dict):
            data.update(extra)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


def setup(level: str = "INFO", fmt: str = "text", *, debug: bool = False) -> None:
    """(Re)configure the root logger on stderr: `level` (DEBUG under `debug`), `fmt` text or json."""
    root = logging.getLogger()
    numeric = logging.DEBUG if debug else getattr(logging, level.upper(), logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in NOISY:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
