"""One end of a table check (`End`): the source or the target, asked for a chunk's aggregate
(`summary`), its rows' hashes (`rows`) or some rows' column texts (`texts`), computed by the server
(``sql`` mode) or here from fetched rows (``python`` mode) in the same canonical form.

A chunk is the key range (`lower`, `upper`] (open ends when None) or, for re-checks, a list of
keys. Keys travel as two things: their canonical texts (equal at both ends, so they match rows
across engines) and the raw values this process read (used in later queries).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from setl.model import Position
from setl.snapshot.reader import ChunkReader, key_range
from setl.stages.extract import FILTER_BUILTINS
from setl.verify import canonical
from setl.verify.plan import TableCheck

KeyText = tuple[str | None, ...]
Texts = tuple[str | None, ...]
#: keys per `IN (...)` list
IN_BATCH = 500


class End:
    """The reads of one end (`side`: ``source`` or ``target``) for one table check, on `conn`
    (PyMySQL or psycopg, as `engine`, `setl.verify.mariadb` or `setl.verify.postgresql`, says)."""

    def __init__(self, conn: Any, engine: ModuleType, check: TableCheck, side: str) -> None:
        self.conn, self.engine, self.check, self.side = conn, engine, check, side
        source = side == "source"
        self.names = [c.source if source else c.target for c in check.columns]
        self.key_names = [c.source if source else c.target for c in check.key]
        table = check.source.name if source else check.target
        self.table = engine.table_sql(table.schema, table.table)
        q = engine.quote
        if check.mode == "sql":
            self.texts_sql = [engine.text_sql(c.kind, c.kind if source else c.target_type, q(n))
                              for c, n in zip(check.columns, self.names)]
            self.key_sql = [self.texts_sql[check.columns.index(c)] for c in check.key]
            # strings and other texts that may hold the separator carry their length
            counted = [c.kind in canonical.STRINGS or c.kind in ("set", "json") for c in check.columns]
            plain = [engine.plain_sql(c.kind if source else c.target_type, q(n))
                     for c, n in zip(check.columns, self.names)]
            recoded = engine.recode(conn)  # a target server keeping text in another encoding than UTF-8
            self.hash = engine.hash_sql(engine.row_sql(self.texts_sql, counted, plain, recoded), recoded)
        # python mode: the source reads every column (a row filter may name any); the target the compared ones
        self.fetched = list(check.source.columns) if source else self.names

    # --- transactions ---------------------------------------------------------------------

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Position | None]:
        """A read-only transaction: on the source a consistent snapshot, whose binlog position it yields."""
        position = self.engine.begin_snapshot(self.conn) if self.side == "source" else self.engine.begin(self.conn)
        try:
            yield position
        finally:
            self.engine.end(self.conn)

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self.engine.dialect == "mysql":
            with self.conn.cursor() as cur:
                cur.execute(sql, list(args))
                return list(cur.fetchall())
        return list(self.conn.execute(sql, list(args)).fetchall())

    def _where(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
               keys: Sequence[tuple[Any, ...]] | None) -> tuple[str, list[Any]]:
        q = self.engine.quote
        if keys is not None:
            if len(self.key_names) == 1:
                condition = f"{q(self.key_names[0])} IN ({', '.join(['%s'] * len(keys))})"
                return f" WHERE {condition}", [k[0] for k in keys]
            one = "(" + ", ".join(["%s"] * len(self.key_names)) + ")"
            columns = "(" + ", ".join(q(n) for n in self.key_names) + ")"
            return f" WHERE {columns} IN ({', '.join([one] * len(keys))})", [v for k in keys for v in k]
        conditions, args = key_range(self.key_names, lower, upper, q)
        return (f" WHERE {' AND '.join(conditions)}" if conditions else ""), args

    def _batches(self, keys: Sequence[tuple[Any, ...]] | None) -> Iterator[Sequence[tuple[Any, ...]] | None]:
        if keys is None:
            yield None
            return
        for i in range(0, len(keys), IN_BATCH):
            yield keys[i:i + IN_BATCH]

    # --- python mode ----------------------------------------------------------------------

    def _images(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
                keys: Sequence[tuple[Any, ...]] | None) -> list[tuple[KeyText, tuple[Any, ...], Texts]]:
        """(key texts, raw key, column texts) of the rows, computed here."""
        q = self.engine.quote
        out = []
        select = ", ".join(q(n) for n in self.fetched)
        positions = {n: i for i, n in enumerate(self.fetched)}
        key_at = [positions[n] for n in self.key_names]
        check, route = self.check, self.check.route
        for batch in self._batches(keys):
            where, args = self._where(lower, upper, batch)
            rows = self._fetch(f"SELECT {select} FROM {self.table}{where}", args)
            if self.side == "source":
                images = ChunkReader.converted(check.source, [dict(zip(self.fetched, row)) for row in rows])
                for image, row in zip(images, rows):
                    if route.filter is not None and not eval(route.filter, {"__builtins__": FILTER_BUILTINS},
                                                             dict(image)):
                        continue
                    texts = tuple(canonical.text(c.kind, image[c.source]) for c in check.columns)
                    out.append((tuple(canonical.text(c.kind, image[c.source]) for c in check.key),
                                tuple(row[i] for i in key_at), texts))
            else:
                for row in rows:
                    texts = tuple(canonical.text(c.kind, row[i]) for i, c in enumerate(check.columns))
                    out.append((tuple(texts[check.columns.index(c)] for c in check.key),
                                tuple(row[i] for i in key_at), texts))
        return out

    # --- reads ----------------------------------------------------------------------------

    def summary(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None) -> tuple[int, int]:
        """(rows, hash sum) of the chunk: equal chunks give equal summaries."""
        if self.check.mode == "python":
            return canonical.summary([canonical.row_hash(t) for _, _, t in self._images(lower, upper, None)])
        where, args = self._where(lower, upper, None)
        (count, total), = self._fetch(self.engine.summary_sql(self.hash, self.table, where), args)
        return int(count or 0), int(total or 0)

    def splits(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None, every: int
               ) -> list[tuple[Any, ...]]:
        """The keys of every `every`-th row of the range, in key order, found by the server."""
        q = self.engine.quote
        keys = ", ".join(q(n) for n in self.key_names)
        where, args = self._where(lower, upper, None)
        return [tuple(row) for row in self._fetch(
            f"SELECT {keys} FROM (SELECT {keys}, ROW_NUMBER() OVER (ORDER BY {keys}) AS verify_n FROM {self.table}"
            f"{where}) AS verify_numbered WHERE MOD(verify_n, %s) = 0 ORDER BY {keys}", [*args, every])]

    def summaries(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
                  splits: Sequence[tuple[Any, ...]]) -> dict[int, tuple[int, int]]:
        """`summary` of each part of the range cut after each of `splits` (part i ends at splits[i];
        the last ends at `upper`), in one pass; parts without rows are left out."""
        q = self.engine.quote
        cases, args = [], []
        for i, split in enumerate(splits):
            conditions, values = key_range(self.key_names, None, split, q)
            cases.append(f"WHEN {conditions[0]} THEN {i}")
            args.extend(values)
        part = f"CASE {' '.join(cases)} ELSE {len(splits)} END" if cases else "0"
        where, more = self._where(lower, upper, None)
        summary = self.engine.summary_sql(self.hash, self.table, where)
        select = summary.replace("SELECT ", f"SELECT {part} AS verify_part, ", 1) + " GROUP BY verify_part"
        return {int(p): (int(n or 0), int(total or 0)) for p, n, total in self._fetch(select, [*args, *more])}

    def rows(self, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
             keys: Sequence[tuple[Any, ...]] | None = None) -> dict[KeyText, tuple[str, tuple[Any, ...]]]:
        """Key texts -> (row hash, raw key) of a keyed table's chunk (or of `keys`)."""
        if self.check.mode == "python":
            return {k: (canonical.row_hash(t), raw) for k, raw, t in self._images(lower, upper, keys)}
        q = self.engine.quote
        width = len(self.key_names)
        select = ", ".join([*self.key_sql, *(q(n) for n in self.key_names), self.hash])
        found = {}
        for batch in self._batches(keys):
            where, args = self._where(lower, upper, batch)
            for row in self._fetch(f"SELECT {select} FROM {self.table}{where}", args):
                found[tuple(row[:width])] = (str(row[-1]), tuple(row[width:2 * width]))
        return found

    def multiset(self) -> collections.Counter[str]:
        """Row hash -> rows, of a keyless table."""
        if self.check.mode == "python":
            return collections.Counter(canonical.row_hash(t) for _, _, t in self._images(None, None, None))
        rows = self._fetch(f"SELECT {self.hash}, COUNT(*) FROM {self.table} GROUP BY 1", [])
        return collections.Counter({str(h): int(n) for h, n in rows})

    def texts(self, keys: Sequence[tuple[Any, ...]]) -> dict[KeyText, Texts]:
        """Key texts -> the column texts of the rows with these raw keys."""
        if self.check.mode == "python":
            return {k: t for k, _, t in self._images(None, None, keys)}
        width = len(self.key_names)
        found = {}
        for batch in self._batches(keys):
            where, args = self._where(None, None, batch)
            for row in self._fetch(f"SELECT {', '.join([*self.key_sql, *self.texts_sql])} FROM {self.table}{where}",
                                   args):
                found[tuple(row[:width])] = tuple(row[width:])
        return found

    def sample(self, row_hash: str) -> Texts | None:
        """The column texts of a (keyless) row with this hash, for the report."""
        if self.check.mode == "python":
            return next((t for _, _, t in self._images(None, None, None) if canonical.row_hash(t) == row_hash), None)
        rows = self._fetch(f"SELECT {', '.join(self.texts_sql)} FROM {self.table} WHERE {self.hash} = %s LIMIT 1",
                           [row_hash])
        return tuple(rows[0]) if rows else None
